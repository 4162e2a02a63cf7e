"""Grade one notebook, or a loose folder of them (``--help``); a term's gradebook is nbgrader's, on the same engine.

``folder/alice/01_rmsnorm.ipynb`` is student ``alice``. The reference is ``--reference`` (the notebook handed out,
or a folder of them), else the course's solution the metadata names; a notebook is graded against its own check
cells only with ``--self``. Exit status: 0 all passed; 1 some did not, an error row, or an output not written;
2 the grader could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from . import feedback, names
from .class_folder import OutputError, Submission, UsageError, collect, refuse_target
from .engine import grade_notebook, launcher_for, read_reference
from .grade_report import FAILED, NOT_ATTEMPTED, PASSED, Report, format_report, gradebook, one_line
from .notebook import BadReference, NotebookError, Reference, read_notebook
from .sandbox import NO_CGROUP_FLAG, UNSAFE_FLAG, Limits, SandboxError
from .session import Options

__all__ = ["PASSED", "FAILED", "NOT_ATTEMPTED", "Options", "Limits", "Report", "Submission", "collect",
           "load_reference", "grade_all", "grade_paths", "format_report", "launcher_for", "main"]


def load_reference(path) -> dict[str, Reference]:
    """The reference notebook(s) by file name. Raises UsageError when one cannot be used."""
    path = Path(path)
    files = sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise UsageError(f"--reference: no such notebook or folder of notebooks: {path}")
    refs: dict[str, Reference] = {}
    for f in files:
        try:
            refs[f.name] = read_reference(f)
        except (NotebookError, BadReference) as err:
            raise UsageError(f"--reference {f}: {err}") from None
    return refs


def course_reference(data: bytes | None) -> Reference | None:
    """Without --reference: the course's own solution notebook named in the submission's metadata, where this
    installation has it (which lesson it is may come from the student; what the lesson holds never does)."""
    try:
        generated = read_notebook(data or b"")[0].generated_from or ""
    except NotebookError:
        return None
    name = generated.removeprefix("solutions/")
    if generated == name or not name.endswith(".ipynb") or "/" in name or name.startswith("."):
        return None
    from ..exercises import default_root  # here: exercises imports nbformat, 1.4 s at a grader's every start

    path = default_root() / "solutions" / name
    try:
        return read_reference(path) if path.is_file() else None
    except (NotebookError, BadReference):
        return None


def _reference_for(sub: Submission, data: bytes | None, refs: dict[str, Reference] | None,
                   own: bool) -> tuple[Reference | None, str | None]:
    """The trusted reference for a submission, or why there is none (``own``: its check cells may do)."""
    if refs is None:
        ref = course_reference(data)
        if ref is None and not own:
            return None, ("no reference: pass --reference (the notebook handed out); a notebook is graded "
                          "against its own check cells only with --self")
        return ref, None
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


def grade_all(submissions: list[Submission], refs: dict[str, Reference] | None, options: Options | None = None,
              jobs: int = 1, limits: Limits | None = None, python: str | None = None,
              private: tuple[str, ...] = (), own: bool = False, each=None) -> list[Report]:
    """Grade the submissions, ``jobs`` at a time, each in a sandbox of its own; reports in the given order,
    each passed to ``each`` as soon as it and those before it are graded. ``private``: folders (the
    reference's, the class's) no sandbox may see; ``own``: a notebook without a reference is graded against
    its own check cells (``--self``)."""
    options = options or Options()
    launcher = launcher_for(python, limits or Limits())
    launcher.hide(private)
    alike = _names(submissions)

    def one(sub: Submission) -> Report:
        data, error = sub.read()  # now, not before: the grader holds one notebook per job
        ref, problem = _reference_for(sub, data, refs, own)
        report = grade_notebook(data, sub.notebook, sub.student, ref, launcher, options,
                                read_error=error or problem)
        if refs is None and ref is not None:
            report.notes.append(f"no --reference: graded with the check cells of the course's solutions/{ref.name}")
        elif refs and len(refs) > 1 and ref is not None and os.path.basename(sub.path) != ref.name:
            report.notes.append(f"graded as {ref.name}, the lesson its metadata, check cells or number name")
        if sub.name in alike:
            report.notes.append(f"the name {report.student!r} looks like {', '.join(map(repr, alike[sub.name]))} "
                                "(another student of this run; names shown with escapes): check who is whom")
        return report

    reports = []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(submissions)))) as pool:
        for report in pool.map(one, submissions):
            reports.append(report)
            if each is not None:
                each(report)
    return reports


def _names(submissions: list[Submission]) -> dict[str, list[str]]:
    """Students shown so that no two show the same; in a class, invisible characters refused and look-alikes
    found (``grading.names``): raw name -> the escaped names it looks like."""
    raw = {sub.name or sub.student for sub in submissions}
    for sub in submissions:
        sub.student = names.shown(sub.name or sub.student)
        why = names.invisible(sub.name) if len(raw) > 1 and not sub.read_error else None
        if why:
            sub.read_error = f"the name {sub.student!r} has {why}: not graded (rename the folder)"
    if len(raw) < 2:
        return {}
    return {name: [names.shown(o) for o in others] for name, others in names.look_alikes(raw).items()}


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
                                description="Grade exercise notebooks: one notebook, or a folder of them.")
    p.add_argument("submissions", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument("--reference", default=None,
                   help="the notebook handed out (or a folder of them, matched by file name, else by the lesson in "
                        "a notebook's metadata); without it, the course's solution notebook named in a notebook's "
                        "metadata when this installation has it (with --self: else its own check cells)")
    p.add_argument("--jobs", type=_positive(int, 1, 64), default=1, help="submissions graded at once (default 1)")
    p.add_argument("--csv", default=None, help="write one row per student and exercise to this file, as graded")
    p.add_argument("--feedback", default=None, metavar="DIR",
                   help="write one Markdown feedback file per student and notebook: DIR/<student>/<lesson>.md")
    p.add_argument("--json", action="store_true", help="print the report as JSON lines (one per notebook)")
    p.add_argument("--json-file", default=None, help="also write the report as JSON lines to this file, as graded")
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
    p.add_argument(NO_CGROUP_FLAG, dest="without_cgroup", action="store_true",
                   help="where no cgroup can be made: grade in the sandbox with limits on each process only (address "
                        "space, CPU time, processes, open files), so that a submission's processes together may hold "
                        "more memory than --memory-mb")
    p.add_argument(UNSAFE_FLAG, dest="no_sandbox", action="store_true",
                   help="where bubblewrap cannot run: grade in plain processes of your user, which can read, change "
                        "and send anything your user can (only for notebooks you trust)")
    return p


SELF_NOTE = ("self-graded WITHOUT isolation ({why}): your notebook ran as a plain process of your own user, "
             "which is fine for your own code; it is not a grade of record (your instructor grades in the sandbox)")


def _self_limits(args, limits: Limits, python: str) -> tuple[Limits, str | None]:
    """--self: one notebook file only; the sandbox where it starts (with a cgroup, else with limits on each
    process: the student's own notebook on their own machine), else plain processes (and why)."""
    if len(args.submissions) != 1 or os.path.isdir(args.submissions[0]):
        raise UsageError("--self grades one notebook of your own, named as a file; grading a folder or several "
                         "notebooks (other people's code) needs the sandbox")
    if not limits.sandbox:
        return limits, "you passed " + UNSAFE_FLAG
    limits = dataclasses.replace(limits, without_cgroup=True)
    try:
        launcher_for(python, limits)
        return limits, None
    except SandboxError as err:
        why = one_line(str(err)).split(": ", 1)[-1].split(". Install ", 1)[0]  # the reason, not the remedies
        return Limits(limits.memory_mb, limits.cpu_seconds, sandbox=False), why


class _Outputs:
    """The output files, opened before grading (never through a link) and written as each notebook is graded."""

    def __init__(self, args):
        self.problems: list[str] = []
        self.files = {}
        self.feedback = args.feedback
        if self.feedback and not os.path.isdir(self.feedback):
            if not os.path.isdir(os.path.dirname(os.path.abspath(self.feedback))):
                raise UsageError(f"--feedback: the folder of {self.feedback} does not exist")
            os.mkdir(self.feedback)
        targets = [(option, path) for option, path in (("--csv", args.csv), ("--json-file", args.json_file)) if path]
        for option, path in targets:
            refuse_target(path, option)  # all refused before any is opened
        for option, path in targets:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
            except OSError as err:
                raise OutputError(f"{option} {path}: {err.strerror or err}") from None
            self.files[option] = (path, open(fd, "w", encoding="utf-8", newline=""))
        self.write("--csv", gradebook([]))

    def write(self, option: str, text: str) -> None:
        if option not in self.files:
            return
        path, f = self.files[option]
        try:
            f.write(text)
            f.flush()
        except OSError as err:  # disk full, say: the report goes on, this file stops
            self.problems.append(f"{option} {path}: {err.strerror or err}")
            del self.files[option]

    def report(self, report: Report, graded_at: str) -> None:
        self.write("--csv", gradebook([report], graded_at, header=False))
        self.write("--json-file", json.dumps(report.to_dict(), ensure_ascii=False) + "\n")
        if self.feedback:
            try:
                feedback.write_all(self.feedback, [report], graded_at)
            except OutputError as err:
                self.problems.append(str(err))

    def close(self) -> None:
        for option, (path, f) in list(self.files.items()):
            try:
                f.close()
            except OSError as err:
                self.problems.append(f"{option} {path}: {err.strerror or err}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error
        return 2 if exit_.code else 0
    self_why: str | None = None
    outputs = None
    graded_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    first = [True]

    def each(report: Report) -> None:
        if self_why:
            report.notes.insert(0, SELF_NOTE.format(why=self_why))
        if args.json:
            _emit(json.dumps(report.to_dict(), ensure_ascii=False) + "\n")
        else:
            _emit(("" if first[0] else "\n") + format_report(report) + "\n")
        first[0] = False
        assert outputs is not None
        outputs.report(report, graded_at)

    try:
        refs = load_reference(args.reference) if args.reference else None
        submissions = collect(args.submissions, exclude=[args.reference] if args.reference else [])
        if not submissions:
            raise UsageError(f"no notebooks found in {', '.join(args.submissions)}")
        python = python_of_kernel(args.kernel)
        limits = Limits(memory_mb=args.memory_mb, cpu_seconds=int(args.notebook_timeout) + 30,
                        sandbox=not args.no_sandbox, without_cgroup=args.without_cgroup)
        if args.self_grade:
            limits, self_why = _self_limits(args, limits, python)
        outputs = _Outputs(args)
        options = Options(timeout=args.timeout, notebook_timeout=args.notebook_timeout)
        private = tuple(args.submissions) + ((args.reference,) if args.reference else ())
        reports = grade_all(submissions, refs, options, args.jobs, limits, python, private, args.self_grade, each)
    except SandboxError as err:
        hint = (" To grade your own notebook without the sandbox, add --self." if len(args.submissions) == 1
                and not os.path.isdir(args.submissions[0]) else "")
        _emit(f"error: {one_line(str(err))}{hint}\n", sys.stderr)
        return 2
    except (UsageError, OutputError, OSError, names.NamesUnavailable) as err:
        _emit(f"error: {one_line(str(err))}\n", sys.stderr)
        return 2
    finally:
        if outputs is not None:
            outputs.close()
    for problem in outputs.problems:
        _emit(f"error: {one_line(problem)}: not written (the report above is complete)\n", sys.stderr)
    return 0 if all(r.all_passed for r in reports) and not outputs.problems else 1


if __name__ == "__main__":
    sys.exit(main())
