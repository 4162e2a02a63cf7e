"""Lesson 03: the RoPE tables and the two layouts of applying them."""

from __future__ import annotations

from functools import partial

import torch

from ...rope import rope_cache
from .core import (
    Output,
    call_student,
    exercise_check,
    fail,
    generator,
    judge,
    require_dtype,
    shape_of,
)
from .reference import rope64


def _rope_tables64(positions, dh, base, *, exponent="2i/dh", shift=0, full=None, in_order=False):
    """The tables for the given positions in float64, with a knob per mistake (``in_order``: the positions
    ignored, 0 .. n-1 used instead)."""
    i = torch.arange(dh // 2, dtype=torch.float64)
    if exponent == "2i/dh":
        theta = base ** (-2 * i / dh)
    elif exponent == "i/dh":
        theta = base ** (-i / dh)
    elif exponent == "4i/dh":
        theta = base ** (-4 * i / dh)
    elif exponent == "+2i/dh":
        theta = base ** (2 * i / dh)
    elif exponent == "linspace":
        theta = base ** (-torch.linspace(0, 1, dh // 2, dtype=torch.float64))
    elif exponent == "per_dim":
        theta = base ** (-torch.arange(dh, dtype=torch.float64) / dh)
    else:
        raise ValueError(exponent)
    pos = torch.arange(len(positions), dtype=torch.float64) if in_order else positions.double()
    ang = torch.outer(pos + shift, theta)
    if full == "cat":
        ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


@exercise_check(components=("rope_cache", "rope_frequencies"))
def check_rope_cache(rope_tables_fn) -> str:
    """``rope_tables(positions, dh, base=10000.0)`` → ``(cos, sin)``, each float32 of shape [n, dh/2] for a 1-D
    tensor of n token positions: angle p·θ_i with θ_i = base^(-2i/dh) for the token at position p."""
    __tracebackhide__ = True
    name = "check_rope_cache"
    cases = [(torch.arange(8), 4, None), (torch.tensor([5, 6, 7, 8, 9, 10]), 8, None),
             (torch.arange(64), 16, 500000.0), (torch.arange(4090, 4096), 64, None), (torch.tensor([7]), 2, None),
             (torch.tensor([3, 0, 12, 1]), 8, None)]
    for positions, dh, base in cases:
        b = 10000.0 if base is None else base
        shown = positions.tolist() if len(positions) <= 6 else f"0 .. {len(positions) - 1}"
        call = f"rope_tables(torch.tensor({shown}), {dh}" + ("" if base is None else f", base={base:g}") + ")"
        out = call_student(name, call, rope_tables_fn, positions, dh, *(() if base is None else (base,)))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            fail(name, f"{call} must return a pair (cos, sin), got {type(out).__name__}.")
        cos, sin = out
        want_cos, want_sin = _rope_tables64(positions, dh, b)
        # float32 angles near position 4096 carry ~2.4e-4 rad of rounding: allow for it there
        atol = 2e-3 if int(positions.max()) > 1000 else 2e-5
        mistakes: list[tuple[str, dict]] = [
            ("the exponent is i/dh; it is 2i/dh (θ_i = base^(-2i/dh) for pair i = 0 .. dh/2-1).",
             dict(exponent="i/dh")),
            ("the exponent counts 2i twice: with i from torch.arange(0, dh, 2) (already even numbers), "
             "use base^(-i/dh), not base^(-2i/dh).", dict(exponent="4i/dh")),
            ("the exponent has the wrong sign: θ_i = base^(-2i/dh) starts at 1 rad/token and decreases.",
             dict(exponent="+2i/dh")),
            ("the exponents run from 0 to 1 (linspace); they are 2i/dh for i < dh/2, so the last is 1 - 2/dh.",
             dict(exponent="linspace")),
            ("the positions are off by one: the token at position p turns by p·θ_i (position 0: cos = 1, sin = 0).",
             dict(shift=1)),
            ("the positions given were ignored: row r belongs to the token at positions[r], not at position r.",
             dict(in_order=True)),
            ("one angle per dimension (dh columns); RoPE has one angle per pair: dh/2 columns.",
             dict(exponent="per_dim")),
            ("the tables were duplicated to dh columns (Hugging Face's layout); here cos and sin have one "
             "column per pair, shape [n, dh/2].", dict(full="cat")),
        ]
        if b != 10000.0:
            mistakes.append((f"the base argument is ignored: use base (here {b:g}) in θ_i = base^(-2i/dh).",
                             dict(base=10000.0)))
        for which, got, want in (("cos", cos, want_cos), ("sin", sin, want_sin)):
            k = 0 if which == "cos" else 1
            cands = [("cos and sin were returned in the wrong order: return (cos, sin).",
                      (want_sin, want_cos)[k])]
            for diag, kw in mistakes:
                kw = dict(kw)
                bb = kw.pop("base", b)
                cands.append((diag, _rope_tables64(positions, dh, bb, **kw)[k]))
            if isinstance(got, torch.Tensor) and got.shape != want.shape and got.shape == want.shape[::-1]:
                fail(name, f"{call}: {which} has shape {shape_of(got)}; it should be [n, dh/2] = {list(want.shape)} "
                           "(one row per position).")
            judge(name, got, want, cands, f"{call}, {which}", atol=atol, rtol=0,
                  hint="angle[r, i] = positions[r]·base^(-2i/dh), i = 0 .. dh/2-1.", dims=("row", "pair"))
        for which, got in (("cos", cos), ("sin", sin)):
            require_dtype(name, got, torch.float32, call, which, "return float32 tables.")
    return "6 cases incl. positions out of order, base 500,000 and positions up to 4,095"


def _rope_cases(g):
    """(description, x, cos, sin) cases shared by the two RoPE-application checks: per-sequence tables
    [B, T, dh/2], each sequence at its own positions (a left-padded batch, or sequences at different offsets)."""
    cos8, sin8 = rope_cache(12, 8)
    cos16, sin16 = rope_cache(4096, 16)
    cos2, sin2 = rope_cache(8, 2)
    starts = torch.tensor([0, 3])  # sequence b's tokens sit at positions starts[b] ..
    idx = starts[:, None] + torch.arange(6)  # [2, 6]
    return [
        ("x of shape [2, 3, 6, 8], sequence 0 at positions 0..5, sequence 1 at 3..8 (tables [2, 6, 4])",
         torch.randn(2, 3, 6, 8, generator=g), cos8[idx], sin8[idx]),
        ("x of shape [2, 2, 4, 16] at positions 4090..4093 and 10..13 (tables [2, 4, 8])",
         torch.randn(2, 2, 4, 16, generator=g), torch.stack([cos16[4090:4094], cos16[10:14]]),
         torch.stack([sin16[4090:4094], sin16[10:14]])),
        ("x of shape [1, 1, 1, 2] at position 7 (one pair, tables [1, 1, 1])", torch.randn(1, 1, 1, 2, generator=g),
         cos2[7:8][None], sin2[7:8][None]),
        ("x of shape [3, 3, 2, 8], batch size equal to the number of heads (tables [3, 2, 4])",
         torch.randn(3, 3, 2, 8, generator=g), cos8[torch.tensor([[0, 1], [4, 5], [9, 10]])],
         sin8[torch.tensor([[0, 1], [4, 5], [9, 10]])]),
    ]


def _check_rope_fn(name, fn, layout) -> str:
    __tracebackhide__ = True
    other = "interleaved" if layout == "half" else "half"
    g = generator(4)
    layouts = {"half": "half-split (pair i with i + dh/2: x1, x2 = x.chunk(2, -1))",
               "interleaved": "interleaved (pair 2i with 2i+1: x[..., 0::2], x[..., 1::2])"}
    for desc, x, cos, sin in _rope_cases(g):
        after = Output(x)  # what the function leaves in its copy of x
        got = call_student(name, f"{name[6:]} on {desc}", fn, after, cos, sin)
        if not (isinstance(after.value, torch.Tensor) and torch.equal(after.value, x)):
            fail(name, f"on {desc}: your function changed x in place; return a new tensor.")
        c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, dh/2]: one table per sequence, shared by its heads
        want = rope64(x, c, s_, layout)
        mk = partial(rope64, x, c, s_)
        cands = [
            (f"the other RoPE layout: you rotated {layouts[other]}; this function uses {layouts[layout]}.",
             partial(mk, other)),
            ("rotation in the wrong direction (sin has the wrong sign): rotate (a, b) to "
             "(a·cos - b·sin, a·sin + b·cos).", partial(mk, layout, sign=-1.0)),
            (f"the other layout and the wrong direction: use {layouts[layout]} and (a·cos - b·sin, a·sin + b·cos).",
             partial(mk, other, sign=-1.0)),
            ("cos and sin were swapped.", partial(mk, layout, swap_tables=True)),
            ("the two halves of the result were swapped: the first half of the output holds what belongs in the "
             "second half, and the other way round." if layout == "half" else
             "the rotated pairs were written back half-split (all first members, then all second members) "
             "instead of re-interleaved: each rotated pair goes back to dimensions 2i and 2i+1.",
             partial(mk, layout, swap_halves=True)),
            ("only x·cos: the rotate-half term (sin) is missing.", partial(mk, "cos_only")),
            ("x is returned unrotated.", partial(mk, "none")),
            ("the tables were lined up with the heads, not the batch: a table of shape [B, T, dh/2] belongs to "
             "sequence b and is shared by all its heads (add the heads' dimension at position 1).",
             (lambda x=x, cos=cos, sin=sin: rope64(x, cos.unsqueeze(0), sin.unsqueeze(0), layout))
             if x.shape[0] == x.shape[1] else None),
        ]
        judge(name, got, want, cands, f"on {desc}", hint=f"layout: {layouts[layout]}.",
              dims=("sequence", "head", "position", ""))
    x = torch.randn(2, 2, 5, 8, generator=g).to(torch.bfloat16)
    cos, sin = (t.expand(2, 5, 4) for t in rope_cache(5, 8))
    desc = "a bfloat16 x of shape [2, 2, 5, 8] with float32 tables [2, 5, 4]"
    got = call_student(name, f"{name[6:]} on {desc}", fn, x, cos, sin)
    judge(name, got, rope64(x, cos.unsqueeze(1).to(torch.bfloat16), sin.unsqueeze(1).to(torch.bfloat16), layout), [],
          f"on {desc}", rtol=2e-2, atol=2e-2)
    require_dtype(name, got, x.dtype, f"on {desc}", "the output",
                  "keep x's dtype (cast cos and sin to x.dtype first).")
    return "5 cases: per-sequence positions, batch size = heads, positions up to 4,093, one pair, bfloat16"


@exercise_check(components=("apply_rope", "_broadcast_tables"))
def check_apply_rope(apply_rope_fn) -> str:
    """``apply_rope(x, cos, sin)``: half-split layout; x [B, heads, T, dh], per-sequence tables [B, T, dh/2]."""
    __tracebackhide__ = True
    return _check_rope_fn("check_apply_rope", apply_rope_fn, "half")


@exercise_check(components=("apply_rope_interleaved", "interleaved_to_half_split", "permute_qk_weight"))
def check_apply_rope_interleaved(apply_rope_interleaved_fn) -> str:
    """``apply_rope_interleaved(x, cos, sin)``: pairs (2i, 2i+1); same shapes as apply_rope."""
    __tracebackhide__ = True
    return _check_rope_fn("check_apply_rope_interleaved", apply_rope_interleaved_fn, "interleaved")
