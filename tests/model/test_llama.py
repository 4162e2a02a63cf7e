"""The block and the Llama-style LM: the chapter's figures, tied embeddings, options."""

import pytest
import torch
import torch.nn as nn
from tiny_models import dropout_rates

import modern_block as mb
from modern_block import (
    GPT2LM,
    Block,
    GQAttention,
    LlamaStyleLM,
    MLAConfig,
    RMSNorm,
    rope_cache,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_chapter_model_shape_and_parameter_count():
    torch.manual_seed(0)
    model = LlamaStyleLM(V=1000)
    logits = model(torch.randint(0, 1000, (2, 16)))
    assert logits.shape == (2, 16, 1000)
    assert sum(p.numel() for p in model.parameters()) == 3_283_456 == model.num_parameters()
    parts = mb.parameter_breakdown(model)
    assert sum(parts.values()) == 3_283_456
    assert parts["embedding"] == parts["head"] == 256_000


def test_chapter_block_code_runs_unchanged():
    blk = Block(256, 8, 2, 688)
    cos, sin = rope_cache(16, 32)
    assert blk(torch.randn(2, 16, 256), cos, sin).shape == (2, 16, 256)
    assert isinstance(blk.attn, GQAttention) and blk.attn.kv == 2 and blk.attn.dh == 32


def test_tied_embeddings_share_storage_and_save_vd():
    untied, tied = LlamaStyleLM(V=1000), LlamaStyleLM(V=1000, tie=True)
    assert tied.head.weight.data_ptr() == tied.emb.weight.data_ptr() and tied.tied and not untied.tied
    assert untied.num_parameters() - tied.num_parameters() == 1000 * 256
    assert 151_936 * 1024 == 155_582_464  # the chapter's "about 156M" for Qwen3-0.6B's vocabulary
    gpt2 = GPT2LM(100, d=32, n_layers=1, n_heads=4, max_len=16)
    assert gpt2.head.weight is gpt2.emb.weight


def test_qk_norm_option_and_head_dim():
    m = LlamaStyleLM(V=100, d=64, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=96, qk_norm=False, head_dim=32)
    attn = m.blocks[0].attn
    assert isinstance(attn.q_norm, nn.Identity) and attn.wq.out_features == 128 and attn.wo.in_features == 128
    assert m(torch.randint(0, 100, (1, 5))).shape == (1, 5, 100)


def test_norm_eps_reaches_every_norm():
    m = LlamaStyleLM(V=10, d=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, norm_eps=1e-5)
    eps = {mod.eps for mod in m.modules() if isinstance(mod, RMSNorm)}
    assert eps == {1e-5}


def test_explicit_positions_are_checked():
    model = LlamaStyleLM(V=50, d=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_len=8)
    idx = torch.zeros(1, 3, dtype=torch.long)
    torch.testing.assert_close(model(idx, positions=torch.arange(3)), model(idx))
    # a negative position would silently read the end of the RoPE table
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_len=8\), got min -1, max 1"):
        model(idx, positions=torch.tensor([-1, 0, 1]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, max_len=8\), got min 0, max 8"):
        model(idx, positions=torch.tensor([0, 1, 8]))
    with pytest.raises(TypeError, match="positions must be an int64 or int32 tensor"):
        model(idx, positions=torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"positions must have shape \[T\] or \[B, T\]"):
        model(idx, positions=torch.arange(4))


def test_block_defaults_are_the_chapters():
    """Block(d, n_heads, n_kv_heads, d_ff) is the block with QK-norm and eps 1e-6 (COURSE.md's public names)."""
    torch.manual_seed(0)
    default = Block(32, 4, 2, 48)
    with torch.no_grad():
        for p in default.parameters():  # norm scales away from one, so that QK-norm counts
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    explicit = Block(32, 4, 2, 48, qk_norm=True, norm_eps=1e-6)
    explicit.load_state_dict(default.state_dict())  # strict: the same parts, QK-norm's scales included
    x = torch.randn(2, 5, 32) * 1e-3  # small activations: an epsilon far from 1e-6 would show
    cos, sin = rope_cache(5, 8)
    torch.testing.assert_close(default(x, cos, sin), explicit(x, cos, sin), rtol=0, atol=0)
    assert {m.eps for m in default.modules() if isinstance(m, RMSNorm)} == {1e-6}
    assert isinstance(default.attn.q_norm, RMSNorm) and isinstance(default.attn.k_norm, RMSNorm)


def test_the_default_rope_base_is_10000():
    """The default model's rotation tables are cos/sin(position · 10000^(-2i/d_h)), computed here by hand."""
    model = LlamaStyleLM(V=10, n_layers=1)  # d 256, 8 heads: d_h 32, 1024 positions
    i = torch.arange(16, dtype=torch.float64)
    angles = torch.arange(1024, dtype=torch.float64).unsqueeze(-1) * 10000.0 ** (-2 * i / 32)  # [1024, 16]
    cos, sin = model.rope(torch.arange(1024))
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=2e-4)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=2e-4)


@pytest.mark.parametrize("bad,error,rule", [(0, ValueError, "must be positive, got 0"),
                                            (-8, ValueError, "must be positive, got -8"),
                                            (8.0, TypeError, "must be an int, got float")])
def test_n_heads_is_refused_by_name_before_it_divides_d(bad, error, rule):
    """Not a ZeroDivisionError, nor a message about the rotary 'dim' derived from it."""
    with pytest.raises(error, match=rf"^n_heads {rule}$"):
        LlamaStyleLM(V=10, n_layers=1, n_heads=bad)


def test_mla_of_the_wrong_type_is_refused_naming_what_it_got():
    with pytest.raises(TypeError, match=r"^mla must be an MLAConfig, got dict$"):
        LlamaStyleLM(V=10, n_layers=1, mla=dict(kv_latent_dim=16))


MLA = MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=8, v_head_dim=8)


@pytest.mark.parametrize("mla", [None, MLA], ids=["gqa", "mla"])
def test_dropout_reaches_every_place_it_applies(mla):
    """In each block: the attention weights (GQA's or MLA's) and the two residual branches (one module, used
    twice); in the LM also after the embeddings. dropout=0 leaves no dropout anywhere."""
    assert dropout_rates(Block(32, 4, 2, 48, dropout=0.25, mla=mla)) == [0.25, 0.25]
    lm = dict(V=50, d=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48, max_len=8, mla=mla)
    assert dropout_rates(LlamaStyleLM(**lm, dropout=0.25)) == [0.25] * (1 + 3 + 3)
    assert dropout_rates(LlamaStyleLM(**lm)) == [0.0] * 3
