"""What the grader reports, per submission and exercise: text, JSON lines or the long CSV gradebook.

Student text (names, errors, metadata) is made harmless in every output: controls and escape sequences shown as
escapes, never at the start of a line of its own, unencodable characters escaped, and a CSV cell a spreadsheet
would run as a formula quoted.
"""

from __future__ import annotations

import csv
import functools
import io
import re
import unicodedata
from dataclasses import asdict, dataclass, field

from .notebook import Cell, sections

PASSED, FAILED, NOT_ATTEMPTED, NOT_GRADED = "passed", "failed", "not attempted", "not graded"
MAX_ERROR, MAX_OUTPUT = 1_200, 1_500  # characters of a cell's error and output kept, after escaping
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # C0 and C1 controls, format characters (bidirectional
# overrides, zero-width), lone surrogates, and the line and paragraph separators U+2028/9
_NAMED = {"\n": "\\n", "\t": "\\t"}
# runs of the characters that may need escaping: all but printable ASCII (and line feeds and tabs where kept)
_CANDIDATES = {True: re.compile(r"[^\t\n\x20-\x7e]+"), False: re.compile(r"[^\x20-\x7e]+")}


@functools.lru_cache(maxsize=4096)  # a flood of raising cells repeats the same few characters
def _shown(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if unicodedata.category(ch) not in _ESCAPED:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escape_run(match: re.Match) -> str:
    return "".join(map(_shown, match.group()))


def printable(text: str, newlines: bool = True) -> str:
    """``text`` with every control, format and separator character and every lone surrogate escaped
    (``\\x1b``, ``\\u202e``, ``\\u2028``); line feeds and tabs are kept unless ``newlines=False``."""
    return _CANDIDATES[newlines].sub(_escape_run, str(text))


def bounded(text: str, limit: int, newlines: bool = True) -> str:
    """``text`` escaped as in ``printable``, then cut to ``limit`` characters: escaping first, since one format
    character grows to six (no character beyond ``limit`` can be shown, so only those are escaped)."""
    shown = printable(text[:limit], newlines)
    return shown if len(shown) <= limit and len(text) <= limit else shown[:limit] + " [... cut]"


def one_line(text: str) -> str:
    """A student's text inside a message or a field: one line, nothing a terminal would act on."""
    return printable(text, newlines=False)


def spreadsheet_safe(value):
    """A CSV cell: one line, escaped as in ``one_line`` (so every record is one line for grep and awk), and a
    leading quote where a spreadsheet would read a formula."""
    if not isinstance(value, str):
        return value
    value = one_line(value)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def clean_strings(value):
    """``value`` (a report's dict) with every string escaped as in ``printable``, for JSON in any encoding."""
    if isinstance(value, str):
        return printable(value)
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
    id: str = ""  # stable across runs: the answer cell's nbgrader grade_id (``points.scheme``), else exN
    points: float = 0.0
    max_points: float = 0.0
    passed_checks: list[int] = field(default_factory=list)  # which of ``checks`` passed (partial credit)


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
    lesson: str = ""  # the reference's name without .ipynb: with the student, what a gradebook row is about
    labels: dict[int, str] = field(default_factory=dict)  # cell index -> how the student finds the cell

    @property
    def status(self) -> str:
        return "error" if self.error else "graded"

    @property
    def all_passed(self) -> bool:
        return not self.error and bool(self.exercises) and all(e.status == PASSED for e in self.exercises)

    @property
    def score(self) -> float:
        return round(sum(e.points for e in self.exercises), 4)

    @property
    def max_score(self) -> float:
        return round(sum(e.max_points for e in self.exercises), 4)

    @property
    def percent(self) -> float:
        return round(100 * self.score / self.max_score, 1) if self.max_score > 0 else 0.0

    def label(self, index: int) -> str:
        """Cell ``index`` (from 0, over all cells) as the student finds it: ``code cell 5 (Exercise 2)``
        (a report built without its notebook's cells: ``cell <index>``)."""
        return self.labels.get(index, f"cell {index}")

    def counts(self) -> dict[str, int]:
        return {s: sum(e.status == s for e in self.exercises) for s in STATUSES}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("labels")
        for row in d["cells"]:
            row["label"] = self.label(row["cell"])
        d["status"] = self.status
        d["summary"] = {**self.counts(), "total": len(self.exercises), "all_passed": self.all_passed,
                        "score": self.score, "max_score": self.max_score, "percent": self.percent}
        return clean_strings(d)


def number_text(value: float) -> str:
    """Points as a person writes them: 1, 0.5, 0.33."""
    return f"{value:.2f}".rstrip("0").rstrip(".") or "0"


def cell_labels(cells: list[Cell]) -> dict[int, str]:
    """Each code cell by its place among the code cells (from 1, as a student counts them down the notebook)
    and the exercise whose section holds it."""
    section = {c.index: f"Exercise {number}" for number, _, cells_of in sections(cells) for c in cells_of}
    code = [c for c in cells if c.kind == "code"]
    return {c.index: f"code cell {k}" + (f" ({section[c.index]})" if c.index in section else "")
            for k, c in enumerate(code, start=1)}


_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")


def short_traceback(output: str, keep_frames: int = 6) -> str:
    """A cell's output with its IPython traceback cut to the student's own frames: the last exception of a
    chain (the earlier ones named in one line each), frames of the student's cells (``Cell In[...]``) kept,
    each run of library frames (torch's module calls, say) replaced by one line that counts them."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("-" * 20) and i + 1 < len(lines)
                  and line.strip("-") == "" and "Traceback (most recent call last)" in lines[i + 1]), None)
    if start is None:
        return output
    before, tb = lines[:start], lines[start + 1:]
    blocks: list[list[str]] = [[]]  # one per exception of the chain
    for line in tb:
        if line.strip() in _CHAINED:
            blocks.append([])
        else:
            blocks[-1].append(line)
    causes = [_last_line(b) for b in blocks[:-1]]
    block = [line for line in blocks[-1] if line.strip("-").strip()]
    if not block:
        return output
    paragraphs: list[list[str]] = [[]]
    for line in blocks[-1][blocks[-1].index(block[0]) + 1:]:
        if line.strip():
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    frames = [p for p in paragraphs if p and p[0].startswith(("Cell In[", "File ", "<ipython-input"))]
    tail = [line for p in paragraphs if p and p not in frames for line in p]
    mine = [k for k, f in enumerate(frames) if not f[0].startswith("File ")][-keep_frames:]
    out = [*before, block[0].split()[0] + " (most recent call last; your code only):"]
    skipped = 0
    for k, frame in enumerate(frames):
        if k not in mine:
            skipped += 1
            continue
        if skipped:
            out.append(f"  ... {skipped} frame{'s' * (skipped != 1)} in libraries (torch, ...) ...")
            skipped = 0
        where = frame[0].split(", ", 1)
        out.append(f"In your code, {where[1]}" if len(where) == 2 else frame[0])
        out.extend(frame[1:])
    if skipped:
        out.append(f"  ... {skipped} frame{'s' * (skipped != 1)} in libraries (torch, ...) ...")
    out.extend(tail)
    out.extend(f"(while handling {cause})" for cause in causes if cause)
    return "\n".join(out) + "\n"


def _last_line(block: list[str]) -> str:
    text = [line for line in block if line.strip() and not line.startswith(" ")]
    return text[-1].strip() if text else ""


_MARK = {PASSED: "✓", FAILED: "✗", NOT_ATTEMPTED: "·", NOT_GRADED: "-"}


def format_report(report: Report) -> str:
    notebook, student = one_line(report.notebook), one_line(report.student)
    lines = [notebook + (f" (student {student})" if student not in notebook else "")]
    for note in report.notes:
        lines.append(f"  note: {one_line(note)}")
    if report.error:
        lines.append(f"  error: {one_line(report.error)}")
    for cell in report.cells:
        lines.append(f"  ! {report.label(cell['cell'])}: {one_line(cell['error'])}")
    for e in report.exercises:
        label = f"  {_MARK[e.status]} Exercise {e.number}: {one_line(e.title)}"
        points = f"{number_text(e.points)}/{number_text(e.max_points)} pt, " if e.max_points else ""
        lines.append(f"{label} {'.' * max(2, 60 - len(label))} {e.status} ({points}{e.seconds:.1f} s)")
        for line in printable(e.detail).splitlines() if e.status in (FAILED, NOT_GRADED) else []:
            lines.append(f"      | {line}")
    if report.error and not report.exercises:
        return "\n".join(lines)
    c = report.counts()
    restarts = f", {report.restarts} restart{'s' * (report.restarts != 1)}" if report.restarts else ""
    score = f"; {number_text(report.score)}/{number_text(report.max_score)} points ({report.percent:g}%)" \
        if report.max_score else ""
    lines.append(f"  {len(report.exercises)} exercises: {c[PASSED]} passed, {c[FAILED]} failed, "
                 f"{c[NOT_ATTEMPTED]} not attempted{score} ({report.seconds:.1f} s{restarts})")
    return "\n".join(lines)


ERROR = "error"  # an exercise's result in the gradebook when its notebook could not be graded
COLUMNS = ("student", "notebook", "reference", "status", "lesson", "exercise", "number", "title", "result",
           "points", "max_points", "detail", "graded_at")


def gradebook(reports: list[Report], graded_at: str = "", header: bool = True) -> str:
    """The long CSV of ``reports`` (``COLUMNS``, after the header where ``header``), escaped as written: one row
    per student and exercise. A notebook that could not be graded gets one row without an exercise (``result``
    error, 0 points); one stopped on the way (its time limit) keeps the exercises graded before, the others are
    ``error`` with the reason."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for r in reports:
        error = f"error: {one_line(r.error)}" if r.error else ""
        stopped = {e.number for e in r.exercises if r.error and e.status == NOT_GRADED}
        items = [(e.id or f"ex{e.number}", str(e.number), e.title, ERROR if e.number in stopped else e.status,
                  number_text(e.points), number_text(e.max_points), error if e.number in stopped else e.detail)
                 for e in r.exercises] or [("", "", "", ERROR, "0", "0", error)]
        for exercise, number, title, result, points, maximum, detail in items:
            row = [r.student, r.notebook, r.reference, r.status, r.lesson, exercise, number, title, result, points,
                   maximum, detail, graded_at]
            writer.writerow([str(spreadsheet_safe(cell)) for cell in row])
    return out.getvalue()
