"""GQAttention (MHA/MQA/GQA) against explicit-mask attention and nn.MultiheadAttention."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modern_block import (
    GQAttention,
    LlamaStyleLM,
    apply_rope,
    rope_cache,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def _reference_gqa(attn: GQAttention, x, cos, sin):
    """Explicit-mask SDPA with the K/V heads repeated per group (the chapter's approach)."""
    B, T, _ = x.shape
    q = attn.wq(x).view(B, T, attn.h, attn.dh).transpose(1, 2)
    k = attn.wk(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
    v = attn.wv(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
    q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = attn.h // attn.kv
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.wo(out.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("n_heads,n_kv,qk_norm,head_dim", [(8, 8, True, None), (8, 2, True, None), (8, 1, False, None),
                                                           (4, 2, True, 16), (6, 3, False, None)])
def test_gqattention_matches_explicit_mask_sdpa(n_heads, n_kv, qk_norm, head_dim):
    torch.manual_seed(0)
    d, T = 48, 9
    attn = GQAttention(d, n_heads, n_kv, qk_norm=qk_norm, head_dim=head_dim)
    if qk_norm:
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 1.5)
            attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, T, d)
    cos, sin = rope_cache(T, attn.dh)
    torch.testing.assert_close(attn(x, cos, sin), _reference_gqa(attn, x, cos, sin), atol=1e-5, rtol=1e-4)


def test_gqa_with_all_kv_heads_equals_mha():
    """n_kv = n_heads is MHA: compare with nn.MultiheadAttention (no RoPE, no QK-norm: cos=1, sin=0)."""
    torch.manual_seed(0)
    d, h, T = 32, 4, 7
    attn = GQAttention(d, h, h, qk_norm=False)
    mha = nn.MultiheadAttention(d, h, bias=False, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attn.wq.weight, attn.wk.weight, attn.wv.weight]))
        mha.out_proj.weight.copy_(attn.wo.weight)
    x = torch.randn(2, T, d)
    cos, sin = torch.ones(T, d // h // 2), torch.zeros(T, d // h // 2)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = masked
    expected, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(attn(x, cos, sin), expected, atol=1e-5, rtol=1e-4)


def test_gqa_groups_kv_heads_not_tiles_them():
    """Query heads 0-3 must read KV head 0 and heads 4-7 KV head 1 (repeat_interleave, not repeat)."""
    torch.manual_seed(0)
    d, T = 32, 5
    attn = GQAttention(d, 8, 2, qk_norm=False)
    x = torch.randn(1, T, d)
    cos, sin = rope_cache(T, 4)
    base = attn(x, cos, sin)
    with torch.no_grad():
        attn.wv.weight[4:8].mul_(3.0)  # change only KV head 1's values
    out = attn(x, cos, sin)
    per_head = (out - base) @ torch.linalg.pinv(attn.wo.weight).T  # back to the concatenated head outputs
    changed = per_head.view(1, T, 8, 4).abs().amax(dim=(0, 1, 3)) > 1e-4
    assert changed.tolist() == [False] * 4 + [True] * 4


def test_attention_is_causal():
    torch.manual_seed(0)
    model = LlamaStyleLM(V=50, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=32)
    idx = torch.randint(0, 50, (1, 12))
    changed = idx.clone()
    changed[0, 8] = (idx[0, 8] + 1) % 50
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-4


def test_per_sequence_rope_tables_match_shared_tables():
    torch.manual_seed(0)
    attn = GQAttention(32, 4, 2)
    x = torch.randn(2, 6, 32)
    cos, sin = rope_cache(20, 8)
    shared = attn(x, cos[3:9], sin[3:9])
    pos = torch.arange(3, 9).expand(2, 6)  # [B, T]
    torch.testing.assert_close(attn(x, cos[pos], sin[pos]), shared)
    pos2 = torch.stack([torch.arange(3, 9), torch.arange(10, 16)])  # different offsets per sequence
    out = attn(x, cos[pos2], sin[pos2])
    torch.testing.assert_close(out[0], shared[0])
    torch.testing.assert_close(out[1], attn(x[1:], cos[10:16], sin[10:16])[0], atol=1e-5, rtol=1e-4)


def test_gqattention_defaults_are_the_chapters_layer():
    """GQAttention(d, h, n_kv) is the chapter's layer: QK-norm on with eps 1e-6 (Qwen3's), no biases, no dropout."""
    torch.manual_seed(0)
    default = GQAttention(32, 4, 2)
    explicit = GQAttention(32, 4, 2, qk_norm=True, norm_eps=1e-6, qkv_bias=False, dropout=0.0)
    explicit.load_state_dict(default.state_dict())  # strict: the same parameters, QK-norm weights included
    x = torch.randn(2, 5, 32)
    cos, sin = rope_cache(5, 8)
    torch.testing.assert_close(default.train()(x, cos, sin), explicit.train()(x, cos, sin))


def test_attention_dropout_acts_in_training_only():
    torch.manual_seed(0)
    attn, plain = GQAttention(32, 4, 2, dropout=0.5), GQAttention(32, 4, 2)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 6, 32)
    cos, sin = rope_cache(6, 8)
    reference = plain.train()(x, cos, sin)  # no dropout: the same output in either mode
    torch.testing.assert_close(attn.eval()(x, cos, sin), reference)
    attn.train()
    first, second = attn(x, cos, sin), attn(x, cos, sin)
    assert (first - reference).abs().max() > 1e-3 and (first - second).abs().max() > 1e-3


SIZES = dict(d=32, n_heads=4, n_kv_heads=2, head_dim=8)


@pytest.mark.parametrize("name", SIZES)
def test_every_size_is_refused_by_its_own_name(name):
    GQAttention(**SIZES)
    with pytest.raises(ValueError, match=rf"^{name} must be positive, got 0$"):
        GQAttention(**{**SIZES, name: 0})


@pytest.mark.parametrize("sizes,head_dim", [(dict(d=36, n_heads=4, n_kv_heads=2), 9),
                                            (dict(d=32, n_heads=4, n_kv_heads=2, head_dim=7), 7)])
def test_an_odd_head_dim_is_refused_with_the_reason(sizes, head_dim):
    with pytest.raises(ValueError, match=rf"^head_dim must be even for RoPE \(dimensions are rotated in pairs\), "
                                         rf"got {head_dim}$"):
        GQAttention(**sizes)
