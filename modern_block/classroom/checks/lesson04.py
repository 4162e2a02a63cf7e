"""Lesson 04: grouped KV heads, GQA attention and decoding with a KV cache."""

from __future__ import annotations

import itertools
from functools import partial

import torch

from ...attention import GQAttention
from ...rmsnorm import RMSNorm
from ...rope import rope_cache
from .core import (
    Output,
    call_student,
    dtype_name,
    exercise_check,
    fail,
    generator,
    judge,
    load_weights,
    matches,
    randomize,
    shape_of,
)
from .reference import rms_norm64, rope64


@exercise_check(components=("GQAttention", "causal_attention"))
def check_repeat_kv(repeat_kv) -> str:
    """``repeat_kv(k, n_rep)``: [B, n_kv, T, dh] → [B, n_kv·n_rep, T, dh], query head j reading KV head
    j // n_rep (grouped)."""
    __tracebackhide__ = True
    name = "check_repeat_kv"
    g = generator(5)
    cases = [(torch.randn(2, 2, 3, 4, generator=g), 3), (torch.randn(1, 1, 5, 4, generator=g), 4),
             (torch.randn(2, 3, 2, 4, generator=g), 1), (torch.randn(1, 4, 1, 2, generator=g), 2)]
    for k, n_rep in cases:
        desc = f"k of shape {shape_of(k)}, n_rep={n_rep}"
        got = call_student(name, f"repeat_kv on {desc}", repeat_kv, k.clone(), n_rep)
        want = k.repeat_interleave(n_rep, dim=1)
        cands = [
            ("KV heads tiled (k.repeat) instead of grouped (repeat_interleave): query head j must read KV head "
             "j // n_rep, so copies of one KV head sit next to each other (0,0,1,1), not (0,1,0,1).",
             k.repeat(1, n_rep, 1, 1)),
            ("repeated along the sequence (dim 2) instead of the head dimension (dim 1).",
             k.repeat_interleave(n_rep, dim=2)),
            ("repeated along the head size (last dim) instead of the head dimension (dim 1).",
             k.repeat_interleave(n_rep, dim=-1)),
        ]
        judge(name, got, want, cands, f"on {desc}", rtol=0, atol=0,
              hint="k.repeat_interleave(n_rep, dim=1), or k[:, :, None].expand(...).reshape(...).")
    return "4 cases: GQA, MQA (one KV head), n_rep = 1"


def _attention64(p, x, cos, sin, *, h, kv, dh, eps, qk_norm, group="grouped", mask="causal", scale="dh",
                 rope="qk", layout="half", sign=1.0, norm="before", split="ok", merge="ok", softmax_dim=-1):
    """GQA attention in float64 from the weights ``p``, with one knob per common mistake."""
    B, T, d = x.shape
    x = x.double()

    def heads(t, n):
        if split == "ok":
            return t.view(B, T, n, dh).transpose(1, 2)
        return t.reshape(B, n, T, dh)  # wrong: mixes tokens and features

    q, k, v = heads(x @ p["wq"].T, h), heads(x @ p["wk"].T, kv), heads(x @ p["wv"].T, kv)

    def rms(t, w):
        return rms_norm64(t, w, eps)

    rot = partial(rope64, cos=cos, sin=sin, layout=layout, sign=sign)
    if qk_norm and norm == "swap":
        q, k = rms(q, p["k_norm"]), rms(k, p["q_norm"])
    elif qk_norm and norm == "before":
        q, k = rms(q, p["q_norm"]), rms(k, p["k_norm"])
    elif qk_norm and norm == "q_only":
        q = rms(q, p["q_norm"])
    elif qk_norm and norm == "k_only":
        k = rms(k, p["k_norm"])
    if rope in ("qk", "qkv", "q"):
        q = rot(q)
    if rope in ("qk", "qkv", "k"):
        k = rot(k)
    if rope == "qkv":
        v = rot(v)
    if qk_norm and norm == "after":
        q, k = rms(q, p["q_norm"]), rms(k, p["k_norm"])
    rep = h // kv
    if group == "grouped":
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    else:
        k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
    s = q @ k.transpose(-1, -2)
    s = s * {"dh": dh ** -0.5, "head_dim_lin": 1.0 / dh, "none": 1.0, "d": d ** -0.5}[scale]
    if mask != "none":
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        if mask == "anti":
            keep = keep.T
        s = s.masked_fill(~keep, float("-inf"))
    a = s.softmax(softmax_dim).nan_to_num(0.0)
    o = a @ v  # [B, h, T, dh]
    o = o.transpose(1, 2).reshape(B, T, h * dh) if merge == "ok" else o.reshape(B, T, h * dh)
    return o @ p["wo"].T


_ATTENTION_MISTAKES = [  # (diagnosis, knobs, applies(h, kv, qk_norm))
    ("KV heads tiled instead of grouped: query head j must read KV head j // (n_heads / n_kv_heads). Use "
     "repeat_interleave(n_rep, dim=1) (or enable_gqa=True), not repeat / expand over a new leading dim.",
     dict(group="tiled"), lambda h, kv, qn: 1 < kv < h),
    ("no causal mask: each token also attends to later tokens. Use is_causal=True, or fill the scores above "
     "the diagonal with -inf before the softmax.", dict(mask="none"), lambda h, kv, qn: True),
    ("the causal mask is upside down: it hides the past and shows the future (tril/triu mixed up).",
     dict(mask="anti"), lambda h, kv, qn: True),
    ("wrong softmax scale: the scores were divided by head_dim; divide by sqrt(head_dim).",
     dict(scale="head_dim_lin"), lambda h, kv, qn: True),
    ("no softmax scale: divide the scores q·k by sqrt(head_dim).", dict(scale="none"), lambda h, kv, qn: True),
    ("wrong softmax scale: 1/sqrt(d) uses the model width; use 1/sqrt(head_dim).", dict(scale="d"),
     lambda h, kv, qn: True),
    ("RoPE is not applied: rotate q and k with apply_rope(q, cos, sin), apply_rope(k, cos, sin).",
     dict(rope="none"), lambda h, kv, qn: True),
    ("RoPE was applied to q only; rotate k too.", dict(rope="q"), lambda h, kv, qn: True),
    ("RoPE was applied to k only; rotate q too.", dict(rope="k"), lambda h, kv, qn: True),
    ("RoPE was applied to the values too; it rotates q and k only (positions enter through the scores).",
     dict(rope="qkv"), lambda h, kv, qn: True),
    ("the interleaved RoPE layout; these models use the half-split layout of apply_rope.",
     dict(layout="interleaved"), lambda h, kv, qn: True),
    ("RoPE rotates in the wrong direction (the sign of sin).", dict(sign=-1.0), lambda h, kv, qn: True),
    ("QK-norm after RoPE: normalise q and k first (self.q_norm, self.k_norm), then rotate them.",
     dict(norm="after"), lambda h, kv, qn: qn),
    ("QK-norm is missing: apply self.q_norm to q and self.k_norm to k (per head, before RoPE).",
     dict(norm="none"), lambda h, kv, qn: qn),
    ("q_norm and k_norm were swapped: q goes through self.q_norm, k through self.k_norm.",
     dict(norm="swap"), lambda h, kv, qn: qn),
    ("QK-norm on q only: k needs self.k_norm too.", dict(norm="q_only"), lambda h, kv, qn: qn),
    ("QK-norm on k only: q needs self.q_norm too.", dict(norm="k_only"), lambda h, kv, qn: qn),
    ("the heads were split with view(B, n_heads, T, head_dim), which mixes tokens and features; use "
     "view(B, T, n_heads, head_dim).transpose(1, 2).", dict(split="bad"), lambda h, kv, qn: True),
    ("the heads were merged without transposing back: out.transpose(1, 2).reshape(B, T, n_heads·head_dim).",
     dict(merge="bad"), lambda h, kv, qn: h > 1),
    ("softmax over the wrong axis (over queries); normalise each query's scores over the keys (last dim).",
     dict(softmax_dim=-2), lambda h, kv, qn: True),
]


def _attention_params(ref: GQAttention) -> dict:
    p: dict = {k: w.detach().double() for k, w in (("wq", ref.wq.weight), ("wk", ref.wk.weight),
                                                  ("wv", ref.wv.weight), ("wo", ref.wo.weight))}
    for k in ("q_norm", "k_norm"):
        mod = ref.get_submodule(k)
        p[k] = mod.weight.detach().double() if isinstance(mod, RMSNorm) else None
    return p


def _judge_attention(name, got, ref, x, cos, sin, qk_norm, desc, extra=()):
    """Compare an attention output with the reference; the candidates are every single mistake, then every
    pair of mistakes (the verdict names the one that explains every failing case)."""
    __tracebackhide__ = True
    h, kv, dh = ref.h, ref.kv, ref.dh
    eps = ref.q_norm.eps if qk_norm else 1e-6
    p = _attention_params(ref)
    run = partial(_attention64, p, x, cos, sin, h=h, kv=kv, dh=dh, eps=eps, qk_norm=qk_norm)
    want = run()
    # a mistake that makes no difference in this configuration (tiled heads with one KV head) is a no-op here
    mistakes = [(diag, knobs if ok(h, kv, qk_norm) else None) for diag, knobs, ok in _ATTENTION_MISTAKES]
    cands = list(extra) + [(diag, partial(run, **knobs) if knobs is not None else None) for diag, knobs in mistakes]
    cands += [(f"two at once: {d1}\nand: {d2}", partial(run, **(k1 or {}), **(k2 or {})))
              for (d1, k1), (d2, k2) in itertools.combinations(mistakes, 2)
              if (k1 or k2) and not set(k1 or {}) & set(k2 or {})]
    judge(name, got, want, cands, desc, atol=2e-5, rtol=1e-4, dims=("batch", "position", ""))


def _attention_cases(g):
    """(description, d, n_heads, n_kv_heads, qk_norm, B, T, position offset)."""
    return [
        ("GQA with 4 query heads over 2 KV heads, x of shape [2, 6, 32]", 32, 4, 2, True, 2, 6, 0),
        ("MQA (one KV head), x of shape [1, 5, 32]", 32, 4, 1, False, 1, 5, 0),
        ("MHA (3 KV heads for 3 heads), x of shape [2, 4, 24]", 24, 3, 3, True, 2, 4, 0),
        ("GQA 8 over 2, x of shape [2, 9, 64] at positions 100..108", 64, 8, 2, False, 2, 9, 100),
        ("GQA 4 over 2, one token (T = 1), x of shape [2, 1, 32]", 32, 4, 2, True, 2, 1, 0),
    ]


def grade_attention_module(name, make_student, qk_norm_cases=None, load_hints=None):
    __tracebackhide__ = True
    g = generator(6)
    n = 0
    for desc, d, h, kv, qk_norm, B, T, offset in _attention_cases(g):
        if qk_norm_cases is not None:
            qk_norm = qk_norm_cases
        else:
            desc += f", qk_norm={qk_norm}"
        ref = randomize(GQAttention(d, h, kv, qk_norm=qk_norm), 10 + n)
        student = make_student(d, h, kv, qk_norm)
        load_weights(name, student, ref, load_hints)
        x = torch.randn(B, T, d, generator=g)
        cos, sin = rope_cache(offset + T, d // h)
        cos, sin = cos[offset:], sin[offset:]
        got = call_student(name, f"forward(x, cos, sin) with {desc}", student, x.clone(), cos, sin)
        extra = []
        if offset:
            c0, s0 = rope_cache(T, d // h)
            p = _attention_params(ref)
            extra.append(("your forward ignores the cos/sin it is given (it rotates as if the tokens were at "
                          "positions 0..T-1): use the tables passed to forward.",
                          lambda p=p, c0=c0, s0=s0, ref=ref, x=x, qk_norm=qk_norm: _attention64(
                              p, x, c0, s0, h=ref.h, kv=ref.kv, dh=ref.dh, eps=1e-6, qk_norm=qk_norm)))
        _judge_attention(name, got, ref, x, cos, sin, qk_norm, f"with {desc}", extra)
        n += 1
    # bfloat16 weights and inputs
    ref = randomize(GQAttention(32, 4, 2, qk_norm=qk_norm_cases if qk_norm_cases is not None else True), 30)
    student = make_student(32, 4, 2, qk_norm_cases if qk_norm_cases is not None else True)
    load_weights(name, student, ref, load_hints)
    student = call_student(name, "module.to(torch.bfloat16)", student.to, torch.bfloat16)
    ref = ref.to(torch.bfloat16)
    x = torch.randn(2, 5, 32, generator=g).to(torch.bfloat16)
    cos, sin = rope_cache(5, 8)
    got = call_student(name, "forward on a bfloat16 x of shape [2, 5, 32]", student, x, cos, sin)
    want = ref(x, cos, sin)
    judge(name, got, want, [], "on a bfloat16 x of shape [2, 5, 32] (module in bfloat16)", rtol=5e-2,
          atol=5e-2 * want.abs().max().item())
    if got.dtype != torch.bfloat16:
        fail(name, f"a bfloat16 module and input gave a {dtype_name(got)} output; keep the input's dtype "
                   "(cast the RoPE tables to x.dtype).")
    qk = "QK-norm on/off" if qk_norm_cases is None else "random QK-norm scales"
    return f"{n + 1} cases: GQA, MQA, MHA, {qk}, batch 1 and 2, T = 1, positions from 100, bfloat16"


GQA_LOAD_HINTS = {
    "wk.weight": "wk and wv project to n_kv_heads·head_dim features (fewer K/V heads than query heads).",
    "wv.weight": "wk and wv project to n_kv_heads·head_dim features (fewer K/V heads than query heads).",
    "q_norm": "With qk_norm=True: self.q_norm = RMSNorm(head_dim) and self.k_norm = RMSNorm(head_dim) (per head, "
              "not over d); with qk_norm=False use nn.Identity().",
    "wq": "Name the projections wq, wk, wv (d → heads·head_dim) and wo (n_heads·head_dim → d), all bias-free.",
}


@exercise_check(components=("GQAttention", "causal_attention"), uses=("RMSNorm", "apply_rope"))
def check_gqattention(GQAttentionClass) -> str:
    """``GQAttention(d, n_heads, n_kv_heads, qk_norm=True)`` with wq/wk/wv/wo/q_norm/k_norm and
    ``forward(x, cos, sin)``, causal."""
    __tracebackhide__ = True
    name = "check_gqattention"

    def make(d, h, kv, qk_norm):
        return call_student(name, f"GQAttention({d}, {h}, {kv}, qk_norm={qk_norm})", GQAttentionClass, d, h, kv,
                            qk_norm=qk_norm)

    return grade_attention_module(name, make, load_hints=GQA_LOAD_HINTS)


def _decode64(ref: GQAttention, x, cos, sin, schedule, *, positions="offset", cache="rotated",
              chunk_mask="offset", prefill_mask=True, use_cache=True, update=True, group="grouped"):
    """Emulate chunked decoding with a KV cache in float64, with knobs for the common mistakes.
    Returns the outputs of all chunks concatenated along T."""
    p = _attention_params(ref)
    h, kv, dh = ref.h, ref.kv, ref.dh
    eps = ref.q_norm.eps if p["q_norm"] is not None else 1e-6
    B = x.shape[0]
    x = x.double()
    keys: list[torch.Tensor] = []
    vals: list[torch.Tensor] = []
    raw_keys: list[torch.Tensor] = []
    outs = []
    start = 0
    for T in schedule:
        xt = x[:, start:start + T]
        q = (xt @ p["wq"].T).view(B, T, h, dh).transpose(1, 2)
        k = (xt @ p["wk"].T).view(B, T, kv, dh).transpose(1, 2)
        v = (xt @ p["wv"].T).view(B, T, kv, dh).transpose(1, 2)
        if p["q_norm"] is not None:
            q, k = rms_norm64(q, p["q_norm"], eps), rms_norm64(k, p["k_norm"], eps)
        cached = sum(t.shape[2] for t in keys)
        if positions != "offset":
            pos = 0
        elif not use_cache:  # the cache is kept (so the offset is known) but not attended to
            pos = start
        else:
            pos = cached
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        q = rope64(q, c, s)
        k_rot = rope64(k, c, s)
        if not use_cache:
            K, V = k_rot, v
        else:
            if cache == "rotated":
                K = torch.cat(keys + [k_rot], dim=2)
            else:  # cache holds raw keys, rotated all together at the current positions
                Kraw = torch.cat(raw_keys + [k], dim=2)
                S = Kraw.shape[2]
                K = rope64(Kraw, cos[pos:pos + 1].expand(S, -1), sin[pos:pos + 1].expand(S, -1)) \
                    if T == 1 else rope64(Kraw, cos[:S], sin[:S])
            V = torch.cat(vals + [v], dim=2)
            if update:
                keys.append(k_rot)
                raw_keys.append(k)
                vals.append(v)
            elif not keys:  # only the prefill was ever stored
                keys.append(k_rot)
                raw_keys.append(k)
                vals.append(v)
        S = K.shape[2]
        rep = h // kv
        if group == "grouped":
            K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
        else:
            K, V = K.repeat(1, rep, 1, 1), V.repeat(1, rep, 1, 1)
        scores = q @ K.transpose(-1, -2) * dh ** -0.5  # [B, h, T, S]
        offset = S - T
        if T > 1 or chunk_mask == "topleft":
            if offset == 0:
                keep = torch.ones(T, S, dtype=torch.bool).tril() if prefill_mask else None
            elif chunk_mask == "offset":
                keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=offset)
            elif chunk_mask == "topleft":
                keep = torch.ones(T, S, dtype=torch.bool).tril()
            else:
                keep = None
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
        o = scores.softmax(-1) @ V
        outs.append(o.transpose(1, 2).reshape(B, T, h * dh) @ p["wo"].T)
        start += T
    return torch.cat(outs, dim=1)


@exercise_check(components=("GQAttention.forward", "causal_attention", "LayerCache", "KVCache"),
                uses=("RMSNorm", "apply_rope"))
def check_kv_cache(attend_cached) -> str:
    """``attend_cached(attn, x, cos, sin, cache)``: attention of the new tokens x [B, T, d] (which follow
    the cached ones) through the package's GQAttention ``attn``; ``cache`` is a dict with "k" and "v"
    (None when empty, else [B, n_kv, past, dh]) that the function extends; cos/sin are the full tables."""
    __tracebackhide__ = True
    name = "check_kv_cache"
    g = generator(7)
    configs = [  # (description, d, h, kv, qk_norm, B, schedule)
        ("GQA 4 over 2 heads, batch 2, prefill 3 tokens then 1, 1, a chunk of 2, then 1", 32, 4, 2, False, 2,
         [3, 1, 1, 2, 1]),
        ("MQA (one KV head), batch 1, QK-norm on, one token at a time", 32, 4, 1, True, 1, [1, 1, 1, 1]),
        ("MHA (2 over 2), batch 2, prefill 4, then a chunk of 3", 16, 2, 2, False, 2, [4, 3]),
    ]
    for desc, d, h, kv, qk_norm, B, schedule in configs:
        ref = randomize(GQAttention(d, h, kv, qk_norm=qk_norm), 40 + d + h + kv)
        total = sum(schedule)
        x = torch.randn(B, total, d, generator=g)
        cos, sin = rope_cache(total + 4, d // h)
        cache = Output({"k": None, "v": None})  # the function extends it in place: a declared output
        outs = []
        start = 0
        for step, T in enumerate(schedule):
            out = call_student(name, f"attend_cached (step {step}, {T} new token{'s' * (T > 1)}) with {desc}",
                               attend_cached, ref, x[:, start:start + T].clone(), cos, sin, cache)
            if not isinstance(out, torch.Tensor) or out.shape != (B, T, d):
                fail(name, f"step {step} with {desc}: the output has shape {shape_of(out)}, expected {[B, T, d]}.")
            outs.append(out)
            start += T
        got = torch.cat(outs, dim=1)
        want = _decode64(ref, x, cos, sin, schedule)
        run = partial(_decode64, ref, x, cos, sin, schedule)
        cands = [
            ("the new tokens were rotated as if they started at position 0: their positions are past .. past+T-1, "
             "where past is the number of cached tokens (slice cos[past:past+T]).", partial(run, positions="zero")),
            ("the cache is not used, or never filled: the new tokens attend only to themselves. Store the K/V in "
             "the dict you are given (cache['k'] = ..., in place, not a new dict), and attend over the cached and "
             "the new ones together.", partial(run, use_cache=False)),
            ("the cache is not updated after the first call: store the extended K/V back into cache['k'] and "
             "cache['v'].", partial(run, update=False)),
            ("the cache holds keys before RoPE and all of them were rotated at the new token's position: cache "
             "the rotated keys (each rotated once, at its own position).", partial(run, cache="raw")),
            ("is_causal=True with cached keys: PyTorch aligns that mask to the top-left corner, so new query i "
             "sees only keys 0..i. Query i is at position past+i and must see keys 0..past+i (use a mask "
             "tril(diagonal=past), or no mask for a single new token).", partial(run, chunk_mask="topleft")),
            ("no causal mask inside a chunk of several new tokens after a prefix: query i must not see the "
             "chunk's later tokens (mask = ones(T, S).tril(diagonal=past)).", partial(run, chunk_mask="none")),
            ("no causal mask, not even in the prefill.", partial(run, chunk_mask="none", prefill_mask=False)),
            ("KV heads tiled instead of grouped: repeat_interleave(n_heads // n_kv_heads, dim=1), not repeat.",
             partial(run, group="tiled")),
        ]
        judge(name, got, want, cands, f"with {desc}, the outputs of all steps", atol=2e-5, rtol=1e-4,
              hint="Each step's output must equal the matching rows of attn(all tokens so far).")
        # what is cached: the n_kv rotated keys and the values, for every token so far
        held = cache.value if isinstance(cache.value, dict) else {}
        k, v = held.get("k"), held.get("v")
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            fail(name, f"with {desc}: after the last step cache['k'] and cache['v'] must be tensors, got "
                       f"{type(k).__name__} and {type(v).__name__}.")
        if k.shape == (B, h, total, d // h) and kv < h:
            fail(name, f"with {desc}: your outputs are right, but the cache holds {h} heads: it stores K/V after "
                       f"repeating them for every query head, {h // kv}× the memory. Cache the {kv} KV heads and "
                       "share them at attention time.")
        if k.shape != (B, kv, total, d // h) or v.shape != (B, kv, total, d // h):
            fail(name, f"with {desc}: after {total} tokens the cache should hold k and v of shape "
                       f"{[B, kv, total, d // h]}, got {shape_of(k)} and {shape_of(v)}.")
        p = _attention_params(ref)
        kk = (x.double() @ p["wk"].T).view(B, total, kv, d // h).transpose(1, 2)
        if p["k_norm"] is not None:
            kk = rms_norm64(kk, p["k_norm"], ref.k_norm.eps)
        k_rot = rope64(kk, cos[:total], sin[:total])
        if not matches(k, k_rot, 1e-4, 2e-5):
            if matches(k, kk, 1e-4, 2e-5):
                fail(name, f"with {desc}: your outputs are right, but cache['k'] holds the keys before RoPE, so "
                           "every step has to rotate the whole cache again. Store the rotated keys.")
            fail(name, f"with {desc}: cache['k'] does not hold the keys (after k_norm and RoPE) of the tokens so "
                       "far, in order.")
        vv = (x.double() @ p["wv"].T).view(B, total, kv, d // h).transpose(1, 2)
        if not matches(v, vv, 1e-4, 2e-5):
            fail(name, f"with {desc}: cache['v'] does not hold the values of the tokens so far, in order.")
    return "3 decoding schedules: GQA, MQA, MHA; prefill, single tokens and chunks; cache contents"
