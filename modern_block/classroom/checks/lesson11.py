"""Lesson 11: what a config implies: the KV cache one token adds (GQA or MLA), the rule behind a d_ff, and the
parameters a mixture-of-experts model runs per token."""

from __future__ import annotations

from functools import partial

from ...ffn import swiglu_hidden_dim
from ...interop.config_card import load_config
from ...kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from .core import Case, CheckRun, Mistake, exercise_check

# ---- exercise 1: KV bytes per token of any config ---------------------------------------------------------

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
    kv, dh = cfg.get("num_key_value_heads") or h, cfg.get("head_dim") or cfg["hidden_size"] // h
    return {None: kv_cache_bytes_per_token(L, kv, dh, b), "no_two": kv_cache_bytes_per_token(L, kv, dh, b) // 2,
            "query_heads": kv_cache_bytes_per_token(L, h, dh, b),
            "d_over_h": kv_cache_bytes_per_token(L, kv, cfg["hidden_size"] // h, b)
            if cfg["hidden_size"] // h != dh else None,
            "bits": 8 * kv_cache_bytes_per_token(L, kv, dh, b)}.get(mistake)


KV_MISTAKES = [
    Mistake("the 2 for K and V is missing: a GQA layer caches one key and one value per K/V head.",
            dict(mistake="no_two")),
    Mistake("that counts every query head: with GQA only num_key_value_heads heads are cached.",
            dict(mistake="query_heads")),
    Mistake("d_h taken as hidden_size / num_attention_heads: this config gives head_dim, and it differs.",
            dict(mistake="d_over_h")),
    Mistake("the decoupled RoPE key (qk_rope_head_dim) is cached beside the latent: add it.",
            dict(mistake="no_rope_key")),
    Mistake("the latent counted twice: MLA caches one latent per token (keys and values are rebuilt from it).",
            dict(mistake="latent_twice")),
    Mistake("that is the full-MHA cache MLA avoids: cache the latent (kv_lora_rank) and the RoPE key only.",
            dict(mistake="mha")),
    Mistake("that is bits, not bytes: bf16 is 2 bytes per number.", dict(mistake="bits")),
]


def _kv_case(cfg: dict, name: str) -> Case:
    return Case(f"kv_bytes_per_token(<{name}>)", partial(_kv, cfg), (cfg,))


def _gqa_config(L: int, d: int, h: int, kv: int | None, head_dim) -> dict:
    """A config dict with only GQA's fields; ``kv`` None leaves num_key_value_heads out, ``head_dim`` "absent" leaves
    it out (None keeps it, as null)."""
    cfg = {"num_hidden_layers": L, "hidden_size": d, "num_attention_heads": h}
    if kv is not None:
        cfg["num_key_value_heads"] = kv
    if head_dim != "absent":
        cfg["head_dim"] = head_dim
    return cfg


@exercise_check
def check_kv_bytes_per_token(run: CheckRun, kv_bytes_per_token) -> str:
    """``kv_bytes_per_token(cfg)``: the bytes one token adds to the bf16 cache of a config (a dict with Hugging Face's
    field names): 2·L·n_kv·d_h·2 for GQA (d_h = head_dim, or hidden_size // heads when it is absent or None; n_kv =
    num_key_value_heads, or the heads when absent), L·(kv_lora_rank + qk_rope_head_dim)·2 for MLA."""
    __tracebackhide__ = True
    public = [_kv_case(load_config(p), f"{p}'s config") for p in KV_CASES] + [
        _kv_case(_gqa_config(12, 768, 12, 4, None), "a config with head_dim: null, 12 heads over 4, d = 768"),
        _kv_case(_gqa_config(6, 512, 8, None, "absent"), "a config without num_key_value_heads or head_dim (MHA)")]

    def secret(g):
        h = run.pick(g, [8, 12, 16])
        cfg = _gqa_config(run.randint(g, 2, 60), h * run.pick(g, [64, 96, 128]), h,
                          run.pick(g, [None, 1, 2, 4]), run.pick(g, ["absent", None, 64, 256]))
        mla = {"num_hidden_layers": run.randint(g, 2, 70), "kv_lora_rank": run.pick(g, [256, 512]),
               "qk_rope_head_dim": run.pick(g, [32, 64]), "qk_nope_head_dim": 128, "num_key_value_heads": 32,
               "num_attention_heads": 32, "hidden_size": 4096}
        return [_kv_case(cfg, f"a drawn config {cfg}"), _kv_case(mla, f"a drawn MLA config {mla}")]

    for case in run.cases(public, secret, seed=211):
        got = run.call(case.text, kv_bytes_per_token, dict(case.args[0]))
        run.judge_int(case, got, KV_MISTAKES)
    return f"{len(public)} configs incl. head_dim null; DeepSeek-V3 {_kv(load_config('DeepSeek-V3')):,} B/token"


# ---- exercise 2: the multiple_of behind a d_ff ------------------------------------------------------------

POWERS = tuple(2**k for k in range(4, 13))  # 16 .. 4,096


class _NoneAnswer:
    """"None" as an answer the verdict compares like any other (a 0 or a False is not it)."""

    def __repr__(self) -> str:
        return "None"

    def __eq__(self, other) -> bool:
        return isinstance(other, _NoneAnswer)

    def __hash__(self) -> int:
        return 0


NONE = _NoneAnswer()


def _multiple(d: int, d_ff: int, mult: float | None, mistake: str | None = None, powers=POWERS):
    """The smallest power of two that Llama's rule rounds to d_ff, or with one known mistake; NONE if none does."""
    fits = []
    for m in powers:
        hidden = int(mult * int(2 * 4 * d / 3)) if mult else int(2 * 4 * d / 3)
        if mistake == "round_down":
            got = m * (hidden // m)
        elif mistake == "multiplier_after":
            got = int((mult or 1) * swiglu_hidden_dim(d, m))
        else:
            got = swiglu_hidden_dim(d, m, mult)
        if got == d_ff:
            fits.append(m)
    if not fits:
        return 0 if mistake == "zero" else NONE
    return max(fits) if mistake == "largest" else min(fits)


MULTIPLE_MISTAKES = [
    Mistake("rounded down: the rule rounds int(8/3·d) UP to the next multiple.", dict(mistake="round_down")),
    Mistake("the multiplier was applied after rounding: multiply int(8/3·d) first, then round up.",
            dict(mistake="multiplier_after"), when=lambda c: c.mult is not None),
    Mistake("that is the largest power of two that works; the exercise asks for the smallest.",
            dict(mistake="largest")),
    Mistake("the search stops too early: try every power of two the exercise names, the largest included.",
            dict(powers=POWERS[:-1])),
    Mistake("0 was returned where no power of two gives d_ff: return None then.", dict(mistake="zero")),
]


def _multiple_case(d: int, d_ff: int, mult: float | None) -> Case:
    args = (d, d_ff) if mult is None else (d, d_ff, mult)
    return Case(f"smallest_multiple_of({', '.join(map(str, args))})", partial(_multiple, d, d_ff, mult), args,
                mult=mult)


@exercise_check
def check_smallest_multiple_of(run: CheckRun, smallest_multiple_of) -> str:
    """``smallest_multiple_of(d, d_ff, ffn_dim_multiplier=None)``: the smallest power of two m from 16 to 4,096 for
    which Llama's rule (int(8/3·d), times the multiplier if any, rounded up to a multiple of m) gives d_ff; None if
    none does."""
    __tracebackhide__ = True
    public = [_multiple_case(*c) for c in [(4096, 11008, None), (5120, 13824, None), (4096, 14336, 1.3),
                                           (8192, 28672, 1.3), (576, 1536, None), (1024, 3072, None),
                                           (7168, 18432, None), (2880, 2880, None), (8192, 24576, None)]]

    def secret(g):
        d, mult = 64 * run.randint(g, 8, 160), run.pick(g, [None, 1.3, 1.5])
        d_ff = swiglu_hidden_dim(d, run.pick(g, POWERS), mult)
        return [_multiple_case(d, d_ff, mult), _multiple_case(d, d_ff + 8 * run.randint(g, 1, 4), mult)]

    for case in run.cases(public, secret, seed=212):
        got = run.call(case.text, smallest_multiple_of, *case.args)
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            run.fail(f"{case.text}: expected an int or None, got {type(got).__name__} {got!r}.")
        run.judge_equal(case, NONE if got is None else got, MULTIPLE_MISTAKES)
    return (f"{len(public)} cases: Llama 3 70B's 28,672 from multiple_of {_multiple(8192, 28672, 1.3)} up, one "
            "needing 4,096, none for DeepSeek-V3")


# ---- exercise 3: active parameters of a mixture of experts -------------------------------------------------

MOE_CASES = {  # name -> (MoE layers, routed experts, top-k, d, expert d_ff)
    "Qwen3-235B-A22B": (94, 128, 8, 4096, 1536),
    "DeepSeek-V3": (58, 256, 8, 7168, 2048),
    "Kimi K2": (60, 384, 8, 7168, 2048),
}
TOTALS = {"Qwen3-235B-A22B": 235_093_634_560, "DeepSeek-V3": 671_026_404_352, "Kimi K2": 1_026_408_209_408}


def _active(total, L, E, k, d, f, *, matrices=3, idle="unpicked", layers=True, alone=False) -> int:
    per_expert = matrices * d * f
    if alone:
        return L * k * per_expert
    return total - (L if layers else 1) * ((E - k) if idle == "unpicked" else k) * per_expert


ACTIVE_MISTAKES = [
    Mistake("an expert has three matrices (gate, up, down): 3·d·d_expert, not 2.", dict(matrices=2)),
    Mistake("the picked experts were subtracted: the idle ones are the n_experts - top_k others.",
            dict(idle="picked")),
    Mistake("that counts the picked experts alone: attention, embeddings, norms and shared experts run too.",
            dict(alone=True)),
    Mistake("one layer's idle experts only: every MoE layer leaves its own n_experts - top_k idle.",
            dict(layers=False)),
]


def _active_case(args: tuple, name: str = "") -> Case:
    total, L, E, k, d, f = args
    return Case(f"active_parameters({total:_}, {L}, {E}, {k}, {d}, {f})" + (f" ({name})" if name else ""),
                partial(_active, *args), args)


@exercise_check
def check_active_parameters(run: CheckRun, active_parameters) -> str:
    """``active_parameters(total, moe_layers, n_experts, top_k, d, d_expert)``: the parameters one token runs in a
    mixture-of-experts model whose routed experts are SwiGLUs of width d_expert: all but the unpicked experts."""
    __tracebackhide__ = True
    public = [_active_case((TOTALS[m], *sizes), m) for m, sizes in MOE_CASES.items()]

    def secret(g):
        L, E, d, f = run.randint(g, 4, 100), run.pick(g, [16, 64, 128, 256]), run.pick(g, [2048, 4096]), \
            run.pick(g, [512, 1024, 1536])
        k = run.pick(g, [1, 2, 4, 8])
        return [_active_case((L * E * 3 * d * f + run.randint(g, 10**8, 10**10), L, E, k, d, f))]

    for case in run.cases(public, secret, seed=213):
        got = run.call(case.text, active_parameters, *case.args)
        run.judge_int(case, got, ACTIVE_MISTAKES)
    L, E, k, d, f = MOE_CASES["DeepSeek-V3"]
    return f"3 models; DeepSeek-V3: {_active(TOTALS['DeepSeek-V3'], L, E, k, d, f) / 1e9:.1f}B active"
