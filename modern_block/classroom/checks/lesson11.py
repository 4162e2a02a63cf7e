"""Lesson 11: what a config implies: the KV cache one token adds (GQA or MLA), the rule behind a d_ff, the
parameters a mixture-of-experts model runs per token, its FFN's parameters held and active, and the cache a model
with sliding windows holds at a context."""

from __future__ import annotations

from functools import partial

from ...ffn import swiglu_hidden_dim
from ...interop.config_card import load_config
from ...interop.config_source import language_model
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

    run.judge_each(kv_bytes_per_token, run.cases(public, secret, seed=211), run.judge_int, KV_MISTAKES)
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
    public = [_active_case((TOTALS[m], *sizes), m) for m, sizes in MOE_CASES.items()]

    def secret(g):
        L, E, d, f = run.randint(g, 4, 100), run.pick(g, [16, 64, 128, 256]), run.pick(g, [2048, 4096]), \
            run.pick(g, [512, 1024, 1536])
        k = run.pick(g, [1, 2, 4, 8])
        return [_active_case((L * E * 3 * d * f + run.randint(g, 10**8, 10**10), L, E, k, d, f))]

    run.judge_each(active_parameters, run.cases(public, secret, seed=213), run.judge_int, ACTIVE_MISTAKES)
    L, E, k, d, f = MOE_CASES["DeepSeek-V3"]
    return f"3 models; DeepSeek-V3: {_active(TOTALS['DeepSeek-V3'], L, E, k, d, f) / 1e9:.1f}B active"


# ---- exercise 4: a mixture of experts' FFN parameters, held and active ---------------------------------------

MOE_FFN_CASES = {  # name -> (L, d, d_ff, first_k_dense, n_routed, top_k, d_expert, n_shared), as config_card reads it
    "DeepSeek-V3": (61, 7168, 18432, 3, 256, 8, 2048, 1),
    "Kimi K2": (61, 7168, 18432, 1, 384, 8, 2048, 1),
    "Mixtral 8x7B": (32, 4096, 0, 0, 8, 2, 14336, 0),  # every layer MoE: d_ff unused
}
MOE_FFN_GRADER = {  # the grader's own published models (d_ff: the config's dense width, unused with no dense layer)
    "Llama 4 Scout (text)": (48, 5120, 16384, 0, 16, 1, 8192, 1),
    "Qwen3-235B-A22B": (94, 4096, 12288, 0, 128, 8, 1536, 0),
}


def _moe_ffn(L, d, d_ff, first_k, E, k, f, n_shared, *, part, matrices=3, dense="first_k", router="both",
             shared="both", routed_active="top_k") -> int:
    """The FFN sublayers' parameters, held (``part`` 0) or run by one token (1), or with one known mistake."""
    def swiglu(width):  # gate, up and down
        return matrices * d * width

    dense_layers = 0 if dense == "none" else first_k
    moe_layers = L if dense in ("none", "twice") else L - first_k
    gate = d * E if router != "none" else 0
    shared_held = n_shared * swiglu(f) if shared != "none" else 0
    held = dense_layers * swiglu(d_ff) + moe_layers * (gate + E * swiglu(f) + shared_held)
    if part == 0:
        return held
    runs = (E if routed_active == "all" else k) * swiglu(f) + (gate if router == "both" else 0) + (
        shared_held if shared == "both" else 0)
    return dense_layers * swiglu(d_ff) + moe_layers * runs


MOE_FFN_MISTAKES = [
    Mistake("every layer was counted as MoE: the first first_k_dense layers keep a dense SwiGLU of width d_ff.",
            dict(dense="none"), when=lambda c: c.first_k > 0),
    Mistake("the first first_k_dense layers were counted twice, dense and MoE: only the other "
            "L - first_k_dense layers are MoE.", dict(dense="twice"), when=lambda c: c.first_k > 0),
    Mistake("the router was left out: each MoE layer's router is d x E (n_routed), held and run by every token.",
            dict(router="none")),
    Mistake("the router was left out of active: every token runs it to pick its experts.", dict(router="held")),
    Mistake("the shared expert runs for every token: count it in active too.", dict(shared="held"),
            when=lambda c: c.n_shared > 0),
    Mistake("the shared experts were left out: each MoE layer holds n_shared of them, SwiGLUs of width d_expert.",
            dict(shared="none"), when=lambda c: c.n_shared > 0),
    Mistake("active counts every routed expert: a token runs only top_k of them.", dict(routed_active="all")),
    Mistake("a SwiGLU has three matrices (gate, up, down): 3·d·width, not 2.", dict(matrices=2)),
]
MOE_FFN_ALL = [*MOE_FFN_MISTAKES, *Mistake.pairs(MOE_FFN_MISTAKES)]  # and two slips at once


def _moe_ffn_case(args: tuple, name: str = "") -> Case:
    """One call, its two outputs judged as the cases ``held`` and ``active``."""
    call = f"moe_ffn_parameters{args}" + (f" ({name})" if name else "")
    facts = dict(first_k=args[3], n_shared=args[7])
    return Case(call, lambda: None, args, held=Case(f"{call}, held", partial(_moe_ffn, *args, part=0), args, **facts),
                active=Case(f"{call}, active", partial(_moe_ffn, *args, part=1), args, **facts))


@exercise_check
def check_moe_ffn_parameters(run: CheckRun, moe_ffn_parameters) -> str:
    """``moe_ffn_parameters(L, d, d_ff, first_k_dense, n_routed, top_k, d_expert, n_shared)`` -> ``(held, active)``:
    the FFN sublayers' parameters of a DeepSeek-style model (dense SwiGLUs in the first layers; in the others a d x E
    router, E routed and n_shared shared SwiGLU experts of width d_expert), all of them and those one token runs."""
    public = [_moe_ffn_case(sizes, name) for name, sizes in MOE_FFN_CASES.items()]

    def secret(g):
        drawn = [_moe_ffn_case(sizes, name) for name, sizes in MOE_FFN_GRADER.items()]
        for _ in range(2):
            L, E = run.randint(g, 4, 96), run.pick(g, [8, 16, 64, 128, 256])
            args = (L, 128 * run.randint(g, 8, 64), 256 * run.randint(g, 8, 80), run.randint(g, 0, min(L, 5)), E,
                    run.pick(g, [1, 2, 4, 8]), 128 * run.randint(g, 2, 24), run.pick(g, [0, 1, 2]))
            drawn.append(_moe_ffn_case(args))
        return drawn

    for case in run.cases(public, secret, seed=214):
        got = run.call(case.text, moe_ffn_parameters, *case.args)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            run.fail(f"{case.text}: expected a tuple (held, active) of two ints, got {type(got).__name__} {got!r:.60}.")
        run.judge_int(case.held, got[0], MOE_FFN_ALL)
        run.judge_int(case.active, got[1], MOE_FFN_ALL)
    held, active = (_moe_ffn(*MOE_FFN_CASES["DeepSeek-V3"], part=p) for p in (0, 1))
    return f"3 models; DeepSeek-V3's FFNs hold {held / 1e9:.1f}B, {active / 1e9:.1f}B run per token"


# ---- exercise 5: the KV cache of a model with sliding windows, at a context ---------------------------------

KV_AT_CASES = [("Gemma 3 27B", 32_768), ("Gemma 3 27B", 512), ("gpt-oss-120b", 131_072),
               ("Mistral Small 3", 32_768)]
KV_AT_GRADER = ["gpt-oss-20b", "Gemma 3 27B", "Qwen2.5-7B"]  # Qwen2.5-7B: a window, but no layer listed as sliding


def _sliding(cfg: dict, pattern: str = "right") -> list[bool]:
    """Which layers are sliding: ``layer_types``, else every ``sliding_window_pattern``-th layer full (or a known
    misreading of the pattern), else none."""
    L, p = cfg["num_hidden_layers"], cfg.get("sliding_window_pattern")
    if cfg.get("layer_types"):
        return [t == "sliding_attention" for t in cfg["layer_types"]]
    if not p or cfg.get("sliding_window") is None:
        return [False] * L
    full = {"right": lambda i: (i + 1) % p == 0, "off_by_one": lambda i: i % p == 0,
            "inverted": lambda i: (i + 1) % p != 0}[pattern]
    return [not full(i) for i in range(L)]


def _kv_at(cfg: dict, context: int, *, windows="listed", clamp=True, pattern="right", head_dim=True, two=2,
           heads="kv") -> int:
    """bf16 cache bytes of one sequence after ``context`` tokens, or with one known mistake."""
    h = cfg["num_attention_heads"]
    kv = h if heads == "query" else cfg["num_key_value_heads"]
    dh = (cfg.get("head_dim") if head_dim else None) or cfg["hidden_size"] // h
    window = cfg.get("sliding_window")
    sliding = _sliding(cfg, pattern)
    if windows == "every" and window is not None:
        sliding = [True] * len(sliding)
    if windows == "none":
        sliding = [False] * len(sliding)
    local = min(context, window or context) if clamp else window or context  # tokens a sliding layer holds
    return two * kv * dh * 2 * sum(local if s else context for s in sliding)


def _has_local(case: Case) -> bool:
    return any(_sliding(case.cfg))


def _pattern_only(case: Case) -> bool:
    return "sliding_window_pattern" in case.cfg and not case.cfg.get("layer_types")


KV_AT_MISTAKES = [
    Mistake("the window was applied to every layer: only the layers listed as sliding keep a window; a full "
            "layer holds the whole context.", dict(windows="every"), when=_has_local),
    Mistake("every layer holds the whole context: a sliding layer keeps only the last sliding_window tokens.",
            dict(windows="none"), when=_has_local),
    Mistake("a sliding layer holds min(context, sliding_window) tokens: at a context shorter than the window it "
            "holds the context, not the whole window.", dict(clamp=False), when=_has_local),
    Mistake("sliding_window_pattern read off by one: with pattern p the full layers are p - 1, 2p - 1, ... "
            "(counting from 0), so layer 0 is sliding.", dict(pattern="off_by_one"), when=_pattern_only),
    Mistake("sliding_window_pattern read inverted: one layer in p is full, the other p - 1 are sliding.",
            dict(pattern="inverted"), when=_pattern_only),
    Mistake("d_h taken as hidden_size / num_attention_heads: this config gives head_dim, and it differs.",
            dict(head_dim=False)),
    Mistake("the 2 for K and V is missing: each layer caches one key and one value per K/V head.", dict(two=1)),
    Mistake("that counts every query head: only num_key_value_heads heads are cached.", dict(heads="query")),
]
KV_AT_ALL = [*KV_AT_MISTAKES, *Mistake.pairs(KV_AT_MISTAKES)]  # and two slips at once


def _kv_at_case(cfg: dict, context: int, name: str) -> Case:
    return Case(f"kv_cache_at(<{name}>, {context:_})", partial(_kv_at, cfg, context), (cfg, context), cfg=cfg)


def _drawn_window_config(run: CheckRun, g) -> tuple[dict, str]:
    """A config with sliding layers listed in layer_types, or given by a pattern, or none; head_dim given or not."""
    h = run.pick(g, [8, 16, 32])
    L, dh, window = run.randint(g, 4, 64), run.pick(g, [64, 128, 256]), run.pick(g, [128, 512, 1024, 4096])
    cfg = {"num_hidden_layers": L, "hidden_size": h * run.pick(g, [64, 96, 160]), "num_attention_heads": h,
           "num_key_value_heads": h // run.pick(g, [1, 2, 4, 8]), "sliding_window": window}
    if run.pick(g, [True, False]):
        cfg["head_dim"] = dh
    form, every = run.pick(g, ["layer_types", "pattern", "none"]), run.randint(g, 2, 7)
    if form == "layer_types":
        cfg["layer_types"] = ["full_attention" if (i + run.randint(g, 0, 2)) % every == 0 else "sliding_attention"
                              for i in range(L)]
    elif form == "pattern":
        cfg["sliding_window_pattern"] = every
    else:
        cfg["sliding_window"] = None
    shown = {k: v for k, v in cfg.items() if k != "layer_types"}
    if form == "layer_types":
        shown["layer_types"] = "".join("S" if t == "sliding_attention" else "F" for t in cfg["layer_types"])
    return cfg, f"a drawn config {shown}" + (" (S: sliding, F: full)" if form == "layer_types" else "")


@exercise_check
def check_kv_cache_at(run: CheckRun, kv_cache_at) -> str:
    """``kv_cache_at(cfg, context)``: the bf16 bytes one sequence's cache holds after ``context`` tokens: 2·n_kv·d_h·2
    per token per layer, a layer listed as sliding_attention in layer_types (or not every sliding_window_pattern-th)
    holding min(context, sliding_window) tokens, a full layer all of them."""
    public = [_kv_at_case(language_model(load_config(name))[0], context, f"{name}'s config")
              for name, context in KV_AT_CASES]

    def secret(g):
        drawn = []
        for name in KV_AT_GRADER:
            cfg = language_model(load_config(name))[0]
            drawn.append(_kv_at_case(cfg, run.pick(g, [100, 777, 4096, 65_536]), f"{name}'s config"))
        for _ in range(3):
            cfg, text = _drawn_window_config(run, g)
            drawn.append(_kv_at_case(cfg, run.pick(g, [cfg["sliding_window"] or 64, 50, 3000, 40_000]), text))
        return drawn

    run.judge_each(kv_cache_at, run.cases(public, secret, seed=215), run.judge_int, KV_AT_ALL)
    gemma = _kv_at(language_model(load_config("Gemma 3 27B"))[0], 32_768)
    return f"{len(public)} cases; Gemma 3 27B at 32K holds {gemma / 2**30:.2f} GiB"
