"""What an architecture costs: parameters by component as transformers builds the model (a tied head counts once,
under the embedding; GPT-2's learned positions are a component of their own), the parameters one token runs, the
cache one token adds (lessons 04 and 05) and what a sequence's cache holds at a context (sliding and chunked
layers capped), and the weights' stored bytes."""

from ..kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from ..presets import BYTES_PER_ELEM
from .config_arch import Architecture

COMPONENTS = ("embedding", "positions", "attention", "norms", "ffn", "router", "experts", "shared_experts", "head")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # torch_dtype -> presets.BYTES_PER_ELEM key


def norm_size(a: Architecture, width: int) -> int:
    """Parameters of one of the family's norms over ``width`` features."""
    return {"rms": width, "layer": 2 * width, "layer_nobias": width, "none": 0}[a.spec.norm]


def attention_per_layer(a: Architecture) -> int:
    """q, k, v and o (MLA's down- and up-projections), their biases, and gpt-oss's sinks."""
    d, h, kv, dh = a.d, a.n_heads, a.n_kv_heads, a.head_dim
    if a.mla is not None:
        m = a.mla
        rank, latent = m["q_lora_rank"], m["kv_lora_rank"] + m["qk_rope_head_dim"]
        q = d * h * dh if rank is None else d * rank + a.qkv_bias * rank + rank * h * dh  # queries (low rank)
        kv_params = d * latent + a.qkv_bias * latent + m["kv_lora_rank"] * h * (m["qk_nope_head_dim"]
                                                                                + m["v_head_dim"])
        return q + kv_params + h * m["v_head_dim"] * d + a.o_bias * d
    o_in = d if a.spec.o_width == "hidden" else h * dh
    qkv = d * (h + 2 * kv) * dh + a.qkv_bias * (h + 2 * kv) * dh
    return qkv + o_in * d + a.o_bias * d + (h if a.spec.sinks else 0)


def norms_per_layer(a: Architecture) -> int:
    """The layer's own norms, QK-norm's weights and MLA's latent norms."""
    d, h, kv, dh = a.d, a.n_heads, a.n_kv_heads, a.head_dim
    qk = {None: 0, "weightless": 0, "head": 2 * norm_size(a, dh),
          "all_heads": norm_size(a, h * dh) + norm_size(a, kv * dh),
          "hidden": norm_size(a, d) + norm_size(a, d // h * kv)}[a.qk_norm_kind]
    latent = a.mla["kv_lora_rank"] + (a.mla["q_lora_rank"] or 0) if a.mla else 0  # RMSNorms, whatever the family
    return len(a.spec.layer_norms) * norm_size(a, d) + qk + latent


def mlp_size(a: Architecture, width: int, bias: bool) -> int:
    """One FFN of hidden ``width``: gated (gate, up, down) or plain (up, down), and their biases."""
    gated = a.spec.mlp == "gated"
    matrices = (3 if gated else 2) * a.d * width
    return matrices + (((2 if gated else 1) * width + a.d) if bias else 0)


def parameter_counts(a: Architecture) -> dict[str, int]:
    """Parameters by component, counted as transformers builds the model."""
    moe, dense = a.moe_layers, a.n_layers - a.moe_layers
    counts = {"embedding": a.vocab * a.d, "positions": a.positions * a.d,
              "attention": a.n_layers * attention_per_layer(a),
              "norms": a.n_layers * norms_per_layer(a) + norm_size(a, a.d),
              "ffn": dense * mlp_size(a, a.d_ff or 0, a.mlp_bias) if dense else 0,
              "router": 0, "experts": 0, "shared_experts": 0,
              "head": 0 if a.tied else a.vocab * a.d + (a.vocab if a.head_bias else 0)}
    e = a.experts
    if e is not None:
        counts["router"] = moe * (a.d * e.n + (e.n if e.router_bias else 0))
        counts["experts"] = moe * e.n * expert_size(a)
        width = e.n_shared * e.shared_width  # the shared experts are one FFN this wide
        counts["shared_experts"] = moe * mlp_size(a, width, a.mlp_bias) + (
            moe * a.d if e.shared_gate else 0)
    return counts


def expert_size(a: Architecture) -> int:
    """One routed expert: a gated FFN of the expert width (gpt-oss's with biases)."""
    assert a.experts is not None
    w = a.experts.width
    return 3 * a.d * w + ((2 * w + a.d) if a.experts.expert_bias else 0)


def active_parameters(a: Architecture, counts: dict[str, int]) -> int:
    """Parameters one token runs: all but the routed experts it does not pick, in every MoE layer."""
    if a.experts is None:
        return sum(counts.values())
    return sum(counts.values()) - a.moe_layers * (a.experts.n - a.experts.top_k) * expert_size(a)


def dtype_of(cfg: dict) -> tuple[str, str | None]:
    """(the weights' dtype, the note saying it was assumed)."""
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype is None:
        return "bfloat16", "no torch_dtype in the config: weights and cache counted in bf16"
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"config field 'torch_dtype' must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype, None


def kv_bytes_per_token(a: Architecture, elem_bytes: int) -> int:
    """Cache bytes one token adds across the layers: 2·L·n_kv·d_h (GQA), L·(d_c + d_R) (MLA), times bytes."""
    if a.mla is not None:
        return mla_cache_bytes_per_token(a.n_layers, a.mla["kv_lora_rank"], a.mla["qk_rope_head_dim"], elem_bytes)
    return kv_cache_bytes_per_token(a.n_layers, a.n_kv_heads, a.head_dim, elem_bytes)


def cache_bytes(a: Architecture, elem_bytes: int, context: int, batch: int = 1) -> int:
    """The cache of ``batch`` sequences of ``context`` tokens: a sliding or chunked layer holds at most its window."""
    per_layer = kv_bytes_per_token(a, elem_bytes) // a.n_layers
    held = sum(context if layer.attention == "full" else min(context, layer.window or context) for layer in a.layers)
    return per_layer * held * batch


def weight_bytes(cfg: dict, a: Architecture, counts: dict[str, int]) -> tuple[dict[str, float] | None, list[str]]:
    """Stored bytes per component at the config's dtype, with fp8 blocks (a byte per weight and a 4-byte scale per
    block) or MXFP4 experts (32 four-bit values and an 8-bit scale: 17 bytes per 32). Another quantization is not
    modelled: no bytes (None) and the note why."""
    dtype, note = dtype_of(cfg)
    notes = [note] if note else []
    per = float(BYTES_PER_ELEM[DTYPES[dtype]])
    out = {k: n * per for k, n in counts.items()}
    quant = cfg.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        rows, cols = quant.get("weight_block_size") or (128, 128)
        for k in ("attention", "ffn", "experts", "shared_experts"):
            out[k] = counts[k] * (1 + 4 / (rows * cols))
    elif method == "mxfp4" and a.experts is not None:
        biases = a.moe_layers * a.experts.n * (2 * a.experts.width + a.d) if a.experts.expert_bias else 0
        out["experts"] = (counts["experts"] - biases) * 17 / 32 + biases * per
    elif quant:
        notes.append(f"quantization {method or quant!r} is not modelled: no weight bytes and no decoding floor")
        return None, notes
    return out, notes
