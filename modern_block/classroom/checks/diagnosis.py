"""A check's diagnosis over all its cases, and the words for how an answer is off.

Every failing case records which known mistakes compute exactly what the student returned there; every passing
case is kept, to ask later whether a mistake would have failed it. When the check is over, the mistakes named are
those that explain every failing case and fail no passing one: one ("Likely mistake: ..."), several that no case
of the check tells apart ("Likely mistake, one of: ..."), or none (the message then says where the output
differs). A compound diagnosis ("two at once: ...") that contains a named one gives way to it.

No message lets a student compute a target: a number that is off is described by its direction and a rough
size (a band: "by 1% to 10%", "by about 13 orders of magnitude"), never by an exact ratio or the right value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ONE = "\nLikely mistake: "
SEVERAL = "\nLikely mistake, one of:"
ONE_NOTE = "(Your output equals what that mistake computes in every failing case.)"
SEVERAL_NOTE = "(Each of these computes your output in every failing case; no case of this check tells them apart.)"


@dataclass
class Failure:
    case: str
    detail: str  # how the output is off, in words
    diagnoses: list[str] = field(default_factory=list)  # the check's known mistakes for this case, in its order
    explains: Callable[[str], bool] = lambda diagnosis: False  # whether a mistake computes the student's output here
    known: bool = True  # whether the check knows mistakes for this case (not for a precision-only case)


class Diagnosis:
    """The failing and passing cases of one run of a check, in order. What a mistake computes in a case is asked
    only when it matters (a check may know hundreds of mistakes, two at a time)."""

    def __init__(self, name: str):
        self.name = name
        self.failures: list[Failure] = []
        self.passes: list[Callable[[str], bool]] = []  # per passing case: would this mistake have failed it?

    def failed(self, case: str, detail: str, diagnoses: list[str], explains: Callable[[str], bool],
               known: bool = True) -> None:
        self.failures.append(Failure(case, detail, diagnoses, explains, known))

    def passed(self, would_fail: Callable[[str], bool]) -> None:
        self.passes.append(would_fail)

    def mistakes(self) -> list[str]:
        """The known mistakes that explain every failing case and fail no passing one, in the check's order
        (cases for which the check knows no mistakes, such as a bfloat16 precision case, do not count)."""
        judged = [f for f in self.failures if f.known]
        if not judged:
            return []
        named = [d for d in judged[0].diagnoses if judged[0].explains(d)]
        named = [d for d in named if all(f.explains(d) for f in judged[1:])]
        named = [d for d in named if not any(would_fail(d) for would_fail in self.passes)]
        return [d for d in named if not any(e != d and e in d for e in named)]  # the simpler explanation wins

    def message(self) -> str:
        first = self.failures[0]
        text = f"{self.name}: {first.case}: {first.detail}"
        if len(self.failures) > 1:
            others = [f.case for f in self.failures[1:4]]
            text += f"\n({len(self.failures)} cases fail; the others: " + "; ".join(others) + \
                (" ..." if len(self.failures) > 4 else "") + ")"
        named = self.mistakes()
        if len(named) == 1:
            text += f"{ONE}{named[0]}\n{ONE_NOTE}"
        elif named:
            text += SEVERAL + "".join(f"\n- {d}" for d in named) + f"\n{SEVERAL_NOTE}"
        elif any(f.explains(d) for f in self.failures for d in f.diagnoses[:64]):
            text += "\n(No single known mistake explains every failing case.)"
        return text


def named(message: str) -> list[str]:
    """The mistakes a check's message names."""
    if ONE in message:
        return [message.split(ONE, 1)[1].split(f"\n{ONE_NOTE}", 1)[0]]
    if SEVERAL in message:
        body = message.split(SEVERAL, 1)[1].split(f"\n{SEVERAL_NOTE}", 1)[0]
        return [line[2:] for line in body.split("\n") if line.startswith("- ")]
    return []


# ---- how an answer is off, without the right value -----------------------------------------------------


def rough_factor(ratio: float) -> str:
    """How far a positive ratio (got / right) is from 1, in bands: never the ratio itself."""
    if ratio >= 10 or ratio <= 0.1:
        orders = round(abs(math.log10(ratio)))
        return f"too {'large' if ratio > 1 else 'small'} by about {orders} order{'s' * (orders != 1)} of magnitude"
    if ratio >= 1.5:
        return "too large: between 1.5 and 10 times the right value"
    if ratio <= 0.5:
        return "too small: between a tenth and a half of the right value"
    off = abs(ratio - 1)
    band = "less than 1%" if off < 0.01 else "1% to 10%" if off < 0.1 else "10% to 50%"
    return f"too {'large' if ratio > 1 else 'small'} by {band}"


def how_off(value: float, want: float) -> str:
    """How a number is off, in words that do not give the right one away."""
    if want == 0 or value == 0:
        return f"it is too {'large' if value > want else 'small'}"
    ratio = value / want
    if not math.isfinite(ratio):
        return f"it is too {'large' if abs(value) > abs(want) else 'small'}"
    if ratio < 0:
        return "it has the wrong sign"
    return f"it is {rough_factor(ratio)}"


def shown(value) -> str:
    """A student's number as the message shows it: exact for an int, ten significant digits for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.10g}"


# ---- where two tensors differ --------------------------------------------------------------------------


def _ranges(indices: list[int]) -> str:
    parts, start = [], None
    for i, k in enumerate(indices):
        if start is None:
            start = k
        if i + 1 == len(indices) or indices[i + 1] != k + 1:
            parts.append(str(start) if start == k else f"{start}-{k}")
            start = None
    return ", ".join(parts)


def where_differs(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, dims: tuple[str, ...] = (),
                  halves: bool = False) -> str:
    """Where two same-shaped tensors differ (``bad``: the elementwise mismatch): a constant factor between them
    (as a rough band), which half of the last dimension (``halves``: for head vectors, whose halves RoPE pairs),
    which indices along the named trailing dimensions (``dims``, "" for one not to report)."""
    notes = []
    g, w = got.detach().double(), want.detach().double()
    nonzero = w.abs() > 1e-6 * (w.abs().max() + 1e-30)
    if nonzero.any() and torch.isfinite(g).all():
        r = g[nonzero] / w[nonzero]
        mean = r.mean().item()
        if mean != 0 and (r - mean).abs().max() <= 1e-3 * abs(mean) and abs(mean - 1) > 1e-3:
            band = "it has the wrong sign" if mean < 0 else rough_factor(mean)
            notes.append(f"everywhere it is the correct output times one constant factor ({band})")
    if halves and want.dim() >= 1 and want.shape[-1] >= 2 and want.shape[-1] % 2 == 0:
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
