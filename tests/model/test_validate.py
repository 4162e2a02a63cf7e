"""Bad input gets a ValueError/TypeError naming the argument and the rule."""

import pytest
import torch

from modern_block import (
    GPT2LM,
    GQAttention,
    LlamaStyleLM,
    RMSNorm,
    dynamic_ntk_frequencies,
    generate,
    interleaved_to_half_split,
    kv_cache_bytes_per_token,
    mla_cache_bytes_per_token,
    rope_cache,
    swiglu_hidden_dim,
    validate,
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


def test_the_rules_themselves_at_their_edges():
    """The helpers every module calls (modern_block/validate.py): each rule at its boundary, on both sides."""
    assert validate.positive_int("n", 1) == 1
    for bad, error in ((0, ValueError), (-3, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)):
        with pytest.raises(error, match="^n must be"):
            validate.positive_int("n", bad)
    with pytest.raises(ValueError, match=r"^n must be positive, got 0$"):
        validate.positive_int("n", 0)
    with pytest.raises(TypeError, match=r"^n must be an int, got bool$"):
        validate.positive_int("n", True)
    assert validate.positive_number("eps", 1e-12) == 1e-12 and validate.positive_number("eps", 3) == 3
    for bad in (0, -1e-6, float("nan"), True, "1e-5", None):
        with pytest.raises(ValueError, match=r"^eps must be a number > 0, got "):
            validate.positive_number("eps", bad)
    validate.positive_ints(a=1, b=2)
    with pytest.raises(ValueError, match="^b must be positive"):
        validate.positive_ints(a=1, b=0)
    assert validate.dropout_rate(0.0) == 0.0 and validate.dropout_rate(0) == 0 and validate.dropout_rate(0.5) == 0.5
    for bad in (1.0, -0.1, True, float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got "):
            validate.dropout_rate(bad)
    validate.divisible("d", 12, "n_heads", 4)
    with pytest.raises(ValueError, match=r"^d \(10\) must be divisible by n_heads \(4\)$"):
        validate.divisible("d", 10, "n_heads", 4)
    validate.even("head_dim", 8, "for RoPE")
    with pytest.raises(ValueError, match=r"^head_dim must be even for RoPE, got 7$"):
        validate.even("head_dim", 7, "for RoPE")


def test_token_ids_and_positions_at_their_edges():
    ids = torch.tensor([[0, 9]])
    validate.token_ids(ids, vocab_size=10, max_len=4, offset=2)  # offset + T == max_len fits
    with pytest.raises(ValueError, match=r"^sequence length 5 \(idx.shape\[1\]=2, cache offset 3\) exceeds max_len=4$"):
        validate.token_ids(ids, vocab_size=10, max_len=4, offset=3)
    validate.token_ids(ids, vocab_size=10, max_len=None, offset=100)  # no limit without max_len
    validate.token_ids(ids, vocab_size=10, max_len=2)  # no offset (no cache): a prompt of exactly max_len fits
    validate.token_ids(ids, vocab_size=10, max_len=2, offset=torch.tensor(5))  # a tensor offset: its owner checks
    with pytest.raises(ValueError, match=r"min 0, max 10"):
        validate.token_ids(torch.tensor([[0, 10]]), vocab_size=10, max_len=None)
    with pytest.raises(ValueError, match="at least one token"):
        validate.token_ids(torch.zeros(1, 0, dtype=torch.long), vocab_size=10, max_len=None)
    with pytest.raises(TypeError, match="^idx must be a torch.Tensor of token ids, got list$"):
        validate.token_ids([[0]], vocab_size=10, max_len=None)
    validate.token_ids(ids.int(), vocab_size=10, max_len=None, cache=[None, None], n_layers=2)
    with pytest.raises(ValueError, match=r"^the cache has 1 layers but the model has 2: build it with "
                                         r"KVCache\(n_layers=2, capacity=...\)$"):
        validate.token_ids(ids, vocab_size=10, max_len=None, cache=[None], n_layers=2)
    validate.check_positions(torch.tensor([0, 3]), ids, max_len=4)  # [T]
    validate.check_positions(torch.tensor([[2, 3]], dtype=torch.int32), ids, max_len=4)  # [B, T]
    for bad, error, match in ((torch.tensor([0, 4]), ValueError, r"\[0, max_len=4\), got min 0, max 4"),
                              (torch.tensor([-1, 0]), ValueError, r"got min -1, max 0"),
                              (torch.tensor([0.0, 1.0]), TypeError, "int64 or int32 tensor, got torch.float32"),
                              ([0, 1], TypeError, r"int64 or int32 tensor, got \[0, 1\]$"),
                              (torch.tensor([0, 1, 2]), ValueError, r"shape \[T\] or \[B, T\] = \[1, 2\], got \[3\]")):
        with pytest.raises(error, match=match):
            validate.check_positions(bad, ids, max_len=4)


def test_the_range_checks_read_no_values_off_the_device_and_pass_an_empty_batch():
    """Token ids and positions are range-checked on the CPU only (elsewhere reading them would synchronise every
    step): a tensor whose values cannot be read (the meta device) passes unread, and so does a batch of 0 sequences."""
    validate.token_ids(torch.zeros(0, 3, dtype=torch.long), vocab_size=10, max_len=None)
    unread = torch.full((1, 3), 99, dtype=torch.long, device="meta")
    validate.token_ids(unread, vocab_size=10, max_len=None)
    validate.check_positions(torch.full((3,), 99, dtype=torch.long, device="meta"), unread, max_len=4)
    model = LlamaStyleLM(V=50, d=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_len=8)
    assert model(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, 50)
    assert model.to("meta")(unread, positions=torch.arange(3, device="meta")).shape == (1, 3, 50)


SIZE_ARGUMENTS = [  # (callable, valid keyword arguments): each int argument set to 0 is refused by its own name
    (swiglu_hidden_dim, dict(d=64, multiple_of=32)),
    (kv_cache_bytes_per_token, dict(n_layers=2, n_kv_heads=2, head_dim=8, bytes_per_elem=2)),
    (mla_cache_bytes_per_token, dict(n_layers=2, kv_latent_dim=16, rope_dim=8, bytes_per_elem=2)),
    (interleaved_to_half_split, dict(dh=8)),
    (rope_cache, dict(T=4, dh=8)),
    (lambda dh: dynamic_ntk_frequencies(dh, 10000.0, 2.0, 64, 32), dict(dh=8)),
]


@pytest.mark.parametrize("fn,kwargs", SIZE_ARGUMENTS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_size_argument_is_refused_by_its_name(fn, kwargs):
    fn(**kwargs)
    for name in kwargs:
        with pytest.raises(ValueError, match=rf"^{name} must be positive, got 0$"):
            fn(**{**kwargs, name: 0})


def test_an_odd_head_dim_is_refused_for_rope():
    with pytest.raises(ValueError, match=r"^dh must be even for RoPE, got 7$"):
        interleaved_to_half_split(7)
    with pytest.raises(ValueError, match=r"^dh must be even for RoPE \(dimensions are rotated in pairs\), got 7$"):
        dynamic_ntk_frequencies(7, 10000.0, 2.0, 64, 32)
