"""The grading engine shared by ``python -m modern_block grade`` and nbgrader's autograde step.

``grade_notebook`` grades one submission against a trusted reference (its cells in a sandbox, the checks here on
secret inputs, points and ids from the reference only), every student text escaped first, then cut, so a report
stays under ``MAX_REPORT_CHARS``; ``annotate`` writes the verdicts where nbgrader reads them.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from .class_folder import read_regular
from .grade_report import MAX_ERROR, MAX_OUTPUT, NOT_GRADED, PASSED, Report, bounded, one_line, short_traceback
from .notebook import NotebookError, Reference, normalised, read_notebook, reference_from
from .sandbox import Launcher, Limits, SandboxError
from .session import Options, grade_submission

MAX_CELL_ROWS = 20  # cells that raised, listed per notebook (the rest are counted in a note)
MAX_DETAIL = 4_000  # characters of one exercise's diagnosis, after escaping
MAX_REPORT_CHARS = 64_000  # cells and notes of one report: 20 x (1,200 + 1,500) + 10 notes x 500 characters

_LAUNCHERS: dict[tuple, Launcher] = {}
_LAUNCHER_LOCK = threading.Lock()


def launcher_for(python: str | None, limits: Limits) -> Launcher:
    """One launcher (its pre-loaded interpreter) per interpreter and limits, kept for the life of this process."""
    key = (python or sys.executable, limits)
    with _LAUNCHER_LOCK:
        if key not in _LAUNCHERS:
            _LAUNCHERS[key] = Launcher(python, limits)  # SandboxError where no sandbox can start
            atexit.register(_LAUNCHERS[key].close)
        return _LAUNCHERS[key]


def read_reference(path) -> Reference:
    """The instructor's notebook at ``path`` (links followed: the instructor named it) as the trusted reference.
    Raises NotebookError or BadReference."""
    data, error = read_regular(os.path.realpath(path))
    if error or data is None:
        raise NotebookError(error or "no data")
    return reference_from(read_notebook(data), os.path.basename(path))


def score(report: Report, reference: Reference | None) -> None:
    """Each exercise's id, points and maximum from the trusted ``reference``; without one, 1 point per check."""
    trusted = {e.number: e for e in reference.exercises} if reference is not None else {}
    for e in report.exercises:
        ref = trusted.get(e.number)
        weights = ref.weights if ref is not None else [1.0] * max(1, len(e.checks))
        e.id = ref.id if ref is not None else f"ex{e.number}"
        e.max_points = float(round(sum(weights), 4))
        earned = range(len(weights)) if e.status == PASSED else e.passed_checks
        e.points = float(round(sum(weights[i] for i in earned if 0 <= i < len(weights)), 4))


def finish(report: Report, reference: Reference | None) -> Report:
    """The report's lesson (the reference's name, never the submission's), points, and its caps."""
    score(report, reference)
    report.lesson = os.path.splitext(os.path.basename(reference.name))[0] if reference is not None else ""
    for e in report.exercises:
        e.detail = bounded(e.detail, MAX_DETAIL)
    rows = report.cells
    report.cells = [{**row, "error": bounded(str(row.get("error", "")), MAX_ERROR),
                     "output": bounded(short_traceback(str(row.get("output", ""))), MAX_OUTPUT)}
                    for row in rows[:MAX_CELL_ROWS]]
    if len(rows) > MAX_CELL_ROWS:
        report.notes.append(f"{len(rows) - MAX_CELL_ROWS:,} more cells raised errors (the first {MAX_CELL_ROWS} "
                            "are listed)")
    report.notes = [bounded(n, 500) for n in report.notes[:10]]
    return report


def grade_notebook(data: bytes | None, name: str, student: str, reference: Reference | None, launcher: Launcher,
                   options: Options | None = None, read_error: str | None = None) -> Report:
    """One submission, graded and finished; a bug in the grader becomes this row's error, never the run's."""
    try:
        report = grade_submission(name, student, data, reference, launcher, options, read_error=read_error)
    except SandboxError:
        raise
    except Exception as err:  # a bug in the grader: this row says so, the others are graded
        report = Report(name, student, error=f"internal error in the grader ({type(err).__name__}: "
                                             f"{one_line(str(err))[:300]}); please report it")
    return finish(report, reference)


def _error(name: str, text: str) -> dict:
    return {"output_type": "error", "ename": name, "evalue": text, "traceback": [f"{name}: {text}"]}


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def annotate(nb: dict, report: Report, reference: Reference) -> None:
    """Write ``report`` into the notebook ``nb`` (nbformat 4, the bytes that were graded, parsed): each check
    cell of ``reference`` its verdict, diagnosis and earned share of its points (as nbgrader scores a cell);
    each listed cell that raised its error and output. Every other cell's outputs are left as they are."""
    results = {e.number: e for e in report.exercises}
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        check = _check_of(cell, reference)
        row = next((r for r in report.cells if r["cell"] == index), None)
        if check is not None:
            number, calls, points = check
            cell["outputs"] = _verdict(results.get(number), calls, points, report.error)
        elif row is not None:
            cell["outputs"] = ([_stream(row["output"])] if row.get("output") else []) + [_error("Error", row["error"])]


def _check_of(cell: dict, reference: Reference) -> tuple[int, range, float] | None:
    """(exercise number, the indices of its check calls in this cell, the cell's points) for a check cell."""
    source = normalised("".join(cell.get("source", "")))
    for ex in reference.exercises:
        first = 0
        for check in ex.cells:
            if check.source == source or (check.id and check.id == cell.get("id")):
                return ex.number, range(first, first + len(check.calls)), check.points
            first += len(check.calls)
    return None


def _verdict(result, calls: range, points: float, error: str | None) -> list[dict]:
    """A check cell's outputs: a line (full points), an error (none), or the points earned as its value."""
    if result is None or result.status == NOT_GRADED:
        return [_error("NotGraded", one_line(error or "this exercise was not graded"))]
    if result.status == PASSED:
        return [_stream(f"✓ passed ({', '.join(result.checks)})\n")]
    passed = sum(i in result.passed_checks for i in calls)
    name = "NotAttempted" if result.status == "not attempted" else "CheckFailed"
    if not passed:
        return [_error(name, result.detail)]
    return [_stream(f"{name}: {result.detail}\n"),
            {"output_type": "execute_result", "execution_count": None, "metadata": {},
             "data": {"text/plain": f"{points * passed / len(calls):.6g}"}}]
