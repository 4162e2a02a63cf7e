"""Grade exercise notebooks: run each in a fresh kernel and report every exercise as passed, failed
(with the check's diagnosis) or not attempted.

    python -m modern_block.grade NOTEBOOK [NOTEBOOK ...] [--json] [--timeout S] [--reference REF] [--jobs N]

An exercise is a section that starts with a markdown heading "## Exercise N: title" and runs to the
next heading of the same or a higher level. Notebooks without such headings are split at their check
calls instead (each cell calling ``check_...(`` closes an exercise). The cells before the first
exercise are the setup; they run first, and again after every kernel restart.

Each cell runs with a time limit (``--timeout``, seconds). A cell that exceeds it is interrupted, its
exercise is marked failed ("timed out"), and the kernel is restarted (setup cells re-run) before the
next exercise, so an endless loop or a crash in one exercise never stops the report. The first error
of an exercise decides its status: ``NotImplementedError`` or ``NotAttempted`` (a stub) → not
attempted; ``CheckFailed`` → failed with the diagnosis; anything else → failed with the error.

``--reference`` takes the check cells from another notebook (the exercise notebook as handed out),
exercise by exercise, so a student's edited or deleted check cells do not count.

Exit status: 0 when every exercise of every notebook passed, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

PASSED, FAILED, NOT_ATTEMPTED = "passed", "failed", "not attempted"
EXERCISE_HEADING = re.compile(r"^(#{1,6})\s*Exercise\s+(\d+)\s*[:.·—–-]?\s*(.*?)\s*$", re.IGNORECASE)
ANY_HEADING = re.compile(r"^(#{1,6})\s")
CHECK_CALL = re.compile(r"\b(check_\w+)\s*\(")
DEFINITION = re.compile(r"^(def|class|async def)\s", re.MULTILINE)
STUB_ERRORS = ("NotImplementedError", "NotAttempted")
TIMEOUT_ENAME = "GraderTimeout"
DEFAULT_TIMEOUT = 60
SETUP_TIMEOUT = 300  # cells outside the exercises (imports) may be slow on a busy machine


@dataclass
class Exercise:
    number: int
    title: str
    heading_cell: int = 0  # index of the cell holding the heading (or the first cell)
    cells: list[int] = field(default_factory=list)  # indices into the notebook's code cells
    checks: list[str] = field(default_factory=list)  # names of the check functions its cells call
    status: str = NOT_ATTEMPTED
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    notebook: str
    exercises: list[Exercise]
    setup_errors: list[str] = field(default_factory=list)
    restarts: int = 0
    seconds: float = 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.exercises) and all(e.status == PASSED for e in self.exercises)

    def counts(self) -> dict[str, int]:
        return {s: sum(e.status == s for e in self.exercises) for s in (PASSED, FAILED, NOT_ATTEMPTED)}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = {**self.counts(), "total": len(self.exercises), "all_passed": self.all_passed}
        for e in d["exercises"]:
            del e["cells"], e["heading_cell"]
        return d


# ---- finding the exercises ---------------------------------------------------------------------------


def _headings(cell):
    if cell.cell_type != "markdown":
        return []
    return [line.strip() for line in cell.source.splitlines() if ANY_HEADING.match(line.strip())]


def find_exercises(nb) -> tuple[list[int], list[Exercise], list[int]]:
    """(setup cell indices, exercises, other code cells after the first exercise that belong to none)."""
    exercises: list[Exercise] = []
    setup, loose = [], []
    current, level = None, 0
    for i, cell in enumerate(nb.cells):
        for line in _headings(cell):
            m = EXERCISE_HEADING.match(line)
            if m:
                current = Exercise(int(m.group(2)), m.group(3) or f"Exercise {m.group(2)}", i)
                level = len(m.group(1))
                exercises.append(current)
            elif current is not None and len(ANY_HEADING.match(line).group(1)) <= level:
                current = None
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if current is not None:
            current.cells.append(i)
            current.checks += CHECK_CALL.findall(cell.source)
        elif exercises:
            loose.append(i)
        else:
            setup.append(i)
    if exercises:
        return setup, exercises, loose
    # no headings: the leading cells that define nothing are the setup; then every cell that calls a
    # check closes an exercise
    pending: list[int] = []
    setup = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        names = CHECK_CALL.findall(cell.source)
        if not exercises and not pending and not names and not DEFINITION.search(cell.source):
            setup.append(i)
            continue
        pending.append(i)
        if names:
            exercises.append(Exercise(len(exercises) + 1, names[0], pending[0], pending, names))
            pending = []
    return setup, exercises, pending


def use_reference_checks(nb, reference) -> list[str]:
    """Replace the check cells of each exercise in ``nb`` by the reference notebook's. Returns the
    reference's exercises that ``nb`` lacks, already marked failed."""
    missing = []
    _, ref_exercises, _ = find_exercises(reference)
    _, exercises, _ = find_exercises(nb)
    by_number = {e.number: e for e in exercises}
    for ref in ref_exercises:
        ref_checks = [reference.cells[i] for i in ref.cells if CHECK_CALL.search(reference.cells[i].source)]
        ex = by_number.get(ref.number)
        if ex is None:
            missing.append(Exercise(ref.number, ref.title, checks=ref.checks, status=FAILED,
                                    detail="this exercise is missing from the notebook"))
            continue
        student_checks = [i for i in ex.cells if CHECK_CALL.search(nb.cells[i].source)]
        for i in student_checks:
            nb.cells[i].source = "pass  # (check replaced by the reference's)"
        anchor = ex.cells[-1]
        for k, cell in enumerate(ref_checks):
            nb.cells.insert(anchor + 1 + k, nbformat.v4.new_code_cell(cell.source))
        # indices after the anchor moved; recompute for the next exercise
        _, exercises, _ = find_exercises(nb)
        by_number = {e.number: e for e in exercises}
    return missing


# ---- running ------------------------------------------------------------------------------------------


def _error_of(cell, reply) -> tuple[str, str] | None:
    """(ename, evalue) of a failed cell, from the execute reply, else from its error output."""
    content = (reply or {}).get("content", {})
    if content.get("status") == "error":
        return content.get("ename", "Error"), content.get("evalue", "")
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return out.get("ename", "Error"), out.get("evalue", "")
    return None


def _kernel_env() -> dict:
    """The kernel imports the same modern_block as this grader."""
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def grade_notebook(path, timeout: float = DEFAULT_TIMEOUT, reference=None, kernel_name: str = "python3") -> Report:
    """Run the notebook at ``path`` exercise by exercise in a fresh kernel and classify each exercise."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    started = time.monotonic()
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    missing = use_reference_checks(nb, nbformat.read(reference, as_version=4)) if reference else []
    setup, exercises, loose = find_exercises(nb)
    report = Report(str(path), sorted(exercises + missing, key=lambda e: e.number))
    if not exercises:
        return report

    replies: dict[int, dict] = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        replies[cell_index] = execute_reply

    exercise_cells = {id(nb.cells[i]) for ex in exercises for i in ex.cells}
    limit = max(1, int(round(timeout)))

    def cell_timeout(cell):  # the limit applies to the exercises; setup cells (imports) get more room
        return limit if id(cell) in exercise_cells else max(limit, SETUP_TIMEOUT)

    client = NotebookClient(
        nb, timeout_func=cell_timeout, kernel_name=kernel_name, allow_errors=True,
        interrupt_on_timeout=True, record_timing=False, startup_timeout=120, shutdown_kernel="immediate",
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "the cell ran past its time limit", "traceback": []},
        resources={"metadata": {"path": str(path.parent.resolve())}}, on_cell_executed=on_cell_executed)

    def run(i):
        """Execute cell i. Returns ("ok" | "error" | "timeout" | "died", ename, evalue)."""
        replies.pop(i, None)
        try:
            client.execute_cell(nb.cells[i], i)
        except DeadKernelError:
            return "died", "DeadKernelError", "the kernel died (a crash, or it ran out of memory)"
        err = _error_of(nb.cells[i], replies.get(i))
        if err is None:
            return "ok", "", ""
        if err[0] == TIMEOUT_ENAME:
            return "timeout", *err
        return "error", *err

    # notebook order: setup and in-between cells give context (re-run after a restart), exercises are graded
    plan = sorted([(i, "context", i) for i in setup + loose] +
                  [(ex.cells[0] if ex.cells else ex.heading_cell, "exercise", ex) for ex in exercises],
                  key=lambda item: item[0])
    context_done: list[int] = []
    pos = 0
    while pos < len(plan):
        with client.setup_kernel(env=_kernel_env(), stderr=subprocess.DEVNULL):  # no kernel start-up chatter
            if pos:
                report.restarts += 1
                for i in list(context_done):
                    if run(i)[0] in ("timeout", "died"):
                        context_done.remove(i)
                        break
            while pos < len(plan):
                _, kind, item = plan[pos]
                pos += 1
                if kind == "context":
                    outcome, ename, evalue = run(item)
                    if outcome == "ok" or outcome == "error":
                        context_done.append(item)
                    if outcome != "ok":
                        report.setup_errors.append(f"cell {item} (not part of an exercise): {ename}: {evalue}")
                    if outcome in ("timeout", "died"):
                        break
                elif _run_exercise(item, run, timeout, nb):
                    break
        client.km, client.kc = None, None  # the next setup_kernel starts a fresh kernel
    report.seconds = time.monotonic() - started
    return report


def _run_exercise(ex: Exercise, run, timeout: float, nb) -> bool:
    """Run an exercise's cells, set its status. Returns True when the kernel must be restarted."""
    t0 = time.monotonic()
    first_error = None
    ran_check = False
    restart = False
    for i in ex.cells:
        kind, ename, evalue = run(i)
        if kind == "timeout":
            first_error = first_error or (FAILED, f"timed out: a cell ran longer than {timeout:g} s (an endless "
                                                  "loop?); it was interrupted and the kernel restarted")
            restart = True
            break
        if kind == "died":
            first_error = first_error or (FAILED, f"{evalue}; the kernel was restarted")
            restart = True
            break
        if kind == "error" and first_error is None:
            if ename in STUB_ERRORS:
                first_error = (NOT_ATTEMPTED, evalue if ename == "NotAttempted" else
                               "not implemented yet" + (f" ({evalue})" if evalue else ""))
            elif ename in ("CheckFailed", "AssertionError"):
                first_error = (FAILED, evalue or ename)
            else:
                first_error = (FAILED, f"{ename}: {evalue}")
        if kind == "ok" and CHECK_CALL.search(nb.cells[i].source):
            ran_check = True
    if first_error is not None:
        ex.status, ex.detail = first_error
    elif not ex.checks:
        ex.status, ex.detail = FAILED, "no check found in this exercise (was the check cell deleted?)"
    elif not ran_check:
        ex.status, ex.detail = FAILED, "the check did not run"
    else:
        ex.status, ex.detail = PASSED, ""
    ex.seconds = round(time.monotonic() - t0, 2)
    return restart


def grade_notebooks(paths, timeout: float = DEFAULT_TIMEOUT, reference=None, kernel_name: str = "python3",
                    jobs: int = 1) -> list[Report]:
    """Grade several notebooks, ``jobs`` at a time (each in its own kernel); reports in the given order."""
    paths = list(paths)
    if jobs <= 1 or len(paths) <= 1:
        return [grade_notebook(p, timeout, reference, kernel_name) for p in paths]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda p: grade_notebook(p, timeout, reference, kernel_name), paths))


# ---- reporting ----------------------------------------------------------------------------------------

_MARK = {PASSED: "✓", FAILED: "✗", NOT_ATTEMPTED: "·"}


def format_report(report: Report) -> str:
    lines = [report.notebook]
    for note in report.setup_errors:
        lines.append(f"  ! {note}")
    if not report.exercises:
        lines.append("  no exercises found (expected headings like '## Exercise 1: ...' or check_...() calls)")
    for e in report.exercises:
        head = f"  {_MARK[e.status]} Exercise {e.number}: {e.title}"
        lines.append(f"{head} {'.' * max(2, 60 - len(head))} {e.status} ({e.seconds:.1f} s)")
        for detail_line in e.detail.splitlines() if e.status == FAILED else []:
            lines.append(f"      {detail_line}")
    c = report.counts()
    lines.append(f"  {len(report.exercises)} exercises: {c[PASSED]} passed, {c[FAILED]} failed, "
                 f"{c[NOT_ATTEMPTED]} not attempted ({report.seconds:.1f} s"
                 + (f", {report.restarts} kernel restart{'s' * (report.restarts > 1)}" if report.restarts else "")
                 + ")")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modern_block.grade",
                                     description="Grade exercise notebooks, exercise by exercise.")
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebook(s) to grade")
    parser.add_argument("--json", action="store_true", help="print a JSON report instead of text")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"time limit per cell in seconds (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--reference", type=Path, default=None,
                        help="take the check cells from this notebook (the one handed out)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks graded at the same time (default 1)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks + ([args.reference] if args.reference else []) if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("error: --timeout must be positive", file=sys.stderr)
        return 2
    reports = grade_notebooks(args.notebooks, args.timeout, args.reference, args.kernel, max(1, args.jobs))
    if args.json:
        print(json.dumps({"notebooks": [r.to_dict() for r in reports],
                          "all_passed": all(r.all_passed for r in reports)}, indent=1, ensure_ascii=False))
    else:
        print("\n\n".join(format_report(r) for r in reports))
    if any(not r.exercises for r in reports):
        return 2
    return 0 if all(r.all_passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
