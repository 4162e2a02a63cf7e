"""The fast layer (modern_block/fast.py): fused weights, static cache and compiled step give the plain
model's logits and tokens, and Hugging Face's tokens; what it does not support is refused.

Most tests run the fast model uncompiled (fused projections and the static cache, in eager mode): cheap.
``torch.compile`` runs in two tests only (a Llama and a Qwen3 configuration; tens of seconds each on a
busy 2-core machine), marked slow; CI runs them.
"""

import pytest
import torch

from modern_block import GPT2LM, KVCache, LlamaStyleLM, generate
from modern_block.fast import decoding as fast
from modern_block.mla import MLAConfig

V = 97
CONFIGS = {  # the shapes fast.prepare must handle: GQA/MQA/MHA, QK-norm or not, tied or not, head_dim != d/h
    "gqa-qknorm": dict(n_heads=4, n_kv_heads=2),
    "mqa-tied-llama": dict(n_heads=4, n_kv_heads=1, tie=True, qk_norm=False),
    "mha-llama": dict(n_heads=4, n_kv_heads=4, qk_norm=False),
    "qwen3-head_dim12-tied": dict(n_heads=4, n_kv_heads=2, head_dim=12, tie=True, rope_base=1e6),
    "qwen2-qkv_bias-yarn": dict(n_heads=4, n_kv_heads=2, qk_norm=False, qkv_bias=True,
                                rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                              "original_max_position_embeddings": 32}),
}


def model_for(name: str, seed: int = 0) -> LlamaStyleLM:
    """A tiny model whose weights and norm scales are random at unit scale, so logits are far apart
    and a wrong fusion or a wrong cache slot shows."""
    torch.manual_seed(seed)
    model = LlamaStyleLM(V, d=32, n_layers=2, d_ff=40, max_len=64, **CONFIGS[name]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() == 2 else 1 + 0.3 * torch.randn_like(p))
    return model


def prompts(batch: int = 2, length: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_fused_weights_are_the_stacked_originals_and_the_model_is_untouched():
    model = model_for("qwen3-head_dim12-tied")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fm = fast.prepare(model, compile=False)
    for blk, fblk in zip(model.blocks, fm.blocks, strict=True):
        a, f = blk.attn, fblk.attn
        assert isinstance(f.wqkv, torch.nn.Linear) and isinstance(fblk.ffn.w_gate_up, torch.nn.Linear)
        assert torch.equal(f.wqkv.weight, torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]))
        assert torch.equal(fblk.ffn.w_gate_up.weight, torch.cat([blk.ffn.w_gate.weight, blk.ffn.w_up.weight]))
        assert f.wqkv.weight.data_ptr() != a.wq.weight.data_ptr()  # a copy: the plain model keeps its own
    assert fm.tied and fm.head.weight is fm.emb.weight
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not fast.prepare(model_for("gqa-qknorm"), compile=False).tied


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_the_plain_model(name):
    """A whole sequence at once (prefill), then single tokens against the static cache."""
    model = model_for(name)
    fm = fast.prepare(model, compile=False)
    idx = prompts(length=12)
    fm.setup_cache(batch=2, capacity=16)
    with torch.inference_mode():
        ref = model(idx)  # [2, 12, V]
        torch.testing.assert_close(fm(idx[:, :8], torch.arange(8)), ref[:, :8], atol=1e-5, rtol=0)
        for t in range(8, 12):
            torch.testing.assert_close(fm.step(idx[:, t:t + 1], torch.tensor([t])), ref[:, t], atol=1e-5, rtol=0)
        cache = KVCache(len(model.blocks), 16)  # and the plain model's own cache agrees
        model(idx[:, :8], cache)
        torch.testing.assert_close(model(idx[:, 8:9], cache)[:, -1], ref[:, 8], atol=1e-5, rtol=0)
    assert ref.std() > 0.5  # logits of unit scale: the tolerance is a real test


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_tokens_as_the_plain_model_greedy_and_sampled(name):
    model = model_for(name)
    fm = fast.prepare(model, compile=False)
    idx = prompts()
    assert torch.equal(fast.generate(fm, idx, 20), generate(model, idx, 20))
    sampled = [f(m, idx, 20, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(3))
               for f, m in ((fast.generate, fm), (generate, model))]
    assert torch.equal(*sampled)
    assert torch.equal(fast.generate(fm, idx[:1], 1), generate(model, idx[:1], 1))  # one token: no step at all


def test_the_static_cache_is_allocated_once_per_shape():
    model = model_for("gqa-qknorm")
    fm = fast.prepare(model, compile=False)
    idx = prompts()
    fast.generate(fm, idx, 10)
    k = fm.blocks[0].attn.k_cache
    assert list(k.shape) == [2, 2, 64, 8] and fm.capacity == 64  # 5 + 10 - 1 rounded up to 64, max_len 64
    fast.generate(fm, prompts(seed=2), 20)  # same batch, same capacity: the same buffers, overwritten
    assert fm.blocks[0].attn.k_cache is k
    out = fast.generate(fm, idx[:1], 10)  # another batch size: new buffers, same tokens as before
    assert fm.blocks[0].attn.k_cache.shape[0] == 1 and torch.equal(out, generate(model, idx[:1], 10))


def test_bad_input_is_refused_clearly():
    with pytest.raises(TypeError, match="LlamaStyleLM"):
        fast.prepare(GPT2LM(V, d=32, n_layers=1, n_heads=4))
    mla = LlamaStyleLM(V, d=32, n_layers=1, n_heads=4, d_ff=40,
                       mla=MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=8, v_head_dim=8))
    with pytest.raises(ValueError, match="MLA"):
        fast.prepare(mla)
    dynamic = LlamaStyleLM(V, d=32, n_layers=1, n_heads=4, d_ff=40, max_len=64,
                           rope_scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="dynamic NTK"):
        fast.prepare(dynamic)
    model = model_for("gqa-qknorm")
    fm = fast.prepare(model, compile=False)
    with pytest.raises(TypeError, match="fast.prepare"):
        fast.generate(model, prompts(), 4)  # the plain model: use modern_block.generate
    with pytest.raises(ValueError, match="max_len"):
        fast.generate(fm, prompts(length=60), 10)
    with pytest.raises(ValueError, match="max_new_tokens"):
        fast.generate(fm, prompts(), 0)
    with pytest.raises(ValueError, match=r"\[0, V=97\)"):
        fast.generate(fm, torch.tensor([[3, 97]]), 4)
    with pytest.raises(TypeError, match="int64"):
        fast.generate(fm, prompts().float(), 4)
    with pytest.raises(ValueError, match="temperature"):
        fast.generate(fm, prompts(), 4, temperature=-1.0)
    with pytest.raises(ValueError, match="capacity"):
        fm.setup_cache(1, 65)


# ---------------------------------------------------------------- compiled, against Hugging Face
@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-gqa-tied"])
def test_compiled_decoding_gives_the_plain_models_and_hugging_faces_tokens(case):
    from test_hf import hf_model  # tiny random Llama / Qwen3 (head_dim 12 != d/h, tied) at unit scale

    from modern_block.interop.hf import from_hf

    hf = hf_model(case, num_hidden_layers=1)  # one layer: half the kernels to compile (the eager tests run two)
    model = from_hf(hf)
    fm = fast.prepare(model)
    assert fm.compiled
    idx, new = prompts(length=5), 12
    ours = fast.generate(fm, idx, new)
    with torch.inference_mode():
        theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)
        ref = model(ours[:, :-1])[:, 4:]  # the plain model's logits at every decoded position
        fm.setup_cache(2, fm.capacity)
        fm(ours[:, :5], torch.arange(5))
        steps = torch.stack([fm.step(ours[:, t:t + 1], torch.tensor([t])) for t in range(5, 5 + new - 1)], 1)
    assert torch.equal(ours, generate(model, idx, new))
    assert torch.equal(ours, theirs)
    torch.testing.assert_close(steps, ref[:, 1:], atol=1e-4, rtol=0)  # compiled step logits = plain logits


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2-tied", "llama-yarn", "smollm2", "mistral", "qwen2",
                                  "qwen2.5-tied-yarn", "qwen3-llama3"])
def test_fast_logits_equal_hugging_face_for_each_family(name):
    """Every Hugging Face family the course loads into LlamaStyleLM (dynamic NTK aside, refused above):
    the fast layer's logits over a whole sequence, then one token at a time, equal Hugging Face's."""
    from test_hf_families import ATOL, hf_family, hf_logits, long_tokens

    from modern_block.interop.hf import from_hf

    hf = hf_family(name)
    fm = fast.prepare(from_hf(hf), compile=False)
    idx = long_tokens()  # [2, 40]: past the scaled models' original context
    ref = hf_logits(hf, idx)
    fm.setup_cache(batch=2, capacity=idx.shape[1])
    with torch.no_grad():
        prefill = fm(idx[:, :30], torch.arange(30))  # [2, 30, V]
        steps = torch.stack([fm.step(idx[:, t:t + 1], torch.tensor([t])) for t in range(30, idx.shape[1])], 1)
    assert (torch.cat([prefill, steps], 1) - ref).abs().max().item() <= ATOL
