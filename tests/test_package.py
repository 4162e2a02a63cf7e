"""The core components against PyTorch's built-ins and the chapter's own figures."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import modern_block as mb
from modern_block import (
    GPT2LM,
    PRESETS,
    Block,
    GQAttention,
    LlamaStyleLM,
    RMSNorm,
    SwiGLU,
    apply_rope,
    apply_rope_interleaved,
    cache_size,
    generate,
    kv_cache_bytes_per_token,
    mla_cache_bytes_per_token,
    permute_qk_weight,
    rope_cache,
    swiglu_hidden_dim,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


# ---------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("shape", [(3, 7, 64), (5, 1), (2, 4, 8, 32)])
def test_rmsnorm_matches_torch(shape):
    torch.manual_seed(0)
    d = shape[-1]
    ours, ref = RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(d))
        ref.weight.copy_(ours.weight)
    x = torch.randn(shape) * 3
    torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=1e-5)


def test_rmsnorm_computes_in_fp32_and_returns_input_dtype():
    torch.manual_seed(0)
    x = torch.randn(4, 256) * 300  # squares reach ~1e5-1e6: past fp16's max of 65,504
    norm = RMSNorm(256)
    out = norm(x.half())
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), norm(x), atol=2e-3, rtol=2e-3)
    # the same formula evaluated in fp16 overflows: this is what the upcast prevents
    xh = x.half()
    naive = xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert not torch.isfinite(xh.pow(2)).all() and (naive == 0).any()
    assert norm(x.bfloat16()).dtype == torch.bfloat16


# ---------------------------------------------------------------- feed-forward
def test_swiglu_is_silu_gate_times_up_then_down():
    torch.manual_seed(0)
    ffn = SwiGLU(32, 80)
    x = torch.randn(2, 5, 32)
    expected = (F.silu(x @ ffn.w_gate.weight.T) * (x @ ffn.w_up.weight.T)) @ ffn.w_down.weight.T
    torch.testing.assert_close(ffn(x), expected)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 32 * 80


def test_gelu_mlp_uses_tanh_gelu_and_4d():
    torch.manual_seed(0)
    mlp = mb.GeluMLP(16)
    assert mlp.fc.out_features == 64 and mlp.fc.bias is not None
    x = torch.randn(3, 16)
    h = x @ mlp.fc.weight.T + mlp.fc.bias
    gelu_tanh = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(mlp(x), gelu_tanh @ mlp.proj.weight.T + mlp.proj.bias)


def test_swiglu_sizing_figures():
    assert 8 / 3 * 4096 == pytest.approx(10922.67, abs=0.01)
    assert swiglu_hidden_dim(4096) == 11008 == 43 * 256
    assert swiglu_hidden_dim(5120) == 13824 == 54 * 256
    assert swiglu_hidden_dim(4096, multiple_of=1024, ffn_dim_multiplier=1.3) == 14336 == 3.5 * 4096
    assert swiglu_hidden_dim(256, multiple_of=16) == 688  # the chapter's d_ff
    d = 4096
    gelu, swiglu = 8 * d * d, 3 * d * 11008
    assert round(gelu / 1e6, 1) == 134.2 and round(swiglu / 1e6, 1) == 135.3
    assert abs(swiglu / gelu - 1) < 0.01
    assert 3 * d * (4 * d) / gelu == 1.5  # copying d_ff = 4d into SwiGLU: +50%


# ---------------------------------------------------------------- RoPE
def _score(q, k, cos, sin, m, n):
    qm = apply_rope(q, cos[m:m + 1], sin[m:m + 1])
    kn = apply_rope(k, cos[n:n + 1], sin[n:n + 1])
    return (qm * kn).sum().item()


def test_rope_chapter_relative_position_check():
    torch.manual_seed(0)
    dh = 8
    cos, sin = rope_cache(64, dh)
    q, k = torch.randn(1, 1, 1, dh), torch.randn(1, 1, 1, dh)
    assert cos.shape == sin.shape == (64, dh // 2)
    assert _score(q, k, cos, sin, 5, 2) == pytest.approx(_score(q, k, cos, sin, 40, 37), abs=1e-5)
    assert _score(q, k, cos, sin, 10, 10) == pytest.approx(_score(q, k, cos, sin, 0, 0), abs=1e-5)
    assert _score(q, k, cos, sin, 5, 2) != pytest.approx(_score(q, k, cos, sin, 5, 3), abs=1e-3)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500),
       half_dh=st.integers(1, 32), base=st.sampled_from([100.0, 10000.0, 500000.0, 1e6]), seed=st.integers(0, 99))
def test_rope_score_depends_only_on_offset(m, n, shift, half_dh, base, seed):
    dh = 2 * half_dh
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, dh, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, dh, generator=g,
                                                                                     dtype=torch.float64)
    cos, sin = (t.double() for t in rope_cache(1001, dh, base))
    a, b = _score(q, k, cos, sin, m, n), _score(q, k, cos, sin, m + shift, n + shift)
    # fp32 angles: the rounding of m·θ grows with the position, so allow ~1e-4 relative
    assert a == pytest.approx(b, abs=1e-4 * (1 + abs(a)) * dh)


@settings(max_examples=30, deadline=None)
@given(pos=st.integers(0, 4000), half_dh=st.integers(1, 64), base=st.sampled_from([10000.0, 500000.0, 1e6]))
def test_rope_preserves_norm(pos, half_dh, base):
    dh = 2 * half_dh
    x = torch.randn(2, 3, 1, dh)
    cos, sin = rope_cache(pos + 1, dh, base)
    for rope in (apply_rope, apply_rope_interleaved):
        y = rope(x, cos[pos:pos + 1], sin[pos:pos + 1])
        torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_rope_position_zero_is_identity_and_layouts_differ():
    x = torch.randn(1, 2, 3, 16)
    cos, sin = rope_cache(3, 16)
    torch.testing.assert_close(apply_rope(x, cos[:1], sin[:1]), x)
    assert not torch.allclose(apply_rope(x, cos, sin), apply_rope_interleaved(x, cos, sin), atol=1e-3)


def test_interleaved_and_half_split_scores_match_after_permuting_weights():
    torch.manual_seed(0)
    d, h, dh, T = 32, 4, 8, 10
    wq, wk = torch.randn(h * dh, d), torch.randn(h * dh, d)
    x = torch.randn(1, T, d)
    cos, sin = rope_cache(T, dh)

    def scores(wq, wk, rope):
        q = (x @ wq.T).view(1, T, h, dh).transpose(1, 2)
        k = (x @ wk.T).view(1, T, h, dh).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        return q @ k.transpose(-1, -2)  # [1, h, T, T]

    inter = scores(wq, wk, apply_rope_interleaved)  # weights "trained" for the interleaved layout
    half = scores(permute_qk_weight(wq, h), permute_qk_weight(wk, h), apply_rope)
    torch.testing.assert_close(half, inter, atol=1e-4, rtol=1e-5)
    mixed = scores(wq, wk, apply_rope)  # the pitfall: unpermuted weights in the other layout
    assert (mixed - inter).abs().max() > 1.0
    back = permute_qk_weight(permute_qk_weight(wq, h), h, to="interleaved")
    torch.testing.assert_close(back, wq)


# ---------------------------------------------------------------- attention
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


def test_gpt2_attention_matches_nn_multiheadattention():
    torch.manual_seed(0)
    d, h, T = 48, 6, 8
    attn = mb.CausalSelfAttention(d, h)
    with torch.no_grad():
        attn.qkv.bias.normal_()
        attn.proj.bias.normal_()
    mha = nn.MultiheadAttention(d, h, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.proj.weight)
        mha.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(3, T, d)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    expected, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- models
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
    assert gpt2.head.weight is gpt2.wte.weight


def test_gpt2_parameter_count_by_hand():
    V, d, L, T = 100, 32, 2, 16
    model = GPT2LM(V, d=d, n_layers=L, n_heads=4, max_len=T)
    per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert model.num_parameters() == V * d + T * d + L * per_block + 2 * d


def test_qk_norm_option_and_head_dim():
    m = LlamaStyleLM(V=100, d=64, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=96, qk_norm=False, head_dim=32)
    attn = m.blocks[0].attn
    assert isinstance(attn.q_norm, nn.Identity) and attn.wq.out_features == 128 and attn.wo.in_features == 128
    assert m(torch.randint(0, 100, (1, 5))).shape == (1, 5, 100)


def test_norm_eps_reaches_every_norm():
    m = LlamaStyleLM(V=10, d=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, norm_eps=1e-5)
    eps = {mod.eps for mod in m.modules() if isinstance(mod, RMSNorm)}
    assert eps == {1e-5}


# ---------------------------------------------------------------- KV cache and generation
def _tiny_models():
    torch.manual_seed(0)
    return [LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64),
            LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=64, max_len=64, tie=True,
                         qk_norm=False),
            GPT2LM(64, d=32, n_layers=2, n_heads=4, max_len=64)]


@settings(max_examples=12, deadline=None)
@given(prompt_len=st.integers(1, 12), new=st.integers(1, 20), batch=st.integers(1, 3), seed=st.integers(0, 1000))
def test_cached_decoding_equals_recomputation(prompt_len, new, batch, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 64, (batch, prompt_len), generator=g)
    for model in _tiny_models():
        with_cache = generate(model, idx, new, use_cache=True)
        without = generate(model, idx, new, use_cache=False)
        assert with_cache.shape == (batch, prompt_len + new)
        assert torch.equal(with_cache, without)
        assert torch.equal(with_cache[:, :prompt_len], idx)


def test_sampling_is_seeded_and_cache_independent():
    model = _tiny_models()[0]
    idx = torch.zeros(2, 3, dtype=torch.long)
    runs = [generate(model, idx, 15, use_cache=c, temperature=0.8, top_k=10,
                     generator=torch.Generator().manual_seed(7)) for c in (True, False, True)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    other = generate(model, idx, 15, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(runs[0], other)


def test_top_k_one_is_greedy():
    model = _tiny_models()[2]
    idx = torch.randint(0, 64, (2, 4))
    assert torch.equal(generate(model, idx, 10, temperature=1.5, top_k=1), generate(model, idx, 10))


@pytest.mark.parametrize("which", [0, 2])
def test_chunked_prefill_with_cache_equals_full_forward(which):
    model = _tiny_models()[which].eval()
    idx = torch.randint(0, 64, (2, 20))
    full = model(idx)
    cache = model.new_cache(2, 20)
    parts = [model(idx[:, a:b], cache) for a, b in [(0, 7), (7, 8), (8, 15), (15, 20)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == 20


def test_cache_bytes_equal_formula():
    for model, n_kv, dh in [(LlamaStyleLM(V=64, d=64, n_layers=3, n_heads=8, n_kv_heads=2, d_ff=64), 2, 8),
                            (GPT2LM(64, d=48, n_layers=2, n_heads=6), 6, 8)]:
        n, B = 37, 3
        cache = model.new_cache(B, n)
        model(torch.randint(0, 64, (B, n)), cache)
        assert cache.length == n
        L = len(model.blocks)
        assert cache.nbytes() == kv_cache_bytes_per_token(L, n_kv, dh, bytes_per_elem=4) * n * B
        assert model.new_cache(1, n, dtype=torch.bfloat16).nbytes() == kv_cache_bytes_per_token(L, n_kv, dh) * n


def test_cache_overflow_and_batch_mismatch_are_clear_errors():
    model = _tiny_models()[0]
    cache = model.new_cache(1, 4)
    model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        model(torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="batch size"):
        model(torch.zeros(2, 1, dtype=torch.long), model.new_cache(1, 4))


# ---------------------------------------------------------------- cache-size figures
def test_llama3_70b_cache_table():
    per_token = {n_kv: kv_cache_bytes_per_token(80, n_kv, 128, 2) for n_kv in (64, 8, 1)}
    assert per_token == {64: 2_621_440, 8: 327_680, 1: 40_960}
    assert per_token[64] == 2.5 * MiB and per_token[8] == 320 * KiB and per_token[1] == 40 * KiB
    assert [per_token[n] * 131_072 / GiB for n in (64, 8, 1)] == [320, 40, 5]
    assert cache_size("Llama 3 70B", 131_072) == 40 * GiB


def test_small_gqa_example_and_ratio():
    per_token = kv_cache_bytes_per_token(32, 8, 128, 2)
    assert per_token == 131_072 == 128 * KiB
    assert per_token * 32_768 == 4 * GiB
    assert kv_cache_bytes_per_token(32, 32, 128) / per_token == 32 / 8 == 4  # h / n_kv, not 8x


def test_deepseek_v3_mla_cache():
    mla = mla_cache_bytes_per_token(61, 512, 64, 2)
    assert mla == 70_272 == PRESETS["DeepSeek-V3"].bytes_per_token()
    assert round(mla * 131_072 / GiB, 1) == 8.6
    mha = 128 * (192 + 128) * 61 * 2
    assert round(mha / MiB, 2) == 4.77 and round(mha / mla) == 71


def test_presets_and_sliding_windows():
    assert cache_size("Llama 3 8B", 1000, batch=2, dtype="fp32") == 2 * 1000 * kv_cache_bytes_per_token(32, 8, 128, 4)
    oss = PRESETS["gpt-oss-120b"]
    per_layer = 2 * 8 * 64 * 2
    assert cache_size(oss, 131_072) == per_layer * (18 * 131_072 + 18 * 128)
    assert cache_size(oss, 100) == oss.bytes_per_token() * 100  # below the window every layer holds everything
    with pytest.raises(ValueError, match="preset must be one of"):
        cache_size("GPT-5", 10)
    with pytest.raises(ValueError, match="dtype must be one of"):
        cache_size("Llama 3 8B", 10, dtype="int3")


# ---------------------------------------------------------------- bad input
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
    (lambda: RMSNorm(8, eps=0.0), "eps must be positive"),
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
        with pytest.raises(ValueError, match=r"shape \[batch, seq_len\]"):
            m(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 6)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 2, temperature=-1.0)


def test_rope_table_mismatch_is_a_clear_error():
    x = torch.randn(1, 2, 4, 8)
    cos, sin = rope_cache(4, 6)
    with pytest.raises(ValueError, match="head_dim/2 = 4"):
        apply_rope(x, cos, sin)
