"""The config card's words: one line per field (its lesson, what the field is, and what this value implies for
this family) and the summary of what the whole config implies. Each implication is computed from the value and
the architecture the card read, never written for a typical value."""

import json
import textwrap
from dataclasses import dataclass
from typing import Any

from .config_ffn import activation_text, ffn_rule
from .config_fields import GLOSSARY, Fields, lesson_and_meaning
from .config_rope import SCALING

WIDTH = 100  # the printed card's columns (a notebook's output area)
NORMS = {"rms": "RMSNorm", "layer": "LayerNorm (weight and bias)", "layer_nobias": "LayerNorm without bias",
         "none": "LayerNorm without learned parameters"}
PLACEMENT = {  # a family's norms per layer -> where they sit (lessons 01 and 07)
    ("input_layernorm", "post_attention_layernorm"): "pre-norm: one before attention, one before the FFN",
    ("ln_1", "ln_2"): "pre-norm: one before attention, one before the FFN",
    ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        "sandwich: before and after attention, before and after the FFN",
    ("post_attention_layernorm", "post_feedforward_layernorm"):
        "reordered: after attention and after the FFN, on each sublayer's output (nothing before them)",
    ("input_layernorm",): "parallel: one norm feeds attention and the FFN side by side",
    ("input_layernorm", "pre_feedforward_layernorm"): "pre-norm: one before attention, one before the FFN",
    ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"):
        "sandwich: before and after attention, before and after the FFN",
}
QK_NORM = {"head": "an RMSNorm over each head's d_h features, on queries and keys (lesson 06)",
           "all_heads": "one norm over all query heads' features and one over all keys' (lesson 06)",
           "hidden": "one norm over the queries' d features and one over the keys' (lesson 06)",
           "weightless": "an L2-style RMSNorm without weights on queries and keys of the RoPE layers (lesson 06)"}


@dataclass(frozen=True)
class FieldLine:
    key: str
    value: Any
    lesson: str | None  # None: a field the card does not interpret
    meaning: str
    implies: str = ""


def attention_text(a) -> str:
    """MHA, MQA or GQA by the ratio of query heads to KV heads, e.g. 'GQA 32/8'."""
    kind = "MHA" if a.n_kv_heads == a.n_heads else "MQA" if a.n_kv_heads == 1 else "GQA"
    return f"{kind} {a.n_heads}/{a.n_kv_heads}"


def block_text(card) -> str:
    """The family's block in one line: norms and their placement, QK-norm, attention, FFN."""
    a = card.arch
    spec = a.spec
    parts = [f"{NORMS[spec.norm]}, {len(spec.layer_norms)} per layer ({PLACEMENT[spec.layer_norms]})"]
    parts.append(f"QK-norm: {QK_NORM[a.qk_norm_kind]}" if a.qk_norm_kind else "no QK-norm")
    parts.append("MLA attention" if a.mla else attention_text(a))
    if a.positions:
        parts.append(f"learned absolute positions ({a.positions:,} vectors added to the embedding), no RoPE")
    biases = [name for name, on in (("q/k/v", a.qkv_bias), ("o", a.o_bias), ("FFN", a.mlp_bias),
                                    ("head", a.head_bias)) if on]
    parts.append(f"biases on {', '.join(biases)}" if biases else "no biases")
    return "; ".join(parts)


def layers_text(card) -> str:
    """Which layers keep a window (sliding or chunked) and which have no RoPE."""
    a = card.arch
    out = []
    context = a.context
    for kind in ("sliding", "chunked"):
        windows = sorted({layer.window for layer in a.layers if layer.attention == kind})
        n = sum(layer.attention == kind for layer in a.layers)
        if n:
            text = f"{n} of {a.n_layers} layers {kind} ({' / '.join(f'{w:,}' for w in windows)} tokens)"
            if isinstance(context, int) and min(windows) >= context:
                text += f", no shorter than the {context:,}-token context: no effect"
            out.append(text)
    if a.positions:  # GPT-2: positions enter once, at the embedding
        return "; ".join(out + [f"all {a.n_layers} layers attend to the whole context; positions are learned "
                                f"vectors added to the embedding, no RoPE"])
    if a.nope_layers:
        out.append(f"{a.nope_layers} of {a.n_layers} layers without RoPE (NoPE)")
    return "; ".join(out) or f"all {a.n_layers} layers attend to the whole context, all with RoPE"


def _implications(card) -> dict[str, str]:
    a, p, r = card.arch, card.params, card.rope
    spec = a.spec
    ratio = a.n_heads // a.n_kv_heads
    out = {"model_type": f"{spec.title}: {block_text(card)}",
           "vocab_size": f"{p['embedding']:,} embedding parameters",
           "num_hidden_layers": f"{card.total / a.n_layers / 1e6:,.1f}M parameters per layer on average",
           "tie_word_embeddings": (f"the head is the embedding: {a.vocab * a.d:,} parameters saved" if a.tied else
                                   f"a separate head of {a.vocab * a.d:,} parameters"),
           "head_dim": f"h·d_h = {a.n_heads * a.head_dim:,} (d = {a.d:,})",
           "num_key_value_heads": (f"{ratio} query heads per K/V head: the cache is {ratio}× smaller than MHA's"
                                   if a.mla is None else "MLA caches a latent instead (kv_lora_rank)"),
           spec.act_field: activation_text(a.activation, spec.mlp == "gated", a.family),
           "torch_dtype": f"{card.cache_elem_bytes} bytes per number: weights and cache",
           "layer_types": layers_text(card), "sliding_window": layers_text(card),
           "attention_chunk_size": layers_text(card), "sliding_window_pattern": layers_text(card),
           "no_rope_layers": layers_text(card), "no_rope_layer_interval": layers_text(card)}
    for key in ("attention_bias", "qkv_bias", "use_bias", "mlp_bias", "attention_out_bias"):
        out[key] = block_text(card).split("; ")[-1]
    if spec.qk_norm_switch:
        out[spec.qk_norm_switch] = f"QK-norm: {QK_NORM[a.qk_norm_kind]}" if a.qk_norm_kind else "no QK-norm"
    if a.mla is not None:
        out["kv_lora_rank"] = f"{card.kv_bytes_per_token():,} B/token in the cache (latent + RoPE key)"
    dense_key = spec.moe.dense_width if spec.moe else spec.ffn_width
    if a.d_ff:
        out[dense_key] = ffn_rule(a.d, a.d_ff, a.model_type)
        if spec.ffn_null_is_4d and card.config.get(dense_key) is None:
            out[dense_key] = f"null: d_ff = 4·d = {a.d_ff:,}, {spec.title}'s own rule"
    elif dense_key in card.config or dense_key in (card.config.get("text_config") or {}):
        out[dense_key] = "unused: every layer is a mixture of experts"
    if a.positions:
        out["max_position_embeddings"] = (f"{a.positions:,} learned position vectors: {p['positions']:,} "
                                          f"parameters, and no position beyond {a.positions - 1:,}")
    if a.experts is not None:
        e, moe = a.experts, spec.moe
        assert moe is not None
        out[moe.experts] = f"{e.n} routed experts in each of {a.moe_layers} MoE layers (of {a.n_layers})"
        out["num_experts_per_tok"] = f"{card.active:,} of {card.total:,} parameters active per token"
        out[moe.width] = f"each expert: {ffn_rule(a.d, e.width, a.model_type)}"
        for key in ("first_k_dense_replace", "moe_layers", "decoder_sparse_step", "mlp_only_layers",
                    "interleave_moe_layer_step"):
            out[key] = f"MoE in {a.moe_layers} of {a.n_layers} layers"
        if e.n_shared:
            out[moe.shared if moe.shared != "count" else "n_shared_experts"] = (
                f"{e.n_shared} shared expert(s) of width {e.shared_width:,}, run by every token")
    if r.get("longest") is not None:
        text = f"{r['dim']} of {a.mla['qk_rope_head_dim'] if a.mla else a.head_dim} dims rotated; " \
               f"wavelengths {r['shortest']:.2f} to {r['longest']:,.0f} tokens"
        for key in ("rope_theta", "rope_parameters"):
            out[key] = text
        out["partial_rotary_factor"] = text
    if r.get("scaling"):
        extends = (f", {r['factor']:g}×" + (f" from {r['original']:,}" if r.get("original") else "")
                   + f" to {r['extends_to']:,} tokens") if r.get("factor") else ""
        scaled = SCALING.get(r["scaling"], r.get("not_interpreted", ""))
        out["rope_scaling"] = f"{r['scaling']}: {scaled}{extends}"
        out["rope_parameters"] = out.get("rope_parameters", "") + f"; {out['rope_scaling']}"
    for key, rule in GLOSSARY["accepted"].items():
        out.setdefault(key, rule["why"])
    return out


def field_lines(cfg: dict, f: Fields, card) -> list[FieldLine]:
    """One line per field of the config as given (a multimodal config's text_config expanded, a GGUF file's
    metadata keys): lesson and meaning, the implication (none when the card is refused), or why not interpreted."""
    implies = _implications(card) if card is not None else {}
    if "gguf_metadata" in cfg:
        arch = cfg.get("model_type", "")
        glossary = {k.replace("{arch}", arch): v for k, v in GLOSSARY["gguf"].items()}
        return [FieldLine(k, v, *(glossary[k] if k in glossary else (None, "a GGUF key this card does not know")))
                for k, v in cfg["gguf_metadata"].items()]
    items = list(cfg.items())
    inner = "text_config" in cfg and f.cfg is cfg.get("text_config")
    if inner:
        items = [(k, v) for k, v in items if k != "text_config"] + [(f"text_config.{k}", v)
                                                                    for k, v in cfg["text_config"].items()]
    if card is not None:  # a family's own name for a common field (GPT-2's n_embd) reads the common one's line
        implies = {**{own: implies[common] for common, own in f.aliases.items() if common in implies}, **implies}
    lines = []
    for key, value in items:
        short = key.removeprefix("text_config.")
        own = key.startswith("text_config.") or not inner
        known = lesson_and_meaning(short)
        if own and short in f.problems:
            lines.append(FieldLine(key, value, None, f"not interpreted: {f.problems[short]}"))
        elif known is None:
            lines.append(FieldLine(key, value, None, "not interpreted" + ("" if own else
                                                                         " (outside the language model)")))
        else:
            canonical = f.aliases.get(short, short)  # a name transformers maps to another field
            lines.append(FieldLine(key, value, *known, implies.get(canonical, "") if own else ""))
    return lines


def _show(value) -> str:  # a value in a table cell: long lists and strings cut
    if isinstance(value, list) and len(value) > 6:
        return f"[{len(value):,} items: {', '.join(map(repr, value[:3]))}, ...]"
    return (repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False))[:70]


def field_table(fields: list[FieldLine], width: int = WIDTH) -> str:
    """The fields as a table of ``width`` columns: field, lesson (? for a field not interpreted), value, and
    the meaning with this value's implication, wrapped under its column."""
    key = min(max([30] + [len(f.key) for f in fields]), 38)
    rows = [f"{'field':{key}s} {'lesson':6s} {'value':22s} meaning"]
    for f in fields:
        text = f.meaning + (f" -> {f.implies}" if f.implies else "")
        lead = f"{f.key:{key}s} {f.lesson or '?':6s} {_show(f.value)[:22]:22s} "
        rows += textwrap.wrap(text, width, initial_indent=lead, subsequent_indent=" " * len(lead),
                              break_on_hyphens=False) if len(lead) < width - 20 else [lead + text]
    return "\n".join(rows)


def summary(card, context: int, gpu: str) -> str:
    """Everything the config implies, computed: totals, components, MoE, cache, windows, FFN, RoPE, the floor."""
    a, p = card.arch, card.params
    head = f"{card.name} ({a.model_type}): {card.total:,} parameters"
    if a.experts is not None:
        head += f", {card.active:,} active per token"
    lines = [head + (" (the language model in text_config)" if card.composite else ""),
             f"  block: {block_text(card)}",
             "  by component: " + ", ".join(f"{k} {v:,}" for k, v in p.items() if v)]
    if a.experts is not None:
        e = a.experts
        lines.append(f"  MoE: {a.moe_layers} of {a.n_layers} layers, {e.n} routed experts ({e.top_k} per token) + "
                     f"{e.n_shared} shared, each {e.width:,} wide")
    kind = (f"MLA latent {a.mla['kv_lora_rank']} + RoPE key {a.mla['qk_rope_head_dim']}" if a.mla
            else f"{attention_text(a)} heads of {a.head_dim}")
    beyond = (a.context or context) < context
    lines.append(f"  KV cache ({kind}): {card.kv_bytes_per_token():,} B/token; at {context:,} tokens "
                 f"{card.cache_bytes(context) / 2**30:,.2f} GiB" + (" (beyond its context)" if beyond else ""))
    lines.append(f"  layers: {layers_text(card)}")
    full = card.kv_bytes_per_token() * context
    if card.cache_bytes(context) < full:
        lines.append(f"  windows keep {card.cache_bytes(context) / full:.1%} of the {full / 2**30:,.2f} GiB "
                     f"a cache without them would hold")
    lines.append(f"  FFN ({activation_text(a.activation, a.spec.mlp == 'gated', a.family)}): {card.ffn()}")
    r = card.rope
    if r.get("learned"):
        lines.append(f"  positions: {r['learned']:,} learned vectors of d = {a.d:,} ({p['positions']:,} "
                     f"parameters), no RoPE; the longest context is {r['learned']:,} tokens")
    if r.get("longest") is not None:
        text = (f"  RoPE: base {r['base']:,}, {r['dim']} dims; wavelengths {r['shortest']:.2f} to "
                f"{r['longest']:,.0f} tokens")
        if r["scaling"]:
            text += f"; {r['scaling']} scaling"
            if r.get("factor"):
                text += (f" × {r['factor']:g}" + (f" from {r['original']:,}" if r.get("original") else "")
                         + f" to {r['extends_to']:,} tokens")
            if "longest_scaled" in r:
                text += f" (longest wavelength {r['longest_scaled']:,.0f})"
        lines.append(text)
    floor = card.floor_tokens_per_s(gpu, context)
    if floor is None:
        lines.append("  decoding floor: not computed (the weights' stored bytes are unknown)")
    else:
        lines.append(f"  decoding at batch 1, {context:,} tokens: {card.decode_bytes(context) / 1e9:,.2f} GB per "
                     f"token -> at most {floor:,.1f} tokens/s on {gpu}")
    lines += [f"  assumed: {x}" for x in card.assumptions]
    lines += [f"  not interpreted: {f.key} = {_show(f.value)}" for f in card.unknown]
    return "\n".join(wrapped for line in lines for wrapped in textwrap.wrap(
        line, WIDTH, subsequent_indent="      ", break_on_hyphens=False))
