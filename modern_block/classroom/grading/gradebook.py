"""The gradebook across runs: a regrade merged into the file, and the one-row-per-student export.

The gradebook (``--csv``) is the long CSV of ``report.gradebook``: one row per student and exercise. Grading
into an existing gradebook merges: the rows of each (student, lesson) graded in this run replace that pair's
rows, every other row is kept, and ``Merge.summary`` says what changed. Rows are compared as written
(escaped), so a name escaped on the way out matches itself on the next run. A file that is not such a
gradebook is refused (the grader writes over it only when told to, ``--overwrite-gradebook``).

The export (``--wide``) has one row per student, ready for an LMS gradebook import: the student's id (the
folder name), the points of each lesson (empty where nothing was handed in), the total, the maximum (every
lesson's maximum, handed in or not) and the percentage.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from .report import COLUMNS, Report, number_text, one_line, percent, render_csv

STUDENT, NOTEBOOK, LESSON, EXERCISE = (COLUMNS.index(c) for c in ("student", "notebook", "lesson", "exercise"))
RESULT, POINTS, MAX_POINTS = (COLUMNS.index(c) for c in ("result", "points", "max_points"))


class GradebookError(ValueError):
    """A file at ``--csv`` that is not a gradebook of this grader (so merging into it would lose it)."""


def parse(text: str, where: str = "the gradebook") -> list[list[str]]:
    """The rows of a gradebook file's text (header checked). Raises GradebookError."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(rows[0]) != COLUMNS:
        first = one_line(text.split("\n", 1)[0])[:120] if text else "(empty)"
        raise GradebookError(f"{where} is not a gradebook of this grader (its first line is {first!r}, expected "
                             f"{','.join(COLUMNS)!r}); to replace it pass --overwrite-gradebook, or choose another "
                             "file")
    bad = [n for n, row in enumerate(rows[1:], start=2) if len(row) != len(COLUMNS)]
    if bad:
        raise GradebookError(f"{where}: line {bad[0]} has {len(rows[bad[0] - 1])} fields, not {len(COLUMNS)}; "
                             "to replace the file pass --overwrite-gradebook")
    return rows[1:]


def key(row: list[str]) -> tuple[str, str]:
    """Who and what a row is about: (student, lesson); a notebook of no known lesson by its path."""
    return row[STUDENT], row[LESSON] or row[NOTEBOOK]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _total(rows: list[list[str]], column: int) -> float:
    return round(sum(_number(r[column]) for r in rows), 4)


def _changes(old: list[list[str]], new: list[list[str]]) -> list[str]:
    """What a regrade changed for one (student, lesson), exercise by exercise, in words."""
    before = {r[EXERCISE]: r for r in old}
    out = []
    for row in new:
        was = before.pop(row[EXERCISE], None)
        now = f"{row[RESULT]} {row[POINTS]}/{row[MAX_POINTS]}"
        if was is None:
            out.append(f"{row[EXERCISE] or 'the notebook'}: new, {now}")
        elif (was[RESULT], was[POINTS], was[MAX_POINTS]) != (row[RESULT], row[POINTS], row[MAX_POINTS]):
            out.append(f"{row[EXERCISE] or 'the notebook'}: {was[RESULT]} {was[POINTS]}/{was[MAX_POINTS]} -> {now}")
    out += [f"{ex or 'the notebook'}: no longer graded (was {r[RESULT]})" for ex, r in before.items()]
    return out


@dataclass
class Merge:
    rows: list[list[str]]
    kept: int = 0  # (student, lesson) pairs of the old file this run did not touch
    new: list[tuple[str, str]] = field(default_factory=list)
    replaced: list[tuple[str, str, list[str]]] = field(default_factory=list)  # with what changed
    notes: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """The changes, one line each (every student text escaped)."""
        lines = [f"gradebook: {len(self.rows)} rows; {len(self.replaced)} (student, lesson) regraded, "
                 f"{len(self.new)} new, {self.kept} kept as they were"]
        for student, lesson, changes in self.replaced:
            what = "; ".join(changes) if changes else "unchanged"
            lines.append(f"  regraded {one_line(student)} {one_line(lesson)}: {one_line(what)}")
        lines += [f"  new {one_line(s)} {one_line(lesson)}" for s, lesson in self.new]
        lines += [f"  note: {one_line(n)}" for n in self.notes]
        return lines

    def to_dict(self) -> dict:
        return {"rows": len(self.rows), "kept": self.kept, "notes": self.notes,
                "new": [{"student": s, "lesson": lesson} for s, lesson in self.new],
                "regraded": [{"student": s, "lesson": lesson, "changes": c} for s, lesson, c in self.replaced]}


def merge(old: list[list[str]], new: list[list[str]]) -> Merge:
    """``new`` (this run's rows) merged into ``old`` (the file's): each (student, lesson) of ``new`` replaces
    that pair's old rows; the rest stay. Rows sorted by student, then lesson, exercises in their order."""
    old_by: dict[tuple[str, str], list[list[str]]] = {}
    for row in old:
        old_by.setdefault(key(row), []).append(row)
    new_by: dict[tuple[str, str], list[list[str]]] = {}
    for row in new:
        new_by.setdefault(key(row), []).append(row)
    result = Merge([])
    for pair, rows in new_by.items():
        if pair in old_by:
            result.replaced.append((*pair, _changes(old_by[pair], rows)))
        else:
            result.new.append(pair)
    result.kept = sum(pair not in new_by for pair in old_by)
    merged = {**old_by, **new_by}
    result.rows = [row for pair in sorted(merged) for row in merged[pair]]
    return result


def pick(reports: list[Report]) -> tuple[list[Report], list[str]]:
    """One report per (student, lesson) for the gradebook: where a student handed in two notebooks of one
    lesson, the higher score (the first of equals), and a note that names both."""
    chosen: dict[tuple[str, str], Report] = {}
    notes = []
    for r in reports:
        pair = (r.student, r.lesson or r.notebook)
        other = chosen.get(pair)
        if other is None:
            chosen[pair] = r
            continue
        best = r if r.score > other.score else other
        notes.append(f"{r.student} handed in two notebooks of {pair[1]} ({other.notebook}, {r.notebook}): the "
                     f"gradebook holds {best.notebook} ({number_text(best.score)}/{number_text(best.max_score)}), "
                     "the higher score; grade the other alone to replace it")
        chosen[pair] = best
    kept = {id(r) for r in chosen.values()}
    return [r for r in reports if id(r) in kept], notes


def wide(rows: list[list[str]]) -> str:
    """The one-row-per-student export of a gradebook's rows (as written, so already escaped)."""
    lessons = sorted({r[LESSON] for r in rows if r[LESSON]})
    by_pair: dict[tuple[str, str], list[list[str]]] = {}
    for r in rows:
        if r[LESSON]:
            by_pair.setdefault((r[STUDENT], r[LESSON]), []).append(r)
    maximum = {lesson: max(_total(rs, MAX_POINTS) for (_, ls), rs in by_pair.items() if ls == lesson)
               for lesson in lessons}
    course_max = round(sum(maximum.values()), 4)
    out = []
    for student in sorted({r[STUDENT] for r in rows}):
        scores = [_total(by_pair[(student, lesson)], POINTS) if (student, lesson) in by_pair else None
                  for lesson in lessons]
        total = round(sum(s for s in scores if s is not None), 4)
        out.append([student, *["" if s is None else number_text(s) for s in scores], number_text(total),
                    number_text(course_max), f"{percent(total, course_max):g}"])
    return render_csv(["student", *lessons, "total", "max", "percent"], out)
