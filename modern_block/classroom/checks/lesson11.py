"""Lesson 11: what a config implies: the KV cache one token adds (GQA or MLA), the rule behind a d_ff, and the
parameters a mixture-of-experts model runs per token."""

from __future__ import annotations

from ...ffn import swiglu_hidden_dim
from ...interop.config_card import load_config
from ...kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from .core import call_student, exercise_check, fail, judge_int

KV_CASES = ("Llama 3.1 8B", "Qwen3-0.6B", "SmolLM2-135M-Instruct", "DeepSeek-V3", "Kimi K2")


def _kv(cfg: dict, mistake: str | None = None) -> int | None:
    """bf16 cache bytes per token of a config, or with one known mistake (None where it does not apply)."""
    L, b = cfg["num_hidden_layers"], 2
    if "kv_lora_rank" in cfg:
        c, r = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        return {None: mla_cache_bytes_per_token(L, c, r, b), "no_rope_key": L * c * b,
                "latent_twice": L * 2 * c * b + L * r * b,
                "mha": kv_cache_bytes_per_token(L, cfg["num_key_value_heads"],
                                                cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], b),
                "bits": 8 * mla_cache_bytes_per_token(L, c, r, b)}.get(mistake)
    h = cfg["num_attention_heads"]
    kv, dh = cfg.get("num_key_value_heads", h), cfg.get("head_dim") or cfg["hidden_size"] // h
    return {None: kv_cache_bytes_per_token(L, kv, dh, b), "no_two": kv_cache_bytes_per_token(L, kv, dh, b) // 2,
            "query_heads": kv_cache_bytes_per_token(L, h, dh, b),
            "d_over_h": kv_cache_bytes_per_token(L, kv, cfg["hidden_size"] // h, b)
            if cfg["hidden_size"] // h != dh else None,
            "bits": 8 * kv_cache_bytes_per_token(L, kv, dh, b)}.get(mistake)


@exercise_check(components=("kv_cache_bytes_per_token", "mla_cache_bytes_per_token", "config_card"))
def check_kv_bytes_per_token(kv_bytes_per_token) -> str:
    """``kv_bytes_per_token(cfg)``: the bytes one token adds to the bf16 cache of a config (a dict with Hugging
    Face's field names): 2·L·n_kv·d_h·2 for GQA, L·(kv_lora_rank + qk_rope_head_dim)·2 for MLA."""
    __tracebackhide__ = True
    name = "check_kv_bytes_per_token"
    for preset in KV_CASES:
        cfg = load_config(preset)
        what = f"kv_bytes_per_token(<{preset}'s config>)"
        got = call_student(name, what, kv_bytes_per_token, dict(cfg))
        cands = [
            ("the 2 for K and V is missing: a GQA layer caches one key and one value per K/V head.",
             _kv(cfg, "no_two")),
            ("that counts every query head: with GQA only num_key_value_heads heads are cached.",
             _kv(cfg, "query_heads")),
            ("d_h taken as hidden_size / num_attention_heads: this config gives head_dim, and it differs.",
             _kv(cfg, "d_over_h")),
            ("the decoupled RoPE key (qk_rope_head_dim) is cached beside the latent: add it.", _kv(cfg, "no_rope_key")),
            ("the latent counted twice: MLA caches one latent per token (keys and values are rebuilt from it).",
             _kv(cfg, "latent_twice")),
            ("that is the full-MHA cache MLA avoids: cache the latent (kv_lora_rank) and the RoPE key only.",
             _kv(cfg, "mha")),
            ("that is bits, not bytes: bf16 is 2 bytes per number.", _kv(cfg, "bits")),
        ]
        want = _kv(cfg)
        assert want is not None
        judge_int(name, got, want, cands, what,
                  hint="GQA: 2 · layers · K/V heads · head_dim · 2 bytes; MLA: layers · (latent + RoPE key) · 2.")
    return f"{len(KV_CASES)} configs; DeepSeek-V3 {_kv(load_config('DeepSeek-V3')):,} B/token"


FFN_CASES = [(4096, 11008, None), (5120, 13824, None), (4096, 14336, 1.3), (8192, 28672, 1.3), (576, 1536, None),
             (1024, 3072, None), (7168, 18432, None), (2880, 2880, None)]
POWERS = tuple(2**k for k in range(4, 13))  # 16 .. 4,096


def _multiple(d: int, d_ff: int, mult: float | None, mistake: str | None = None) -> int | None:
    """The smallest power of two (16..4,096) that Llama's rule rounds to d_ff, or with one known mistake."""
    fits = []
    for m in POWERS:
        if mistake == "round_down":
            hidden = int(2 * 4 * d / 3)
            hidden = int(mult * hidden) if mult else hidden
            got = m * (hidden // m)
        elif mistake == "multiplier_after":
            got = swiglu_hidden_dim(d, m)
            got = int(mult * got) if mult else got
        else:
            got = swiglu_hidden_dim(d, m, mult)
        if got == d_ff:
            fits.append(m)
    if not fits:
        return None
    return max(fits) if mistake == "largest" else min(fits)


@exercise_check(components=("ffn_rule", "swiglu_hidden_dim"))
def check_smallest_multiple_of(smallest_multiple_of) -> str:
    """``smallest_multiple_of(d, d_ff, ffn_dim_multiplier=None)``: the smallest power of two m from 16 to 4,096
    for which Llama's rule (int(8/3·d), times the multiplier if any, rounded up to a multiple of m) gives d_ff;
    None if none does."""
    __tracebackhide__ = True
    name = "check_smallest_multiple_of"
    for d, d_ff, mult in FFN_CASES:
        what = f"smallest_multiple_of({d}, {d_ff}" + (f", {mult})" if mult else ")")
        got = call_student(name, what, smallest_multiple_of, d, d_ff, *([mult] if mult else []))
        want = _multiple(d, d_ff, mult)
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            fail(name, f"{what}: expected an int or None, got {type(got).__name__} {got!r}.")
        if want is None or got is None:  # None is judged as 0: "no power of two gives it"
            what += " (None is shown as 0)"
        cands = [
            ("rounded down: the rule rounds int(8/3·d) UP to the next multiple.",
             _multiple(d, d_ff, mult, "round_down")),
            ("the multiplier was applied after rounding: multiply int(8/3·d) first, then round up.",
             _multiple(d, d_ff, mult, "multiplier_after")),
            ("that is the largest power of two that works; the exercise asks for the smallest.",
             _multiple(d, d_ff, mult, "largest")),
        ]
        judge_int(name, got or 0, want or 0, [(text, wrong or 0) for text, wrong in cands], what,
                  hint="try m = 16, 32, ..., 4096 in order with Llama's rounding; None if none gives d_ff.")
    return f"{len(FFN_CASES)} cases: Llama 3 70B's 28,672 from multiple_of {_multiple(8192, 28672, 1.3)} up"


MOE_CASES = {  # name -> (MoE layers, routed experts, top-k, d, expert d_ff)
    "Qwen3-235B-A22B": (94, 128, 8, 4096, 1536),
    "DeepSeek-V3": (58, 256, 8, 7168, 2048),
    "Kimi K2": (60, 384, 8, 7168, 2048),
}
TOTALS = {"Qwen3-235B-A22B": 235_093_634_560, "DeepSeek-V3": 671_026_404_352, "Kimi K2": 1_026_408_209_408}


@exercise_check(components=("active_parameters", "config_card"))
def check_active_parameters(active_parameters) -> str:
    """``active_parameters(total, moe_layers, n_experts, top_k, d, d_expert)``: the parameters one token runs in
    a mixture-of-experts model whose routed experts are SwiGLUs of width d_expert: all but the unpicked experts."""
    __tracebackhide__ = True
    name = "check_active_parameters"
    for model, (L, E, k, d, f) in MOE_CASES.items():
        total, expert = TOTALS[model], 3 * d * f
        what = f"active_parameters({total:,}, {L}, {E}, {k}, {d}, {f}) ({model})"
        got = call_student(name, what, active_parameters, total, L, E, k, d, f)
        cands = [
            ("an expert has three matrices (gate, up, down): 3·d·d_expert, not 2.", total - L * (E - k) * 2 * d * f),
            ("the picked experts were subtracted: the idle ones are the n_experts - top_k others.",
             total - L * k * expert),
            ("that counts the picked experts alone: attention, embeddings, norms and shared experts run too.",
             L * k * expert),
            ("one layer's idle experts only: every MoE layer leaves its own n_experts - top_k idle.",
             total - (E - k) * expert),
        ]
        judge_int(name, got, total - L * (E - k) * expert, cands, what,
                  hint="subtract moe_layers · (n_experts - top_k) · 3 · d · d_expert from the total.")
    L, E, k, d, f = MOE_CASES["DeepSeek-V3"]
    return f"3 models; DeepSeek-V3: {(TOTALS['DeepSeek-V3'] - L * (E - k) * 3 * d * f) / 1e9:.1f}B active"
