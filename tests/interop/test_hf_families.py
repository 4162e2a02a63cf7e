"""The families lesson 09 loads, against Hugging Face: Llama 3.1/3.2 (RoPE scaling), Mistral without a
sliding window, Qwen2/Qwen2.5 (q/k/v biases), ``swish`` as SiLU, and the RoPE scalings in a whole model.

As in test_hf.py, every model is a tiny random config (nothing is downloaded), redrawn at unit scale
with random norms and biases, so a missing bias or a wrong frequency moves the logits far beyond the
tolerance. The RoPE scalings use a short original context (L₀ = 16) and sequences past it, so that every
band of each rule is used and the positions beyond L₀ are the ones compared.
"""

import pytest
import torch
from decodes import assert_decodes_agree, cached_logits
from test_hf import ATOL, V, hf_logits, randomise, tokens, transformers

from modern_block import LlamaStyleLM, generate
from modern_block.interop.compare_layers import compare_layers
from modern_block.interop.hf import from_hf, to_hf

L0, MAX_POS, T_LONG = 16, 64, 40
BASE = dict(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=MAX_POS)  # head_dim 8: 4 frequencies


def rope(kind: str, theta: float = 10000.0, **extra) -> dict:
    params = {"llama3": dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=L0),
              "yarn": dict(factor=4.0, original_max_position_embeddings=L0),
              "linear": dict(factor=4.0), "dynamic": dict(factor=4.0), "default": {}}[kind]
    return {"rope_type": kind, "rope_theta": theta, **params, **extra}


FAMILIES = {  # name: (config class, keywords, what it stands for)
    "llama3.1": ("LlamaConfig", dict(BASE, rope_parameters=rope("llama3", 500000.0), rms_norm_eps=1e-5),
                 "Llama 3.1 8B: GQA, llama3 RoPE scaling, untied"),
    "llama3.2-tied": ("LlamaConfig", dict(BASE, rope_parameters=rope("llama3", 500000.0, factor=32.0),
                                          tie_word_embeddings=True, head_dim=16),
                      "Llama 3.2 1B: llama3 scaling with factor 32, tied, head_dim x heads != d"),
    "llama-linear": ("LlamaConfig", dict(BASE, rope_parameters=rope("linear")), "position interpolation"),
    "llama-dynamic": ("LlamaConfig", dict(BASE, rope_parameters=rope("dynamic"), max_position_embeddings=L0),
                      "dynamic NTK (L₀ = max_position_embeddings)"),
    "llama-yarn": ("LlamaConfig", dict(BASE, rope_parameters=rope("yarn", beta_fast=8, beta_slow=1)),
                   "YaRN with its attention temperature"),
    "llama-swish": ("LlamaConfig", dict(BASE, hidden_act="swish"), "hidden_act 'swish' (SiLU)"),
    "smollm2": ("LlamaConfig", dict(BASE, num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True,
                                    rope_parameters=rope("default", 100000.0), rms_norm_eps=1e-5),
                "SmolLM2-135M: Llama with tied embeddings, GQA 3:1, base 100k"),
    "mistral": ("MistralConfig", dict(BASE, sliding_window=None), "Mistral 7B v0.2+: no sliding window"),
    "mistral-wide-window": ("MistralConfig", dict(BASE, sliding_window=MAX_POS),
                            "Mistral with a window covering every position (never binds)"),
    "qwen2": ("Qwen2Config", dict(BASE, rope_parameters=rope("default", 1e6)), "Qwen2: q/k/v biases"),
    "qwen2.5-tied-yarn": ("Qwen2Config", dict(BASE, tie_word_embeddings=True, rope_parameters=rope("yarn", 1e6)),
                          "Qwen2.5 small: biases, tied, YaRN as its long-context option"),
    "qwen3-llama3": ("Qwen3Config", dict(BASE, head_dim=8, rope_parameters=rope("llama3")),
                     "Qwen3 (QK-norm) with a llama3 scaling: the two options together"),
}


def hf_family(name: str, seed: int = 0, **overrides):
    cls_name, kwargs, _ = FAMILIES[name]
    torch.manual_seed(seed)
    config = getattr(transformers, cls_name)(**{**kwargs, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomise(model, seed)
    return model


def long_tokens(length: int = T_LONG) -> torch.Tensor:
    return tokens(length=length)  # [2, length], past L₀


@torch.no_grad()
def hf_cached_logits(hf, idx: torch.Tensor, prefill: int) -> torch.Tensor:
    """transformers' logits at every position of idx [B, T] through its own cache: the first ``prefill`` tokens at
    once, then one at a time, as its ``generate`` computes them. [B, T, V]"""
    out = hf(idx[:, :prefill], use_cache=True)
    logits = [out.logits]
    for t in range(prefill, idx.shape[1]):
        out = hf(idx[:, t:t + 1], cache=out.cache, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, 1)


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_family_logits_equal_hugging_face(name):
    hf = hf_family(name)
    model = from_hf(hf)
    idx = long_tokens()
    ref, ours = hf_logits(hf, idx), model(idx)
    assert ref.abs().max() > 1.0
    diff = (ours - ref).abs().max().item()
    print(f"{name} ({FAMILIES[name][2]}): max |logit diff| over {T_LONG} positions = {diff:.2e}")
    assert diff <= ATOL
    assert model.tied == (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight)


def test_families_map_to_the_expected_course_options():
    q2 = from_hf(hf_family("qwen2"))
    attn = q2.blocks[0].attn
    assert attn.wq.bias is not None and attn.wk.bias is not None and attn.wv.bias is not None
    assert attn.wo.bias is None and isinstance(attn.q_norm, torch.nn.Identity)
    llama = from_hf(hf_family("llama3.1"))
    assert llama.blocks[0].attn.wq.bias is None  # biases stay an option, off by default
    assert llama.rope_scaling == {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": L0}
    assert llama.rope_base == 500000.0 and llama.max_len == MAX_POS
    dynamic = from_hf(hf_family("llama-dynamic"))  # L₀ kept in the scaling, the course allows factor·L₀
    assert dynamic.rope_scaling["original_max_position_embeddings"] == L0 and dynamic.max_len == 4 * L0
    assert LlamaStyleLM(V, d=32, n_layers=1, n_heads=2, d_ff=16).blocks[0].attn.wq.bias is None


@torch.no_grad()
def test_scaling_changes_the_logits_beyond_the_original_context():
    """Non-vacuous: the same weights with plain RoPE differ from the scaled model (so the equality above
    checks the scaling), and the difference is in the frequencies, not elsewhere."""
    for name in ("llama3.1", "llama-linear", "llama-yarn", "llama-dynamic"):
        hf = hf_family(name)
        model = from_hf(hf)
        plain = LlamaStyleLM(**{**_kwargs(model), "rope_scaling": None}).eval()
        plain.load_state_dict(model.state_dict())
        idx = long_tokens()
        assert (plain(idx) - hf_logits(hf, idx)).abs().max() > 100 * ATOL, name


def _kwargs(model: LlamaStyleLM) -> dict:
    attn = model.blocks[0].attn
    return dict(V=model.V, d=model.emb.embedding_dim, n_layers=len(model.blocks), n_heads=attn.h, n_kv_heads=attn.kv,
                d_ff=model.blocks[0].ffn.w_gate.out_features, max_len=model.max_len, rope_base=model.rope_base,
                qk_norm=not isinstance(attn.q_norm, torch.nn.Identity), norm_eps=model.norm.eps, head_dim=attn.dh,
                qkv_bias=attn.wq.bias is not None, rope_scaling=model.rope_scaling, tie=model.tied)


@pytest.mark.parametrize("name", ["llama3.1", "llama3.2-tied", "llama-yarn", "llama-dynamic", "mistral", "qwen2",
                                  "qwen2.5-tied-yarn", "llama-swish"])
def test_family_greedy_tokens_equal_hugging_face_generate(name):
    hf = hf_family(name)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    model = from_hf(hf)
    idx, new = long_tokens(length=10), 24  # runs past L₀ = 16
    ours = generate(model, idx, new, use_cache=True)
    with torch.no_grad():
        theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new, do_sample=False)
    assert ours.shape == (2, 10 + new)
    # transformers' cached decode against ours, teacher-forced on ours (with dynamic NTK both follow the length
    # processed: the logits through each one's cache, step by step)
    dynamic = name == "llama-dynamic"
    mine = (lambda s: cached_logits(model, s, 10)) if dynamic else model
    assert_decodes_agree(mine, lambda s: hf_cached_logits(hf, s, 10) if dynamic else hf_logits(hf, s), ours, theirs,
                         10, ATOL, f"{name}: transformers against ours")
    if not dynamic:  # dynamic NTK re-scales the whole prefix: with a cache, old keys keep old angles
        assert_decodes_agree(model, lambda s: cached_logits(model, s, 10), generate(model, idx, new, use_cache=False),
                             ours, 10, ATOL, f"{name}: cached against recomputed")


@pytest.mark.parametrize("name, family", [("llama3.1", None), ("llama3.2-tied", None), ("llama-dynamic", None),
                                          ("llama-yarn", None), ("mistral", "mistral"), ("qwen2", None),
                                          ("qwen2.5-tied-yarn", None), ("qwen3-llama3", None)])
@torch.no_grad()
def test_family_round_trip(name, family):
    hf = hf_family(name)
    model = from_hf(hf)
    back = to_hf(model, family=family)
    assert type(back) is type(hf)
    idx = long_tokens()
    torch.testing.assert_close(hf_logits(back, idx), hf_logits(hf, idx), atol=ATOL, rtol=0)
    again = from_hf(back)
    assert again.rope_scaling == model.rope_scaling and again.max_len == model.max_len
    for key, p in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], p, atol=0, rtol=0)


@torch.no_grad()
def test_course_model_with_options_to_hf_and_back():
    torch.manual_seed(0)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": L0}
    model = LlamaStyleLM(V, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=40, max_len=MAX_POS, qk_norm=False,
                         qkv_bias=True, rope_scaling=scaling, rope_base=5e5).eval()
    randomise(model)
    hf = to_hf(model)
    assert type(hf).__name__ == "Qwen2ForCausalLM" and hf.config.rope_parameters["rope_type"] == "llama3"
    idx = long_tokens()
    torch.testing.assert_close(hf_logits(hf, idx), model(idx), atol=ATOL, rtol=0)
    torch.testing.assert_close(from_hf(hf)(idx), model(idx), atol=ATOL, rtol=0)


# ---------------------------------------------------------------- what stays refused
REFUSALS = [  # (family, config overrides, text the error must contain: the config field)
    ("mistral", dict(sliding_window=8), "config.sliding_window=8"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "config.layer_types"),
    ("qwen2", dict(hidden_act="gelu"), "config.hidden_act='gelu'"),
    ("llama3.1", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
                                       "long_factor": [2.0] * 4, "original_max_position_embeddings": L0}),
     "config.rope_parameters['rope_type']='longrope'"),
    ("llama3.1", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "config.partial_rotary_factor=0.5"),
    ("llama3.1", dict(attention_bias=True), "config.attention_bias=True"),
]


@pytest.mark.parametrize("name, overrides, field", REFUSALS, ids=[f"{n}-{f.split('=')[0]}" for n, _, f in REFUSALS])
def test_unsupported_family_options_are_refused_by_field(name, overrides, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_hf(hf_family(name, **overrides))


@pytest.mark.parametrize("cls_name, kwargs, reason", [
    ("GemmaConfig", dict(head_dim=8), "1 \\+ weight"),
    ("MixtralConfig", dict(num_local_experts=2), "mixture of experts"),
    ("Qwen3MoeConfig", dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16), "mixture of experts"),
])
def test_other_families_are_refused_by_model_type(cls_name, kwargs, reason):
    config = getattr(transformers, cls_name)(**{k: v for k, v in BASE.items()}, **kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match=f"config.model_type='{config.model_type}' is not supported: .*{reason}"):
        from_hf(model)


def test_to_hf_refuses_what_a_family_cannot_express():
    biased = LlamaStyleLM(V, d=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=16, qk_norm=False, qkv_bias=True)
    with pytest.raises(ValueError, match="family='llama' cannot express"):
        to_hf(biased, family="llama")
    with pytest.raises(ValueError, match="QK-norm and q/k/v biases"):
        to_hf(LlamaStyleLM(V, d=32, n_layers=1, n_heads=4, d_ff=16, qkv_bias=True))
    with pytest.raises(ValueError, match="family must be one of"):
        to_hf(biased, family="gemma")
    from modern_block import MLAConfig
    mla = LlamaStyleLM(V, d=16, n_layers=1, n_heads=2, d_ff=8, mla=MLAConfig(8, 4, 4, 4),
                       rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_scaling with MLA"):
        to_hf(mla)


def test_compare_layers_passes_on_a_biased_family_and_finds_a_dropped_bias():
    hf = hf_family("qwen2")
    model = from_hf(hf)
    idx = long_tokens(length=12)
    assert compare_layers(model, hf, idx, atol=ATOL).first_divergence is None
    with torch.no_grad():
        model.blocks[1].attn.wk.bias.zero_()  # as if the biases had not been copied
    first = compare_layers(model, hf, idx, atol=ATOL).first_divergence
    assert (first.name_a, first.name_b) == ("blocks.1.attn.wk", "model.layers.1.self_attn.k_proj")
