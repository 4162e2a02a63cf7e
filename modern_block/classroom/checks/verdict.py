"""A check's verdict over all of its cases, and the words for how an output is off.

A check compares the student's output with the reference in several cases. Each failing case records which
of the check's candidate mistakes compute exactly what the student returned there; each passing case, which
mistakes would have failed it. When the check is over, a mistake is named only if it explains every failing
case and fails no passing one; a coincidence in one case (two mistakes giving the same number at one size)
names nothing. Without an explanation the message says where the output differs (which half of the last
dimension, which positions or heads, a constant factor), never the whole right formula.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch


@dataclass
class Failure:
    case: str
    detail: str  # how the output is off, in words
    explained: list[str] = field(default_factory=list)  # the mistakes whose output equals the student's here
    known: bool = True  # whether the check knows mistakes for this case (not for a precision-only case)


class Verdict:
    """The failing cases of one run of a check, in order."""

    def __init__(self, name: str):
        self.name = name
        self.failures: list[Failure] = []
        self.contradicted: set[str] = set()  # mistakes that would have failed a case the student passes

    def add(self, case: str, detail: str, explained: list[str], known: bool = True) -> None:
        self.failures.append(Failure(case, detail, explained, known))

    def passed(self, wrong_here: list[str]) -> None:
        """A case the student passes, and the mistakes that would have failed it."""
        self.contradicted.update(wrong_here)

    def mistakes(self) -> list[str]:
        """The candidate mistakes that explain every failing case and fail no case the student passes, in the
        order the check lists them (cases for which the check knows no mistakes, such as a bfloat16 precision
        case, do not count)."""
        judged = [f for f in self.failures if f.known]
        if not judged:
            return []
        named = [d for d in judged[0].explained
                 if d not in self.contradicted and all(d in f.explained for f in judged[1:])]
        # the simpler explanation wins: a compound diagnosis ("two at once: A and: B") that contains a named one
        return [d for d in named if not any(e != d and e in d for e in named)]

    def message(self) -> str:
        first = self.failures[0]
        n = len(self.failures)
        text = f"{self.name}: {first.case}: {first.detail}"
        if n > 1:
            text += f"\n({n} cases fail; the others: " + "; ".join(f.case for f in self.failures[1:4]) + \
                    (" ..." if n > 4 else "") + ")"
        named = self.mistakes()
        if named:
            text += "\nLikely mistake: " + "\nor: ".join(named)
            text += ("\n(Your output equals what that mistake computes in every failing case.)" if len(named) == 1
                     else "\n(These mistakes give the same output in every failing case; each would explain it.)")
        elif any(f.explained for f in self.failures):
            text += "\n(No single known mistake explains every failing case.)"
        return text


_CURRENT: contextvars.ContextVar[Verdict | None] = contextvars.ContextVar("modern_block_check_verdict", default=None)


def current() -> Verdict | None:
    return _CURRENT.get()


def start(name: str) -> contextvars.Token:
    return _CURRENT.set(Verdict(name))


def finish(token: contextvars.Token) -> Verdict | None:
    verdict = _CURRENT.get()
    _CURRENT.reset(token)
    return verdict


_OBSERVED: contextvars.ContextVar[list | None] = contextvars.ContextVar("modern_block_check_observed", default=None)


@contextlib.contextmanager
def observing():
    """Inside the block every judged case is recorded as (got, want, [(diagnosis, the mistake's output)]): the
    audit of the diagnoses (tests/test_verdict.py) replays each mistake from it."""
    seen: list = []
    token = _OBSERVED.set(seen)
    try:
        yield seen
    finally:
        _OBSERVED.reset(token)


def observe(got, want, candidates) -> None:
    seen = _OBSERVED.get()
    if seen is None:
        return
    outputs = []
    for diagnosis, make in candidates:
        try:
            outputs.append((diagnosis, make() if callable(make) else make))
        except Exception:
            outputs.append((diagnosis, None))
    seen.append((got, want, outputs))


# ---- how an answer is off --------------------------------------------------------------------------------


def _simple_fraction(ratio: float) -> Fraction | None:
    """``ratio`` as p/q with small p and q (2, 1/2, 3/2 ...), when it is one to 1e-9."""
    if not math.isfinite(ratio) or ratio <= 0:
        return None
    f = Fraction(ratio).limit_denominator(12)
    return f if f.numerator <= 64 and abs(float(f) - ratio) <= 1e-9 * ratio and f != 1 else None


def how_off(value: float, want: float) -> str:
    """How a number is off, without saying the right one: an exact simple factor, or too large / too small by
    roughly so many percent (one significant digit)."""
    if want == 0:
        return "it should be 0"
    ratio = value / want
    if ratio < 0:
        return "it has the wrong sign"
    f = _simple_fraction(ratio)
    if f is not None:
        words = {Fraction(1, 2): "half", Fraction(2): "twice", Fraction(1, 3): "a third"}
        return f"it is exactly {words.get(f, f'{f}×' if f.denominator > 1 else f'{f.numerator}×')} the right value"
    pct = abs(ratio - 1) * 100
    rough = float(f"{pct:.1g}") if pct >= 1 else None
    size = f"roughly {rough:g}%" if rough is not None else "less than 1%"
    return f"it is too {'large' if ratio > 1 else 'small'} by {size}"


def _ranges(indices: list[int]) -> str:
    parts, start = [], None
    for i, k in enumerate(indices):
        if start is None:
            start = k
        if i + 1 == len(indices) or indices[i + 1] != k + 1:
            parts.append(str(start) if start == k else f"{start}-{k}")
            start = None
    return ", ".join(parts)


def where_differs(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, dims: tuple[str, ...] = ()) -> str:
    """Where two same-shaped tensors differ (``bad``: the elementwise mismatch): which half of the last dimension,
    which indices along the named dimensions (``dims`` names the trailing ones: "head", "position" ..., "" for
one not to report), and a
    constant factor between them if there is one."""
    notes = []
    g, w = got.detach().double(), want.detach().double()
    nonzero = w.abs() > 1e-6 * (w.abs().max() + 1e-30)
    if nonzero.any() and torch.isfinite(g).all():
        r = g[nonzero] / w[nonzero]
        if (r - r.mean()).abs().max() <= 1e-3 * r.mean().abs() and abs(r.mean().item() - 1) > 1e-3:
            notes.append(f"everywhere it is {r.mean().item():.4g} × the correct output (a constant factor)")
    if want.dim() >= 1 and want.shape[-1] >= 2 and want.shape[-1] % 2 == 0:
        half = want.shape[-1] // 2
        lo, hi = bool(bad[..., :half].any()), bool(bad[..., half:].any())
        if lo != hi:
            notes.append(f"only the {'first' if lo else 'second'} half of the last dimension differs")
    names = dict(zip(range(want.dim() - len(dims), want.dim()), dims, strict=True))
    for axis, label in names.items():
        size = want.shape[axis]
        if size < 2 or axis < 0 or not label:
            continue
        per = bad.transpose(axis, -1).reshape(-1, size).any(0)
        wrong = [int(i) for i in per.nonzero().flatten()]
        if 0 < len(wrong) < size:
            right = [i for i in range(size) if i not in wrong]
            notes.append(f"{label} {_ranges(right)} {'is' if len(right) == 1 else 'are'} right, {label} "
                         f"{_ranges(wrong)} {'differs' if len(wrong) == 1 else 'differ'}")
    return "; ".join(notes)
