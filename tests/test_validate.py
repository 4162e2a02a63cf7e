"""Bad input gets a ValueError/TypeError naming the argument and the rule."""

import pytest
import torch

from modern_block import (
    GPT2LM,
    GQAttention,
    LlamaStyleLM,
    RMSNorm,
    generate,
    kv_cache_bytes_per_token,
    mla_cache_bytes_per_token,
    rope_cache,
    swiglu_hidden_dim,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


@pytest.mark.parametrize("build,match", [
    (lambda: GQAttention(30, 4, 2), r"d \(30\) must be divisible by n_heads \(4\)"),
    (lambda: GQAttention(32, 8, 3), r"n_heads \(8\) must be divisible by n_kv_heads \(3\)"),
    (lambda: GQAttention(36, 4, 2), "head_dim must be even"),
    (lambda: GQAttention(32, 4, 2, head_dim=7), "head_dim must be even"),
    (lambda: LlamaStyleLM(V=0), "V must be positive"),
    (lambda: LlamaStyleLM(V=10, d=-4), "d must be positive"),
    (lambda: LlamaStyleLM(V=10, n_layers=0), "n_layers must be positive"),
    (lambda: LlamaStyleLM(V=10, d_ff=0), "d_ff must be positive"),
    (lambda: LlamaStyleLM(V=10, max_len=0), "max_len must be positive"),
    (lambda: LlamaStyleLM(V=10, dropout=1.0), "dropout must be in"),
    (lambda: GPT2LM(10, d=30, n_heads=4), r"d \(30\) must be divisible by n_heads \(4\)"),
    (lambda: RMSNorm(0), "d must be positive"),
    (lambda: RMSNorm(8, eps=0.0), "eps must be a number > 0"),
    (lambda: swiglu_hidden_dim(4096, ffn_dim_multiplier=-1.3), "ffn_dim_multiplier must be a number > 0"),
    (lambda: rope_cache(8, 7), "dh must be even"),
    (lambda: rope_cache(0, 8), "T must be positive"),
    (lambda: swiglu_hidden_dim(4096, multiple_of=0), "multiple_of must be positive"),
    (lambda: kv_cache_bytes_per_token(0, 8, 128), "n_layers must be positive"),
    (lambda: mla_cache_bytes_per_token(61, 512, -1), "rope_dim must be positive"),
])
def test_bad_sizes_raise_value_error_naming_the_rule(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_sizes_of_the_wrong_type_raise_type_error():
    with pytest.raises(TypeError, match="n_heads must be an int"):
        GQAttention(32, 4.0, 2)


def test_bad_token_batches():
    model = LlamaStyleLM(V=50, d=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_len=8)
    gpt2 = GPT2LM(50, d=32, n_layers=1, n_heads=4, max_len=8)
    for m in (model, gpt2):
        with pytest.raises(ValueError, match="exceeds max_len=8"):
            m(torch.zeros(1, 9, dtype=torch.long))
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, V=50\)"):
            m(torch.tensor([[1, 50]]))
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, V=50\)"):
            m(torch.tensor([[-1, 2]]))
        with pytest.raises(TypeError, match="integer token ids"):
            m(torch.zeros(1, 3))
        for small in (torch.uint8, torch.int16):  # would reach the embedding and fail there, in torch's words
            with pytest.raises(TypeError, match=f"int64\\) or int32, got {small}"):
                m(torch.zeros(1, 3, dtype=small))
        with pytest.raises(ValueError, match=r"shape \[batch, seq_len\]"):
            m(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 6)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 0)
    for temperature in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            generate(model, torch.zeros(1, 4, dtype=torch.long), 2, temperature=temperature)
