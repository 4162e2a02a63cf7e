"""What the grader reports: per submission, per exercise; as text, JSON or a CSV gradebook.

Much of what a report holds comes from students (file and folder names, error messages, notebook metadata),
so every output makes it harmless: control characters and terminal escape sequences are shown as escapes,
never sent to the terminal; a student's text never starts a line of its own in the text report; characters
that cannot be encoded (lone surrogates, undecodable file names) are escaped; and a CSV cell that a
spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``, a tab or a carriage return first) starts with
a quote instead.
"""

from __future__ import annotations

import csv
import io
import unicodedata
from dataclasses import asdict, dataclass, field

PASSED, FAILED, NOT_ATTEMPTED, NOT_GRADED = "passed", "failed", "not attempted", "not graded"
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # C0 and C1 controls, format characters (bidirectional
# overrides, zero-width), lone surrogates, and the line and paragraph separators U+2028/9


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, newlines: bool = True) -> str:
    """``text`` with every control, format and separator character and every lone surrogate escaped
    (``\\x1b``, ``\\u202e``, ``\\u2028``); line feeds and tabs are kept unless ``newlines=False``."""
    out = []
    for ch in str(text):
        if ch in "\n\t" and newlines:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif unicodedata.category(ch) in _ESCAPED:
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def one_line(text: str) -> str:
    """A student's text inside a message or a field: one line, nothing a terminal would act on."""
    return printable(text, newlines=False)


def spreadsheet_safe(value):
    """A CSV cell: text escaped as in ``printable`` (newlines kept), and a leading quote where a spreadsheet
    would read a formula."""
    if not isinstance(value, str):
        return value
    value = printable(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def clean_strings(value):
    """``value`` (a report's dict) with every string's lone surrogates escaped, for JSON in any encoding."""
    if isinstance(value, str):
        return "".join(_escape(ch) if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    if isinstance(value, dict):
        return {clean_strings(k): clean_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_strings(v) for v in value]
    return value


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
        return clean_strings(d)


_MARK = {PASSED: "✓", FAILED: "✗", NOT_ATTEMPTED: "·", NOT_GRADED: "-"}


def format_report(report: Report) -> str:
    notebook, student = one_line(report.notebook), one_line(report.student)
    lines = [notebook + (f" (student {student})" if student not in notebook else "")]
    for note in report.notes:
        lines.append(f"  note: {one_line(note)}")
    if report.error:
        lines.append(f"  error: {one_line(report.error)}")
    for cell in report.cells:
        lines.append(f"  ! cell {cell['cell']}: {one_line(cell['error'])}")
    for e in report.exercises:
        label = f"  {_MARK[e.status]} Exercise {e.number}: {one_line(e.title)}"
        lines.append(f"{label} {'.' * max(2, 60 - len(label))} {e.status} ({e.seconds:.1f} s)")
        for line in printable(e.detail).splitlines() if e.status in (FAILED, NOT_GRADED) else []:
            lines.append(f"      | {line}")
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
        row = [r.student, r.notebook, r.reference, r.status, c[PASSED], c[FAILED], c[NOT_ATTEMPTED],
               len(r.exercises), *[by_number.get(n, "") for n in numbers], f"error: {one_line(r.error)}" if r.error
               else ""]
        writer.writerow([spreadsheet_safe(cell) for cell in row])
    return out.getvalue()
