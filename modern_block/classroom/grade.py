"""Grade exercise notebooks, a whole class at once, outside the students' code.

    python -m modern_block grade SUBMISSIONS [SUBMISSIONS ...] --reference REF [--jobs N] [--csv FILE]
        [--overwrite-gradebook] [--wide FILE] [--feedback DIR] [--json] [--json-file FILE] [--timeout S]
        [--notebook-timeout S] [--memory-mb M] [--kernel NAME] [--self] [--no-sandbox-i-trust-these-notebooks]

SUBMISSIONS are notebooks or folders (searched for ``*.ipynb``; ``folder/alice/01_rmsnorm.ipynb`` is
student ``alice``, and so is ``alice/Copy of 01_rmsnorm (1).ipynb`` named on its own: rows are named by the
student's folder). REF is the notebook handed out (``exercises/NN_*.ipynb``), or a folder of them matched by
file name, else by the lesson the notebook's metadata names, else by lesson number. Each exercise is reported
as passed, failed (with the check's diagnosis) or not attempted, with its points (``grading.points``); a
submission that cannot be graded (not a notebook, a link, another lesson, endless, hostile) gets a row
``error: <reason>`` and nothing else changes. ``--csv`` merges into an existing gradebook
(``grading.gradebook``), ``--wide`` exports one row per student, ``--feedback`` writes a file per student
and notebook (``grading.feedback``).

How: every submission runs in a bubblewrap sandbox of its own (``grading.sandbox``) that sees the interpreter,
a copy of the course package without the pieces the exercises ask for, its own notebook and a private tmpfs;
the checks of ``modern_block.classroom.checks`` run here, in the grader, on inputs drawn from a secret,
calling the student's functions and modules through stand-ins that send fresh copies and bring back only
data (``grading.remote``, ``grading.wire``). The report is printed first; then the gradebook and the JSON
file are written (atomically, never through a link).

Exit status: 0 every exercise of every submission passed; 1 some did not, some submission got an error
row, or an output file could not be written (one line says which; the printed report is complete); 2 the
grader could not run (bad arguments, an unusable reference, no notebooks found, no sandbox).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from .exercises import default_root
from .grading import feedback, points
from .grading import gradebook as book
from .grading.files import CollectionError, OutputError, Submission, read_regular, refuse_target, write_atomic
from .grading.files import collect as _collect_files
from .grading.notebook import BadReference, NotebookError, Reference, read_notebook, reference_from
from .grading.report import (
    FAILED,
    NOT_ATTEMPTED,
    PASSED,
    Report,
    clean_strings,
    format_report,
    gradebook,
    gradebook_rows,
    one_line,
    short_traceback,
)
from .grading.sandbox import UNSAFE_FLAG, Launcher, Limits, SandboxError
from .grading.session import Options, grade_submission

__all__ = ["PASSED", "FAILED", "NOT_ATTEMPTED", "Options", "Limits", "Report", "Submission", "collect",
           "load_reference", "grade_all", "grade_paths", "format_report", "gradebook", "main"]


class UsageError(Exception):
    """The grader cannot run with these arguments (exit status 2)."""


def collect(paths, exclude=()) -> list[Submission]:
    """The submissions named by ``paths`` (notebooks, or folders searched for ``*.ipynb``, ``exclude`` left
    out of the search), each read when it is graded; links, special files and over-large student folders
    get error rows. A notebook named on its own is its folder's student (``Hank Lee/Copy of 03_rope (1).ipynb``:
    ``Hank Lee``)."""
    try:
        return _collect_files(paths, exclude)
    except FileNotFoundError as err:
        raise UsageError(f"no such notebook or folder: {err.args[0]}") from None
    except CollectionError as err:
        raise UsageError(str(err)) from None


def load_reference(path) -> dict[str, Reference]:
    """The reference notebook(s) by file name. Raises UsageError when one cannot be used."""
    path = Path(path)
    files = sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise UsageError(f"--reference: no such notebook or folder of notebooks: {path}")
    refs: dict[str, Reference] = {}
    for f in files:
        data, error = read_regular(os.path.realpath(f))  # the instructor's own: links followed
        try:
            if error or data is None:
                raise NotebookError(error or "no data")
            refs[f.name] = points.scored(reference_from(read_notebook(data), f.name), data)
        except (NotebookError, BadReference) as err:
            raise UsageError(f"--reference {f}: {err}") from None
    return refs


_COURSE_REFERENCES: dict[str, Reference | None] = {}


def course_reference(data: bytes | None) -> Reference | None:
    """Without --reference: the course's own solution notebook the submission ``data`` was generated from (named
    in its metadata), when this installation has it; its check cells are the ones handed out."""
    try:
        generated = read_notebook(data or b"")[0].generated_from
    except (NotebookError, IndexError):
        return None
    if not generated or not generated.startswith("solutions/") or "/" in generated[len("solutions/"):]:
        return None
    if generated not in _COURSE_REFERENCES:
        path = default_root() / generated
        try:
            course = load_reference(path)[path.name] if path.is_file() else None
            if course is not None:
                course.name = generated
            _COURSE_REFERENCES[generated] = course
        except UsageError:
            _COURSE_REFERENCES[generated] = None
    return _COURSE_REFERENCES[generated]


def _reference_for(sub: Submission, data: bytes | None,
                   refs: dict[str, Reference] | None) -> tuple[Reference | None, str | None]:
    if refs is None:
        return course_reference(data), None
    if len(refs) == 1:
        return next(iter(refs.values())), None
    name = os.path.basename(sub.path)
    if name in refs:
        return refs[name], None
    try:  # a renamed file (``Copy of 03_rope (1).ipynb``): the lesson its metadata names, else its check cells'
        cells = read_notebook(data or b"")
    except NotebookError:
        cells = []
    generated = (cells[0].generated_from or "").rsplit("/", 1)[-1] if cells else ""
    if generated in refs:
        return refs[generated], None
    code = "\n".join(c.source for c in cells if c.kind == "code")
    found = {n: sum(f"{call.check}(" in code for e in r.exercises for call in e.calls) for n, r in refs.items()}
    best = max(found.values(), default=0)
    if best and list(found.values()).count(best) == 1:
        return refs[max(found, key=lambda n: found[n])], None
    same_lesson = [r for n, r in refs.items() if n[:3] == name[:3] and name[:2].isdigit()]
    if len(same_lesson) == 1:
        return same_lesson[0], None
    return None, f"no reference notebook for {name} among {', '.join(sorted(refs))}"


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


def _finish(report: Report, sub: Submission, data: bytes | None, ref: Reference | None) -> Report:
    """The report's lesson, points and short tracebacks (the student's own frames)."""
    scheme = ref.scheme if isinstance(ref, points.ScoredReference) else points.default_scheme(report)
    points.score(report, scheme)
    if ref is not None:
        report.lesson = os.path.splitext(os.path.basename(ref.name))[0]
    elif report.exercises:  # its own check cells: the lesson it was generated from, else its file
        try:
            generated = read_notebook(data or b"")[0].generated_from
        except (NotebookError, IndexError):
            generated = None
        report.lesson = os.path.splitext(os.path.basename(generated or sub.path))[0]
    for cell in report.cells:
        cell["output"] = short_traceback(str(cell.get("output", "")))
    return report


def grade_all(submissions: list[Submission], refs: dict[str, Reference] | None, options: Options | None = None,
              jobs: int = 1, limits: Limits | None = None, python: str | None = None,
              private: tuple[str, ...] = ()) -> list[Report]:
    """Grade the submissions, ``jobs`` at a time, each in a sandbox of its own; reports in the given order.
    ``private``: folders (the reference's, the class's) no sandbox may see, wherever they are."""
    options = options or Options()
    launcher = launcher_for(python, limits or Limits())
    launcher.hide(private)

    def one(sub: Submission) -> Report:
        try:
            data, error = sub.read()  # now, not before: the grader holds one notebook per job
            ref, problem = _reference_for(sub, data, refs)
            report = grade_submission(sub.notebook, sub.student, data, ref, launcher, options,
                                      read_error=error or problem)
            if refs is None and ref is not None:
                report.notes.append(f"no --reference: graded with the check cells of the course's {ref.name}")
            elif refs and len(refs) > 1 and ref is not None and os.path.basename(sub.path) != ref.name:
                report.notes.append(f"graded as {ref.name}, the lesson its metadata, check cells or number name")
            return _finish(report, sub, data, ref)
        except SandboxError:
            raise
        except Exception as err:  # a bug in the grader: this row says so, the others are graded
            return Report(sub.notebook, sub.student, error=f"internal error in the grader ({type(err).__name__}: "
                                                              f"{one_line(str(err))}); please report it")

    if jobs <= 1 or len(submissions) <= 1:
        return [one(s) for s in submissions]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, submissions))


def grade_paths(paths, reference=None, **kwargs) -> list[Report]:
    """The Python entry point: ``grade_paths(["submissions/"], "exercises/01_rmsnorm.ipynb", jobs=2)``."""
    refs = load_reference(reference) if reference is not None else None
    private = tuple(str(p) for p in [*paths, *([reference] if reference else [])])
    return grade_all(collect(paths, exclude=[reference] if reference else []), refs, private=private, **kwargs)


def python_of_kernel(name: str) -> str:
    """The interpreter of a Jupyter kernel (a Python one). Raises UsageError for an unknown kernel."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        if name == "python3":
            return sys.executable
        raise UsageError("--kernel needs jupyter_client installed") from None
    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        known = ", ".join(sorted(manager.find_kernel_specs())) or "none"
        raise UsageError(f"--kernel: no Jupyter kernel named {name!r} (installed: {known})") from None
    if spec.language.lower() != "python" or not spec.argv:
        raise UsageError(f"--kernel {name}: not a Python kernel ({spec.language})")
    exe = spec.argv[0]
    exe = sys.executable if exe in ("python", "python3") and name == "python3" else shutil.which(exe) or exe
    if not os.path.isfile(exe):
        raise UsageError(f"--kernel {name}: its interpreter {exe} does not exist")
    return exe


def _emit(text: str, stream=None) -> None:
    """Write ``text``; characters the console cannot encode (a cp1252 Windows console) become '?'."""
    stream = stream or sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, errors="replace").decode(encoding))
    stream.flush()


def _positive(kind, low: float, high: float):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m modern_block grade",
                                description="Grade exercise notebooks (a whole class folder at once).")
    p.add_argument("submissions", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument("--reference", default=None,
                   help="the notebook handed out (or a folder of them, matched by file name, else by the lesson in "
                        "a notebook's metadata); without it, the course's solution notebook named in a notebook's "
                        "metadata when this installation has it, else the notebook's own check cells")
    p.add_argument("--jobs", type=_positive(int, 1, 64), default=1, help="submissions graded at once (default 1)")
    p.add_argument("--csv", default=None,
                   help="the gradebook (one row per student and exercise): merged into the file when it exists (the "
                        "rows of each student and lesson graded now replace theirs; the rest are kept)")
    p.add_argument("--overwrite-gradebook", action="store_true",
                   help="write --csv afresh instead of merging into it (needed when the file is not a gradebook)")
    p.add_argument("--wide", default=None,
                   help="also write one row per student (id, points per lesson, total, max, percent) for an LMS "
                        "import, from the whole gradebook")
    p.add_argument("--feedback", default=None, metavar="DIR",
                   help="write one Markdown feedback file per student and notebook: DIR/<student>/<lesson>.md")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--json-file", default=None, help="also write the report as JSON to this file")
    p.add_argument("--timeout", type=_positive(float, 0.1, 3600), default=60.0,
                   help="seconds for each cell and each exercise's check (default 60)")
    p.add_argument("--notebook-timeout", type=_positive(float, 1, 86400), default=600.0,
                   help="seconds for a whole submission (default 600)")
    p.add_argument("--memory-mb", type=_positive(int, 256, 1 << 20), default=2048,
                   help="memory a submission's process may add to the loaded interpreter (default 2048)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel whose Python runs the submissions")
    p.add_argument("--self", dest="self_grade", action="store_true",
                   help="grade one notebook of your own: in the sandbox where it can start, else (macOS has none, "
                        "nor has Colab) as a plain process of yours, labelled not isolated")
    p.add_argument(UNSAFE_FLAG, dest="no_sandbox", action="store_true",
                   help="where bubblewrap cannot run: grade in plain processes of your user, which can read, change "
                        "and send anything your user can (only for notebooks you trust)")
    return p


SELF_NOTE = ("self-graded WITHOUT isolation ({why}): your notebook ran as a plain process of your own user, "
             "which is fine for your own code; it is not a grade of record (your instructor grades in the sandbox)")


def _self_limits(args, limits: Limits, python: str) -> tuple[Limits, str | None]:
    """--self: one notebook file only; the sandbox where it starts, else plain processes (and why)."""
    if len(args.submissions) != 1 or os.path.isdir(args.submissions[0]):
        raise UsageError("--self grades one notebook of your own, named as a file; grading a folder or several "
                         "notebooks (other people's code) needs the sandbox")
    if not limits.sandbox:
        return limits, "you passed " + UNSAFE_FLAG
    try:
        launcher_for(python, limits)
        return limits, None
    except SandboxError as err:
        return Limits(limits.memory_mb, limits.cpu_seconds, sandbox=False), one_line(str(err)).split(": ", 1)[-1][:200]


def _students(reports: list[Report]) -> list[dict]:
    """Per student: the points of this run's notebooks added up."""
    by: dict[str, list[Report]] = {}
    for r in reports:
        by.setdefault(r.student, []).append(r)
    out = []
    for student, rs in sorted(by.items()):
        score, maximum = round(sum(r.score for r in rs), 4), round(sum(r.max_score for r in rs), 4)
        out.append({"student": student, "notebooks": len(rs), "score": score, "max_score": maximum,
                    "percent": round(100 * score / maximum, 1) if maximum else 0.0})
    return out


def _document(reports: list[Report], merge: book.Merge | None = None) -> dict:
    doc = {"notebooks": [r.to_dict() for r in reports], "all_passed": all(r.all_passed for r in reports),
           "students": clean_strings(_students(reports)),
           "summary": {"notebooks": len(reports), "errors": sum(r.error is not None for r in reports),
                       "all_passed": sum(r.all_passed for r in reports)}}
    if merge is not None:
        doc["gradebook"] = clean_strings(merge.to_dict())
    return doc


def _old_gradebook(path: str | None, overwrite: bool) -> list[list[str]]:
    """The rows of the gradebook at ``path`` to merge into ([] when there is none, or when told to overwrite).
    Raises GradebookError for a file that is not one."""
    if not path or overwrite or not os.path.isfile(path):
        return []
    data, error = read_regular(path)
    if error or data is None:
        raise book.GradebookError(f"--csv {path}: {error}")
    try:
        return book.parse(data.decode("utf-8"), f"--csv {path}")
    except UnicodeDecodeError:
        raise book.GradebookError(f"--csv {path} is not UTF-8 text: not a gradebook of this grader; to replace "
                                  "it pass --overwrite-gradebook") from None


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error
        return 2 if exit_.code else 0
    self_why: str | None = None
    try:
        for option, target in (("--csv", args.csv), ("--json-file", args.json_file), ("--wide", args.wide)):
            if target:
                refuse_target(target, option)
        _old_gradebook(args.csv, args.overwrite_gradebook)  # refused now, not after an hour of grading
        if args.feedback and not os.path.isdir(args.feedback):
            if not os.path.isdir(os.path.dirname(os.path.abspath(args.feedback))):
                raise UsageError(f"--feedback: the folder of {args.feedback} does not exist")
            os.mkdir(args.feedback)
        refs = load_reference(args.reference) if args.reference else None
        submissions = collect(args.submissions, exclude=[args.reference] if args.reference else [])
        if not submissions:
            raise UsageError(f"no notebooks found in {', '.join(args.submissions)}")
        python = python_of_kernel(args.kernel)
        limits = Limits(memory_mb=args.memory_mb, cpu_seconds=int(args.notebook_timeout) + 30,
                        sandbox=not args.no_sandbox)
        if args.self_grade:
            limits, self_why = _self_limits(args, limits, python)
        options = Options(timeout=args.timeout, notebook_timeout=args.notebook_timeout)
        private = tuple(args.submissions) + ((args.reference,) if args.reference else ())
        reports = grade_all(submissions, refs, options, args.jobs, limits, python, private)
    except SandboxError as err:
        hint = (" To grade your own notebook without the sandbox, add --self." if len(args.submissions) == 1
                and not os.path.isdir(args.submissions[0]) else "")
        _emit(f"error: {one_line(str(err))}{hint}\n", sys.stderr)
        return 2
    except (UsageError, OutputError, book.GradebookError, OSError) as err:
        _emit(f"error: {one_line(str(err))}\n", sys.stderr)
        return 2
    if self_why:
        for r in reports:
            r.notes.insert(0, SELF_NOTE.format(why=self_why))
    graded_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    chosen, duplicates = book.pick(reports)
    rows = gradebook_rows(chosen, graded_at)
    status = 0 if all(r.all_passed for r in reports) else 1
    merge = None
    if args.csv:
        try:
            merge = book.merge(_old_gradebook(args.csv, args.overwrite_gradebook), rows)
        except book.GradebookError as err:  # the file changed while grading: the report stands
            _emit(f"error: {one_line(str(err))}: not written\n", sys.stderr)
            status = 1
        else:
            merge.notes += duplicates
    doc = _document(reports, merge)
    if args.json:
        text = json.dumps(doc, indent=1, ensure_ascii=False)
        try:
            text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
        except (UnicodeEncodeError, LookupError):  # a console that cannot show it: \u escapes, still JSON
            text = json.dumps(doc, indent=1)
        _emit(text + "\n")
    else:
        summary = merge.summary() if merge else [f"note: {one_line(n)}" for n in duplicates]
        _emit("\n\n".join(format_report(r) for r in reports) + "\n" + "".join(f"\n{line}" for line in summary)
              + ("\n" if summary else ""))
    merged = merge.rows if merge else rows
    outputs = [(args.csv if merge else None, "--csv", lambda: book.render_csv(book.COLUMNS, merged)),
               (args.wide, "--wide", lambda: book.wide(merged)),
               (args.json_file, "--json-file", lambda: json.dumps(doc, indent=1, ensure_ascii=False) + "\n")]
    for target, option, render in outputs:
        if target:
            try:
                write_atomic(target, render(), option)
            except OutputError as err:  # disk full, read-only, a path planted meanwhile: the report stands
                _emit(f"error: {one_line(str(err))}: not written (the report above is complete)\n", sys.stderr)
                status = 1
    if args.feedback:
        try:
            feedback.write_all(args.feedback, chosen, graded_at)
        except OutputError as err:
            _emit(f"error: {one_line(str(err))}: not written (the report above is complete)\n", sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
