"""What the grader reports: per submission, per exercise; as text, JSON or a CSV gradebook."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field

PASSED, FAILED, NOT_ATTEMPTED, NOT_GRADED = "passed", "failed", "not attempted", "not graded"
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED)


@dataclass
class Exercise:
    number: int
    title: str
    checks: list[str] = field(default_factory=list)
    status: str = NOT_GRADED
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    """One submission. ``error`` is set when it could not be graded (the row of a broken, hostile or
    endless notebook); exercises graded before that keep their status."""

    notebook: str
    student: str
    reference: str = ""
    exercises: list[Exercise] = field(default_factory=list)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    cells: list[dict] = field(default_factory=list)  # cells that raised or were stopped, with their output
    restarts: int = 0
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return "error" if self.error else "graded"

    @property
    def all_passed(self) -> bool:
        return not self.error and bool(self.exercises) and all(e.status == PASSED for e in self.exercises)

    def counts(self) -> dict[str, int]:
        return {s: sum(e.status == s for e in self.exercises) for s in STATUSES}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        d["summary"] = {**self.counts(), "total": len(self.exercises), "all_passed": self.all_passed}
        return d


_MARK = {PASSED: "✓", FAILED: "✗", NOT_ATTEMPTED: "·", NOT_GRADED: "-"}


def format_report(report: Report) -> str:
    head = report.notebook + (f" (student {report.student})" if report.student not in report.notebook else "")
    lines = [head]
    for note in report.notes:
        lines.append(f"  note: {note}")
    if report.error:
        lines.append(f"  error: {report.error}")
    for cell in report.cells:
        lines.append(f"  ! cell {cell['cell']}: {cell['error']}")
    for e in report.exercises:
        label = f"  {_MARK[e.status]} Exercise {e.number}: {e.title}"
        lines.append(f"{label} {'.' * max(2, 60 - len(label))} {e.status} ({e.seconds:.1f} s)")
        for line in e.detail.splitlines() if e.status in (FAILED, NOT_GRADED) else []:
            lines.append(f"      {line}")
    if report.error and not report.exercises:
        return "\n".join(lines)
    c = report.counts()
    restarts = f", {report.restarts} restart{'s' * (report.restarts != 1)}" if report.restarts else ""
    lines.append(f"  {len(report.exercises)} exercises: {c[PASSED]} passed, {c[FAILED]} failed, "
                 f"{c[NOT_ATTEMPTED]} not attempted ({report.seconds:.1f} s{restarts})")
    return "\n".join(lines)


def gradebook(reports: list[Report]) -> str:
    """The CSV gradebook: one row per submission, one column per exercise number."""
    numbers = sorted({e.number for r in reports for e in r.exercises})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "notebook", "reference", "status", "passed", "failed", "not_attempted", "total",
                     *[f"ex{n}" for n in numbers], "error"])
    for r in reports:
        c = r.counts()
        by_number = {e.number: e.status for e in r.exercises}
        writer.writerow([r.student, r.notebook, r.reference, r.status, c[PASSED], c[FAILED], c[NOT_ATTEMPTED],
                         len(r.exercises), *[by_number.get(n, "") for n in numbers],
                         f"error: {r.error}" if r.error else ""])
    return out.getvalue()
