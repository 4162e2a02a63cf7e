"""Hugging Face configs <-> the course models' keyword arguments.

Reading (``llama_kwargs``, ``deepseek_kwargs``, ``gpt2_kwargs``): what the course model can express is
carried over, anything else is refused with a ValueError naming the config field (sliding windows,
mixture-of-experts layers, partial rotary, longrope, ...). Writing (``hf_config``): the transformers config
that describes a course model. transformers is imported only when a function here needs it.
"""

import math
from typing import Any, NoReturn

import torch.nn as nn

from ..attention import GQAttention
from ..decoder import DecoderLM
from ..gpt2 import GPT2LM
from ..llama import LlamaStyleLM
from ..mla import MLAConfig, MLAttention
from ..rope import ROPE_SCALING_KEYS, ROPE_SCALING_TYPES, check_rope_scaling
from .hf_names import HF_CLASSES, UNSUPPORTED


def transformers_module():
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("modern_block.interop.hf needs transformers: pip install 'modern-block[dev]' "
                          "(or pip install transformers)") from err
    return transformers



# ---------------------------------------------------------------------------------------------
# Configurations: what the course model can express, and its keyword arguments
# ---------------------------------------------------------------------------------------------
def _refuse(family: str, field: str, value, why: str) -> NoReturn:
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


def llama_kwargs(family: str, cfg) -> dict:
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


def deepseek_kwargs(cfg) -> dict:
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


def gpt2_kwargs(cfg) -> dict:
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


def hf_family(hf_model) -> str:
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


def course_tied(model: DecoderLM) -> bool:
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


def hf_config(model: nn.Module, rope_interleave: bool, family: str | None = None):
    """(family, transformers config) describing a course model; refuses what transformers cannot build."""
    if not isinstance(model, (LlamaStyleLM, GPT2LM)):
        raise TypeError(f"model must be a LlamaStyleLM or GPT2LM, got {type(model).__name__}")
    if family is not None and family not in HF_CLASSES:
        raise ValueError(f"family must be one of {sorted(HF_CLASSES)} or None, got {family!r}")
    tf = transformers_module()
    common: dict[str, Any] = dict(vocab_size=model.V, max_position_embeddings=model.max_len,
                                  tie_word_embeddings=course_tied(model), bos_token_id=None, eos_token_id=None,
                                  pad_token_id=None)
    if isinstance(model, GPT2LM):
        if family not in (None, "gpt2"):
            raise ValueError(f"family={family!r} cannot express a GPT2LM; it converts to 'gpt2'")
        blk: Any = model.blocks[0]  # a GPT2Block
        if model.norm.bias is None or blk.attn.qkv.bias is None:
            raise ValueError("GPT2LM(bias=False) has no Hugging Face GPT-2 counterpart (GPT-2 has biases)")
        common.pop("max_position_embeddings")
        cfg = tf.GPT2Config(n_embd=model.emb.embedding_dim, n_layer=len(model.blocks), n_head=blk.attn.h,
                            n_positions=model.max_len, n_inner=blk.mlp.fc.out_features,
                            layer_norm_epsilon=model.norm.eps, activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        return "gpt2", cfg
    attn: Any = model.blocks[0].attn  # a GQAttention or an MLAttention, the same in every block
    first_ffn: Any = model.blocks[0].ffn
    for i, blk in enumerate(model.blocks):  # transformers' configs describe identical layers
        if type(blk.attn) is not type(attn) or repr(blk.attn) != repr(attn) or repr(blk.ffn) != repr(first_ffn):
            raise ValueError(f"model.blocks[{i}] differs from model.blocks[0]; transformers needs identical layers")
    rope_parameters, common["max_position_embeddings"] = _hf_rope(model)
    common.update(hidden_size=model.emb.embedding_dim, num_hidden_layers=len(model.blocks),
                  num_attention_heads=attn.h, intermediate_size=first_ffn.w_gate.out_features,
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
