"""RoPE as a config states it (lessons 03 and 09b): the base and scaling of the full-attention layers and of the
local ones where they differ, the rotated share of each head, the layers without RoPE, and what that implies:
the shortest and longest wavelengths, and the longest after scaling.

Configs write RoPE two ways: transformers >= 5 one ``rope_parameters`` dict (per layer type in Gemma 3 and
OLMo 3), older files ``rope_theta`` with a ``rope_scaling`` dict (and Gemma 3's ``rope_local_base_freq``, a
top-level ``partial_rotary_factor``). Both read the same. Every scaling type transformers knows is explained;
one the card does not know is named as not interpreted (RoPE has no parameters: totals do not depend on it).
"""

import math
from typing import Any

import torch

from ..rope import dynamic_ntk_frequencies, linear_frequencies, llama3_frequencies, rope_frequencies, yarn_frequencies
from .config_arch import Architecture
from .config_fields import Fields

SCALING = {  # rope_type -> what it does to the frequencies (lesson 09b)
    "default": "none: plain RoPE",
    "linear": "position interpolation: every frequency divided by the factor",
    "dynamic": "dynamic NTK: the base grows with the length being processed, beyond the trained one",
    "yarn": "YaRN: long wavelengths interpolated, short ones kept, a ramp between, and attention rescaled",
    "longrope": "LongRoPE: one searched factor per frequency (short_factor within the trained length, "
                "long_factor beyond), and attention rescaled",
    "llama3": "Llama 3.1's rule: long wavelengths divided by the factor, short ones kept, a blend between",
}


def _as_dict(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"config field {what!r} must be a dict or null, got {type(value).__name__} {value!r}")
    return dict(value)


def rope_parameters(f: Fields) -> dict[str, dict]:
    """{"full": parameters, "sliding": parameters} (rope_type, rope_theta, the scaling's keys,
    partial_rotary_factor), whichever spelling the config uses; absent parts take the family's defaults."""
    legacy = any(k in f.cfg for k in ("rope_theta", "rope_scaling", "rope_local_base_freq"))
    params = _as_dict(f.cfg.get("rope_parameters"), "rope_parameters") if not legacy else {}
    default = _as_dict(f.defaults.get("rope_parameters"), "rope_parameters")
    if not params and not legacy:
        params = default
    if set(params) & {"full_attention", "sliding_attention"}:
        out = {"full": _as_dict(params.get("full_attention"), "rope_parameters['full_attention']"),
               "sliding": _as_dict(params.get("sliding_attention"), "rope_parameters['sliding_attention']")}
    else:
        scaling = _as_dict(f.cfg.get("rope_scaling"), "rope_scaling")
        default_full = default.get("full_attention", default)
        base = f.cfg.get("rope_theta", params.get("rope_theta", default_full.get("rope_theta")))
        full = {**params, **scaling, "rope_theta": base}
        full["rope_type"] = scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or "default"
        full.pop("type", None)
        local = dict(default.get("sliding_attention") or full)
        if "rope_local_base_freq" in f.cfg:
            local = {"rope_type": "default", "rope_theta": f.cfg["rope_local_base_freq"]}
        out = {"full": full, "sliding": local if "sliding_attention" in default else full}
    factor = f.cfg.get("partial_rotary_factor")
    for p in out.values():
        if factor is not None:
            p.setdefault("partial_rotary_factor", factor)
    return out


def _scaled(kind: str, p: dict, dim: int, base: float, context: int | None) -> torch.Tensor:
    """The frequencies after scaling, at a length beyond the trained one (float64)."""
    theta = rope_frequencies(dim, base).double()  # [dim/2]
    original = int(p.get("original_max_position_embeddings") or 0)  # every type but linear needs it (KeyError)
    if kind != "linear" and not original:
        raise KeyError("original_max_position_embeddings")
    if kind == "linear":
        return linear_frequencies(theta, p["factor"])
    if kind == "llama3":  # equal low and high factors make it a step: long waves / factor, short ones kept
        return llama3_frequencies(theta, p["factor"], p["low_freq_factor"], p["high_freq_factor"], original)
    if kind == "dynamic":
        return dynamic_ntk_frequencies(dim, base, p["factor"], context or original, original).double()
    if kind == "yarn":
        return yarn_frequencies(dim, base, p["factor"], original, p.get("beta_fast") or 32.0,
                                p.get("beta_slow") or 1.0, p.get("truncate", True)).double()
    long = torch.tensor(p["long_factor"], dtype=torch.float64)  # longrope beyond the trained length
    if long.shape != theta.shape:
        raise ValueError(f"long_factor has {long.numel()} entries; RoPE rotates {dim // 2} pairs")
    return theta / long


def rope_summary(f: Fields, a: Architecture) -> dict:
    """Base, rotated dims, wavelengths (tokens) and the scaling of the full-attention layers: its kind, factor,
    the trained and the promised length and the longest wavelength after it; the local layers' base if it
    differs; the NoPE layers. ``not_interpreted`` names what the card could not read (no total depends on it).
    A family with learned positions (GPT-2) has no RoPE: only the table's length."""
    if a.positions:
        return {"learned": a.positions, "scaling": None, "nope_layers": 0}
    params = rope_parameters(f)
    p = params["full"]
    head = a.mla["qk_rope_head_dim"] if a.mla else a.head_dim
    share = p.get("partial_rotary_factor", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"config field 'partial_rotary_factor' must be a number in (0, 1], got {share!r}")
    dim = int(head * share)
    if dim < 2:
        raise ValueError(f"config field 'partial_rotary_factor' ({share}) leaves {dim} of {head} dims to rotate")
    base, kind = p.get("rope_theta"), p.get("rope_type", "default")
    out: dict[str, Any] = {"base": base, "dim": dim, "share": share, "scaling": None, "nope_layers": a.nope_layers,
                           "local_base": params["sliding"].get("rope_theta") if a.sliding_layers else None}
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ValueError(f"config field 'rope_theta' must be a number > 1, got {base!r}")
    wavelengths = [2 * math.pi * base ** (2 * i / dim) for i in range(dim // 2)]  # tokens per turn, float64
    out.update(shortest=wavelengths[0], longest=wavelengths[-1])
    if kind == "default":
        return out
    context = a.context
    if kind == "longrope" and "original_max_position_embeddings" not in p:  # Phi-3 states it beside rope_scaling
        p = {**p, "original_max_position_embeddings": f.optional_int("original_max_position_embeddings")}
    if kind != "default" and context is None:
        raise ValueError(f"config field 'max_position_embeddings' is missing: {kind} scaling stretches RoPE to it")
    factor = p.get("factor")
    if kind == "longrope" and factor is None and p.get("original_max_position_embeddings"):
        factor = context / p["original_max_position_embeddings"]  # transformers' rule when factor is absent
    out.update(scaling=kind, factor=factor, original=p.get("original_max_position_embeddings"), extends_to=context)
    if kind not in SCALING:
        out["not_interpreted"] = f"rope_type {kind!r} is not one this card explains"
        return out
    try:
        theta = _scaled(kind, p, dim, float(base), context)
        out["longest_scaled"] = float((2 * math.pi / theta).max())
    except (KeyError, TypeError, ValueError) as err:
        out["not_interpreted"] = f"{kind} scaling: {err}"
    return out
