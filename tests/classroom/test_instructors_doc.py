"""docs/instructors.md is tested, not trusted: its walk-through's commands run, in order, in a scratch folder
with the course's solutions and a small class; its exercise table is what the solution notebooks' metadata
says (regenerate it from the failure message); its gradebook header is the grader's."""

import ast
import csv
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from submissions import LAYERNORM_RMSNORM, ROOT, WRONG_RMS, answered, sandbox_problem, write

from modern_block.__main__ import main as cli
from modern_block.classroom.grading import grade
from modern_block.classroom.grading.grade_report import COLUMNS, number_text

DOC = ROOT / "docs" / "instructors.md"
TABLE_START = ("<!-- exercise table: generated from solutions/ by tests/classroom/test_instructors_doc.py; "
               "do not edit -->")
TABLE_END = "<!-- end of the exercise table -->"
RUN = re.compile(r"<!-- run(?:, exit (\d))? -->")
NOT_RUN = re.compile(r"<!-- not run: .+ -->")


def _args(args: ast.arguments) -> str:
    """The parameters without their annotations (a ``|`` in one would split a Markdown table's cell)."""
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    return ast.unparse(args)


def signature(source: str) -> str:
    """What the answer cell asks the student to write: ``rms(x, eps=1e-06)``, ``class RMSNorm(d, eps=1e-06)``
    or, for a value item, ``value: name``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            return f"`{node.name}({_args(node.args)})`"
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            args = _args(init.args).removeprefix("self, ").removeprefix("self") if init else ""
            return f"`class {node.name}({args})`"
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return f"value: `{node.targets[0].id}`"
    return ""


def exercise_table() -> str:
    """The doc's exercise table, from the solution notebooks: each exercise's heading, what the student
    writes, its id (the answer cell's grade_id, the gradebook's key), its points and its check."""
    lines = ["| lesson | exercise | the student writes | id | points | check |", "|---|---|---|---|---|---|"]
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        ref = grade.load_reference(path)[path.name]
        answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nbformat.read(path, as_version=4).cells
                   if c.metadata.get("nbgrader", {}).get("solution")}
        for k, ex in enumerate(ref.exercises):
            ident = ex.id
            lines.append(f"| {path.stem if k == 0 else ''} | {ex.number}. {ex.title} | "
                         f"{signature(answers.get(ident, ''))} | `{ident}` | "
                         f"{number_text(sum(ex.weights))} | "
                         f"{', '.join(f'`{c.check}`' for c in ex.calls)} |")
    return "\n".join(lines)


def test_the_exercise_table_is_the_solutions_metadata():
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_START in text and TABLE_END in text
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == exercise_table(), "docs/instructors.md's exercise table is stale; replace it by:\n" + \
        exercise_table()


def test_the_gradebook_header_shown_is_the_graders():
    assert ",".join(COLUMNS) in DOC.read_text(encoding="utf-8")


def blocks() -> list[tuple[str, int | None]]:
    """The doc's bash blocks, in order: (commands, expected exit status or None when not run). Every bash block
    is marked, so none is forgotten: ``<!-- run -->``, ``<!-- run, exit 1 -->`` or ``<!-- not run: why -->``."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    found = []
    for k, line in enumerate(lines):
        if line.strip() != "```bash":
            continue
        mark = lines[k - 1].strip() if k else ""
        body = []
        for end in lines[k + 1:]:
            if end.strip() == "```":
                break
            body.append(end)
        run = RUN.fullmatch(mark)
        assert run or NOT_RUN.fullmatch(mark), f"line {k + 1}: a bash block without <!-- run --> or <!-- not run: -->"
        found.append(("\n".join(body), int(run.group(1) or 0) if run else None))
    return found



@pytest.mark.slow
@pytest.mark.skipif(sandbox_problem() is not None, reason="no sandbox here")
def test_the_walk_through_runs_as_written(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader comes with the classroom extra")
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    students = {"ada": answered("01_rmsnorm", base="solutions"),
                "ben": answered("01_rmsnorm", dict(ex2_rmsnorm=LAYERNORM_RMSNORM)),
                "cy": answered("01_rmsnorm", dict(ex1_rms=WRONG_RMS))}
    with zipfile.ZipFile(tmp_path / "lms-download.zip", "w") as z:  # an LMS download: student, time, file
        for name, nb in students.items():
            z.writestr(f"{name}_2026-12-03T10:00:00_01_rmsnorm.ipynb", nbformat.writes(nb))
    for name, nb in students.items():
        write(tmp_path / "submissions", name, "01_rmsnorm", nb)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the doc's `python`: this one
    (bin_dir / "python").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])  # nbgrader's too
    env = dict(os.environ, PATH=path, MPLBACKEND="Agg")
    ran = 0
    for commands, status in blocks():
        if status is None:
            continue
        for command in [c for c in commands.split("\n") if c.strip() and not c.lstrip().startswith("#")]:
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == status, (command, done.stdout[-2000:], done.stderr[-2000:])
            assert "missing" not in done.stdout, (command, done.stdout)  # a build says what it writes
            ran += 1
    assert ran >= 12
    # what the walk-through says it leaves behind: nbgrader's export of the roster, its feedback, grade's rows
    with open(tmp_path / "course" / "grades.csv", newline="") as f:
        export = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert export == {"ada": 2.0, "ben": 0.5, "cy": 0.0, "dee": 0.0}  # ben's manual half point; dee handed in nothing
    feedback = (tmp_path / "course" / "feedback" / "cy" / "01_rmsnorm" / "01_rmsnorm.html").read_text()
    assert "CheckFailed" in feedback and "the mean was subtracted" in feedback
    book = (tmp_path / "grades.csv").read_text(encoding="utf-8")
    assert book.startswith(",".join(COLUMNS))
    rows = list(csv.reader(io.StringIO(book)))[1:]
    assert {(r[0], r[4]) for r in rows} == {("ada", "01_rmsnorm"), ("ben", "01_rmsnorm"), ("cy", "01_rmsnorm")}
    assert (tmp_path / "feedback" / "cy" / "01_rmsnorm.md").is_file()
    assert sorted(p.name for p in (tmp_path / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


def test_every_command_in_the_doc_names_an_option_the_grader_has():
    options = {a for action in grade._parser()._actions for a in action.option_strings}
    for commands, _ in blocks():
        for command in commands.replace("\\\n", " ").split("\n"):
            words = shlex.split(command, comments=True) if command.strip() else []
            if words[:4] == ["python", "-m", "modern_block", "grade"]:
                unknown = [w for w in words if w.startswith("--") and w.split("=")[0] not in options]
                assert not unknown, (command, unknown)


def test_a_build_says_what_it_writes(tmp_path, capsys):
    """``python -m modern_block exercises build`` (its entry point, in this process: the walk-through runs the
    command itself) names each file it writes and why, and ``--check`` names a stale one with exit status 1."""
    (tmp_path / "solutions").mkdir()
    shutil.copy(ROOT / "solutions" / "01_rmsnorm.ipynb", tmp_path / "solutions")
    build = ["exercises", "build", "--root", str(tmp_path)]
    assert cli(build) == 0
    assert capsys.readouterr().out.splitlines() == ["exercises/01_rmsnorm.ipynb: written, new (from "
                                                    "solutions/01_rmsnorm.ipynb)", "wrote 1 exercise notebook(s)"]
    nb = nbformat.read(tmp_path / "solutions" / "01_rmsnorm.ipynb", as_version=4)
    last_text = [c for c in nb.cells if c.cell_type == "markdown"][-1]
    last_text.source += "\n\nOne more sentence."
    nbformat.write(nb, tmp_path / "solutions" / "01_rmsnorm.ipynb")
    assert cli([*build, "--check"]) == 1 and "exercises/01_rmsnorm.ipynb: out of date" in capsys.readouterr().out
    assert cli(build) == 0
    assert "exercises/01_rmsnorm.ipynb: rewritten, was out of date" in capsys.readouterr().out
    assert Path(tmp_path / "exercises" / "01_rmsnorm.ipynb").is_file()
