"""Read a model's config (a ``config.json``, a preset, or a GGUF file's metadata) and say what each line buys.

``config_card(source)`` explains every field with the lesson that teaches it and computes what the config implies,
the way the model's family builds its block (``config_families``): parameters by component and active per token,
the KV cache per token and at a context (sliding and chunked layers capped), the FFN's width and rule, RoPE's
wavelengths and scaling, and the bytes one decoded token reads with the floor they set at a GPU's bandwidth.
A config it cannot read exactly (a family it does not read, a field it cannot interpret) raises ``ConfigRefused``,
a ``ValueError`` naming the family and the fields, with no totals: the card never guesses. The parts live in
``config_source`` (where configs come from), ``config_fields`` (reading fields), ``config_arch`` (the
architecture), ``config_counts`` (parameters and bytes), ``config_ffn``, ``config_rope`` and ``config_text``
(the card's words).
"""

from dataclasses import dataclass, field

from ..presets import BYTES_PER_ELEM
from .config_arch import Architecture, read_architecture
from .config_counts import (
    COMPONENTS,
    DTYPES,
    active_parameters,
    cache_bytes,
    dtype_of,
    kv_bytes_per_token,
    parameter_counts,
    weight_bytes,
)
from .config_ffn import ffn_kind, ffn_rule
from .config_fields import GLOSSARY, ConfigRefused, Fields
from .config_rope import rope_summary
from .config_source import CONFIG_PRESETS, PUBLISHED, language_model, load_config
from .config_text import FieldLine, field_lines, field_table, summary

__all__ = ["COMPONENTS", "CONFIG_PRESETS", "CONTEXT_128K", "ConfigCard", "ConfigRefused", "FieldLine", "GLOSSARY",
           "GPU_BANDWIDTH", "PUBLISHED", "active_parameters", "architecture", "config_card", "ffn_rule",
           "load_config", "parameter_counts", "transformers_parameter_count"]

GPU_BANDWIDTH = {  # name -> (peak memory bandwidth in bytes/s, where it is published)
    "H100 SXM": (3.35e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3"),
    "H200": (4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    "A100 80GB SXM": (2.039e12, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e"),
    "MI300X": (5.3e12, "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3"),
    "RTX 4090": (1.008e12, "NVIDIA GeForce RTX 4090 specifications: 1,008 GB/s GDDR6X"),
}
CONTEXT_128K = 131_072


@dataclass
class ConfigCard:
    name: str
    config: dict  # the whole config as given
    arch: Architecture
    fields: list[FieldLine]
    params: dict[str, int]
    active: int
    weight_bytes: dict[str, float] | None  # None: a quantization the card does not model
    cache_elem_bytes: int
    rope: dict
    assumptions: list[str] = field(default_factory=list)
    composite: bool = False  # read from a multimodal config's text_config

    @property
    def total(self) -> int:
        return sum(self.params.values())

    @property
    def unknown(self) -> list[FieldLine]:
        return [f for f in self.fields if f.lesson is None]

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token adds in every layer (lessons 04 and 05), windows not yet full."""
        return kv_bytes_per_token(self.arch, self.cache_elem_bytes)

    def cache_bytes(self, context: int, batch: int = 1) -> int:
        """The whole cache of ``batch`` sequences of ``context`` tokens: local layers hold at most their window."""
        return cache_bytes(self.arch, self.cache_elem_bytes, context, batch)

    def active_weight_bytes(self) -> float | None:
        """Bytes of the weights one token uses (the routed experts it does not pick left out); None if unknown."""
        a, w = self.arch, self.weight_bytes
        if "gguf_weight_bytes" in self.config:  # the file's own bytes
            return float(self.config["gguf_weight_bytes"])
        if w is None:
            return None
        idle = w["experts"] * (a.n_experts - a.top_k) / a.n_experts if a.n_experts else 0.0
        return sum(w.values()) - idle

    def decode_bytes(self, context: int) -> float | None:
        """Bytes one decoded token reads at batch 1: its weights (one row of an untied embedding, one of learned
        positions) and the cache."""
        active = self.active_weight_bytes()
        if active is None or self.weight_bytes is None:
            return None
        a = self.arch
        stored = self.config.get("gguf_embedding_bytes", self.weight_bytes["embedding"])
        embedding = 0.0 if a.tied else stored * (1 - 1 / a.vocab)  # all rows but one
        positions = self.weight_bytes["positions"] * (1 - 1 / a.positions) if a.positions else 0.0
        return active - embedding - positions + self.cache_bytes(context)

    def floor_tokens_per_s(self, gpu: str = "H100 SXM", context: int = CONTEXT_128K) -> float | None:
        """The most tokens/s at batch 1 the GPU's published bandwidth allows (every byte read once); None when
        the weights' bytes are unknown."""
        if gpu not in GPU_BANDWIDTH:
            raise ValueError(f"gpu must be one of {list(GPU_BANDWIDTH)}, got {gpu!r}")
        read = self.decode_bytes(context)
        return None if read is None else GPU_BANDWIDTH[gpu][0] / read

    def ffn(self) -> str:
        """d_ff / d and the rule (if any) behind each FFN width (lesson 02)."""
        a = self.arch
        widths = [("dense", a.d_ff), ("each expert", a.d_expert),
                  ("shared expert", a.experts.shared_width if a.experts and a.n_shared else 0)]
        return "; ".join(f"{what} d_ff = {n:,}: {ffn_rule(a.d, n, a.model_type)}" for what, n in widths if n)

    def ffn_kind(self) -> str:
        """SwiGLU, GeGLU, ... or a plain MLP: what the activation field makes of this family's FFN."""
        return ffn_kind(self.arch.activation, self.arch.spec.mlp == "gated", self.arch.family)

    def field_table(self) -> str:
        return field_table(self.fields)

    def summary(self, context: int = CONTEXT_128K, gpu: str = "H100 SXM") -> str:
        return summary(self, context, gpu)


def _gguf_problems(cfg: dict) -> dict[str, str]:
    arch = cfg.get("model_type", "")
    known = {k.replace("{arch}", arch) for k in GLOSSARY["gguf"]}
    return {k: "a GGUF key this card does not know" for k in cfg["gguf_metadata"] if k not in known}


def _read(cfg: dict) -> tuple[Fields, Architecture | None, dict]:
    """The language model's fields, its architecture (None if refused) and the config the bytes come from."""
    text, composite = language_model(cfg)
    f = Fields(text)
    if "gguf_metadata" in cfg:
        f.problems |= _gguf_problems(cfg)
    arch = read_architecture(f) if f.family else None
    outer = {k: cfg[k] for k in ("torch_dtype", "dtype", "quantization_config") if composite and k in cfg}
    return f, arch, {**outer, **text}


def architecture(source) -> Architecture:
    """The architecture of a config (a multimodal one's language model); ``ConfigRefused`` if the card cannot
    read it exactly."""
    f, arch, _ = _read(load_config(source))
    f.refuse_if_unreadable()
    assert arch is not None
    return arch


def config_card(source, name: str | None = None) -> ConfigCard:
    """Explain every field of a config and compute what it implies (see the module's docstring)."""
    cfg = load_config(source)
    f, arch, own = _read(cfg)
    if arch is None or f.problems:
        f.refuse_if_unreadable(tuple(field_lines(cfg, f, None)))
    assert arch is not None
    counts = parameter_counts(arch)
    wbytes, notes = weight_bytes(own, arch, counts)
    dtype, _ = dtype_of(own)
    rope = rope_summary(f, arch)
    title = name or (source if isinstance(source, str) and (source in CONFIG_PRESETS or source in PUBLISHED)
                     else cfg.get("model_type", "config"))
    card = ConfigCard(title, cfg, arch, [], counts, active_parameters(arch, counts), wbytes,
                      int(BYTES_PER_ELEM[DTYPES[dtype]]), rope, list(arch.assumptions) + notes,
                      composite=language_model(cfg)[1])
    if "not_interpreted" in rope:
        card.assumptions.append(f"not interpreted: {rope['not_interpreted']} (no total depends on it)")
    card.fields = field_lines(cfg, f, card)
    return card


def transformers_parameter_count(config) -> int:
    """Parameters of the model transformers builds from ``config`` on the meta device (no weights allocated)."""
    from .config_reference import reference_model

    return sum(p.numel() for p in reference_model(load_config(config)).parameters())
