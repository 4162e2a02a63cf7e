"""Points: what each exercise of a reference is worth, and what a graded submission earned.

The points are nbgrader's: each check cell of the reference carries ``metadata.nbgrader.points`` (1 where a
cell has none, or where the notebook is not the instructor's). An exercise is worth the points of its check
cells; a cell's points are shared equally by the check calls in it, and each call that passes earns its share,
so an exercise with several checks gets partial credit. Its stable id is the ``grade_id`` of its answer cell
(``ex2_rmsnorm``), which the gradebook keys rows by; ``exN`` where the reference has none.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .notebook import Cell, Reference, calls_a_check, parse_check_cell, read_notebook, sections
from .report import Report

DEFAULT_POINTS = 1.0
MAX_POINTS = 1000.0  # a cell worth more is a typing slip, not a weight: it counts DEFAULT_POINTS


@dataclass
class Scheme:
    """Per exercise number: its id and the points of each of its check calls, in the reference's order."""

    ids: dict[int, str] = field(default_factory=dict)
    weights: dict[int, list[float]] = field(default_factory=dict)


@dataclass
class ScoredReference(Reference):
    """A reference with the points of its exercises (what ``grade.load_reference`` returns)."""

    scheme: Scheme = field(default_factory=Scheme)


def scored(reference: Reference, data: bytes) -> ScoredReference:
    """``reference`` with the points its notebook file (``data``) gives its exercises."""
    return ScoredReference(reference.name, reference.exercises, reference.generated_from, reference.unchecked,
                           scheme_of(data, reference))


def _nbgrader(raw_cells: list, index: int) -> dict:
    cell = raw_cells[index] if 0 <= index < len(raw_cells) else {}
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    found = meta.get("nbgrader") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def cell_points(meta: dict) -> float:
    """A check cell's points: nbgrader's ``points`` when it is a number from 0 to ``MAX_POINTS``, else 1."""
    value = meta.get("points")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_POINTS
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= MAX_POINTS else DEFAULT_POINTS


def scheme_of(data: bytes, reference: Reference) -> Scheme:
    """The points and ids of ``reference``'s exercises, read from its notebook file's bytes ``data``."""
    cells = read_notebook(data)
    raw = json.loads(data.decode("utf-8-sig")).get("cells", [])
    found = sections(cells)
    if not found:  # no headings: each check cell is an exercise (as ``reference_from`` reads it)
        found = [(n, "", [c]) for n, c in enumerate(
            (c for c in cells if c.kind == "code" and calls_a_check(c.source)), start=1)]
    by_number: dict[int, list[Cell]] = {number: section for number, _, section in found}
    scheme = Scheme()
    for ex in reference.exercises:
        weights: list[float] = []
        answer_id = check_id = ""
        for cell in by_number.get(ex.number, []):
            meta = _nbgrader(raw, cell.index)
            if cell.kind != "code":
                continue
            if calls_a_check(cell.source):
                n_calls = len(parse_check_cell(cell))
                weights += [cell_points(meta) / n_calls] * n_calls
                check_id = check_id or str(meta.get("grade_id", ""))
            elif meta.get("solution") and not answer_id:
                answer_id = str(meta.get("grade_id", ""))
        if len(weights) != len(ex.calls):  # sections that disagree with the reference's reading: 1 per call
            weights = [DEFAULT_POINTS] * len(ex.calls)
        scheme.weights[ex.number] = weights
        scheme.ids[ex.number] = answer_id or check_id.removesuffix("_check") or f"ex{ex.number}"
    seen: dict[str, int] = {}
    for number, ident in list(scheme.ids.items()):  # ids are unique within a lesson
        seen[ident] = seen.get(ident, 0) + 1
        if seen[ident] > 1:
            scheme.ids[number] = f"{ident}-{number}"
    return scheme


def default_scheme(report: Report) -> Scheme:
    """For a notebook graded against its own check cells (not the instructor's): 1 point per check."""
    return Scheme({e.number: f"ex{e.number}" for e in report.exercises},
                  {e.number: [DEFAULT_POINTS] * max(1, len(e.checks)) for e in report.exercises})


def score(report: Report, scheme: Scheme) -> None:
    """Set each exercise's id, points and maximum from ``scheme`` and the checks it passed."""
    for e in report.exercises:
        weights = scheme.weights.get(e.number) or [DEFAULT_POINTS] * max(1, len(e.checks))
        e.id = scheme.ids.get(e.number, f"ex{e.number}")
        e.max_points = float(round(sum(weights), 4))
        earned = range(len(weights)) if e.status == "passed" else e.passed_checks
        e.points = float(round(sum(weights[i] for i in earned if 0 <= i < len(weights)), 4))
