"""The fast layer (modern_block/fast/decoding.py): ``prepare`` and ``generate`` give the plain model's logits and
tokens, and Hugging Face's, for every model built on the decoder skeleton; each step can be switched on alone.
The fused modules are tested in test_fused.py, the static cache in test_static_cache.py.

Most tests run the fast model uncompiled (fused projections and the static cache, in eager mode): cheap.
``torch.compile`` runs in the tests marked slow (tens of seconds each on a busy 2-core machine); CI runs them.
"""

import pytest
import torch
import torch.nn as nn
from decodes import assert_decodes_agree, cached_logits

from modern_block import GPT2LM, KVCache, LlamaStyleLM, MLAConfig, generate
from modern_block.fast import decoding as fast
from modern_block.fast.fused import FusedGQAttention, FusedSwiGLU
from modern_block.training.ladder import ModelShape, ladder_model

V = 97
MLA = MLAConfig(kv_latent_dim=16, rope_dim=8, nope_dim=8, v_head_dim=8, q_lora_rank=12)
LLAMA = dict(d=32, n_layers=2, d_ff=40, max_len=64)
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
CONFIGS = {  # every kind of model fast.prepare takes: GQA/MQA/MHA, QK-norm or not, tied or not, head_dim != d/h,
    # q/k/v biases, static and dynamic RoPE scaling, MLA, GPT-2, a ladder model with learned positions and GQA
    "gqa-qknorm": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=2),
    "mqa-tied-llama": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=1, tie=True, qk_norm=False),
    "mha-llama": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=4, qk_norm=False),
    "qwen3-head_dim12-tied": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=2, head_dim=12, tie=True,
                                                  rope_base=1e6),
    "qwen2-qkv_bias-yarn": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=2, qk_norm=False, qkv_bias=True,
                                                rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                              "original_max_position_embeddings": 32}),
    "dynamic-ntk": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, n_kv_heads=2, rope_scaling=DYNAMIC),
    "mla": lambda: LlamaStyleLM(V, **LLAMA, n_heads=4, mla=MLA),
    "gpt2": lambda: GPT2LM(V, d=32, n_layers=2, n_heads=4, max_len=64),
    "ladder-no_rope": lambda: ladder_model("no_rope", ModelShape(32, 2, 4, 2, 64), V),
}


@pytest.fixture
def fresh_compiler():
    """torch.compile's caches emptied before and after a test that compiles: every FastLM compiles the same step
    function, and torch refuses a function recompiled more than 8 times in one process (its recompile limit).
    Only the compiling tests (marked slow) use it: the eager ones compile nothing and need no reset."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def model_for(name: str, seed: int = 0) -> nn.Module:
    """A tiny model whose weights and norm scales are random at unit scale, so logits are far apart
    and a wrong fusion or a wrong cache slot shows."""
    torch.manual_seed(seed)
    model = CONFIGS[name]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.dim() == 2 else 1 + 0.3 * torch.randn_like(p))
    return model


def prompts(batch: int = 2, length: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def step_by_step(fm: fast.FastLM, idx: torch.Tensor, prefill: int, capacity: int | None = None) -> torch.Tensor:
    """Logits at every position of idx from the fast model: the first ``prefill`` tokens at once, then one at a
    time through ``step`` (with a cache of ``capacity``, by default idx's length). [B, T, V]"""
    fm.setup_cache(idx.shape[0], capacity or idx.shape[1])
    with torch.inference_mode():
        first = fm(idx[:, :prefill])  # [B, prefill, V]
        steps = [fm.step(idx[:, t:t + 1])[:, None] for t in range(prefill, idx.shape[1])]  # [B, 1, V] each
    return torch.cat([first, *steps], 1)


def through_cache(model: nn.Module, prefill: int = 5):
    """The plain model's forward for the margin rule: its logits through its own KV cache, as ``generate``
    computes them (with dynamic NTK they follow the length processed, not the whole sequence's)."""
    return lambda s: cached_logits(model, s, prefill)


def plain_step_by_step(model: nn.Module, idx: torch.Tensor, prefill: int) -> torch.Tensor:
    """The same with the plain model and its own KV cache."""
    cache = KVCache(len(model.blocks), idx.shape[1])
    with torch.inference_mode():
        first = model(idx[:, :prefill], cache)
        steps = [model(idx[:, t:t + 1], cache) for t in range(prefill, idx.shape[1])]
    return torch.cat([first, *steps], 1)


@pytest.mark.parametrize("static_cache", [True, False], ids=["static", "plain-cache"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_the_plain_model(name, static_cache):
    """A whole sequence at once (prefill), then single tokens against the static (or the plain) cache."""
    model = model_for(name)
    fm = fast.prepare(model, compile=False, static_cache=static_cache)
    assert fm.cache is None and fm.static_cache == static_cache
    idx = prompts(length=12)
    ours, plain = step_by_step(fm, idx, 8), plain_step_by_step(model, idx, 8)
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=0)
    if name != "dynamic-ntk":  # dynamic NTK: the frequencies depend on the length processed, not so for the rest
        torch.testing.assert_close(plain, model(idx), atol=1e-5, rtol=0)
    assert plain.std() > 0.5  # logits of unit scale: the tolerance is a real test


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_tokens_as_the_plain_model_greedy_and_sampled(name):
    """Greedy: the fused model and the static cache compute with other kernels than the plain model, so their
    tokens follow the margin rule (tests/decodes.py), with the logits through the fast decode path within 1e-5 of
    the plain model's. Sampled: with the plain modules and cache (fuse=False, static_cache=False) and a request
    that fills max_len, both decoders run the same kernels on the same shapes, so the same generator must give
    exactly the same tokens: fast.generate's sampling is generate's."""
    model = model_for(name)
    fm = fast.prepare(model, compile=False, static_cache=True)
    idx = prompts()
    for prompt, new in ((idx, 20), (idx[:1], 1)):  # one token: the prefill alone, no step at all
        want, got = generate(model, prompt, new), fast.generate(fm, prompt, new)
        assert_decodes_agree(through_cache(model), lambda s: step_by_step(fm, s, 5, fm.capacity), want, got, 5, 1e-5,
                             f"{name}: fused and static cache against plain")
    same_kernels = fast.prepare(model, compile=False, fuse=False, static_cache=False)
    new = model.max_len - idx.shape[1] + 1  # the cache both decoders allocate holds max_len positions
    sampled = [f(m, idx, new, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(3))
               for f, m in ((fast.generate, same_kernels), (generate, model))]
    assert same_kernels.capacity == model.max_len and torch.equal(*sampled)


def test_prepare_swaps_modules_and_keeps_nothing_else():
    """The copy is the same model class with GQAttention and SwiGLU swapped; the original is untouched."""
    model = model_for("qwen3-head_dim12-tied")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fm = fast.prepare(model, compile=False)
    assert type(fm.model) is LlamaStyleLM and fm.model is not model
    assert all(isinstance(b.attn, FusedGQAttention) and isinstance(b.ffn, FusedSwiGLU) for b in fm.model.blocks)
    assert fm.model.tied and not fm.model.training and not any(p.requires_grad for p in fm.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    idx = prompts()
    plain = fast.prepare(model, compile=False, fuse=False, static_cache=True)  # step 2 alone: plain modules
    assert type(plain.model.blocks[0].attn).__name__ == "GQAttention" and not fm.static_cache
    assert_decodes_agree(through_cache(model), lambda s: step_by_step(plain, s, 5, 64), generate(model, idx, 12),
                         fast.generate(plain, idx, 12), 5, 1e-5, "the static cache against the plain one")
    fast.generate(fm, idx, 12)
    assert type(fm.cache) is KVCache and type(plain.cache) is not KVCache  # uncompiled: the plain cache is faster


def test_the_compile_step_is_named_apart_from_torchs_compile():
    assert fast.FastLM.compile is nn.Module.compile  # not overridden with another meaning
    fm = fast.prepare(model_for("gqa-qknorm"), compile=False)
    assert not fm.compiled and fm.compiled_step is None
    with pytest.raises(ValueError, match="needs the static cache"):
        fast.prepare(model_for("gqa-qknorm"), static_cache=False)


def test_the_static_cache_is_allocated_once_per_shape():
    model = model_for("gqa-qknorm")
    fm = fast.prepare(model, compile=False, static_cache=True)
    idx = prompts()
    fast.generate(fm, idx, 10)
    k = fm.cache[0].buffers[0]
    assert list(k.shape) == [2, 2, 64, 8] and fm.capacity == 64  # 5 + 10 - 1 rounded up to 64, max_len 64
    fast.generate(fm, prompts(seed=2), 20)  # same batch, same capacity: the same buffers, overwritten
    assert fm.cache[0].buffers[0] is k
    out = fast.generate(fm, idx[:1], 10)  # another batch size: new buffers, same tokens as before
    assert fm.cache[0].buffers[0].shape[0] == 1
    assert_decodes_agree(through_cache(model), lambda s: step_by_step(fm, s, 5, 64), generate(model, idx[:1], 10),
                         out, 5, 1e-5, "batch 1 against the plain model")


def test_bad_input_is_refused_clearly():
    with pytest.raises(TypeError, match="DecoderLM"):
        fast.prepare(nn.Linear(3, 3))
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
    fm.cache = None
    with pytest.raises(ValueError, match="setup_cache"):
        fm(prompts())
    for static in (True, False):
        fm = fast.prepare(model, compile=False, static_cache=static)
        fm.setup_cache(2, 8)
        fm(prompts(length=6))
        with pytest.raises(ValueError, match="at most 8 tokens; 6 \\+ 3"):
            fm(prompts(length=3))


# ---------------------------------------------------------------- compiled, against Hugging Face
@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-gqa-tied"])
def test_compiled_decoding_gives_the_plain_models_and_hugging_faces_tokens(case):
    from test_hf import ATOL, hf_model  # tiny random Llama / Qwen3 (head_dim 12 != d/h, tied) at unit scale

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
        ref = model(ours[:, :-1])  # the plain model's logits at every position
    # slices of a prompt made outside inference mode, a cache set up outside it: the step compiled once serves them
    with torch.compiler.set_stance("fail_on_recompile"):
        steps = step_by_step(fm, ours[:, :-1], 5, fm.capacity)  # the compiled step's logits (the compiled shape)
        torch.testing.assert_close(steps, ref, atol=1e-4, rtol=0)  # compiled step logits = plain
        want = generate(model, idx, new)  # the plain model's tokens: the reference of the margin rule
        compiled = lambda s: step_by_step(fm, s, 5, fm.capacity)  # noqa: E731
        assert_decodes_agree(through_cache(model), compiled, want, ours, 5, 1e-4, f"{case}: compiled against plain")
    assert_decodes_agree(model, lambda s: hf(s).logits, want, theirs, 5, ATOL, f"{case}: transformers against ours")


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("name", ["dynamic-ntk", "mla", "gpt2"])
def test_compiled_decoding_of_the_other_models(name):
    """What the fast layer leaves unfused (MLA, GPT-2's attention) and dynamic NTK's per-step frequencies run
    inside the compiled step too."""
    model = model_for(name)
    fm = fast.prepare(model)
    idx = prompts()
    ours, want = fast.generate(fm, idx, 12), generate(model, idx, 12)
    with torch.compiler.set_stance("fail_on_recompile"):  # the step compiled by generate serves what follows
        assert_decodes_agree(through_cache(model), lambda s: step_by_step(fm, s, 5, fm.capacity), want, ours, 5,
                             1e-4, f"{name}: compiled against plain")
        idx = prompts(length=12)
        ours = step_by_step(fm, idx, 8, fm.capacity)  # the capacity generate used: the step compiled for it
    torch.testing.assert_close(ours, plain_step_by_step(model, idx, 8), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2-tied", "llama-yarn", "llama-dynamic", "smollm2", "mistral",
                                  "qwen2", "qwen2.5-tied-yarn", "qwen3-llama3"])
def test_fast_logits_equal_hugging_face_for_each_family(name):
    """Every Hugging Face family the course loads into LlamaStyleLM: the fast layer's logits over a whole
    sequence, then one token at a time, equal Hugging Face's, decoding with its own cache the same way (with
    dynamic NTK the frequencies follow the length processed, in both)."""
    from test_hf_families import ATOL, hf_cached_logits, hf_family, long_tokens

    from modern_block.interop.hf import from_hf

    hf = hf_family(name)
    fm = fast.prepare(from_hf(hf), compile=False)
    idx = long_tokens()  # [2, 40]: past the scaled models' original context
    ours = step_by_step(fm, idx, 30)  # [2, 40, V]
    assert (ours - hf_cached_logits(hf, idx, 30)).abs().max().item() <= ATOL
