"""transformers' own model of a config, built on the meta device (every module with its shapes, no storage), and
what it holds: parameters by component (classified by their names), the K/V widths its attention projects (the
cache per token), and the routed experts a token leaves idle. The card's totals are checked against these in
lesson 11 and in the tests. Needs transformers (the dev extra); imported only by what uses it.

``family_defaults`` reads each family's own defaults from transformers: ``write_defaults()`` writes them to
``configs/transformers-defaults.json`` (run it after changing the families the card reads; the tests check the
file against the installed transformers).
"""

import dataclasses
import json
import re

import torch

from .config_families import ALIASES, DEFAULTS_FILE, FAMILIES
from .config_source import language_model

SKIP = {"auto_map", "quantization_config", "architectures"}  # not shapes: remote code, storage format, class names


def family_defaults(model_type: str) -> dict:
    """{"defaults": the family config's fields with the defaults transformers declares for them (None where it
    derives the value from other fields: head_dim, layer_types, ...; RoPE's as a default config computes it),
    "aliases": the other names transformers reads as one of them}. Fields every config carries are left out."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    base = set(json.loads(PretrainedConfig().to_json_string(use_diff=False)))
    made = json.loads(cls().to_json_string(use_diff=False))
    declared = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            declared[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            declared[field.name] = field.default_factory()
    defaults = {k: declared.get(k, v) if k != "rope_parameters" else v for k, v in made.items()}
    return {"defaults": json.loads(json.dumps({k: v for k, v in sorted(defaults.items()) if k not in base})),
            "aliases": dict(sorted(getattr(cls, "attribute_map", {}).items()))}


def write_defaults() -> None:
    data = {name: family_defaults(name) for name in sorted(FAMILIES)}
    DEFAULTS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def reference_config(cfg: dict):
    """transformers' config object for a config dict (a multimodal one's language model), as ``from_pretrained``
    would read the file."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text, _ = language_model(cfg)
    model_type = str(text.get("model_type"))
    family = ALIASES[model_type][0] if model_type in ALIASES else model_type
    if family not in CONFIG_MAPPING:
        raise ValueError(f"model_type {model_type!r} is not a family transformers implements")
    clean = {k: v for k, v in text.items() if k not in SKIP and k != "model_type" and not k.startswith("gguf")}
    return CONFIG_MAPPING[family].from_dict(clean)


def reference_model(cfg: dict) -> torch.nn.Module:
    """The causal LM transformers builds from ``cfg``, on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(reference_config(cfg))


def component(name: str) -> str:
    """The card's component of a transformers parameter, by its name."""
    parts = name.split(".")
    if parts[0] == "lm_head":
        return "head"
    if "embed_tokens" in parts or "wte" in parts:
        return "embedding"
    if "wpe" in parts:  # GPT-2's learned positions
        return "positions"
    if any("norm" in part or part.startswith("ln_") for part in parts[:-1]):
        return "norms"
    if "experts" in parts:
        return "experts"
    if any(part.startswith("shared_expert") for part in parts):
        return "shared_experts"
    if any(part in ("gate", "router") for part in parts[:-1]):
        return "router"
    if any(part in ("self_attn", "attn", "attention") for part in parts):
        return "attention"
    if any(part in ("mlp", "feed_forward", "block_sparse_moe") for part in parts):
        return "ffn"
    return "other"


def components(model: torch.nn.Module) -> dict[str, int]:
    """Parameters by component (a tied head is one tensor, counted once, under the embedding)."""
    out: dict[str, int] = {}
    for name, p in model.named_parameters():  # shared tensors are listed once
        out[component(name)] = out.get(component(name), 0) + p.numel()
    return out


def kv_widths(model: torch.nn.Module) -> list[int]:
    """Per attention layer, the numbers one token adds to its cache: K and V widths (GQA; GPT-2's from its fused
    ``c_attn``), or MLA's latent and RoPE key (``kv_a_proj_with_mqa``: what an absorbed MLA caches)."""
    def linear(module: torch.nn.Module, name: str) -> torch.nn.Linear | None:
        child = getattr(module, name, None)
        return child if isinstance(child, torch.nn.Linear) else None

    widths = []
    for module in model.modules():
        latent, k, v = linear(module, "kv_a_proj_with_mqa"), linear(module, "k_proj"), linear(module, "v_proj")
        qkv, o = linear(module, "qkv_proj"), linear(module, "o_proj")
        if latent is not None:
            widths.append(latent.out_features)
        elif k is not None and v is not None and o is not None:
            widths.append(k.out_features + v.out_features)
        elif qkv is not None and o is not None:  # Phi-3: q, k, v stacked in one matrix
            widths.append(qkv.out_features - o.in_features)
        elif hasattr(module, "c_attn") and isinstance(split := getattr(module, "split_size", None), int):
            widths.append(2 * split)  # GPT-2: q, k and v in one Conv1D, split_size wide each
    return widths


def idle_expert_parameters(model: torch.nn.Module, top_k: int) -> int:
    """Parameters of the routed experts one token does not run: in each experts module, (E - k)/E of its
    tensors (each holds all E experts along its first dimension)."""
    idle = 0
    for name, module in model.named_modules():
        if re.search(r"(^|\.)experts$", name):
            params = list(module.parameters(recurse=False))
            n = params[0].shape[0]
            idle += sum(p.numel() for p in params) * (n - top_k) // n
    return idle


def cache_layers(config) -> list[tuple[str, int | None]]:
    """Per layer, what transformers' cache keeps: ("full", None), or ("sliding" / "chunked", the window)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    out = []
    for kind, kwargs in zip(*get_layer_types_and_kwargs(config), strict=True):
        window = kwargs.get("sliding_window")
        name = {"sliding_attention": "sliding", "chunked_attention": "chunked"}.get(kind, kind)
        out.append(("full", None) if name == "full_attention" or (name == "sliding" and not window) else (name, window))
    return out


def reference_totals(cfg: dict, elem_bytes: int = 2) -> dict:
    """What transformers' model of ``cfg`` holds: total, components, active, KV bytes per token, and the cache's
    layers."""
    config = reference_config(cfg)
    model = reference_model(cfg)
    parts = components(model)
    total = sum(parts.values())
    top_k = getattr(config, "num_experts_per_tok", None) or 0
    return {"total": total, "components": parts, "active": total - idle_expert_parameters(model, top_k),
            "kv_bytes_per_token": sum(kv_widths(model)) * elem_bytes, "layers": cache_layers(config)}
