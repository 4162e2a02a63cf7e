"""Lesson 03: the RoPE tables and the two layouts of applying them."""

from __future__ import annotations

from functools import partial

import torch

from ...rope import rope_cache
from .core import Case, CheckRun, Mistake, Output, exercise_check, shape_of
from .formulas import rope64


def _tables64(positions, dh, base, which, *, exponent="2i/dh", shift=0, full=None, in_order=False, swapped=False):
    """The cos (``which`` 0) or sin (1) table for the given positions in float64, with a knob per mistake
    (``in_order``: the positions ignored, 0 .. n-1 used instead; ``swapped``: the other table)."""
    i = torch.arange(dh // 2, dtype=torch.float64)
    theta = {"2i/dh": lambda: base ** (-2 * i / dh), "i/dh": lambda: base ** (-i / dh),
             "4i/dh": lambda: base ** (-4 * i / dh), "+2i/dh": lambda: base ** (2 * i / dh),
             "linspace": lambda: base ** (-torch.linspace(0, 1, dh // 2, dtype=torch.float64)),
             "per_dim": lambda: base ** (-torch.arange(dh, dtype=torch.float64) / dh)}[exponent]()
    pos = torch.arange(len(positions), dtype=torch.float64) if in_order else positions.double()
    ang = torch.outer(pos + shift, theta)
    if full == "cat":
        ang = torch.cat([ang, ang], dim=-1)
    return (ang.sin() if which == 0 else ang.cos()) if swapped else (ang.cos() if which == 0 else ang.sin())


TABLE_MISTAKES = [
    Mistake("cos and sin were returned in the wrong order: return (cos, sin).", dict(swapped=True)),
    Mistake("the exponent is i/dh; it is 2i/dh (θ_i = base^(-2i/dh) for pair i = 0 .. dh/2-1).",
            dict(exponent="i/dh")),
    Mistake("the exponent counts 2i twice: with i from torch.arange(0, dh, 2) (already even numbers), use "
            "base^(-i/dh), not base^(-2i/dh).", dict(exponent="4i/dh")),
    Mistake("the exponent has the wrong sign: θ_i = base^(-2i/dh) starts at 1 rad/token and decreases.",
            dict(exponent="+2i/dh")),
    Mistake("the exponents run from 0 to 1 (linspace); they are 2i/dh for i < dh/2, so the last is 1 - 2/dh.",
            dict(exponent="linspace")),
    Mistake("the positions are off by one: the token at position p turns by p·θ_i (position 0: cos = 1, sin = 0).",
            dict(shift=1)),
    Mistake("the positions given were ignored: row r belongs to the token at positions[r], not at position r.",
            dict(in_order=True)),
    Mistake("one angle per dimension (dh columns); RoPE has one angle per pair: dh/2 columns.",
            dict(exponent="per_dim")),
    Mistake("the tables were duplicated to dh columns (Hugging Face's layout); here cos and sin have one column per "
            "pair, shape [n, dh/2].", dict(full="cat")),
    Mistake("the base argument is ignored: use base in θ_i = base^(-2i/dh).",
            lambda c: _tables64(c.positions, c.dh, 10000.0, c.which), when=lambda c: c.base != 10000.0),
]


def _table_case(positions: torch.Tensor, dh: int, base: float | None) -> Case:
    """One call, its two outputs judged as the cases ``cos`` and ``sin``."""
    b = 10000.0 if base is None else base
    shown = positions.tolist() if len(positions) <= 6 else f"0 .. {len(positions) - 1}" if \
        torch.equal(positions, torch.arange(len(positions))) else f"{len(positions)} positions up to {positions.max()}"
    call = f"rope_tables(torch.tensor({shown}), {dh}" + ("" if base is None else f", base={base:g}") + ")"
    args = (positions, dh) if base is None else (positions, dh, base)
    cos, sin = (Case(f"{call}, {name}", partial(_tables64, positions, dh, b, which), args, positions=positions, dh=dh,
                     base=b, which=which) for which, name in ((0, "cos"), (1, "sin")))
    return Case(call, lambda: None, args, positions=positions, cos=cos, sin=sin)


@exercise_check
def check_rope_cache(run: CheckRun, rope_tables_fn) -> str:
    """``rope_tables(positions, dh, base=10000.0)`` → ``(cos, sin)``, each float32 of shape [n, dh/2] for a 1-D
    tensor of n token positions: angle p·θ_i with θ_i = base^(-2i/dh) for the token at position p."""
    public = [(torch.arange(8), 4, None), (torch.tensor([5, 6, 7, 8, 9, 10]), 8, None),
              (torch.arange(64), 16, 500000.0), (torch.arange(4090, 4096), 64, None), (torch.tensor([7]), 2, None),
              (torch.tensor([3, 0, 12, 1]), 8, None)]

    def secret(g):
        n = run.randint(g, 2, 12)
        return [_table_case(torch.randperm(2048, generator=g)[:n], 2 * run.randint(g, 2, 32),
                            run.pick(g, [None, 500000.0, 1000000.0]))]

    for call in run.cases([_table_case(*c) for c in public], secret, seed=104):
        out = run.call(call.text, rope_tables_fn, *call.args)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            run.fail(f"{call.text} must return a pair (cos, sin), got {type(out).__name__}.")
        # float32 angles p·θ are off by up to ~6e-8·p rad (2.4e-4 near position 4,096): 4x that, or 2e-5
        atol = max(2e-5, 2.5e-7 * int(call.positions.max()))
        for case, got in zip((call.cos, call.sin), out, strict=True):
            if isinstance(got, torch.Tensor) and got.shape != case.want.shape and got.shape == case.want.shape[::-1]:
                run.fail(f"{case.text} has shape {shape_of(got)}; it should be [n, dh/2] = {list(case.want.shape)} "
                         "(one row per position).")
            run.judge(case, got, TABLE_MISTAKES, atol=atol, rtol=0, dims=("row", "pair"),
                      hint="compare with angle[r, i] = positions[r]·base^(-2i/dh), i = 0 .. dh/2-1.")
            run.require(getattr(got, "dtype", None) == torch.float32, case.text,
                        "the values are right but it is not float32; return float32 tables.")
    return "6 cases incl. positions out of order, base 500,000 and positions up to 4,095"


# ---- exercises 2 and 3: applying the rotation --------------------------------------------------------------

LAYOUTS = {"half": "half-split (pair i with i + dh/2: x1, x2 = x.chunk(2, -1))",
           "interleaved": "interleaved (pair 2i with 2i+1: x[..., 0::2], x[..., 1::2])"}


def rotation_mistakes(layout: str) -> list[Mistake]:
    """The mistakes of rotating in ``layout`` ("half" or "interleaved")."""
    other = "interleaved" if layout == "half" else "half"
    return [
        Mistake(f"the other RoPE layout: you rotated {LAYOUTS[other]}; this function uses {LAYOUTS[layout]}.",
                dict(layout=other)),
        Mistake("rotation in the wrong direction (sin has the wrong sign): rotate (a, b) to "
                "(a·cos - b·sin, a·sin + b·cos).", dict(sign=-1.0)),
        Mistake(f"the other layout and the wrong direction: use {LAYOUTS[layout]} and (a·cos - b·sin, a·sin + b·cos).",
                dict(layout=other, sign=-1.0)),
        Mistake("cos and sin were swapped.", dict(swap_tables=True)),
        Mistake("the two halves of the result were swapped: the first half of the output holds what belongs in the "
                "second half, and the other way round." if layout == "half" else
                "the rotated pairs were written back half-split (all first members, then all second members) instead "
                "of re-interleaved: each rotated pair goes back to dimensions 2i and 2i+1.", dict(swap_halves=True)),
        Mistake("only x·cos: the rotate-half term (sin) is missing.", dict(layout="cos_only")),
        Mistake("x is returned unrotated.", dict(layout="none")),
        Mistake("the tables were lined up with the heads, not the batch: a table of shape [B, T, dh/2] belongs to "
                "sequence b and is shared by all its heads (add the heads' dimension at position 1).",
                lambda c: rope64(c.args[0], c.args[1].unsqueeze(0), c.args[2].unsqueeze(0), layout),
                when=lambda c: c.args[0].shape[0] == c.args[0].shape[1]),
    ]


def _rotation_case(layout: str, text: str, x, cos, sin) -> Case:
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, dh/2]: one table per sequence, shared by its heads
    return Case(f"on {text}", partial(rope64, x, c, s, layout=layout), (x, cos, sin), layout=layout)


def _rotation_cases(g, layout: str) -> list[Case]:
    """Per-sequence tables [B, T, dh/2], each sequence at its own positions (a left-padded batch, or sequences at
    different offsets)."""
    cos8, sin8 = rope_cache(12, 8)
    cos16, sin16 = rope_cache(4096, 16)
    cos2, sin2 = rope_cache(8, 2)
    idx = torch.tensor([0, 3])[:, None] + torch.arange(6)  # [2, 6]: sequence b's tokens at positions 3b ..
    batch_heads = torch.tensor([[0, 1], [4, 5], [9, 10]])
    return [
        _rotation_case(layout, "x of shape [2, 3, 6, 8], sequence 0 at positions 0..5, sequence 1 at 3..8 (tables "
                               "[2, 6, 4])", torch.randn(2, 3, 6, 8, generator=g), cos8[idx], sin8[idx]),
        _rotation_case(layout, "x of shape [2, 2, 4, 16] at positions 4090..4093 and 10..13 (tables [2, 4, 8])",
                       torch.randn(2, 2, 4, 16, generator=g), torch.stack([cos16[4090:4094], cos16[10:14]]),
                       torch.stack([sin16[4090:4094], sin16[10:14]])),
        _rotation_case(layout, "x of shape [1, 1, 1, 2] at position 7 (one pair, tables [1, 1, 1])",
                       torch.randn(1, 1, 1, 2, generator=g), cos2[7:8][None], sin2[7:8][None]),
        _rotation_case(layout, "x of shape [3, 3, 2, 8], batch size equal to the number of heads (tables [3, 2, 4])",
                       torch.randn(3, 3, 2, 8, generator=g), cos8[batch_heads], sin8[batch_heads]),
    ]


def _check_rotation(run: CheckRun, fn, layout: str) -> str:
    name = run.name.removeprefix("check_")
    mistakes = rotation_mistakes(layout)

    def secret(g):
        B, h, T, dh = run.randint(g, 1, 4), run.randint(g, 1, 4), run.randint(g, 1, 6), 2 * run.randint(g, 1, 9)
        cos, sin = rope_cache(64, dh)
        idx = torch.randint(0, 64, (B, T), generator=g)
        return [_rotation_case(layout, f"x of shape {[B, h, T, dh]} at drawn positions (tables {[B, T, dh // 2]})",
                               torch.randn(B, h, T, dh, generator=g), cos[idx], sin[idx])]

    for case in run.cases(_rotation_cases(run.rng(4), layout), secret, seed=105):
        x = case.args[0]
        after = Output(x)  # what the function leaves in its copy of x
        got = run.call(f"{name} {case.text}", fn, after, *case.args[1:])
        if not (isinstance(after.value, torch.Tensor) and torch.equal(after.value, x)):
            run.fail(f"{case.text}: your function changed x in place; return a new tensor.")
        run.judge(case, got, mistakes, hint=f"layout: {LAYOUTS[layout]}.",
                  dims=("sequence", "head", "position", ""), halves=True)
    g = run.rng(6)
    x = torch.randn(2, 2, 5, 8, generator=g).to(torch.bfloat16)
    cos, sin = (t.expand(2, 5, 4) for t in rope_cache(5, 8))
    bf = Case("on a bfloat16 x of shape [2, 2, 5, 8] with float32 tables [2, 5, 4]",
              partial(rope64, x, cos.unsqueeze(1).to(torch.bfloat16), sin.unsqueeze(1).to(torch.bfloat16), layout))
    got = run.call(f"{name} {bf.text}", fn, x, cos, sin)
    run.judge(bf, got, rtol=2e-2, atol=2e-2)
    run.require(getattr(got, "dtype", None) == x.dtype, bf.text, "the values are right but the output is not "
                                                                 "bfloat16: keep x's dtype (cast cos and sin to "
                                                                 "x.dtype first).")
    return "5 cases: per-sequence positions, batch size = heads, positions up to 4,093, one pair, bfloat16"


@exercise_check
def check_apply_rope(run: CheckRun, apply_rope_fn) -> str:
    """``apply_rope(x, cos, sin)``: half-split layout; x [B, heads, T, dh], per-sequence tables [B, T, dh/2]."""
    return _check_rotation(run, apply_rope_fn, "half")


@exercise_check
def check_apply_rope_interleaved(run: CheckRun, apply_rope_interleaved_fn) -> str:
    """``apply_rope_interleaved(x, cos, sin)``: pairs (2i, 2i+1); same shapes as apply_rope."""
    return _check_rotation(run, apply_rope_interleaved_fn, "interleaved")
