"""Lesson 08b: the verdict an interval supports, and Holm's adjustment for a table of comparisons."""

from __future__ import annotations

import math
from functools import partial

import torch

from .core import Case, CheckRun, Mistake, exercise_check

# ---- exercise 1: the verdict of one interval ---------------------------------------------------------------


def _verdict(low: float, high: float, *, words="inconclusive", reach="far", closed=False, sign=1) -> str:
    """The lesson's verdict for an interval [low, high] of b - a, with knobs for the common mistakes."""
    if sign < 0:
        low, high = -high, -low
    if high <= 0 if closed else high < 0:
        return "lower"
    if low >= 0 if closed else low > 0:
        return "higher"
    if words == "no difference":
        return "no difference at this scale"
    h = max(-low, high) if reach == "far" else (high - low) / 2
    return f"inconclusive at this scale (the interval holds 0; it could hide an effect of up to ±{h:.4f})"


VERDICT_MISTAKES = [
    Mistake("an interval that holds 0 was called \"no difference\": it is inconclusive, and it could hide an effect "
            "as large as its farther end.", dict(words="no difference")),
    Mistake("h is the half-width (high - low)/2; the largest effect the interval could hide is its farther end from "
            "0, max(-low, high).", dict(reach="half")),
    Mistake("an interval that touches 0 at one end (low == 0 or high == 0) still holds 0: it is inconclusive (use < "
            "and >, not <= and >=).", dict(closed=True)),
    Mistake("\"lower\" and \"higher\" are swapped: the interval is of b - a, and an interval below 0 means b's loss "
            "is lower.", dict(sign=-1)),
]


def _verdict_case(low: float, high: float) -> Case:
    return Case(f"verdict({low}, {high})", partial(_verdict, low, high), (low, high))


@exercise_check
def check_verdict(run: CheckRun, verdict) -> str:
    """``verdict(low, high)``: "lower" when the whole interval of b - a lies below 0, "higher" when above, else
    "inconclusive at this scale (the interval holds 0; it could hide an effect of up to ±h)", h = max(-low, high)
    with 4 decimals."""
    public = [_verdict_case(*c) for c in [(-0.1793, -0.0938), (0.064, 0.1862), (-0.0591, 0.1078), (-0.2121, 0.0068),
                                          (-0.1, 0.0), (0.0, 0.25), (-0.03, 0.03)]]

    def secret(g):
        return [_verdict_case(*(round(v, 4) for v in sorted((torch.rand(2, generator=g) * 0.6 - 0.3).tolist())))
                for _ in range(3)]

    for case in run.cases(public, secret, seed=81):
        got = run.call(case.text, verdict, *case.args)
        if not isinstance(got, str):
            run.fail(f"{case.text}: expected a string, got {type(got).__name__} {got!r}.")
        run.judge_equal(case, got, VERDICT_MISTAKES)
    return "7 intervals: wholly below, wholly above, holding 0, touching 0 at one end"


# ---- exercise 2: Holm's adjustment -------------------------------------------------------------------------


def _holm(ps, *, factor="holm", running=True, cap=True, order="input") -> torch.Tensor:
    """Holm's adjusted p-values in the input's order, with knobs for the common mistakes."""
    m = len(ps)
    idx = sorted(range(m), key=lambda j: ps[j])
    out, best = [0.0] * m, 0.0
    for k, i in enumerate(idx):
        value = {"holm": m - k, "bonferroni": m, "rank": k + 1}[factor] * ps[i]
        value = min(1.0, value) if cap else value
        best = max(best, value) if running else value
        out[i] = best
    return torch.tensor([out[i] for i in idx] if order == "sorted" else out, dtype=torch.float64)


HOLM_MISTAKES = [
    Mistake("every p was multiplied by m (Bonferroni): Holm multiplies the k-th smallest by m - k, so only the "
            "smallest gets the full factor.", dict(factor="bonferroni")),
    Mistake("the k-th smallest was multiplied by k + 1 (its rank): Holm's factor runs the other way, m - k.",
            dict(factor="rank")),
    Mistake("the running maximum is missing: an adjusted p must be at least the one before it in sorted order.",
            dict(running=False)),
    Mistake("the values are not capped at 1: an adjusted p-value is a probability, min(1, ...).", dict(cap=False)),
    Mistake("the adjusted values came back in sorted order: return them in the order of the input.",
            dict(order="sorted")),
]


def _holm_case(ps: list[float]) -> Case:
    return Case(f"holm({[round(p, 4) for p in ps]})", partial(_holm, ps), (ps,))


@exercise_check
def check_holm(run: CheckRun, holm) -> str:
    """``holm(p_values)``: Holm's step-down adjusted p-values, in the input's order: sort ascending, multiply the
    k-th smallest (k from 0) by m - k, cap at 1, carry the running maximum up."""
    public = [_holm_case(c) for c in [[0.01, 0.04, 0.03, 0.005], [0.3, 0.6], [0.7, 0.8, 0.01], [0.02],
                                      [0.001, 0.2, 0.04, 0.04, 0.5, 0.012], [0.04, 0.045, 0.001]]]

    def secret(g):
        return [_holm_case((torch.rand(run.randint(g, 2, 14), generator=g) ** 3).tolist()) for _ in range(3)]

    for case in run.cases(public, secret, seed=82):
        got = run.call(case.text, holm, list(case.args[0]))
        got = list(got) if isinstance(got, tuple) else got
        if isinstance(got, list):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got):
                run.fail(f"{case.text}: expected a list of numbers, got {got!r}.")
            got = torch.tensor(got, dtype=torch.float64)
        elif not isinstance(got, torch.Tensor):
            run.fail(f"{case.text}: expected a list of adjusted p-values, got {type(got).__name__} {got!r}.")
        run.judge(case, got.detach().double(), HOLM_MISTAKES, rtol=1e-9, atol=1e-12, dims=("p-value",),
                  hint="compare with the rule: sorted ascending, the k-th smallest times m - k, capped at 1, running "
                       "maximum, back in the input's order.")
    return "6 tables, incl. one comparison, ties and a value capped at 1"
