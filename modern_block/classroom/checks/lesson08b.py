"""Lesson 08b: the verdict an interval supports, and Holm's adjustment for a table of comparisons."""

from __future__ import annotations

import math

import torch

from .core import call_student, exercise_check, fail, generator, is_graded, judge

# ---- exercise 1: the verdict of one interval ---------------------------------------------------------------


def _verdict(low: float, high: float, *, words="inconclusive", reach="far", closed=False, sign=1) -> str:
    """The lesson's verdict for an interval [low, high] of b - a, with knobs for the common mistakes."""
    if sign < 0:
        low, high = -high, -low
    lower = high <= 0 if closed else high < 0
    higher = low >= 0 if closed else low > 0
    if lower:
        return "lower"
    if higher:
        return "higher"
    if words == "no difference":
        return "no difference at this scale"
    h = max(-low, high) if reach == "far" else (high - low) / 2
    return f"inconclusive at this scale (the interval holds 0; it could hide an effect of up to ±{h:.4f})"


@exercise_check(components=("verdict",))
def check_verdict(verdict) -> str:
    """``verdict(low, high)``: "lower" when the whole interval of b - a lies below 0, "higher" when above, else
    "inconclusive at this scale (the interval holds 0; it could hide an effect of up to ±h)", h = max(-low, high)
    with 4 decimals."""
    __tracebackhide__ = True
    name = "check_verdict"
    cases = [(-0.1793, -0.0938), (0.064, 0.1862), (-0.0591, 0.1078), (-0.2121, 0.0068), (-0.1, 0.0), (0.0, 0.25),
             (-0.03, 0.03)]
    if is_graded():
        g = generator(81)
        for _ in range(3):
            a, b = sorted((torch.rand(2, generator=g) * 0.6 - 0.3).tolist())
            cases.append((round(a, 4), round(b, 4)))
    for low, high in cases:
        call = f"verdict({low}, {high})"
        got = call_student(name, call, verdict, low, high)
        want = _verdict(low, high)
        if not isinstance(got, str):
            fail(name, f"{call}: expected a string, got {type(got).__name__} {got!r}.")
        if got == want:
            continue
        cands = [
            ("an interval that holds 0 was called \"no difference\": it is inconclusive, and it could hide an effect "
             "as large as its farther end.", _verdict(low, high, words="no difference")),
            ("h is the half-width (high - low)/2; the largest effect the interval could hide is its farther end from "
             "0, max(-low, high).", _verdict(low, high, reach="half")),
            ("an interval that touches 0 at one end (low == 0 or high == 0) still holds 0: it is inconclusive "
             "(use < and >, not <= and >=).", _verdict(low, high, closed=True)),
            ("\"lower\" and \"higher\" are swapped: the interval is of b - a, and an interval below 0 means b's loss "
             "is lower.", _verdict(low, high, sign=-1)),
        ]
        for diagnosis, wrong in cands:
            if wrong != want and got == wrong:
                fail(name, f"{call}: got {got!r}, expected {want!r}.\nLikely mistake: {diagnosis}")
        fail(name, f"{call}: got {got!r}, expected {want!r}.")
    return f"{len(cases)} intervals: wholly below, wholly above, holding 0, touching 0 at one end"


# ---- exercise 2: Holm's adjustment -------------------------------------------------------------------------


def _holm(ps, *, factor="holm", running=True, cap=True, order="input") -> list[float]:
    """Holm's adjusted p-values in the input's order, with knobs for the common mistakes."""
    m = len(ps)
    idx = sorted(range(m), key=lambda j: ps[j])
    out, best = [0.0] * m, 0.0
    for k, i in enumerate(idx):
        mult = {"holm": m - k, "bonferroni": m, "rank": k + 1}[factor]
        value = mult * ps[i]
        value = min(1.0, value) if cap else value
        best = max(best, value) if running else value
        out[i] = best
    return [out[i] for i in idx] if order == "sorted" else out


@exercise_check(components=("holm",))
def check_holm(holm) -> str:
    """``holm(p_values)``: Holm's step-down adjusted p-values, in the input's order: sort ascending, multiply the
    k-th smallest (k from 0) by m - k, cap at 1, carry the running maximum up."""
    __tracebackhide__ = True
    name = "check_holm"
    cases = [[0.01, 0.04, 0.03, 0.005], [0.3, 0.6], [0.7, 0.8, 0.01], [0.02], [0.001, 0.2, 0.04, 0.04, 0.5, 0.012],
             [0.04, 0.045, 0.001]]
    if is_graded():
        g = generator(82)
        cases += [(torch.rand(int(torch.randint(2, 14, (1,), generator=g)), generator=g) ** 3).tolist()
                  for _ in range(3)]
    for ps in cases:
        call = f"holm({[round(p, 4) for p in ps]})"
        got = call_student(name, call, holm, list(ps))
        if isinstance(got, tuple):
            got = list(got)
        if isinstance(got, list):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got):
                fail(name, f"{call}: expected a list of numbers, got {got!r}.")
            got = torch.tensor(got, dtype=torch.float64)
        elif isinstance(got, torch.Tensor):
            got = got.detach().double()
        else:
            fail(name, f"{call}: expected a list of adjusted p-values, got {type(got).__name__} {got!r}.")
        want = torch.tensor(_holm(ps), dtype=torch.float64)
        cands = [
            ("every p was multiplied by m (Bonferroni): Holm multiplies the k-th smallest by m - k, so only the "
             "smallest gets the full factor.", lambda ps=ps: torch.tensor(_holm(ps, factor="bonferroni"),
                                                                          dtype=torch.float64)),
            ("the k-th smallest was multiplied by k + 1 (its rank): Holm's factor runs the other way, m - k.",
             lambda ps=ps: torch.tensor(_holm(ps, factor="rank"), dtype=torch.float64)),
            ("the running maximum is missing: an adjusted p must be at least the one before it in sorted order.",
             lambda ps=ps: torch.tensor(_holm(ps, running=False), dtype=torch.float64)),
            ("the values are not capped at 1: an adjusted p-value is a probability, min(1, ...).",
             lambda ps=ps: torch.tensor(_holm(ps, cap=False), dtype=torch.float64)),
            ("the adjusted values came back in sorted order: return them in the order of the input.",
             lambda ps=ps: torch.tensor(_holm(ps, order="sorted"), dtype=torch.float64)),
        ]
        judge(name, got, want, cands, call, rtol=1e-9, atol=1e-12,
              hint="sort, multiply the k-th smallest by m - k, cap at 1, running maximum, back to the input order.")
    return f"{len(cases)} tables, incl. one comparison, ties and a value capped at 1"
