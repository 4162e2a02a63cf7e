"""Lesson 04: grouped KV heads, GQA attention and decoding with a KV cache."""

from __future__ import annotations

from functools import partial

import torch

from ...attention import GQAttention
from ...rmsnorm import RMSNorm
from ...rope import rope_cache
from .core import Case, CheckRun, Mistake, Output, dtype_name, exercise_check, matches, shape_of
from .formulas import rms_norm64, rope64

# ---- exercise 1: grouped KV heads ---------------------------------------------------------------------------


def _repeat64(k, n_rep, *, how="grouped"):
    return {"grouped": lambda: k.repeat_interleave(n_rep, dim=1), "tiled": lambda: k.repeat(1, n_rep, 1, 1),
            "sequence": lambda: k.repeat_interleave(n_rep, dim=2),
            "features": lambda: k.repeat_interleave(n_rep, dim=-1)}[how]()


REPEAT_MISTAKES = [
    Mistake("KV heads tiled (k.repeat) instead of grouped (repeat_interleave): query head j must read KV head "
            "j // n_rep, so copies of one KV head sit next to each other (0,0,1,1), not (0,1,0,1).",
            dict(how="tiled")),
    Mistake("repeated along the sequence (dim 2) instead of the head dimension (dim 1).", dict(how="sequence")),
    Mistake("repeated along the head size (last dim) instead of the head dimension (dim 1).", dict(how="features")),
]


def _repeat_case(k: torch.Tensor, n_rep: int) -> Case:
    return Case(f"repeat_kv on k of shape {shape_of(k)}, n_rep={n_rep}", partial(_repeat64, k, n_rep), (k, n_rep))


@exercise_check
def check_repeat_kv(run: CheckRun, repeat_kv) -> str:
    """``repeat_kv(k, n_rep)``: [B, n_kv, T, dh] → [B, n_kv·n_rep, T, dh], query head j reading KV head
    j // n_rep (grouped)."""
    g = run.rng(5)
    public = [_repeat_case(torch.randn(*shape, generator=g), n_rep) for shape, n_rep in
              [((2, 2, 3, 4), 3), ((1, 1, 5, 4), 4), ((2, 3, 2, 4), 1), ((1, 4, 1, 2), 2)]]

    def secret(g):
        shape = (run.randint(g, 1, 3), run.randint(g, 2, 5), run.randint(g, 1, 5), 2 * run.randint(g, 1, 4))
        return [_repeat_case(torch.randn(*shape, generator=g), run.randint(g, 2, 5))]

    run.judge_each(repeat_kv, run.cases(public, secret, seed=106), run.judge, REPEAT_MISTAKES, rtol=0, atol=0)
    return "4 cases: GQA, MQA (one KV head), n_rep = 1"


# ---- exercise 2: GQA attention (and lesson 06's QK-norm attention) -----------------------------------------


def _attention64(p, x, cos, sin, *, h, kv, dh, eps, qk_norm, group="grouped", mask="causal", scale="dh",
                 rope="qk", layout="half", sign=1.0, norm="before", split="ok", merge="ok", softmax_dim=-1):
    """GQA attention in float64 from the weights ``p``, with one knob per common mistake."""
    B, T, d = x.shape
    x = x.double()

    def heads(t, n):
        return t.view(B, T, n, dh).transpose(1, 2) if split == "ok" else t.reshape(B, n, T, dh)

    q, k, v = heads(x @ p["wq"].T, h), heads(x @ p["wk"].T, kv), heads(x @ p["wv"].T, kv)

    def rms(t, w):
        return rms_norm64(t, w, eps)

    rot = partial(rope64, cos=cos, sin=sin, layout=layout, sign=sign)
    if qk_norm and norm in ("before", "swap", "q_only", "k_only"):
        q_w, k_w = (p["k_norm"], p["q_norm"]) if norm == "swap" else (p["q_norm"], p["k_norm"])
        q = rms(q, q_w) if norm != "k_only" else q
        k = rms(k, k_w) if norm != "q_only" else k
    q = rot(q) if rope in ("qk", "qkv", "q") else q
    k = rot(k) if rope in ("qk", "qkv", "k") else k
    v = rot(v) if rope == "qkv" else v
    if qk_norm and norm == "after":
        q, k = rms(q, p["q_norm"]), rms(k, p["k_norm"])
    rep = h // kv
    if group == "grouped":
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    else:
        k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
    s = q @ k.transpose(-1, -2) * {"dh": dh ** -0.5, "head_dim_lin": 1.0 / dh, "none": 1.0, "d": d ** -0.5}[scale]
    if mask != "none":
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~(keep.T if mask == "anti" else keep), float("-inf"))
    o = s.softmax(softmax_dim).nan_to_num(0.0) @ v  # [B, h, T, dh]
    o = o.transpose(1, 2).reshape(B, T, h * dh) if merge == "ok" else o.reshape(B, T, h * dh)
    return o @ p["wo"].T


def _qk_norm(c: Case) -> bool:
    return c.qk_norm


ATTENTION_MISTAKES = [
    Mistake("KV heads tiled instead of grouped: query head j must read KV head j // (n_heads / n_kv_heads). Use "
            "repeat_interleave(n_rep, dim=1) (or enable_gqa=True), not repeat / expand over a new leading dim.",
            dict(group="tiled"), when=lambda c: 1 < c.kv < c.h),
    Mistake("no causal mask: each token also attends to later tokens. Use is_causal=True, or fill the scores above "
            "the diagonal with -inf before the softmax.", dict(mask="none")),
    Mistake("the causal mask is upside down: it hides the past and shows the future (tril/triu mixed up).",
            dict(mask="anti")),
    Mistake("wrong softmax scale: the scores were divided by head_dim; divide by sqrt(head_dim).",
            dict(scale="head_dim_lin")),
    Mistake("no softmax scale: divide the scores q·k by sqrt(head_dim).", dict(scale="none")),
    Mistake("wrong softmax scale: 1/sqrt(d) uses the model width; use 1/sqrt(head_dim).", dict(scale="d")),
    Mistake("RoPE is not applied: rotate q and k with apply_rope(q, cos, sin), apply_rope(k, cos, sin).",
            dict(rope="none")),
    Mistake("RoPE was applied to q only; rotate k too.", dict(rope="q")),
    Mistake("RoPE was applied to k only; rotate q too.", dict(rope="k")),
    Mistake("RoPE was applied to the values too; it rotates q and k only (positions enter through the scores).",
            dict(rope="qkv")),
    Mistake("the interleaved RoPE layout; these models use the half-split layout of apply_rope.",
            dict(layout="interleaved")),
    Mistake("RoPE rotates in the wrong direction (the sign of sin).", dict(sign=-1.0)),
    Mistake("QK-norm after RoPE: normalise q and k first (self.q_norm, self.k_norm), then rotate them.",
            dict(norm="after"), when=_qk_norm),
    Mistake("QK-norm is missing: apply self.q_norm to q and self.k_norm to k (per head, before RoPE).",
            dict(norm="none"), when=_qk_norm),
    Mistake("q_norm and k_norm were swapped: q goes through self.q_norm, k through self.k_norm.",
            dict(norm="swap"), when=_qk_norm),
    Mistake("QK-norm on q only: k needs self.k_norm too.", dict(norm="q_only"), when=_qk_norm),
    Mistake("QK-norm on k only: q needs self.q_norm too.", dict(norm="k_only"), when=_qk_norm),
    Mistake("the heads were split with view(B, n_heads, T, head_dim), which mixes tokens and features; use "
            "view(B, T, n_heads, head_dim).transpose(1, 2).", dict(split="bad")),
    Mistake("the heads were merged without transposing back: out.transpose(1, 2).reshape(B, T, n_heads·head_dim).",
            dict(merge="bad"), when=lambda c: c.h > 1),
    Mistake("softmax over the wrong axis (over queries); normalise each query's scores over the keys (last dim).",
            dict(softmax_dim=-2)),
]
# (tables that start at position 0 instead of the ones given change nothing here: RoPE's scores depend on the
# distance between two positions only, and a forward without a cache shifts queries and keys alike)
ALL_ATTENTION_MISTAKES = [*ATTENTION_MISTAKES, *Mistake.pairs(ATTENTION_MISTAKES)]


def _params(ref: GQAttention) -> dict:
    p: dict = {k: getattr(ref, k).weight.detach().double() for k in ("wq", "wk", "wv", "wo")}
    for k in ("q_norm", "k_norm"):
        mod = ref.get_submodule(k)
        p[k] = mod.weight.detach().double() if isinstance(mod, RMSNorm) else None
    return p


def grade_attention_module(run: CheckRun, make_student, qk_norm: bool | None = None, load_hints=None) -> str:
    """Load the package's random weights into the student's module and compare its forward with the reference on
    every configuration (``qk_norm``: fixed on, or None to try both); the same checks lessons 04 and 06 use."""
    g = run.rng(6)
    configs = [("GQA with 4 query heads over 2 KV heads, x of shape [2, 6, 32]", 32, 4, 2, True, 2, 6, 0),
               ("MQA (one KV head), x of shape [1, 5, 32]", 32, 4, 1, False, 1, 5, 0),
               ("MHA (3 KV heads for 3 heads), x of shape [2, 4, 24]", 24, 3, 3, True, 2, 4, 0),
               ("GQA 8 over 2, x of shape [2, 9, 64] at positions 100..108", 64, 8, 2, False, 2, 9, 100),
               ("GQA 4 over 2, one token (T = 1), x of shape [2, 1, 32]", 32, 4, 2, True, 2, 1, 0)]

    def case(desc, d, h, kv, on, B, T, offset, seed):
        on = on if qk_norm is None else qk_norm
        ref = run.randomize(GQAttention(d, h, kv, qk_norm=on), seed)
        x = torch.randn(B, T, d, generator=g)
        cos, sin = (t[offset:] for t in rope_cache(offset + T, d // h))
        expect = partial(_attention64, _params(ref), x, cos, sin, h=h, kv=kv, dh=d // h, eps=1e-6, qk_norm=on)
        text = f"forward(x, cos, sin) with {desc}" + (f", qk_norm={on}" if qk_norm is None else "")
        return Case(text, expect, (x, cos, sin), ref=ref, h=h, kv=kv, qk_norm=on)

    def secret(g):
        kv = run.pick(g, [1, 2])
        h, T = kv * run.pick(g, [1, 2, 3]), run.randint(g, 2, 8)
        d = h * 2 * run.randint(g, 2, 6)
        return [case(f"{h} heads over {kv}, x of shape [2, {T}, {d}] at drawn positions", d, h, kv,
                     run.pick(g, [False, True]), 2, T, run.randint(g, 0, 50), 90)]

    cases = run.cases([case(*c, 10 + n) for n, c in enumerate(configs)], secret, seed=107)
    for c in cases:
        student = make_student(c.args[0].shape[-1], c.h, c.kv, c.qk_norm)
        run.load_weights(student, c.ref, load_hints)
        got = run.call(c.text, student, *c.args)
        run.judge(c, got, ALL_ATTENTION_MISTAKES, atol=2e-5, rtol=1e-4, dims=("batch", "position", ""))
    on = True if qk_norm is None else qk_norm
    ref = run.randomize(GQAttention(32, 4, 2, qk_norm=on), 30)
    student = make_student(32, 4, 2, on)
    run.load_weights(student, ref, load_hints)
    student = run.call("module.to(torch.bfloat16)", student.to, torch.bfloat16)
    ref = ref.to(torch.bfloat16)
    x = torch.randn(2, 5, 32, generator=g).to(torch.bfloat16)
    cos, sin = rope_cache(5, 8)
    bf = Case("forward on a bfloat16 x of shape [2, 5, 32] (module in bfloat16)", lambda: ref(x, cos, sin))
    got = run.call(bf.text, student, x, cos, sin)
    run.judge(bf, got, rtol=5e-2, atol=5e-2 * bf.want.abs().max().item())
    run.require(getattr(got, "dtype", None) == torch.bfloat16, bf.text,
                f"a bfloat16 module and input gave a {dtype_name(got)} output; keep the input's dtype (cast the RoPE "
                "tables to x.dtype).")
    qk = "QK-norm on/off" if qk_norm is None else "random QK-norm scales"
    return f"{len(configs) + 1} cases: GQA, MQA, MHA, {qk}, batch 1 and 2, T = 1, positions from 100, bfloat16"


GQA_LOAD_HINTS = {
    **dict.fromkeys(("wk.weight", "wv.weight"), "wk and wv project to n_kv_heads·head_dim features (fewer K/V heads "
                                                "than query heads)."),
    "q_norm": "With qk_norm=True: self.q_norm = RMSNorm(head_dim) and self.k_norm = RMSNorm(head_dim) (per head, "
              "not over d); with qk_norm=False use nn.Identity().",
    "wq": "Name the projections wq, wk, wv (d → heads·head_dim) and wo (n_heads·head_dim → d), all bias-free.",
}


@exercise_check
def check_gqattention(run: CheckRun, GQAttentionClass) -> str:
    """``GQAttention(d, n_heads, n_kv_heads, qk_norm=True)`` with wq/wk/wv/wo/q_norm/k_norm and
    ``forward(x, cos, sin)``, causal."""

    def make(d, h, kv, qk_norm):
        return run.call(f"GQAttention({d}, {h}, {kv}, qk_norm={qk_norm})", GQAttentionClass, d, h, kv,
                        qk_norm=qk_norm)

    return grade_attention_module(run, make, load_hints=GQA_LOAD_HINTS)


# ---- exercise 3: decoding with a KV cache --------------------------------------------------------------------


def _decode64(ref: GQAttention, x, cos, sin, schedule, *, positions="offset", cache="rotated", chunk_mask="offset",
              prefill_mask=True, use_cache=True, update=True, group="grouped"):
    """Chunked decoding with a KV cache in float64, with knobs for the common mistakes: the outputs of all chunks,
    concatenated along T."""
    p = _params(ref)
    h, kv, dh = ref.h, ref.kv, ref.dh
    B = x.shape[0]
    x = x.double()
    keys: list[torch.Tensor] = []
    raw_keys: list[torch.Tensor] = []
    vals: list[torch.Tensor] = []
    outs, start = [], 0
    for T in schedule:
        xt = x[:, start:start + T]
        q, k, v = ((xt @ p[w].T).view(B, T, n, dh).transpose(1, 2) for w, n in (("wq", h), ("wk", kv), ("wv", kv)))
        if p["q_norm"] is not None:
            q, k = rms_norm64(q, p["q_norm"], 1e-6), rms_norm64(k, p["k_norm"], 1e-6)
        pos = 0 if positions != "offset" else start if not use_cache else sum(t.shape[2] for t in keys)
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        q, k_rot = rope64(q, c, s), rope64(k, c, s)
        if not use_cache:
            K, V = k_rot, v
        else:
            if cache == "rotated":
                K = torch.cat(keys + [k_rot], dim=2)
            else:  # the cache holds raw keys, rotated all together at the current positions
                raw = torch.cat(raw_keys + [k], dim=2)
                S = raw.shape[2]
                K = rope64(raw, cos[pos:pos + 1].expand(S, -1), sin[pos:pos + 1].expand(S, -1)) if T == 1 else \
                    rope64(raw, cos[:S], sin[:S])
            V = torch.cat(vals + [v], dim=2)
            if update or not keys:  # without updates only the prefill is ever stored
                keys.append(k_rot)
                raw_keys.append(k)
                vals.append(v)
        S, rep = K.shape[2], h // kv
        K, V = (K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)) if group == "grouped" else \
            (K.repeat(1, rep, 1, 1), V.repeat(1, rep, 1, 1))
        scores = q @ K.transpose(-1, -2) * dh ** -0.5  # [B, h, T, S]
        if T > 1 or chunk_mask == "topleft":
            offset = S - T
            keep = {"offset": torch.ones(T, S, dtype=torch.bool).tril(diagonal=offset),
                    "topleft": torch.ones(T, S, dtype=torch.bool).tril()}.get(chunk_mask)
            if offset == 0:
                keep = torch.ones(T, S, dtype=torch.bool).tril() if prefill_mask else None
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
        outs.append((scores.softmax(-1) @ V).transpose(1, 2).reshape(B, T, h * dh) @ p["wo"].T)
        start += T
    return torch.cat(outs, dim=1)


CACHE_MISTAKES = [
    Mistake("the new tokens were rotated as if they started at position 0: their positions are past .. past+T-1, "
            "where past is the number of cached tokens (slice cos[past:past+T]).", dict(positions="zero")),
    Mistake("the cache is not used, or never filled: the new tokens attend only to themselves. Store the K/V in the "
            "dict you are given (cache['k'] = ..., in place, not a new dict), and attend over the cached and the new "
            "ones together.", dict(use_cache=False)),
    Mistake("the cache is not updated after the first call: store the extended K/V back into cache['k'] and "
            "cache['v'].", dict(update=False)),
    Mistake("the cache holds keys before RoPE and all of them were rotated at the new token's position: cache the "
            "rotated keys (each rotated once, at its own position).", dict(cache="raw")),
    Mistake("is_causal=True with cached keys: PyTorch aligns that mask to the top-left corner, so new query i sees "
            "only keys 0..i. Query i is at position past+i and must see keys 0..past+i (use a mask "
            "tril(diagonal=past), or no mask for a single new token).", dict(chunk_mask="topleft")),
    Mistake("no causal mask inside a chunk of several new tokens after a prefix: query i must not see the chunk's "
            "later tokens (mask = ones(T, S).tril(diagonal=past)).", dict(chunk_mask="none")),
    Mistake("no causal mask, not even in the prefill.", dict(chunk_mask="none", prefill_mask=False)),
    Mistake("KV heads tiled instead of grouped: repeat_interleave(n_heads // n_kv_heads, dim=1), not repeat.",
            dict(group="tiled"), when=lambda c: 1 < c.ref.kv < c.ref.h),
]


def _decoding_case(run: CheckRun, g, desc, d, h, kv, qk_norm, B, schedule, seed) -> Case:
    ref = run.randomize(GQAttention(d, h, kv, qk_norm=qk_norm), seed)
    x = torch.randn(B, sum(schedule), d, generator=g)
    cos, sin = rope_cache(sum(schedule) + 4, d // h)
    return Case(f"with {desc}, the outputs of all steps", partial(_decode64, ref, x, cos, sin, schedule),
                (ref, x, cos, sin), desc=desc, ref=ref, schedule=schedule)


@exercise_check
def check_kv_cache(run: CheckRun, attend_cached) -> str:
    """``attend_cached(attn, x, cos, sin, cache)``: attention of the new tokens x [B, T, d] (which follow the
    cached ones) through the package's GQAttention ``attn``; ``cache`` is a dict with "k" and "v" (None when
    empty, else [B, n_kv, past, dh]) that the function extends; cos/sin are the full tables."""
    g = run.rng(7)
    public = [_decoding_case(run, g, "GQA 4 over 2 heads, batch 2, prefill 3 tokens then 1, 1, a chunk of 2, then 1",
                             32, 4, 2, False, 2, [3, 1, 1, 2, 1], 78),
              _decoding_case(run, g, "MQA (one KV head), batch 1, QK-norm on, one token at a time", 32, 4, 1, True, 1,
                             [1, 1, 1, 1], 77),
              _decoding_case(run, g, "MHA (2 over 2), batch 2, prefill 4, then a chunk of 3", 16, 2, 2, False, 2,
                             [4, 3], 60)]

    def secret(g):
        schedule = [run.randint(g, 1, 5) for _ in range(run.randint(g, 2, 5))]
        return [_decoding_case(run, g, f"GQA 4 over 2 heads, steps of {schedule} tokens", 32, 4, 2,
                               run.pick(g, [False, True]), 2, schedule, 79)]

    for case in run.cases(public, secret, seed=108):
        ref, x, cos, sin = case.args
        B, total, d = x.shape
        cache = Output({"k": None, "v": None})  # the function extends it in place: a declared output
        outs, start = [], 0
        for step, T in enumerate(case.schedule):
            out = run.call(f"attend_cached (step {step}, {T} new token{'s' * (T > 1)}) with {case.desc}",
                           attend_cached, ref, x[:, start:start + T], cos, sin, cache)
            if not isinstance(out, torch.Tensor) or out.shape != (B, T, d):
                run.fail(f"step {step} with {case.desc}: the output has shape {shape_of(out)}, expected {[B, T, d]}.")
            outs.append(out)
            start += T
        run.judge(case, torch.cat(outs, dim=1), CACHE_MISTAKES, atol=2e-5, rtol=1e-4,
                  hint="Each step's output must equal the matching rows of attn(all tokens so far).")
        _check_cache_contents(run, case, cache.value)
    return "3 decoding schedules: GQA, MQA, MHA; prefill, single tokens and chunks; cache contents"


def _check_cache_contents(run: CheckRun, case: Case, held) -> None:
    """After right outputs: the cache holds the n_kv rotated keys and the values of every token so far."""
    if run.diagnosis.failures:  # the outputs are wrong: that is the verdict
        return
    ref, x, cos, sin = case.args
    B, total, _ = x.shape
    h, kv, dh = ref.h, ref.kv, ref.dh
    k, v = (held.get("k"), held.get("v")) if isinstance(held, dict) else (None, None)
    where = f"with {case.desc}"
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        run.fail(f"{where}: after the last step cache['k'] and cache['v'] must be tensors, got {type(k).__name__} "
                 f"and {type(v).__name__}.")
    if k.shape == (B, h, total, dh) and kv < h:
        run.fail(f"{where}: your outputs are right, but the cache holds {h} heads: it stores K/V after repeating them "
                 f"for every query head, {h // kv}× the memory. Cache the {kv} KV heads and share them at attention "
                 "time.")
    if k.shape != (B, kv, total, dh) or v.shape != (B, kv, total, dh):
        run.fail(f"{where}: after {total} tokens the cache should hold k and v of shape {[B, kv, total, dh]}, got "
                 f"{shape_of(k)} and {shape_of(v)}.")
    p = _params(ref)
    kk = (x.double() @ p["wk"].T).view(B, total, kv, dh).transpose(1, 2)
    kk = rms_norm64(kk, p["k_norm"], 1e-6) if p["k_norm"] is not None else kk
    if not matches(k, rope64(kk, cos[:total], sin[:total]), 1e-4, 2e-5):
        if matches(k, kk, 1e-4, 2e-5):
            run.fail(f"{where}: your outputs are right, but cache['k'] holds the keys before RoPE, so every step has "
                     "to rotate the whole cache again. Store the rotated keys.")
        run.fail(f"{where}: cache['k'] does not hold the keys (after k_norm and RoPE) of the tokens so far, in order.")
    if not matches(v, (x.double() @ p["wv"].T).view(B, total, kv, dh).transpose(1, 2), 1e-4, 2e-5):
        run.fail(f"{where}: cache['v'] does not hold the values of the tokens so far, in order.")
