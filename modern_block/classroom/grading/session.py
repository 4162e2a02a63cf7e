"""Grade one submission: run its cells in a fresh student process, check each exercise in the grader.

Time limits: every cell and every exercise's check gets ``timeout`` seconds, the whole notebook
``notebook_timeout``. A cell or a check that runs past its limit, or kills its process, is reported (the
exercise: failed, "timed out" or "died"); a fresh process then replays the cells that ran before and
grading goes on. A notebook past its own limit, or one that needs too many fresh processes, gets an
error row. Whatever happens, only this submission's report changes.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from .. import checks
from ..checks.core import graded
from .notebook import BadReference, Cell, NotebookError, Plan, Reference, plan_run, read_notebook, reference_from
from .remote import MISSING, Link
from .report import FAILED, NOT_ATTEMPTED, PASSED, Exercise, Report
from .sandbox import SandboxLost, Zygote

MAX_RESTARTS = 6


@dataclass(frozen=True)
class Options:
    timeout: float = 60.0  # seconds per cell and per exercise's check
    notebook_timeout: float = 600.0  # seconds for the whole submission


class _OutOfTime(Exception):
    """The notebook ran past its own time limit."""


class _Run:
    """The submission's process, restarted (with the cells that ran before replayed) when it is lost."""

    def __init__(self, zygote: Zygote, options: Options, deadline: float, report: Report):
        self.zygote, self.options, self.deadline, self.report = zygote, options, deadline, report
        self.box = None
        self.done: list[Cell] = []  # cells that ran (with or without an error), in order: replayed on restart
        self.lost: dict[int, str] = {}  # cell index -> why it was stopped

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
            self.box = self.zygote.spawn()
            for cell in list(self.done):
                try:
                    self._exec(cell)
                except SandboxLost as lost:
                    self._lose(cell, lost)
                    break
        return self.box

    def _exec(self, cell: Cell) -> dict:
        deadline = self.limit()
        try:
            return self.box.request({"op": "exec", "source": cell.source}, deadline)
        except SandboxLost:
            if time.monotonic() >= self.deadline:
                raise _OutOfTime() from None
            raise

    def _lose(self, cell: Cell, lost: SandboxLost) -> None:
        if cell in self.done:
            self.done.remove(cell)
        why = (f"timed out: ran longer than {self.options.timeout:g} s (an endless loop?) and was stopped"
               if lost.reason == "timed out" else _lost(lost))
        self.lost[cell.index] = why
        self.report.cells.append({"cell": cell.index, "error": why, "output": ""})

    def run_cell(self, cell: Cell) -> None:
        self.sandbox()
        try:
            reply = self._exec(cell)
        except SandboxLost as lost:
            self._lose(cell, lost)
            return
        self.done.append(cell)
        error = reply.get("error")
        if isinstance(error, list) and len(error) == 2:
            self.report.cells.append({"cell": cell.index, "error": f"{error[0]}: {error[1]}"[:3000],
                                      "output": str(reply.get("output", ""))[:5000]})


def _lost(lost: SandboxLost) -> str:
    """Why the submission's process was lost, in words (the time-outs are worded where they happen)."""
    if lost.reason == "garbled":
        return f"the submission's process sent a reply the grader cannot read ({lost.detail})"
    return f"died: {lost.detail}" if lost.detail else "died: the submission's process ended"


def _components(ex) -> set[str]:
    return {c for call in ex.calls for c in getattr(getattr(checks, call.check), "components", ())}


def _reused(used: set[str], components: set[str]) -> list[str]:
    """The package components among the qualified names ``used`` (``Class`` covers ``Class.method``)."""
    return sorted(u for u in used if any(u == c or u.startswith(c + ".") for c in components))


def check_exercise(run: _Run, ex, result: Exercise, plan: Plan, secret: int) -> None:
    """Call the reference's checks on the submission's objects; set ``result``'s status and detail."""
    started = time.monotonic()
    answers = set(plan.answers.get(ex.number, []))
    answer_problems = [f"cell {c['cell']}: {c['error']}" for c in run.report.cells if c["cell"] in answers][:3]
    names, values, link = [], {}, None
    try:
        box = run.sandbox()
        link = Link(box, run.limit())
        names = sorted({n for call in ex.calls for n in call.names})
        values = link.get(names)
        missing = [n for n in names if values[n] is MISSING]
        stubs = [c["error"].split(": ", 1)[1] for c in run.report.cells
                 if c["cell"] in answers and c["error"].startswith("NotImplementedError: ")]
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
        with graded(secret):
            for call in ex.calls:
                args = [values[v] if kind == "name" else v for kind, v in call.args]
                kwargs = {k: values[v] if kind == "name" else v for k, (kind, v) in call.kwargs.items()}
                getattr(checks, call.check)(*args, **kwargs)
        result.status, result.detail = PASSED, ""
    except checks.NotAttempted as err:
        result.status, result.detail = NOT_ATTEMPTED, str(err)
    except checks.CheckFailed as err:
        result.status, result.detail = FAILED, str(err)
    except SandboxLost as lost:
        if time.monotonic() >= run.deadline:
            raise _OutOfTime() from None
        result.status = FAILED
        result.detail = (f"timed out: your code ran longer than {run.options.timeout:g} s (an endless loop?) and "
                         "was stopped" if lost.reason == "timed out" else _lost(lost))
    except Exception as err:  # a result the check cannot use (an odd type, say)
        result.status = FAILED
        result.detail = f"the check could not use what your code returned ({type(err).__name__}: {err})"
    finally:
        result.seconds = round(time.monotonic() - started, 2)
    if result.status == FAILED and answer_problems and "not defined" not in result.detail:
        result.detail += "".join(f"\n({p})" for p in answer_problems)
    targets = [values[n] for n in names if values.get(n, MISSING) is not MISSING]
    used = (link.entered if link else set()) | {o for t in targets for o in getattr(t, "_origin", [])}
    reused = _reused(used, _components(ex))
    if reused:
        result.status = FAILED
        result.detail = (f"uses the package's own implementation ({', '.join('modern_block.' + r for r in reused)}) "
                         "instead of code of its own: the exercise is to write it with plain PyTorch"
                         + (f"\n(with it, the check said: {result.detail.splitlines()[0]})" if result.detail else ""))


def grade_submission(notebook: str, student: str, data: bytes | None, reference: Reference | None,
                     zygote: Zygote, options: Options | None = None, read_error: str | None = None) -> Report:
    """Grade one submission (``reference=None``: against its own check cells)."""
    started = time.monotonic()
    options = options or Options()
    report = Report(notebook, student, reference.name if reference else "(its own check cells)")
    try:
        if read_error:
            raise NotebookError(read_error)
        cells = read_notebook(data)
        own = reference is None
        if own:
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
        run = _Run(zygote, options, started + options.notebook_timeout, report)
        secret = secrets.randbits(62)
        try:
            for kind, item in plan.steps:
                if kind == "cell":
                    run.run_cell(item)
                else:
                    check_exercise(run, item, results[item.number], plan, secret)
        finally:
            if run.box is not None:
                run.box.close()
    except NotebookError as err:
        report.error = str(err)
    except _OutOfTime:
        report.error = f"the notebook ran past its time limit ({options.notebook_timeout:g} s) and was stopped"
    report.seconds = round(time.monotonic() - started, 2)
    return report
