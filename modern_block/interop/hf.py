"""Hugging Face models <-> course models: the same weights, hence the same logits.

    from_hf(hf_model)        a transformers causal LM -> LlamaStyleLM or GPT2LM (eval mode)
    to_hf(model)             a course model -> the matching transformers model (eval mode)
    load_pretrained(name)    a checkpoint on the Hub (or a local folder) -> course model
    module_pairs(model, hf)  which course module should agree with which Hugging Face module
                             (for ``modern_block.interop.compare_layers.compare_layers``)

Supported families (``config.model_type``):
    llama        LlamaForCausalLM        -> LlamaStyleLM(qk_norm=False)   Llama 2/3/3.1/3.2, SmolLM2
    mistral      MistralForCausalLM      -> LlamaStyleLM(qk_norm=False)   without a sliding window
    qwen2        Qwen2ForCausalLM        -> LlamaStyleLM(qk_norm=False, qkv_bias=True)   Qwen2, Qwen2.5
    qwen3        Qwen3ForCausalLM        -> LlamaStyleLM(qk_norm=True, head_dim=config.head_dim)
    gpt2         GPT2LMHeadModel         -> GPT2LM
    deepseek_v3  DeepseekV3ForCausalLM   -> LlamaStyleLM(mla=MLAConfig(...)), dense layers only
RoPE scaling (``rope_parameters['rope_type']`` linear, dynamic, yarn or llama3) becomes the course
model's ``rope_scaling`` and goes back the same way; ``hidden_act`` "swish" is SiLU under its other name.

The tables below are the whole mapping, one line per tensor. Three details need more than a copy:
  * GPT-2 stores its projections as ``Conv1D`` with weights [in, out]: they are transposed.
  * DeepSeek fuses MLA's projections: ``kv_a_proj_with_mqa`` holds W_DKV and W_KR stacked and
    ``kv_b_proj`` holds W_UK,m and W_UV,m head after head; the course keeps the four apart.
  * DeepSeek checkpoints use interleaved RoPE (``rope_interleave=True``): the rotated rows of the
    query and of W_KR are permuted into the half-split layout the course uses (``permute_qk_weight``).

A configuration the course model cannot express is refused with a ValueError naming the config
field (sliding windows, mixture-of-experts layers, Gemma's norms, partial rotary, longrope, ...).
Conversions are for inference: models come back in eval mode and the course model is built
with dropout 0 (dropout rates are not carried over). GPT-2's ``reorder_and_upcast_attn`` only
changes the rounding and is accepted; DeepSeek's multi-token-prediction layers are not part of
``DeepseekV3ForCausalLM`` and are ignored. transformers is imported only when a function here needs it.
"""

import math

import torch
import torch.nn as nn

from ..attention import GQAttention
from ..gpt2 import GPT2LM
from ..llama import LlamaStyleLM
from ..mla import MLAConfig, MLAttention
from ..rope import ROPE_SCALING_KEYS, ROPE_SCALING_TYPES, check_rope_scaling, permute_qk_weight

# ---------------------------------------------------------------------------------------------
# Weight names: course parameter -> Hugging Face parameter ("{i}": layer index)
# ---------------------------------------------------------------------------------------------
_LLAMA_COMMON = {
    "emb.weight": "model.embed_tokens.weight",
    "blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.ffn.w_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blocks.{i}.ffn.w_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blocks.{i}.ffn.w_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}

LLAMA_WEIGHTS = {
    **_LLAMA_COMMON,
    "blocks.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.attn.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.attn.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
}

QWEN2_WEIGHTS = {  # Llama's, plus biases on q, k and v (not on o)
    **LLAMA_WEIGHTS,
    "blocks.{i}.attn.wq.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blocks.{i}.attn.wk.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blocks.{i}.attn.wv.bias": "model.layers.{i}.self_attn.v_proj.bias",
}

QWEN3_WEIGHTS = {
    **LLAMA_WEIGHTS,
    "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blocks.{i}.attn.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
}

GPT2_WEIGHTS = {
    "emb.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "blocks.{i}.ln1.weight": "transformer.h.{i}.ln_1.weight",
    "blocks.{i}.ln1.bias": "transformer.h.{i}.ln_1.bias",
    "blocks.{i}.attn.qkv.weight": "transformer.h.{i}.attn.c_attn.weight",  # Conv1D: transposed
    "blocks.{i}.attn.qkv.bias": "transformer.h.{i}.attn.c_attn.bias",
    "blocks.{i}.attn.proj.weight": "transformer.h.{i}.attn.c_proj.weight",  # Conv1D: transposed
    "blocks.{i}.attn.proj.bias": "transformer.h.{i}.attn.c_proj.bias",
    "blocks.{i}.ln2.weight": "transformer.h.{i}.ln_2.weight",
    "blocks.{i}.ln2.bias": "transformer.h.{i}.ln_2.bias",
    "blocks.{i}.mlp.fc.weight": "transformer.h.{i}.mlp.c_fc.weight",  # Conv1D: transposed
    "blocks.{i}.mlp.fc.bias": "transformer.h.{i}.mlp.c_fc.bias",
    "blocks.{i}.mlp.proj.weight": "transformer.h.{i}.mlp.c_proj.weight",  # Conv1D: transposed
    "blocks.{i}.mlp.proj.bias": "transformer.h.{i}.mlp.c_proj.bias",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
    "head.weight": "lm_head.weight",
}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # [in, out]

DEEPSEEK_V3_WEIGHTS = {
    **_LLAMA_COMMON,
    "blocks.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",  # without q-LoRA; RoPE rows*
    "blocks.{i}.attn.wq_down.weight": "model.layers.{i}.self_attn.q_a_proj.weight",  # with q-LoRA
    "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_a_layernorm.weight",
    "blocks.{i}.attn.wq_up.weight": "model.layers.{i}.self_attn.q_b_proj.weight",  # RoPE rows*
    "blocks.{i}.attn.kv_norm.weight": "model.layers.{i}.self_attn.kv_a_layernorm.weight",
    "blocks.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
}  # * permuted when config.rope_interleave

# Hugging Face tensor -> the course tensors stacked in it, in order (rows)
DEEPSEEK_V3_FUSED = {
    # [W_DKV (d_c rows) ; W_KR (d_R rows, RoPE rows*)]
    "model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight": ("blocks.{i}.attn.w_dkv.weight",
                                                             "blocks.{i}.attn.w_kr.weight"),
    # for each head m: [W_UK,m (d_nope rows) ; W_UV,m (d_v rows)]
    "model.layers.{i}.self_attn.kv_b_proj.weight": ("blocks.{i}.attn.w_uk.weight", "blocks.{i}.attn.w_uv.weight"),
}

WEIGHTS = {"llama": LLAMA_WEIGHTS, "mistral": LLAMA_WEIGHTS, "qwen2": QWEN2_WEIGHTS, "qwen3": QWEN3_WEIGHTS,
           "gpt2": GPT2_WEIGHTS, "deepseek_v3": DEEPSEEK_V3_WEIGHTS}
HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel", "deepseek_v3": "DeepseekV3ForCausalLM"}
# Families that look close but are not the course model, and why (refused by config.model_type)
UNSUPPORTED = {
    "gemma": "Gemma's RMSNorm multiplies by (1 + weight) and its embeddings are scaled by sqrt(d)",
    "gemma2": "Gemma 2 adds post-norms, logit soft-capping and sliding-window layers",
    "gemma3": "Gemma 3 adds post-norms, sliding-window layers and (1 + weight) norms",
    "gemma3_text": "Gemma 3 adds post-norms, sliding-window layers and (1 + weight) norms",
    "mixtral": "its FFN is a mixture of experts",
    "qwen2_moe": "its FFN is a mixture of experts",
    "qwen3_moe": "its FFN is a mixture of experts",
    "gpt_oss": "its FFN is a mixture of experts, with sliding-window layers and attention sinks",
    "phi3": "its q/k/v and gate/up projections are fused, and it uses longrope scaling",
}

# ---------------------------------------------------------------------------------------------
# Modules whose outputs must agree: course module -> Hugging Face module (for compare_layers).
# Only pairs whose outputs have the same layout are listed (Qwen3's q_norm, for one, is applied
# to [B, T, h, dh] there and to [B, h, T, dh] here).
# ---------------------------------------------------------------------------------------------
_LLAMA_COMMON_MODULES = {
    "emb": "model.embed_tokens",
    "blocks.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blocks.{i}.attn.wo": "model.layers.{i}.self_attn.o_proj",
    "blocks.{i}.attn": "model.layers.{i}.self_attn",
    "blocks.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blocks.{i}.ffn.w_gate": "model.layers.{i}.mlp.gate_proj",
    "blocks.{i}.ffn.w_up": "model.layers.{i}.mlp.up_proj",
    "blocks.{i}.ffn.w_down": "model.layers.{i}.mlp.down_proj",
    "blocks.{i}.ffn": "model.layers.{i}.mlp",
    "blocks.{i}": "model.layers.{i}",
    "norm": "model.norm",
    "head": "lm_head",
}
LLAMA_MODULES = {
    **_LLAMA_COMMON_MODULES,
    "blocks.{i}.attn.wq": "model.layers.{i}.self_attn.q_proj",
    "blocks.{i}.attn.wk": "model.layers.{i}.self_attn.k_proj",
    "blocks.{i}.attn.wv": "model.layers.{i}.self_attn.v_proj",
}
DEEPSEEK_V3_MODULES = {
    **_LLAMA_COMMON_MODULES,
    "blocks.{i}.attn.wq_down": "model.layers.{i}.self_attn.q_a_proj",
    "blocks.{i}.attn.q_norm": "model.layers.{i}.self_attn.q_a_layernorm",
    "blocks.{i}.attn.kv_norm": "model.layers.{i}.self_attn.kv_a_layernorm",
}
GPT2_MODULES = {
    "emb": "transformer.wte",
    "wpe": "transformer.wpe",
    "blocks.{i}.ln1": "transformer.h.{i}.ln_1",
    "blocks.{i}.attn.qkv": "transformer.h.{i}.attn.c_attn",
    "blocks.{i}.attn.proj": "transformer.h.{i}.attn.c_proj",
    "blocks.{i}.attn": "transformer.h.{i}.attn",
    "blocks.{i}.ln2": "transformer.h.{i}.ln_2",
    "blocks.{i}.mlp.fc": "transformer.h.{i}.mlp.c_fc",
    "blocks.{i}.mlp.proj": "transformer.h.{i}.mlp.c_proj",
    "blocks.{i}.mlp": "transformer.h.{i}.mlp",
    "blocks.{i}": "transformer.h.{i}",
    "norm": "transformer.ln_f",
    "head": "lm_head",
}
MODULES = {"llama": LLAMA_MODULES, "mistral": LLAMA_MODULES, "qwen2": LLAMA_MODULES, "qwen3": LLAMA_MODULES,
           "gpt2": GPT2_MODULES, "deepseek_v3": DEEPSEEK_V3_MODULES}


def _transformers():
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("modern_block.interop.hf needs transformers: pip install 'modern-block[dev]' "
                          "(or pip install transformers)") from err
    return transformers


def _expand(table: dict, n_layers: int) -> list[tuple[str, str]]:
    """Table entries with "{i}" repeated for every layer, in order."""
    pairs = []
    for ours, theirs in table.items():
        if "{i}" in ours:
            pairs += [(ours.format(i=i), theirs.format(i=i)) for i in range(n_layers)]
        else:
            pairs.append((ours, theirs))
    return pairs


# ---------------------------------------------------------------------------------------------
# Configurations: what the course model can express, and its keyword arguments
# ---------------------------------------------------------------------------------------------
def _refuse(family: str, field: str, value, why: str):
    raise ValueError(f"{family}: config.{field}={value!r} cannot be expressed by the course model: {why}")


def _rope(family: str, cfg) -> tuple[float, dict | None, int]:
    """(RoPE base, the course's rope_scaling or None, max_len) of a config.

    Plain RoPE and the scalings of ``modern_block.rope`` are carried over; anything else is refused.
    Hugging Face's dynamic NTK reads L₀ from max_position_embeddings and stretches beyond it: the
    course model records L₀ in the scaling and allows factor·L₀ positions.
    """
    params = getattr(cfg, "rope_parameters", None)  # transformers >= 5
    field = "rope_parameters"
    if params is None:  # transformers 4.x
        params, field = {"rope_theta": cfg.rope_theta, **(getattr(cfg, "rope_scaling", None) or {})}, "rope_scaling"
    if "rope_theta" not in params:  # one entry per layer type (Gemma-style)
        _refuse(family, field, params, "RoPE parameters per layer type are not supported")
    params = dict(params)
    base = float(params.pop("rope_theta"))
    kind = params.pop("rope_type", params.pop("type", "default"))
    partial = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None)) or 1.0
    if partial != 1.0:
        _refuse(family, "partial_rotary_factor", partial, "the course model rotates the whole head")
    max_len = cfg.max_position_embeddings
    if kind == "default":
        return base, None, max_len
    if family == "deepseek_v3":
        _refuse(family, f"{field}['rope_type']", kind, "scaled RoPE is not implemented for MLA (DeepSeek's yarn "
                "also changes the softmax scale)")
    if kind not in ROPE_SCALING_TYPES:
        _refuse(family, f"{field}['rope_type']", kind, f"the course implements {list(ROPE_SCALING_TYPES)}")
    required, optional = ROPE_SCALING_KEYS[kind]
    scaling = {"rope_type": kind, **{k: v for k, v in params.items() if k in required | optional}}
    if kind == "dynamic":
        scaling["original_max_position_embeddings"] = max_len
        max_len = math.ceil(scaling["factor"] * max_len)
    if kind == "yarn" and scaling.get("factor") is None:  # DeepSeek-style: the ratio of the two lengths
        scaling["factor"] = max_len / scaling["original_max_position_embeddings"]
    try:
        return base, check_rope_scaling(scaling), max_len
    except (TypeError, ValueError) as err:
        _refuse(family, field, params, str(err))


def _check_flags(family: str, cfg, rules) -> None:
    """rules: (config field, the value the course model needs, why). Missing fields are skipped."""
    for field, needed, why in rules:
        if hasattr(cfg, field) and getattr(cfg, field) != needed:
            _refuse(family, field, getattr(cfg, field), why)


_NO_BIAS = "the modern block has no biases"


def _silu(family: str, cfg) -> None:
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):  # swish is SiLU's other name
        _refuse(family, "hidden_act", cfg.hidden_act, "the FFN is SwiGLU (SiLU gate, also called swish)")


def _llama_kwargs(family: str, cfg) -> dict:
    """Llama, Mistral, Qwen2 and Qwen3: the same block, up to QK-norm (Qwen3) and q/k/v biases (Qwen2)."""
    _silu(family, cfg)
    _check_flags(family, cfg, [("attention_bias", False, _NO_BIAS + " (attention_bias also puts one on o_proj)"),
                               ("mlp_bias", False, _NO_BIAS)])
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):  # Qwen2/3: use_sliding_window and max_window_layers
        _refuse(family, "layer_types", layer_types, "sliding-window layers (use_sliding_window) are not implemented")
    window = getattr(cfg, "sliding_window", None) if family == "mistral" else None
    if window is not None and window < cfg.max_position_embeddings:  # a window that covers every position never binds
        _refuse(family, "sliding_window", window, "sliding-window attention is not implemented "
                "(set sliding_window=None, as Mistral 7B v0.2 and later do)")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope_base, rope_scaling, max_len = _rope(family, cfg)
    return dict(V=cfg.vocab_size, d=cfg.hidden_size, n_layers=cfg.num_hidden_layers,
                n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads or cfg.num_attention_heads,
                d_ff=cfg.intermediate_size, max_len=max_len, rope_base=rope_base, rope_scaling=rope_scaling,
                qk_norm=family == "qwen3", qkv_bias=family == "qwen2", norm_eps=cfg.rms_norm_eps,
                head_dim=head_dim)


def _deepseek_kwargs(cfg) -> dict:
    family = "deepseek_v3"
    if cfg.first_k_dense_replace < cfg.num_hidden_layers:
        _refuse(family, "first_k_dense_replace", cfg.first_k_dense_replace,
                f"layers {cfg.first_k_dense_replace}..{cfg.num_hidden_layers - 1} would be mixture-of-experts "
                "layers; only dense layers are implemented (first_k_dense_replace >= num_hidden_layers)")
    _silu(family, cfg)
    _check_flags(family, cfg, [
        ("attention_bias", False, _NO_BIAS),
        ("num_key_value_heads", cfg.num_attention_heads, "MLA rebuilds keys and values for every head"),
    ])
    mla = MLAConfig(kv_latent_dim=cfg.kv_lora_rank, rope_dim=cfg.qk_rope_head_dim, nope_dim=cfg.qk_nope_head_dim,
                    v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank, norm_eps=1e-6)  # HF: default eps
    return dict(V=cfg.vocab_size, d=cfg.hidden_size, n_layers=cfg.num_hidden_layers,
                n_heads=cfg.num_attention_heads, d_ff=cfg.intermediate_size, max_len=cfg.max_position_embeddings,
                rope_base=_rope(family, cfg)[0], qk_norm=False, norm_eps=cfg.rms_norm_eps, mla=mla)


def _gpt2_kwargs(cfg) -> dict:
    family = "gpt2"
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        _refuse(family, "activation_function", cfg.activation_function, "GPT2LM uses GELU with the tanh approximation")
    _check_flags(family, cfg, [
        ("scale_attn_weights", True, "scores are always scaled by 1/sqrt(head_dim)"),
        ("scale_attn_by_inverse_layer_idx", False, "scores are not scaled per layer"),
        ("add_cross_attention", False, "GPT2LM is a decoder without cross-attention"),
    ])
    return dict(V=cfg.vocab_size, d=cfg.n_embd, n_layers=cfg.n_layer, n_heads=cfg.n_head, max_len=cfg.n_positions,
                d_ff=cfg.n_inner, norm_eps=cfg.layer_norm_epsilon)


def _family(hf_model) -> str:
    family = getattr(getattr(hf_model, "config", None), "model_type", None)
    if family is None or not isinstance(hf_model, nn.Module):
        raise TypeError(f"hf_model must be a transformers model, got {type(hf_model).__name__}")
    if family in UNSUPPORTED:
        raise ValueError(f"config.model_type={family!r} is not supported: {UNSUPPORTED[family]}; "
                         f"supported: {sorted(HF_CLASSES)}")
    if family not in HF_CLASSES:
        raise ValueError(f"config.model_type={family!r} is not supported; supported: {sorted(HF_CLASSES)}")
    if type(hf_model).__name__ != HF_CLASSES[family]:
        raise TypeError(f"hf_model must be a {HF_CLASSES[family]} (with its LM head), got {type(hf_model).__name__}")
    return family


# ---------------------------------------------------------------------------------------------
# DeepSeek's fused and interleaved tensors
# ---------------------------------------------------------------------------------------------
def _permute_q_rope_rows(w: torch.Tensor, attn: MLAttention, to: str) -> torch.Tensor:
    """Permute the RoPE rows of each head of a query projection [h·(d_nope + d_R), in]."""
    per_head = w.reshape(attn.h, attn.d_nope + attn.rope_dim, -1)  # [h, d_nope + d_R, in]
    rope_rows = per_head[:, attn.d_nope:].reshape(attn.h * attn.rope_dim, -1)  # [h·d_R, in]
    rope_rows = permute_qk_weight(rope_rows, attn.h, to).reshape(attn.h, attn.rope_dim, -1)
    return torch.cat([per_head[:, :attn.d_nope], rope_rows], dim=1).reshape(w.shape)


def _fused_names(i: int) -> list[tuple[str, list[str]]]:
    """DEEPSEEK_V3_FUSED for layer i."""
    return [(theirs.format(i=i), [ours.format(i=i) for ours in parts]) for theirs, parts in DEEPSEEK_V3_FUSED.items()]


def _split_mla(sd: dict, hf_sd: dict, attn: MLAttention, i: int, interleaved: bool) -> None:
    """HF's fused MLA tensors of layer i -> the course's W_DKV, W_KR, W_UK, W_UV (in sd)."""
    (kv_a, (dkv, kr)), (kv_b, (uk, uv)) = _fused_names(i)
    sd[dkv], sd[kr] = hf_sd[kv_a].split([attn.d_c, attn.rope_dim])  # [d_c, d], [d_R, d]
    per_head = hf_sd[kv_b].reshape(attn.h, attn.d_nope + attn.d_v, attn.d_c)  # [h, d_nope + d_v, d_c]
    sd[uk] = per_head[:, :attn.d_nope].reshape(attn.h * attn.d_nope, attn.d_c)
    sd[uv] = per_head[:, attn.d_nope:].reshape(attn.h * attn.d_v, attn.d_c)
    if interleaved:
        sd[kr] = permute_qk_weight(sd[kr], 1, "half_split")
        for q in (f"blocks.{i}.attn.wq.weight", f"blocks.{i}.attn.wq_up.weight"):
            if q in sd:
                sd[q] = _permute_q_rope_rows(sd[q], attn, "half_split")


def _fuse_mla(hf_sd: dict, sd: dict, attn: MLAttention, i: int, interleaved: bool) -> None:
    """The inverse of ``_split_mla``: course tensors of layer i -> HF's fused ones (in hf_sd)."""
    (kv_a, (dkv, kr)), (kv_b, (uk, uv)) = _fused_names(i)
    w_kr = permute_qk_weight(sd[kr], 1, "interleaved") if interleaved else sd[kr]
    hf_sd[kv_a] = torch.cat([sd[dkv], w_kr])  # [d_c + d_R, d]
    hf_sd[kv_b] = torch.cat([sd[uk].reshape(attn.h, attn.d_nope, attn.d_c),
                             sd[uv].reshape(attn.h, attn.d_v, attn.d_c)], dim=1).reshape(-1, attn.d_c)
    if interleaved:
        for q in ("q_proj", "q_b_proj"):
            name = f"model.layers.{i}.self_attn.{q}.weight"
            if name in hf_sd:
                hf_sd[name] = _permute_q_rope_rows(hf_sd[name], attn, "interleaved")


# ---------------------------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------------------------
def _tied(model: nn.Module) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


@torch.no_grad()
def from_hf(hf_model) -> nn.Module:
    """A course model with ``hf_model``'s weights (same dtype and device), in eval mode.

    Tied embeddings stay tied: the course model's head and embedding share one tensor.
    """
    family = _family(hf_model)
    cfg = hf_model.config
    tie = _tied(hf_model)
    if family == "gpt2":
        model = GPT2LM(**_gpt2_kwargs(cfg), tie=tie)
    elif family == "deepseek_v3":
        model = LlamaStyleLM(**_deepseek_kwargs(cfg), tie=tie)
    else:
        model = LlamaStyleLM(**_llama_kwargs(family, cfg), tie=tie)
    ref = hf_model.get_input_embeddings().weight
    model.to(device=ref.device, dtype=ref.dtype)

    hf_sd = hf_model.state_dict()
    n_layers = len(model.blocks)
    sd = {ours: hf_sd[theirs] for ours, theirs in _expand(WEIGHTS[family], n_layers) if theirs in hf_sd}
    used = {theirs for _, theirs in _expand(WEIGHTS[family], n_layers) if theirs in hf_sd}
    if family == "gpt2":
        for ours, theirs in _expand(GPT2_WEIGHTS, n_layers):
            if theirs.endswith(GPT2_CONV1D):
                sd[ours] = sd[ours].t()  # Conv1D [in, out] -> Linear [out, in]
    if family == "deepseek_v3":
        for i, blk in enumerate(model.blocks):
            _split_mla(sd, hf_sd, blk.attn, i, bool(getattr(cfg, "rope_interleave", False)))
            used |= {theirs for theirs, _ in _fused_names(i)}
    unused = sorted(set(hf_sd) - used)
    if unused:
        raise ValueError(f"{family}: these weights have no place in the course model: {unused[:5]}"
                         f"{' ...' if len(unused) > 5 else ''}")
    model.load_state_dict(sd, strict=True)
    return model.eval()


def _course_tied(model: nn.Module) -> bool:
    return model.head.weight is model.emb.weight


def _hf_rope(model: LlamaStyleLM) -> tuple[dict, int]:
    """(Hugging Face rope_parameters, max_position_embeddings) for a course model: the inverse of ``_rope``."""
    if model.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": model.rope_base}, model.max_len
    scaling = dict(model.rope_scaling)
    max_pos = model.max_len
    if scaling["rope_type"] == "dynamic":  # Hugging Face reads L₀ from max_position_embeddings
        max_pos = scaling.pop("original_max_position_embeddings")
    return {"rope_theta": model.rope_base, **scaling}, max_pos


def _llama_family(attn: GQAttention, family: str | None) -> str:
    """Which transformers family expresses a GQA course model: Qwen3 (QK-norm), Qwen2 (q/k/v biases),
    else Llama (or Mistral, the same architecture, when asked for)."""
    qk_norm, bias = attn.qk_norm, attn.wq.bias is not None
    if qk_norm and bias:
        raise ValueError("a model with both QK-norm and q/k/v biases has no Hugging Face counterpart here")
    natural = "qwen3" if qk_norm else "qwen2" if bias else "llama"
    allowed = {natural, "mistral"} if natural == "llama" else {natural}
    if family is not None and family not in allowed:
        raise ValueError(f"family={family!r} cannot express this model; it converts to {sorted(allowed)}")
    return family or natural


def _hf_config(model: nn.Module, rope_interleave: bool, family: str | None = None):
    """(family, transformers config) describing a course model; refuses what transformers cannot build."""
    if not isinstance(model, (LlamaStyleLM, GPT2LM)):
        raise TypeError(f"model must be a LlamaStyleLM or GPT2LM, got {type(model).__name__}")
    if family is not None and family not in HF_CLASSES:
        raise ValueError(f"family must be one of {sorted(HF_CLASSES)} or None, got {family!r}")
    tf = _transformers()
    common = dict(vocab_size=model.V, max_position_embeddings=model.max_len, tie_word_embeddings=_course_tied(model),
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if isinstance(model, GPT2LM):
        if family not in (None, "gpt2"):
            raise ValueError(f"family={family!r} cannot express a GPT2LM; it converts to 'gpt2'")
        blk = model.blocks[0]
        if model.norm.bias is None or blk.attn.qkv.bias is None:
            raise ValueError("GPT2LM(bias=False) has no Hugging Face GPT-2 counterpart (GPT-2 has biases)")
        common.pop("max_position_embeddings")
        cfg = tf.GPT2Config(n_embd=model.emb.embedding_dim, n_layer=len(model.blocks), n_head=blk.attn.h,
                            n_positions=model.max_len, n_inner=blk.mlp.fc.out_features,
                            layer_norm_epsilon=model.norm.eps, activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        return "gpt2", cfg
    attn = model.blocks[0].attn
    for i, blk in enumerate(model.blocks):  # transformers' configs describe identical layers
        if type(blk.attn) is not type(attn) or repr(blk.attn) != repr(attn) or repr(blk.ffn) != repr(
                model.blocks[0].ffn):
            raise ValueError(f"model.blocks[{i}] differs from model.blocks[0]; transformers needs identical layers")
    rope_parameters, common["max_position_embeddings"] = _hf_rope(model)
    common.update(hidden_size=model.emb.embedding_dim, num_hidden_layers=len(model.blocks),
                  num_attention_heads=attn.h, intermediate_size=model.blocks[0].ffn.w_gate.out_features,
                  rms_norm_eps=model.norm.eps, rope_parameters=rope_parameters, hidden_act="silu",
                  attention_dropout=0.0)
    if isinstance(attn, MLAttention):
        if family not in (None, "deepseek_v3"):
            raise ValueError(f"family={family!r} cannot express an MLA model; it converts to 'deepseek_v3'")
        if attn.kv_norm.eps != 1e-6:
            raise ValueError(f"MLA latent norm eps={attn.kv_norm.eps}: Hugging Face DeepSeek-V3 fixes it at 1e-6")
        if model.rope_scaling is not None:
            raise ValueError("rope_scaling with MLA has no Hugging Face counterpart here (DeepSeek's yarn also "
                             "changes the softmax scale)")
        cfg = tf.DeepseekV3Config(num_key_value_heads=attn.h, kv_lora_rank=attn.d_c, q_lora_rank=attn.q_lora_rank,
                                  qk_rope_head_dim=attn.rope_dim, qk_nope_head_dim=attn.d_nope,
                                  v_head_dim=attn.d_v, first_k_dense_replace=len(model.blocks),
                                  rope_interleave=rope_interleave, attention_bias=False, **common)
        return "deepseek_v3", cfg
    if rope_interleave:
        raise ValueError("rope_interleave applies to MLA (DeepSeek-V3) models only")
    if not isinstance(attn, GQAttention):
        raise TypeError(f"attention {type(attn).__name__} has no Hugging Face counterpart")
    family = _llama_family(attn, family)
    common.update(num_key_value_heads=attn.kv, head_dim=attn.dh)
    if family == "qwen3":
        if attn.q_norm.eps != model.norm.eps:
            raise ValueError("Qwen3 uses one eps for all norms; the model's QK-norm eps differs from norm_eps")
        return family, tf.Qwen3Config(use_sliding_window=False, attention_bias=False, **common)
    if family == "qwen2":
        return family, tf.Qwen2Config(use_sliding_window=False, **common)
    if family == "mistral":
        return family, tf.MistralConfig(sliding_window=None, **common)
    return family, tf.LlamaConfig(attention_bias=False, mlp_bias=False, **common)


@torch.no_grad()
def to_hf(model: nn.Module, *, rope_interleave: bool = False, family: str | None = None):
    """The transformers model with ``model``'s weights, in eval mode: Llama, Qwen3 when the model has
    QK-norm, Qwen2 when it has q/k/v biases, GPT-2, or DeepSeek-V3 for MLA. ``family="mistral"``
    writes a Llama-architecture model as Mistral (the same network under another name).
    ``rope_interleave=True`` writes an MLA model in DeepSeek's interleaved RoPE layout (the rotated
    rows are permuted; the logits do not change)."""
    tf = _transformers()
    family, cfg = _hf_config(model, rope_interleave, family)
    hf_model = getattr(tf, HF_CLASSES[family])(cfg)
    ref = model.head.weight
    hf_model.to(device=ref.device, dtype=ref.dtype)
    sd = model.state_dict()
    n_layers = len(model.blocks)
    hf_sd = {theirs: sd[ours] for ours, theirs in _expand(WEIGHTS[family], n_layers) if ours in sd}
    if family == "gpt2":
        for theirs in list(hf_sd):
            if theirs.endswith(GPT2_CONV1D):
                hf_sd[theirs] = hf_sd[theirs].t()  # Linear [out, in] -> Conv1D [in, out]
    if family == "deepseek_v3":
        for i, blk in enumerate(model.blocks):
            _fuse_mla(hf_sd, sd, blk.attn, i, rope_interleave)
    hf_model.load_state_dict(hf_sd, strict=True)
    if _tied(hf_model) != _course_tied(model):
        raise RuntimeError(f"tying was lost: course tied={_course_tied(model)}, Hugging Face tied={_tied(hf_model)}")
    return hf_model.eval()


def module_pairs(model: nn.Module, hf_model) -> list[tuple[str, str]]:
    """(course module, Hugging Face module) pairs whose outputs should agree, for ``compare_layers``."""
    family = _family(hf_model)
    ours, theirs = dict(model.named_modules()), dict(hf_model.named_modules())
    return [(a, b) for a, b in _expand(MODULES[family], len(model.blocks)) if a in ours and b in theirs]


def load_pretrained(name_or_path: str, *, dtype: torch.dtype = torch.float32, device=None,
                    tokenizer: bool = False, **from_pretrained_kwargs):
    """Load a Hugging Face checkpoint of a supported family and convert it to the course model.

    ``name_or_path`` is a Hub name (downloaded once into the Hugging Face cache; needs internet)
    or a local folder written by ``save_pretrained``. Extra keywords go to
    ``AutoModelForCausalLM.from_pretrained``. With ``tokenizer=True`` returns
    ``(model, tokenizer)``. For example, with internet::

        from modern_block import generate
        from modern_block.interop.hf import load_pretrained
        model, tok = load_pretrained("Qwen/Qwen3-0.6B", tokenizer=True)   # or "HuggingFaceTB/SmolLM2-135M"
        idx = tok("The modern transformer block", return_tensors="pt").input_ids
        print(tok.decode(generate(model, idx, max_new_tokens=20)[0]))

    Llama 3.1/3.2 checkpoints (rope_type "llama3") carry their RoPE scaling into the course model.
    """
    tf = _transformers()
    hf_model = tf.AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **from_pretrained_kwargs)
    model = from_hf(hf_model)
    del hf_model
    if device is not None:
        model.to(device)
    if tokenizer:
        return model, tf.AutoTokenizer.from_pretrained(name_or_path)
    return model
