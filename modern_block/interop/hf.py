"""Hugging Face models <-> course models: the same weights, hence the same logits.

    from_hf(hf_model)        a transformers causal LM -> LlamaStyleLM or GPT2LM (eval mode)
    to_hf(model)             a course model -> the matching transformers model (eval mode)
    (loading a checkpoint by name, folder or .gguf file: ``modern_block.interop.pretrained.load_pretrained``)
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

from typing import cast

import torch
import torch.nn as nn

from ..decoder import DecoderLM
from ..gpt2 import GPT2LM
from ..llama import LlamaStyleLM
from ..mla import MLAttention
from ..rope import permute_qk_weight
from .hf_config import (
    course_tied,
    deepseek_kwargs,
    gpt2_kwargs,
    hf_config,
    hf_family,
    llama_kwargs,
    transformers_module,
)
from .hf_names import (  # noqa: F401 - the tables are part of this module's interface
    DEEPSEEK_V3_FUSED,
    DEEPSEEK_V3_MODULES,
    DEEPSEEK_V3_WEIGHTS,
    GPT2_CONV1D,
    GPT2_MODULES,
    GPT2_WEIGHTS,
    HF_CLASSES,
    LLAMA_MODULES,
    LLAMA_WEIGHTS,
    MODULES,
    QWEN2_WEIGHTS,
    QWEN3_WEIGHTS,
    UNSUPPORTED,
    WEIGHTS,
    _expand,
)


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
def _tied(hf_model) -> bool:
    return hf_model.get_output_embeddings().weight is hf_model.get_input_embeddings().weight


@torch.no_grad()
def from_hf(hf_model) -> nn.Module:
    """A course model with ``hf_model``'s weights (same dtype and device), in eval mode.

    Tied embeddings stay tied: the course model's head and embedding share one tensor.
    """
    family = hf_family(hf_model)
    cfg = hf_model.config
    tie = _tied(hf_model)
    model: GPT2LM | LlamaStyleLM
    if family == "gpt2":
        model = GPT2LM(**gpt2_kwargs(cfg), tie=tie)
    elif family == "deepseek_v3":
        model = LlamaStyleLM(**deepseek_kwargs(cfg), tie=tie)
    else:
        model = LlamaStyleLM(**llama_kwargs(family, cfg), tie=tie)
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
            _split_mla(sd, hf_sd, cast(MLAttention, blk.attn), i, bool(getattr(cfg, "rope_interleave", False)))
            used |= {theirs for theirs, _ in _fused_names(i)}
    unused = sorted(set(hf_sd) - used)
    if unused:
        raise ValueError(f"{family}: these weights have no place in the course model: {unused[:5]}"
                         f"{' ...' if len(unused) > 5 else ''}")
    model.load_state_dict(sd, strict=True)
    return model.eval()


@torch.no_grad()
def to_hf(model: DecoderLM, *, rope_interleave: bool = False, family: str | None = None):
    """The transformers model with ``model``'s weights, in eval mode: Llama, Qwen3 when the model has
    QK-norm, Qwen2 when it has q/k/v biases, GPT-2, or DeepSeek-V3 for MLA. ``family="mistral"``
    writes a Llama-architecture model as Mistral (the same network under another name).
    ``rope_interleave=True`` writes an MLA model in DeepSeek's interleaved RoPE layout (the rotated
    rows are permuted; the logits do not change)."""
    tf = transformers_module()
    family, cfg = hf_config(model, rope_interleave, family)
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
            _fuse_mla(hf_sd, sd, cast(MLAttention, blk.attn), i, rope_interleave)
    hf_model.load_state_dict(hf_sd, strict=True)
    if _tied(hf_model) != course_tied(model):
        raise RuntimeError(f"tying was lost: course tied={course_tied(model)}, Hugging Face tied={_tied(hf_model)}")
    return hf_model.eval()


def module_pairs(model: DecoderLM, hf_model) -> list[tuple[str, str]]:
    """(course module, Hugging Face module) pairs whose outputs should agree, for ``compare_layers``."""
    family = hf_family(hf_model)
    ours, theirs = dict(model.named_modules()), dict(hf_model.named_modules())
    return [(a, b) for a, b in _expand(MODULES[family], len(model.blocks)) if a in ours and b in theirs]
