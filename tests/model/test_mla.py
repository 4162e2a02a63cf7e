"""Multi-head latent attention (absorbed == naive, latent cache, decoupled RoPE) and the KV cache
of every attention: the bytes it holds equal the formulas."""

import pytest
import torch
from decodes import assert_decodes_agree, cached_logits

from modern_block import GPT2LM, KVCache, LlamaStyleLM, generate, kv_cache_bytes_per_token, mla_cache_bytes_per_token
from modern_block.kv_cache import LayerCache
from modern_block.mla import MLAConfig, MLAttention
from modern_block.rope import rope_cache

V = 61
MLA_CONFIGS = {  # with and without the low-rank query; value head dim different from the no-RoPE key dim
    "direct-q": MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=12, v_head_dim=12),
    "q-lora": MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=12, v_head_dim=10, q_lora_rank=24),
    "wide-latent": MLAConfig(kv_latent_dim=40, rope_dim=4, nope_dim=6, v_head_dim=14, q_lora_rank=8),
}


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Unit-scale weights and random norm weights, so that the attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5 if p.dim() == 2
                else 1.0 + 0.5 * torch.randn(p.shape, generator=g))


def mla_model(name: str, n_heads: int = 4, **kw) -> LlamaStyleLM:
    torch.manual_seed(0)
    model = LlamaStyleLM(V, d=32, n_layers=2, n_heads=n_heads, d_ff=48, max_len=40, mla=MLA_CONFIGS[name], **kw)
    randomise(model)
    return model.eval()


def tokens(batch=2, length=14, seed=1):
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the module
@pytest.mark.parametrize("name", list(MLA_CONFIGS))
@torch.no_grad()
def test_absorbed_equals_naive(name):
    model, idx = mla_model(name), tokens()
    naive = model(idx)  # no cache: the naive path by default
    for blk in model.blocks:
        blk.attn.absorb = True
    absorbed = model(idx)
    assert naive.abs().max() > 1.0
    torch.testing.assert_close(absorbed, naive, atol=1e-5, rtol=0)
    # one layer on its own, all positions and heads
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 32)
    cos, sin = rope_cache(9, attn.rope_dim)
    q_nope, q_rope = attn.queries(x, cos, sin)
    latent, k_rope = attn.latents(x, cos, sin)
    torch.testing.assert_close(attn.attend_absorbed(q_nope, q_rope, latent, k_rope),
                               attn.attend_naive(q_nope, q_rope, latent, k_rope), atol=1e-5, rtol=0)


@torch.no_grad()
def test_absorption_is_the_associativity_of_the_key_up_projection():
    """q_nope,m · (W_UK,m c) = (W_UK,mᵀ q_nope,m) · c for every head m: the identity absorption uses."""
    attn = mla_model("q-lora").blocks[0].attn
    q_nope = torch.randn(attn.h, attn.d_nope)  # one query per head
    c = torch.randn(5, attn.d_c)  # five cached latents
    w_uk = attn.w_uk.weight.view(attn.h, attn.d_nope, attn.d_c)
    k_nope = torch.einsum("hnc,sc->hsn", w_uk, c)  # [h, 5, d_nope]: the keys naive attention builds
    scores_naive = torch.einsum("hn,hsn->hs", q_nope, k_nope)
    scores_absorbed = torch.einsum("hc,sc->hs", torch.einsum("hn,hnc->hc", q_nope, w_uk), c)
    torch.testing.assert_close(scores_absorbed, scores_naive, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(MLA_CONFIGS))
@torch.no_grad()
def test_cached_decoding_equals_recomputation(name):
    model, idx = mla_model(name), tokens(length=12)
    full = model(idx)
    cache = KVCache(len(model.blocks), 12)
    pieces = [model(idx[:, :5], cache), model(idx[:, 5:6], cache), model(idx[:, 6:7], cache), model(idx[:, 7:], cache)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 12
    prompt = idx[:, :4]
    assert_decodes_agree(model, lambda s: cached_logits(model, s, 4), generate(model, prompt, 10, use_cache=False),
                         generate(model, prompt, 10, use_cache=True), 4, 1e-5, f"{name}: cached against recomputed")


@torch.no_grad()
def test_decoding_uses_the_absorbed_path_over_cached_latents():
    model, idx = mla_model("q-lora"), tokens(length=6)

    def refuse(*args, **kwargs):
        raise AssertionError("the naive path ran during cached decoding")

    for blk in model.blocks:
        blk.attn.attend_naive = refuse  # instance attribute: shadows the method
    generate(model, idx, 5, use_cache=True)
    with pytest.raises(AssertionError, match="naive path"):
        model(idx)  # without a cache the default is the naive path (as in training)


@torch.no_grad()
def test_cache_holds_only_the_latent_and_the_rope_key():
    model = mla_model("q-lora")
    cache = KVCache(len(model.blocks), 20)
    model(tokens(batch=3, length=4), cache)
    for layer in cache.layers:  # latent [B, capacity, d_c] and k_R [B, capacity, d_R], nothing per head
        assert [tuple(b.shape) for b in layer.buffers] == [(3, 20, 16), (3, 20, 8)]


@torch.no_grad()
def test_decoupled_rope_keeps_scores_relative():
    """Only relative positions matter: shifting every position changes nothing, stretching does."""
    model, idx = mla_model("direct-q"), tokens(length=7)
    default = model(idx)
    per_sequence = torch.arange(7).expand(2, 7)  # [B, T] tables
    torch.testing.assert_close(model(idx, positions=per_sequence), default, atol=1e-6, rtol=0)
    torch.testing.assert_close(model(idx, positions=torch.arange(20, 27)), default, atol=1e-4, rtol=0)
    assert (model(idx, positions=2 * torch.arange(7)) - default).abs().max() > 1e-2


def test_gradients_reach_every_parameter():
    model = mla_model("q-lora").train()
    idx = tokens(length=8)
    torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


def test_parameter_count_follows_the_shapes():
    d, h, c = 32, 4, MLA_CONFIGS["q-lora"]
    attn = c.build(d, h)
    q = d * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * h * (c.nope_dim + c.rope_dim)
    kv = d * c.kv_latent_dim + c.kv_latent_dim + d * c.rope_dim + c.kv_latent_dim * h * (c.nope_dim + c.v_head_dim)
    assert sum(p.numel() for p in attn.parameters()) == q + kv + h * c.v_head_dim * d
    assert attn.scale == pytest.approx((c.nope_dim + c.rope_dim) ** -0.5)


@pytest.mark.parametrize("kwargs, name", [
    (dict(rope_dim=7), "rope_dim"),
    (dict(rope_dim=0), "rope_dim"),
    (dict(kv_latent_dim=0), "kv_latent_dim"),
    (dict(nope_dim=-1), "nope_dim"),
    (dict(v_head_dim=0), "v_head_dim"),
    (dict(q_lora_rank=0), "q_lora_rank"),
    (dict(n_heads=0), "n_heads"),
    (dict(dropout=1.0), "dropout"),
])
def test_bad_dimensions_are_refused_naming_the_argument(kwargs, name):
    args = dict(d=32, n_heads=4, kv_latent_dim=16, rope_dim=8, nope_dim=12, v_head_dim=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        MLAttention(args.pop("d"), args.pop("n_heads"), args.pop("kv_latent_dim"), **args)


def test_llama_style_lm_with_mla_rejects_conflicting_options():
    with pytest.raises(TypeError, match="MLAConfig"):
        LlamaStyleLM(V, d=32, n_heads=4, mla={"kv_latent_dim": 16})


# ---------------------------------------------------------------- the KV cache of every attention
CACHED_MODELS = {  # name: (model factory, bytes per token in fp32 from the formula)
    "mha": (lambda: LlamaStyleLM(V, d=32, n_layers=3, n_heads=4, n_kv_heads=4, d_ff=48, max_len=40),
            kv_cache_bytes_per_token(3, 4, 8, bytes_per_elem=4)),
    "gqa": (lambda: LlamaStyleLM(V, d=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48, max_len=40),
            kv_cache_bytes_per_token(3, 2, 8, bytes_per_elem=4)),
    "mqa-head_dim12": (lambda: LlamaStyleLM(V, d=32, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=48, max_len=40,
                                            head_dim=12), kv_cache_bytes_per_token(3, 1, 12, bytes_per_elem=4)),
    "gpt2": (lambda: GPT2LM(V, d=36, n_layers=2, n_heads=3, max_len=40),
             kv_cache_bytes_per_token(2, 3, 12, bytes_per_elem=4)),
    "mla": (lambda: LlamaStyleLM(V, d=32, n_layers=3, n_heads=4, d_ff=48, max_len=40, mla=MLA_CONFIGS["q-lora"]),
            mla_cache_bytes_per_token(3, 16, 8, bytes_per_elem=4)),
}


@pytest.mark.parametrize("name", list(CACHED_MODELS))
@torch.no_grad()
def test_cache_bytes_after_n_tokens_equal_the_formula(name):
    make, per_token = CACHED_MODELS[name]
    model, B, n = make().eval(), 2, 11
    idx = tokens(batch=B, length=n)
    cache = KVCache(len(model.blocks), n)  # room for exactly the n tokens decoded
    model(idx[:, :6], cache)  # prefill, then one token at a time
    for t in range(6, n):
        model(idx[:, t:t + 1], cache)
    assert cache.length == n
    assert cache.nbytes() == per_token * n * B
    assert all(b.dtype == torch.float32 for layer in cache.layers for b in layer.buffers)


def test_mla_cache_is_smaller_than_the_mha_cache_it_replaces():
    """Same heads and head sizes: MHA caches 2·h·d_h numbers per token and layer, MLA d_c + d_R."""
    c = MLA_CONFIGS["q-lora"]
    heads = 4
    mha = kv_cache_bytes_per_token(1, heads, c.nope_dim + c.rope_dim, 4) // 2 + \
        kv_cache_bytes_per_token(1, heads, c.v_head_dim, 4) // 2  # keys of d_nope + d_R, values of d_v
    attn, cache = c.build(32, heads), LayerCache(1)
    cos, sin = rope_cache(1, c.rope_dim)
    attn(torch.randn(1, 1, 32), cos, sin, cache)
    mla_cache = cache
    assert mla_cache.nbytes() == mla_cache_bytes_per_token(1, c.kv_latent_dim, c.rope_dim, 4)
    assert mla_cache.nbytes() < mha / 4  # 96 vs 480 bytes here


@pytest.mark.parametrize("absorb", [False, True])
def test_attention_dropout_acts_in_training_only_on_both_paths(absorb):
    """Dropout on the attention weights: two training calls differ, an eval call is the dropout-free output."""
    torch.manual_seed(0)
    attn = MLAttention(32, 4, 16, rope_dim=8, nope_dim=8, v_head_dim=8, dropout=0.5)
    attn.absorb = absorb
    plain = MLAttention(32, 4, 16, rope_dim=8, nope_dim=8, v_head_dim=8)
    plain.load_state_dict(attn.state_dict())
    plain.absorb = absorb
    x = torch.randn(2, 6, 32)
    cos, sin = rope_cache(6, 8)
    with torch.no_grad():
        first, second = attn.train()(x, cos, sin), attn(x, cos, sin)
        assert not torch.allclose(first, second)
        torch.testing.assert_close(attn.eval()(x, cos, sin), plain.eval()(x, cos, sin))


def test_the_defaults_are_deepseek_v3s_and_every_size_is_checked():
    attn = MLAttention(64, 2, 32)
    assert (attn.rope_dim, attn.d_nope, attn.d_v, attn.q_lora_rank, attn.dropout) == (64, 128, 128, None, 0.0)
    assert attn.kv_norm.eps == 1e-6
    with pytest.raises(ValueError, match="^d must be positive"):
        MLAttention(0, 2, 32)
    assert MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=8, v_head_dim=8).build(32, 4, dropout=0.25).dropout == 0.25


def test_an_odd_rope_dim_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^rope_dim must be even for RoPE \(dimensions are rotated in pairs\), "
                                         r"got 7$"):
        MLAttention(32, 4, 16, rope_dim=7)


@torch.no_grad()
def test_norm_eps_is_the_epsilon_of_both_latent_norms():
    """The query latent c_Q and the KV latent c are RMS-normalised with norm_eps (unit norm weights at init)."""
    torch.manual_seed(0)
    attn = MLAttention(32, 4, 16, rope_dim=8, nope_dim=8, v_head_dim=8, q_lora_rank=12, norm_eps=0.5)
    x = torch.randn(2, 5, 32)
    cos, sin = rope_cache(5, 8)

    def rms_norm(z):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 0.5)

    q = attn.wq_up(rms_norm(attn.wq_down(x))).view(2, 5, 4, 16).transpose(1, 2)  # [B, h, T, d_nope + d_R]
    q_nope, _ = attn.queries(x, cos, sin)
    torch.testing.assert_close(q_nope, q[..., :8])
    latent, _ = attn.latents(x, cos, sin)
    torch.testing.assert_close(latent, rms_norm(attn.w_dkv(x)))


@pytest.mark.parametrize("absorb", [False, True])
@torch.no_grad()
def test_absorb_forces_one_path_with_or_without_a_cache(absorb):
    model, idx = mla_model("q-lora"), tokens(length=6)
    other = mla_model("q-lora")
    for blk in other.blocks:
        blk.attn.absorb = not absorb
    want_logits, want_tokens = other(idx), generate(other, idx, 3, use_cache=True)

    def refuse(*args, **kwargs):
        raise AssertionError("the other path ran")

    for blk in model.blocks:
        blk.attn.absorb = absorb
        setattr(blk.attn, "attend_naive" if absorb else "attend_absorbed", refuse)  # shadows the method
    torch.testing.assert_close(model(idx), want_logits, rtol=1e-4, atol=1e-5)  # no cache: the same logits
    # cached: the same tokens, by the margin rule (the two paths multiply in another order)
    assert_decodes_agree(other, lambda s: cached_logits(model, s, 6), want_tokens, generate(model, idx, 3), 6, 1e-4,
                         f"the {'absorbed' if absorb else 'naive'} path alone against the other")
