"""Grade one submission: run its cells in a fresh sandbox, check each exercise in the grader.

Exercises whose right answer may build on another's (each check's ``uses``) are graded in separate runs, each
with its own pieces hidden (``groups``). Every cell and check gets ``timeout`` seconds, the notebook
``notebook_timeout``; after a timeout or a crash a fresh sandbox replays the cells before and grading goes on.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from .. import checks
from ..checks import graded
from ..checks.in_notebook import answer_sources
from .grade_report import (
    FAILED,
    MAX_ERROR,
    MAX_OUTPUT,
    NOT_ATTEMPTED,
    PASSED,
    Exercise,
    Report,
    bounded,
    cell_labels,
    one_line,
    printable,
)
from .notebook import (
    BadReference,
    Cell,
    NotebookError,
    Plan,
    Reference,
    RefExercise,
    plan_run,
    read_notebook,
    reference_from,
)
from .remote import MISSING, Link
from .sandbox import Launcher, Sandbox, SandboxLost

MAX_RESTARTS = 6


@dataclass(frozen=True)
class Options:
    timeout: float = 60.0  # seconds per cell and per exercise's check
    notebook_timeout: float = 600.0  # seconds for the whole submission


class _OutOfTime(Exception):
    """The notebook ran past its own time limit."""


def _names(ex: RefExercise, attribute: str) -> set[str]:
    return {c for call in ex.calls for c in getattr(getattr(checks, call.check), attribute, ())}


def groups(reference: Reference) -> list[tuple[frozenset[str], list[RefExercise]]]:
    """The runs a submission needs: (components hidden, exercises checked) each. An exercise joins the first
    run that hides nothing it uses and uses nothing it hides; usually all exercises share one run."""
    runs: list[tuple[set[str], set[str], list[RefExercise]]] = []
    for ex in reference.exercises:
        hidden, used = _names(ex, "components"), _names(ex, "uses")
        for run_hidden, run_used, members in runs:
            if not (hidden & run_used) and not (used & run_hidden):
                run_hidden |= hidden
                run_used |= used
                members.append(ex)
                break
        else:
            runs.append((hidden, used, [ex]))
    return [(frozenset(hidden), members) for hidden, _, members in runs]


class _Run:
    """The submission's sandbox, restarted (with the cells that ran before replayed) when it is lost."""

    def __init__(self, launcher: Launcher, hidden: frozenset[str], notebook: bytes | None, options: Options,
                 deadline: float, report: Report, record):
        self.launcher, self.hidden, self.notebook = launcher, hidden, notebook
        self.options, self.deadline, self.report, self.record = options, deadline, report, record
        self.box: Sandbox | None = None
        self.done: list[Cell] = []  # cells that ran (with or without an error), in order: replayed on restart
        self.errors: dict[int, str] = {}  # cell index -> its error in this run

    def limit(self) -> float:
        now = time.monotonic()
        if now >= self.deadline:
            raise _OutOfTime()
        return min(now + self.options.timeout, self.deadline)

    def sandbox(self):
        """A live process with every cell that ran so far run again (fresh after a loss)."""
        while self.box is None or self.box.closed:
            if self.box is not None:
                self.report.restarts += 1
                if self.report.restarts > MAX_RESTARTS:
                    raise NotebookError(f"its process was lost more than {MAX_RESTARTS} times "
                                        "(endless loops, crashes or exits in many cells)")
            self.limit()
            self.box = self.launcher.spawn(self.hidden, self.notebook)
            for cell in list(self.done):
                try:
                    self._exec(cell)
                except SandboxLost as lost:
                    self._lose(cell, lost)
                    break
        return self.box

    def _exec(self, cell: Cell) -> dict:
        deadline = self.limit()
        assert self.box is not None, "a cell runs in a started sandbox"
        try:
            return self.box.request({"op": "exec", "source": cell.source}, deadline)
        except SandboxLost:
            if time.monotonic() >= self.deadline:
                raise _OutOfTime() from None
            raise

    def _lose(self, cell: Cell, lost: SandboxLost) -> None:
        if cell in self.done:
            self.done.remove(cell)
        self.errors[cell.index] = _lost(lost, self.options.timeout)
        self.record(cell.index, self.errors[cell.index], "")

    def run_cell(self, cell: Cell) -> None:
        try:
            self.sandbox()
            reply = self._exec(cell)
        except SandboxLost as lost:
            self._lose(cell, lost)
            return
        self.done.append(cell)
        error = reply.get("error")
        if isinstance(error, list) and len(error) == 2:
            text = bounded(f"{error[0]}: {error[1]}", MAX_ERROR, newlines=False)  # escaped, then cut
            self.errors[cell.index] = text
            self.record(cell.index, text, bounded(str(reply.get("output", "")), MAX_OUTPUT))

    def close(self) -> None:
        if self.box is not None:
            self.box.close()


def _lost(lost: SandboxLost, timeout: float, who: str = "") -> str:
    """Why the submission's process was lost, in words (``who``: what ran, where a check timed out)."""
    if lost.reason == "timed out":
        return f"timed out: {who}ran longer than {timeout:g} s (an endless loop?) and was stopped"
    if lost.reason == "garbled":
        return f"the submission's process sent a reply the grader cannot read ({one_line(lost.detail)})"
    return f"died: {lost.detail}" if lost.detail else "died: the submission's process ended"


def check_exercise(run: _Run, ex: RefExercise, result: Exercise, plan: Plan, secret: int) -> None:
    """Call the reference's checks on the submission's objects; set ``result``'s status and detail."""
    started = time.monotonic()
    answers = set(plan.answers.get(ex.number, []))
    answer_problems = [f"{run.report.label(i)}: {run.errors[i]}" for i in sorted(answers) if i in run.errors][:3]
    try:
        box = run.sandbox()
        link = Link(box, run.limit())
        names = sorted({n for call in ex.calls for n in call.names})
        values = link.get(names)
        missing = [n for n in names if values[n] is MISSING]
        stubs = [run.errors[i].split(": ", 1)[1] for i in sorted(answers)
                 if run.errors.get(i, "").startswith("NotImplementedError: ")]
        if missing and stubs:  # a value item whose cell is still the stub
            result.status = NOT_ATTEMPTED
            result.detail = f"{ex.calls[0].check}: not implemented yet (the stub says: {stubs[0]})"
            return
        if missing:
            result.status = FAILED
            result.detail = (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not defined when the "
                             "check runs" + ("".join(f"\n{p}" for p in answer_problems) or
                                             " (was the answer cell deleted or renamed?)"))
            return
        first: Exception | None = None  # every check of the exercise runs: each earns its share of the points
        with graded(secret), answer_sources([cell.source for cell in run.done]):  # "computed, not typed in"
            for number, call in enumerate(ex.calls):
                args = [values[v] if kind == "name" else v for kind, v in call.args]
                kwargs = {k: values[v] if kind == "name" else v for k, (kind, v) in call.kwargs.items()}
                try:
                    getattr(checks, call.check)(*args, **kwargs)
                    result.passed_checks.append(number)
                except (checks.NotAttempted, checks.CheckFailed) as err:
                    first = first or err
        if first is not None:
            raise first
        result.status, result.detail = PASSED, ""
    except checks.NotAttempted as err:
        result.status, result.detail = NOT_ATTEMPTED, printable(str(err))  # may quote what the student returned
    except checks.CheckFailed as err:
        result.status, result.detail = FAILED, printable(str(err))
    except SandboxLost as lost:
        if time.monotonic() >= run.deadline:
            raise _OutOfTime() from None
        result.status, result.detail = FAILED, _lost(lost, run.options.timeout, "your code ")
    except (_OutOfTime, NotebookError):
        raise
    except Exception as err:  # a result the check cannot use (an odd type, say)
        result.status = FAILED
        result.detail = f"the check could not use what your code returned ({type(err).__name__}: {one_line(str(err))})"
    finally:
        result.seconds = round(time.monotonic() - started, 2)
    if result.status == FAILED and answer_problems and "not defined" not in result.detail:
        result.detail += "".join(f"\n({p})" for p in answer_problems)


def grade_submission(notebook: str, student: str, data: bytes | None, reference: Reference | None,
                     launcher: Launcher, options: Options | None = None, read_error: str | None = None) -> Report:
    """Grade one submission (``reference=None``: against its own check cells)."""
    started = time.monotonic()
    options = options or Options()
    report = Report(notebook, student, reference.name if reference else "(its own check cells)")
    cell_rows: dict[int, dict] = {}
    try:
        if read_error or data is None:
            raise NotebookError(read_error or "no data")
        cells = read_notebook(data)
        report.labels = cell_labels(cells)
        own = reference is None
        if reference is None:
            report.notes.append("graded against its own check cells: pass --reference (the notebook handed out) "
                                "so that edited or deleted check cells do not count")
            try:
                reference = reference_from(cells, notebook)
            except BadReference as err:
                raise NotebookError(str(err)) from None
        plan = plan_run(cells, reference)
        report.exercises = [Exercise(e.number, e.title, [c.check for c in e.calls]) for e in reference.exercises]
        if own:  # a section whose check cell was deleted or commented out does not pass
            report.exercises += [Exercise(n, t, [], FAILED, "this exercise has no check cell (deleted or commented "
                                          "out?)") for n, t in reference.unchecked]
            report.exercises.sort(key=lambda e: e.number)
        results = {e.number: e for e in report.exercises}
        secret = secrets.randbits(62)
        deadline = started + options.notebook_timeout
        runs = groups(reference)
        for index, (hidden, members) in enumerate(runs):
            checked = {ex.number for ex in members}
            owned = {i for n in checked for i in plan.answers.get(n, [])}
            others = {i for n, cells_of in plan.answers.items() if n not in checked for i in cells_of}

            def record(cell: int, error: str, output: str, first=index == 0, owned=owned, others=others) -> None:
                # a cell's error is reported from the run that checks its exercise (setup cells: the first run)
                if cell in owned or (first and cell not in others):
                    cell_rows.setdefault(cell, {"cell": cell, "error": error, "output": output})

            run = _Run(launcher, hidden, data, options, deadline, report, record)
            try:
                for _, item in plan.steps:
                    if isinstance(item, Cell):
                        run.run_cell(item)
                    elif item.number in checked:
                        check_exercise(run, item, results[item.number], plan, secret)
            finally:
                run.close()
    except NotebookError as err:
        report.error = str(err)
    except _OutOfTime:
        report.error = f"the notebook ran past its time limit ({options.notebook_timeout:g} s) and was stopped"
    report.cells = [cell_rows[i] for i in sorted(cell_rows)]
    report.seconds = round(time.monotonic() - started, 2)
    return report
