"""Read a model's config (a ``config.json``, a preset, or a GGUF file's metadata) and say what each line buys.

``config_card(source)`` explains every field with the lesson that teaches it (fields it does not know are listed
as unknown, with their values, never guessed) and computes what the config implies: parameters by component
(active ones for mixture-of-experts), KV-cache bytes per token and at a context (sliding windows capped), the
FFN sizing rule, RoPE's wavelengths and scaling, and the bytes one decoded token reads, with the floor they set
at a GPU's published bandwidth. The presets (``CONFIG_PRESETS``) are published configs kept in ``configs/``;
the field glossary is ``config_fields.json``.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ffn import swiglu_hidden_dim
from ..kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from ..presets import BYTES_PER_ELEM
from ..rope import scaled_frequencies
from .gguf import gguf_hf_config

HERE = Path(__file__).parent
GLOSSARY = json.loads((HERE / "config_fields.json").read_text(encoding="utf-8"))
CONFIG_PRESETS = {  # name -> (file in configs/, the repository that publishes the config)
    "Llama 3.1 8B": ("llama-3.1-8b.json", "meta-llama/Llama-3.1-8B"),
    "Llama 3.1 70B": ("llama-3.1-70b.json", "meta-llama/Llama-3.1-70B"),
    "Qwen3-0.6B": ("qwen3-0.6b.json", "Qwen/Qwen3-0.6B"),
    "Qwen3-235B-A22B": ("qwen3-235b-a22b.json", "Qwen/Qwen3-235B-A22B"),
    "Mistral 7B v0.3": ("mistral-7b-v0.3.json", "mistralai/Mistral-7B-v0.3"),
    "Gemma 3 27B": ("gemma-3-27b.json", "google/gemma-3-27b-it (its text_config, defaults written out)"),
    "gpt-oss-120b": ("gpt-oss-120b.json", "openai/gpt-oss-120b"),
    "DeepSeek-V3": ("deepseek-v3.json", "deepseek-ai/DeepSeek-V3"),
    "Kimi K2": ("kimi-k2.json", "moonshotai/Kimi-K2-Instruct"),
    "SmolLM2-135M-Instruct": ("smollm2-135m-instruct.json", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
GPU_BANDWIDTH = {  # name -> (peak memory bandwidth in bytes/s, where it is published)
    "H100 SXM": (3.35e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3"),
    "H200": (4.8e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"),
    "A100 80GB SXM": (2.039e12, "NVIDIA A100 datasheet: 2,039 GB/s HBM2e"),
    "MI300X": (5.3e12, "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3"),
    "RTX 4090": (1.008e12, "NVIDIA GeForce RTX 4090 specifications: 1,008 GB/s GDDR6X"),
}
CONTEXT_128K = 131_072
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch_dtype -> presets.BYTES_PER_ELEM key
QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text"}
MLA = {"deepseek_v3", "kimi_k2"}
TIED_DEFAULT = {"gemma3_text": True}  # what transformers assumes when tie_word_embeddings is absent (else False)
KNOWN_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss"} | MLA


# ---- Reading: a preset, a dict, a path or the bytes of a file (JSON or GGUF) ---------------------------------------
def load_config(source) -> dict:
    """The config of a preset name, a dict, a ``config.json`` or ``.gguf`` path, or a file's bytes."""
    if isinstance(source, dict):
        return dict(source)
    if isinstance(source, str) and source in CONFIG_PRESETS:
        source = HERE / "configs" / CONFIG_PRESETS[source][0]
    if isinstance(source, (bytes, bytearray)):
        data, where = bytes(source), "the file's bytes"
    elif isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"source must be a preset ({', '.join(CONFIG_PRESETS)}) or an existing file, "
                             f"got {str(source)!r}")
        if path.read_bytes()[:4] == b"GGUF":
            return gguf_hf_config(path)
        data, where = path.read_bytes(), str(path)
    else:
        raise TypeError(f"source must be a preset name, a dict, a path or bytes, got {type(source).__name__}")
    if data[:4] == b"GGUF":
        raise ValueError("GGUF bytes: give the .gguf file's path (its tensors are read from disk)")
    try:
        cfg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not JSON ({err}); a config.json holds one JSON object") from None
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} holds a JSON {type(cfg).__name__}; a config.json holds one JSON object")
    return cfg


# ---- The architecture: the numbers every computation needs, checked ------------------------------------------------
def _int(cfg: dict, key: str, default=None, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"config field {key!r} is missing; every config must give it (an int >= {minimum})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"config field {key!r} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"config field {key!r} must be >= {minimum}, got {value}")
    return value


def _bool(cfg: dict, key: str, default: bool) -> bool:
    if not isinstance(value := cfg.get(key, default), bool):
        raise TypeError(f"config field {key!r} must be true or false, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class Architecture:
    family: str
    d: int
    n_layers: int
    vocab: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int | None  # the dense FFN's hidden size (None if no layer is dense)
    tied: bool
    qk_norm: bool
    attention_bias: bool = False  # q, k, v and o biases (Qwen2: q, k, v only, always)
    mlp_bias: bool = False
    mla: dict | None = None  # kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    moe_layers: int = 0
    n_experts: int = 0
    top_k: int = 0
    d_expert: int = 0
    n_shared: int = 0
    sliding_layers: int = 0
    window: int | None = None
    assumptions: tuple[str, ...] = ()


def _moe_layers(cfg: dict, family: str, n_layers: int) -> int:
    if family == "gpt_oss":
        return n_layers
    if family == "qwen3_moe":
        step, dense = _int(cfg, "decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
        return sum(1 for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
    if family in MLA:  # DeepSeek's rule: MoE from first_k_dense_replace on, every moe_layer_freq-th layer
        first, freq = _int(cfg, "first_k_dense_replace", 0, minimum=0), _int(cfg, "moe_layer_freq", 1)
        return sum(1 for i in range(first, n_layers) if i % freq == 0)
    return 0


def _sliding(cfg: dict, family: str, n_layers: int) -> tuple[int, int | None]:
    """(layers that keep only a window, the window) from layer_types, Gemma's pattern or Qwen's switch."""
    window = cfg.get("sliding_window")
    if window is None:
        return 0, None
    window = _int(cfg, "sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(f"config field 'layer_types' must list one type per layer ({n_layers}), got {types!r}")
        return sum(t == "sliding_attention" for t in types), window
    if family == "gemma3_text":
        pattern = _int(cfg, "sliding_window_pattern", 6)  # every pattern-th layer is global
        return sum(1 for i in range(n_layers) if (i + 1) % pattern), window
    if family == "mistral":
        return n_layers, window
    if _bool(cfg, "use_sliding_window", False):
        return max(0, n_layers - _int(cfg, "max_window_layers", n_layers, minimum=0)), window
    return 0, None


def architecture(cfg: dict) -> Architecture:
    """The numbers of ``cfg`` the computations need; a missing field or a wrong type raises, naming it."""
    if "text_config" in cfg and "hidden_size" not in cfg:  # a multimodal config: the language model inside it
        return architecture(cfg["text_config"])
    family = cfg.get("model_type", "unknown")
    if not isinstance(family, str):
        raise TypeError(f"config field 'model_type' must be a string, got {type(family).__name__}")
    assumptions = [] if family in KNOWN_FAMILIES else [
        f"model_type {family!r} is not one this card knows: its counts assume a Llama-style block"]
    d, n_layers = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    vocab, n_heads = _int(cfg, "vocab_size"), _int(cfg, "num_attention_heads")
    n_kv = _int(cfg, "num_key_value_heads", n_heads)
    if n_heads % n_kv:
        raise ValueError(f"num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv})")
    if cfg.get("head_dim") is None and d % n_heads:
        raise ValueError(f"head_dim is missing and hidden_size ({d}) is not a multiple of num_attention_heads "
                         f"({n_heads}): the head width is unknown")
    head_dim = _int(cfg, "head_dim", d // n_heads)
    if "tie_word_embeddings" not in cfg:
        assumptions.append(f"tie_word_embeddings absent: transformers' default for {family}, "
                           f"{TIED_DEFAULT.get(family, False)}")
    tied = _bool(cfg, "tie_word_embeddings", TIED_DEFAULT.get(family, False))
    mla: dict[str, Any] | None = None
    if family in MLA:
        mla = {k: _int(cfg, k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        mla["q_lora_rank"] = None if cfg.get("q_lora_rank") is None else _int(cfg, "q_lora_rank")
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    moe_layers = _moe_layers(cfg, family, n_layers)
    moe: dict[str, int] = {}
    if moe_layers:
        experts_key = {"gpt_oss": "num_local_experts", "qwen3_moe": "num_experts"}.get(family, "n_routed_experts")
        moe = dict(n_experts=_int(cfg, experts_key), top_k=_int(cfg, "num_experts_per_tok"),
                   d_expert=_int(cfg, "intermediate_size" if family == "gpt_oss" else "moe_intermediate_size"),
                   n_shared=_int(cfg, "n_shared_experts", 0, minimum=0))
    d_ff = _int(cfg, "intermediate_size") if moe_layers < n_layers else None
    sliding, window = _sliding(cfg, family, n_layers)
    return Architecture(family, d, n_layers, vocab, n_heads, n_kv, head_dim, d_ff, tied, family in QK_NORM,
                        _bool(cfg, "attention_bias", False), _bool(cfg, "mlp_bias", False), mla, moe_layers,
                        sliding_layers=sliding, window=window, assumptions=tuple(assumptions), **moe)


# ---- What the numbers imply ----------------------------------------------------------------------------------------
def parameter_counts(a: Architecture) -> dict[str, int]:
    """Parameters by component (embedding, attention, norms, ffn, router, experts, shared_experts, head),
    counted as transformers builds the model (a tied head counts once, under the embedding)."""
    d, L, h, kv, dh = a.d, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim
    norms = (4 if a.family == "gemma3_text" else 2) * d + (2 * dh if a.qk_norm else 0)  # per layer
    if a.mla is not None:
        m = a.mla
        q = d * h * dh if m["q_lora_rank"] is None else d * m["q_lora_rank"] + m["q_lora_rank"] * h * dh
        attn = (q + d * (m["kv_lora_rank"] + m["qk_rope_head_dim"])  # queries; latent and RoPE key
                + m["kv_lora_rank"] * h * (m["qk_nope_head_dim"] + m["v_head_dim"]) + h * m["v_head_dim"] * d)
        norms += m["kv_lora_rank"] + (m["q_lora_rank"] or 0)  # the latents' RMSNorms
    else:
        attn = 2 * d * h * dh + 2 * d * kv * dh  # q and o; k and v
    attn += _attention_extras(a)
    per_expert = 3 * d * a.d_expert + (2 * a.d_expert + d if a.family == "gpt_oss" else 0)  # + gpt-oss's biases
    router = d * a.n_experts + (a.n_experts if a.family == "gpt_oss" else 0)
    d_ff = a.d_ff or 0
    ffn = 3 * d * d_ff + (2 * d_ff + d if a.mlp_bias else 0)  # per dense layer
    return {"embedding": a.vocab * d, "attention": L * attn, "norms": L * norms + d,
            "ffn": (L - a.moe_layers) * ffn, "router": a.moe_layers * router,
            "experts": a.moe_layers * a.n_experts * per_expert,
            "shared_experts": a.moe_layers * 3 * d * a.d_expert * a.n_shared, "head": 0 if a.tied else a.vocab * d}


def _attention_extras(a: Architecture) -> int:
    """Per layer: biases and gpt-oss's attention sinks (one learned logit per head)."""
    h, kv, dh = a.n_heads, a.n_kv_heads, a.head_dim
    sinks = h if a.family == "gpt_oss" else 0
    if a.family == "qwen2":
        return h * dh + 2 * kv * dh  # q, k, v biases
    return sinks + (h * dh + 2 * kv * dh + a.d if a.attention_bias else 0)  # q, k, v, o biases


def active_parameters(a: Architecture, counts: dict[str, int]) -> int:
    """Parameters one token uses: all but the routed experts it does not pick."""
    idle = counts["experts"] // a.n_experts * (a.n_experts - a.top_k) if a.moe_layers else 0  # all MoE layers
    return sum(counts.values()) - idle


def ffn_rule(d: int, d_ff: int) -> str:
    """Which sizing rule gives ``d_ff`` from ``d`` (lesson 02), or "not a round rule"."""
    if int(8 * d / 3) == d_ff:
        return "8/3·d exactly"
    for mult, name in ((None, "8/3·d rounded up to a multiple of {m}"),
                       (1.3, "Llama 3's rule: 8/3·d × 1.3 rounded up to a multiple of {m}")):
        fits = [m for m in (2**k for k in range(4, 13)) if swiglu_hidden_dim(d, m, mult) == d_ff]
        if fits:
            return name.format(m=" or ".join(f"{m:,}" for m in fits))
    ratio = d_ff / d
    if (2 * ratio).is_integer():
        return f"{ratio:g}·d"
    return f"not a round rule (d_ff/d = {ratio:.3f})"


def rope_summary(cfg: dict, a: Architecture) -> dict:
    """Base, rotated dimensions, shortest and longest wavelength (tokens), and the scaling with what it
    extends to; the longest wavelength after scaling."""
    params = dict(cfg.get("rope_parameters") or {})
    base = params.pop("rope_theta", cfg.get("rope_theta"))
    scaling = params or cfg.get("rope_scaling")
    dim = int((a.mla["qk_rope_head_dim"] if a.mla else a.head_dim) * cfg.get("partial_rotary_factor", 1.0))
    out: dict[str, Any] = {"base": base, "dim": dim, "scaling": None}
    if base is None:
        return out
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ValueError(f"config field 'rope_theta' must be a number > 1, got {base!r}")
    wavelengths = [2 * math.pi * base ** (2 * i / dim) for i in range(dim // 2)]  # tokens per turn, in float64
    out.update(shortest=wavelengths[0], longest=wavelengths[-1])
    if isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        kind = scaling.get("rope_type") or scaling.get("type")
        sc = {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind}
        sc.pop("rope_theta", None)
        out.update(scaling=kind, factor=sc.get("factor"), original=sc.get("original_max_position_embeddings"),
                   extends_to=cfg.get("max_position_embeddings"))
        try:
            theta, _ = scaled_frequencies(dim, float(base), sc)
            out["longest_scaled"] = float((2 * math.pi / theta.double()).max())
        except (TypeError, ValueError) as err:
            out["unsupported"] = str(err)
    return out


def weight_bytes(cfg: dict, a: Architecture, counts: dict[str, int]) -> tuple[dict[str, float], list[str]]:
    """Stored bytes per component: ``torch_dtype``, with fp8 blocks (1 byte per weight and a 4-byte scale per
    block) on the layers' matrices, or MXFP4 experts (32 four-bit values and an 8-bit scale: 17 bytes per 32)."""
    notes = []
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype is None:
        notes.append("no torch_dtype in the config: weights and cache counted in bf16")
        dtype = "bfloat16"
    if dtype not in DTYPES:
        raise ValueError(f"config field 'torch_dtype' must be one of {sorted(DTYPES)}, got {dtype!r}")
    per = float(BYTES_PER_ELEM[DTYPES[dtype]])
    out = {k: n * per for k, n in counts.items()}
    quant = cfg.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        rows, cols = quant.get("weight_block_size") or (128, 128)
        for k in ("attention", "ffn", "experts", "shared_experts"):
            out[k] = counts[k] * (1 + 4 / (rows * cols))
    elif method == "mxfp4":
        biases = a.moe_layers * a.n_experts * (2 * a.d_expert + a.d)
        out["experts"] = (counts["experts"] - biases) * 17 / 32 + biases * per
    elif method is not None:
        notes.append(f"quantization {method!r} is not modelled: weights counted in {dtype}")
    return out, notes


def _show(value) -> str:  # a value in a table cell: long lists and strings cut
    if isinstance(value, list) and len(value) > 6:
        return f"[{len(value):,} items: {', '.join(map(repr, value[:3]))}, ...]"
    return (repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False))[:70]


@dataclass(frozen=True)
class FieldLine:
    key: str
    value: Any
    lesson: str | None  # None: a field the card does not know
    meaning: str
    implies: str = ""


@dataclass
class ConfigCard:
    name: str
    config: dict
    arch: Architecture
    fields: list[FieldLine]
    params: dict[str, int]
    active: int
    weight_bytes: dict[str, float]
    cache_elem_bytes: int
    rope: dict
    assumptions: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.params.values())

    @property
    def unknown(self) -> list[FieldLine]:
        return [f for f in self.fields if f.lesson is None]

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token adds in every layer (lessons 04 and 05), windows not yet full."""
        a = self.arch
        if a.mla is not None:
            return mla_cache_bytes_per_token(a.n_layers, a.mla["kv_lora_rank"],
                                             a.mla["qk_rope_head_dim"], self.cache_elem_bytes)
        return kv_cache_bytes_per_token(a.n_layers, a.n_kv_heads, a.head_dim, self.cache_elem_bytes)

    def cache_bytes(self, context: int, batch: int = 1) -> int:
        """The whole cache of ``batch`` sequences of ``context`` tokens: sliding layers hold at most the window."""
        a = self.arch
        per_layer = self.kv_bytes_per_token() // a.n_layers
        held = (a.n_layers - a.sliding_layers) * context + a.sliding_layers * min(context, a.window or 0)
        return per_layer * held * batch

    def active_weight_bytes(self) -> float:
        """Bytes of the weights one token uses: the routed experts it does not pick are left out."""
        a, w = self.arch, self.weight_bytes
        if "gguf_weight_bytes" in self.config:  # the file's own bytes
            return float(self.config["gguf_weight_bytes"])
        idle = w["experts"] * (a.n_experts - a.top_k) / a.n_experts if a.n_experts else 0.0
        return sum(w.values()) - idle

    def decode_bytes(self, context: int) -> float:
        """Bytes one decoded token reads at batch 1: its weights (one row of an untied embedding) and the cache."""
        a = self.arch
        stored = self.config.get("gguf_embedding_bytes", self.weight_bytes["embedding"])
        embedding = 0.0 if a.tied else stored * (1 - 1 / a.vocab)  # all rows but one
        return self.active_weight_bytes() - embedding + self.cache_bytes(context)

    def floor_tokens_per_s(self, gpu: str = "H100 SXM", context: int = CONTEXT_128K) -> float:
        """The most tokens/s at batch 1 that the GPU's published bandwidth allows (every byte read once)."""
        if gpu not in GPU_BANDWIDTH:
            raise ValueError(f"gpu must be one of {list(GPU_BANDWIDTH)}, got {gpu!r}")
        return GPU_BANDWIDTH[gpu][0] / self.decode_bytes(context)

    def ffn(self) -> str:
        """d_ff / d and the sizing rule each FFN follows (lesson 02)."""
        a = self.arch
        return "; ".join(f"{what} d_ff = {n:,} = {n / a.d:.3f}·d: {ffn_rule(a.d, n)}" for what, n in
                         (("dense", a.d_ff), ("each expert", a.d_expert)) if n)

    def field_table(self) -> str:
        rows = [f"{'field':38s} {'lesson':6s} {'value':34s} meaning"]
        for f in self.fields:
            text = f.meaning + (f" -> {f.implies}" if f.implies else "")
            rows.append(f"{f.key:38s} {f.lesson or '?':6s} {_show(f.value)[:34]:34s} {text}")
        return "\n".join(rows)

    def summary(self, context: int = CONTEXT_128K, gpu: str = "H100 SXM") -> str:
        a, p = self.arch, self.params
        lines = [f"{self.name} ({a.family}): {self.total:,} parameters"
                 + (f", {self.active:,} active per token" if a.n_experts else "")
                 + f"; head {'tied to the embedding' if a.tied else 'untied'}; QK-norm {'yes' if a.qk_norm else 'no'}",
                 "  by component: " + ", ".join(f"{k} {v:,}" for k, v in p.items() if v)]
        if a.n_experts:
            lines.append(f"  MoE: {a.moe_layers} of {a.n_layers} layers, {a.n_experts} routed experts ({a.top_k} per "
                         f"token) + {a.n_shared} shared, each {a.d_expert:,} wide")
        kind = (f"MLA latent {a.mla['kv_lora_rank']} + RoPE key {a.mla['qk_rope_head_dim']}" if a.mla
                else f"GQA {a.n_heads}/{a.n_kv_heads} heads of {a.head_dim}")
        beyond = self.config.get("max_position_embeddings", context) < context
        lines.append(f"  KV cache ({kind}): {self.kv_bytes_per_token():,} B/token; at {context:,} tokens "
                     f"{self.cache_bytes(context) / 2**30:,.2f} GiB" + (" (beyond its context)" if beyond else ""))
        if a.sliding_layers:
            full = self.kv_bytes_per_token() * context
            lines.append(f"  sliding window: {a.sliding_layers} of {a.n_layers} layers keep {a.window:,} tokens: "
                         f"{self.cache_bytes(context) / full:.1%} of the {full / 2**30:,.2f} GiB without windows")
        lines.append(f"  FFN: {self.ffn()}")
        r = self.rope
        if r.get("longest") is not None:
            text = (f"  RoPE: base {r['base']:,}, {r['dim']} dims; wavelengths {r['shortest']:.2f} to "
                    f"{r['longest']:,.0f} tokens")
            if r["scaling"]:
                text += (f"; {r['scaling']} scaling × {r['factor']:g}"
                         + (f" from {r['original']:,}" if r.get("original") else "")
                         + f" to {r['extends_to']:,} tokens")
                if "longest_scaled" in r:
                    text += f" (longest wavelength {r['longest_scaled']:,.0f})"
            lines.append(text)
        lines.append(f"  decoding at batch 1, {context:,} tokens: {self.decode_bytes(context) / 1e9:,.2f} GB per "
                     f"token -> at most {self.floor_tokens_per_s(gpu, context):,.1f} tokens/s on {gpu}")
        lines += [f"  assumed: {x}" for x in self.assumptions]
        lines += [f"  unknown field: {f.key} = {_show(f.value)}" for f in self.unknown]
        return "\n".join(lines)


def _implications(card: ConfigCard) -> dict[str, str]:
    a, p, r = card.arch, card.params, card.rope
    out = {"vocab_size": f"{p['embedding']:,} embedding parameters", "model_type": "QK-norm on queries and keys "
           "(lesson 06)" if a.qk_norm else "",
           "num_hidden_layers": f"{card.total / a.n_layers / 1e6:,.0f}M parameters per layer on average",
           "tie_word_embeddings": f"{'saves' if a.tied else 'a separate head of'} {a.vocab * a.d:,} parameters",
           "head_dim": f"h·d_h = {a.n_heads * a.head_dim:,} (d = {a.d:,})"}
    if a.mla is None:
        out["num_key_value_heads"] = (f"{a.n_heads // a.n_kv_heads} query heads per K/V head: the cache is "
                                      f"{a.n_heads // a.n_kv_heads}× smaller than MHA's")
    else:
        out["kv_lora_rank"] = f"{card.kv_bytes_per_token():,} B/token in the cache"
    if a.d_ff:
        out["intermediate_size"] = ffn_rule(a.d, a.d_ff)
    elif "intermediate_size" in card.config and a.family != "gpt_oss":
        out["intermediate_size"] = "unused: every layer is a mixture of experts"
    if a.n_experts:
        out["num_experts_per_tok"] = f"{card.active:,} of {card.total:,} parameters active"
    if r.get("longest") is not None:
        out["rope_theta"] = f"longest wavelength {r['longest']:,.0f} tokens"
    if r.get("scaling"):
        out["rope_scaling"] = f"{r['scaling']} × {r['factor']:g}, to {r['extends_to']:,} tokens"
    if a.sliding_layers:
        out["sliding_window"] = (f"{a.sliding_layers} of {a.n_layers} layers cache at most {a.window:,} tokens")
    return out


def config_card(source, name: str | None = None) -> ConfigCard:
    """Explain every field of a config and compute what it implies (see the module's docstring)."""
    cfg = load_config(source)
    a = architecture(cfg)
    counts = parameter_counts(a)
    wbytes, notes = weight_bytes(cfg, a, counts)
    cache_elem = int(BYTES_PER_ELEM[DTYPES.get(cfg.get("torch_dtype", cfg.get("dtype")) or "bfloat16", "bf16")])
    card = ConfigCard(name or (source if isinstance(source, str) and source in CONFIG_PRESETS else
                               cfg.get("model_type", "config")), cfg, a, [], counts, active_parameters(a, counts),
                      wbytes, cache_elem, rope_summary(cfg, a), list(a.assumptions) + notes)
    implies = _implications(card)
    glossary, arch = GLOSSARY["config.json"], cfg.get("model_type", "")
    items = list(cfg.get("gguf_metadata", cfg).items())
    if "gguf_metadata" in cfg:
        glossary = {k.replace("{arch}", arch): v for k, v in GLOSSARY["gguf"].items()}
    elif isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg:
        items = [(k, v) for k, v in items if k != "text_config"] + [(f"text_config.{k}", v)
                                                                    for k, v in cfg["text_config"].items()]
    for key, value in items:
        short = key.removeprefix("text_config.")
        lesson, meaning = glossary.get(key, glossary.get(short, (None, "not known to this card")))
        card.fields.append(FieldLine(key, value, lesson, meaning, implies.get(short, "")))
    return card


def transformers_parameter_count(config) -> int:
    """Parameters of the model transformers builds from ``config`` on the meta device (no weights allocated)."""
    import torch
    import transformers as tf

    cfg = load_config(config)
    classes = {"llama": ("Llama", "Llama"), "mistral": ("Mistral", "Mistral"), "qwen2": ("Qwen2", "Qwen2"),
               "qwen3": ("Qwen3", "Qwen3"), "qwen3_moe": ("Qwen3Moe", "Qwen3Moe"), "gpt_oss": ("GptOss", "GptOss"),
               "gemma3_text": ("Gemma3Text", "Gemma3"), "deepseek_v3": ("DeepseekV3", "DeepseekV3"),
               "kimi_k2": ("DeepseekV3", "DeepseekV3")}  # model_type -> transformers' config and model prefixes
    family = cfg.get("model_type")
    if family not in classes:
        raise ValueError(f"model_type must be one of {sorted(classes)}, got {family!r}")
    prefix_config, prefix_model = classes[family]
    config_class, model_class = getattr(tf, prefix_config + "Config"), getattr(tf, prefix_model + "ForCausalLM")
    skip = {"model_type", "architectures", "auto_map", "quantization_config", "transformers_version", "torch_dtype"}
    with torch.device("meta"):
        model = model_class(config_class(**{k: v for k, v in cfg.items() if k not in skip and "gguf" not in k}))
    return sum(p.numel() for p in model.parameters())
