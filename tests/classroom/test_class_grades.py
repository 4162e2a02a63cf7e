"""A folder of notebooks graded by the command line, outside nbgrader: a class folder like the one a tester
handed in (honest, stub, a copy of the solutions, typical mistakes, a crash, an endless loop, 12 MB of output,
a renamed file, the package's own function) graded into rows with points, feedback files and JSON lines; then a
student grading their own notebook where no sandbox can start. (A term's gradebook, regrades and export are
nbgrader's: tests/classroom/test_nbgrader.py.)"""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from submissions import (
    LAYERNORM_RMSNORM,
    RIGHT_RMS,
    ROOT,
    WRONG_RMS,
    answered,
    read_report,
    sandbox_problem,
    solution_source,
    write,
)

REFERENCE = ROOT / "exercises"
RENAMED = "Copy of 03_rope (1).ipynb"
CRASH = ("def rms(x, eps=1e-6):\n    return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()\n\n\n"
         "class Wrapper(nn.Module):\n    def forward(self, x):\n        return self.missing(x)\n\n\n"
         "nn.Sequential(Wrapper(), Wrapper())(torch.ones(2))")


def _answer_cell() -> int:
    """Where exercise 1's answer is among lesson 01's code cells, counted from 1."""
    code = [c for c in answered("01_rmsnorm").cells if c.cell_type == "code"]
    return 1 + next(k for k, c in enumerate(code) if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_rms")


ANSWER_CELL = _answer_cell()



pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason="no sandbox here")


def make_class(folder: Path) -> dict:
    """13 notebooks of 10 students; returns {(student, lesson): the statuses the grade must have}."""
    expected = {}

    def add(student, lesson, statuses, answers=None, base="exercises", name=None):
        path = write(folder, student, lesson, answered(lesson, answers or {}, base=base))
        if name:
            path.rename(path.parent / name)
        expected[(student, lesson)] = statuses

    add("ada", "01_rmsnorm", ["passed", "passed"], dict(ex1_rms=RIGHT_RMS,
                                                        ex2_rmsnorm=solution_source("01_rmsnorm", "ex2_rmsnorm")))
    add("ada", "03_rope", ["passed"] * 3, base="solutions")
    add("ben", "01_rmsnorm", ["not attempted"] * 2)  # the stubs, untouched
    add("ben", "03_rope", ["not attempted"] * 3)
    add("cy", "01_rmsnorm", ["passed", "passed"], base="solutions")  # a copy of the solutions, as it is
    shutil.copy(ROOT / "solutions" / "03_rope.ipynb", folder / "cy" / "03_rope.ipynb")
    expected[("cy", "03_rope")] = ["passed"] * 3
    add("dee", "01_rmsnorm", ["failed", "failed"], dict(ex1_rms=WRONG_RMS, ex2_rmsnorm=LAYERNORM_RMSNORM))
    add("eli", "01_rmsnorm", ["passed", "not attempted"], dict(ex1_rms=CRASH))  # the crash, after rms
    add("fay", "01_rmsnorm", ["failed", "not attempted"], dict(ex1_rms="while True:\n    pass"))
    add("gus", "01_rmsnorm", ["passed", "not attempted"], dict(ex1_rms="print('x' * 12_000_000)\n" + RIGHT_RMS))
    add("Hank Lee", "03_rope", ["passed", "failed", "not attempted"], dict(
        ex1_rope_cache=solution_source("03_rope", "ex1_rope_cache"),
        ex2_apply_rope="def apply_rope(x, cos, sin):\n    return x * cos.repeat(1, 2) + x * sin.repeat(1, 2)"),
        name=RENAMED)
    add("ivy", "03_rope", ["not attempted", "failed", "not attempted"], dict(
        ex2_apply_rope="from modern_block import apply_rope"))  # the package's own function
    add("jo", "03_rope", ["passed", "passed", "failed"], dict(
        ex1_rope_cache=solution_source("03_rope", "ex1_rope_cache"),
        ex2_apply_rope=solution_source("03_rope", "ex2_apply_rope"),
        ex3_interleaved=solution_source("03_rope", "ex2_apply_rope").replace("def apply_rope(",
                                                                             "def apply_rope_interleaved(")))
    return expected


def run(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "modern_block", "grade", *map(str, argv)], capture_output=True,
                          text=True, timeout=900, cwd=ROOT, env=env)


def table(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    base = tmp_path_factory.mktemp("term")
    expected = make_class(base / "class")
    out = base / "out"
    out.mkdir()
    first = run(base / "class", "--reference", REFERENCE, "--jobs", "2", "--timeout", "8", "--csv", out / "grades.csv",
                "--feedback", out / "feedback", "--json-file", out / "report.json")
    return {"base": base, "out": out, "expected": expected, "first": first, "book": table(out / "grades.csv"),
            "doc": read_report((out / "report.json").read_text(encoding="utf-8"))}


def test_every_notebook_gets_its_grade_rows_named_by_folder(term):
    assert term["first"].returncode == 1, term["first"].stderr
    assert term["first"].stderr == ""
    rows = {(r["student"], r["lesson"]): r for r in term["doc"]["notebooks"]}
    assert rows.keys() == term["expected"].keys()  # "Hank Lee", never "Copy of 03_rope (1)"
    for key, want in term["expected"].items():
        assert [e["status"] for e in rows[key]["exercises"]] == want, (key, rows[key])
    hank = rows[("Hank Lee", "03_rope")]
    assert hank["notebook"].endswith(RENAMED) and "graded as 03_rope.ipynb" in " ".join(hank["notes"])
    assert "not available while this notebook is graded" in rows[("ivy", "03_rope")]["exercises"][1]["detail"]
    assert "timed out" in rows[("fay", "01_rmsnorm")]["exercises"][0]["detail"]


def test_points_add_up_in_the_rows(term):
    book = term["book"]
    # one row per student and exercise, the maximum the reference's (1 per exercise here)
    assert len(term["expected"]) == 13 and len(book) == sum(len(v) for v in term["expected"].values())
    for (student, lesson), want in term["expected"].items():
        rows = [r for r in book if r["student"] == student and r["lesson"] == lesson]
        assert [r["result"] for r in rows] == want
        assert sum(float(r["points"]) for r in rows) == want.count("passed")
        assert sum(float(r["max_points"]) for r in rows) == len(want)
    ada = [r for r in term["doc"]["notebooks"] if r["student"] == "ada"]
    assert [(r["lesson"], r["summary"]["score"], r["summary"]["max_score"]) for r in ada] == [
        ("01_rmsnorm", 2.0, 2.0), ("03_rope", 3.0, 3.0)]


def test_outputs_are_readable_by_others(term):
    mask = os.umask(0o022)
    os.umask(mask)
    for path in [term["out"] / "grades.csv", term["out"] / "report.json",
                 *(term["out"] / "feedback").rglob("*.md")]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_feedback_files_one_per_student_and_notebook(term):
    files = sorted(p.relative_to(term["out"] / "feedback").as_posix() for p in (term["out"] / "feedback").rglob("*.md"))
    assert files == sorted(f"{s}/{lesson}.md" for s, lesson in term["expected"])
    dee = (term["out"] / "feedback" / "dee" / "01_rmsnorm.md").read_text(encoding="utf-8")
    assert "Score: **0 / 2 points (0%)**" in dee and "the mean was subtracted" in dee and "LayerNorm" in dee
    ben = (term["out"] / "feedback" / "ben" / "01_rmsnorm.md").read_text(encoding="utf-8")
    assert ben.count("· not attempted") == 2
    eli = (term["out"] / "feedback" / "eli" / "01_rmsnorm.md").read_text(encoding="utf-8")
    assert f"## code cell {ANSWER_CELL} (Exercise 1) raised an error" in eli  # counted as a student counts
    traceback = eli.split("Its output (the traceback shows your code only):", 1)[1]
    assert "module.py" not in traceback and "frames in libraries" in traceback
    assert len(traceback.strip().splitlines()) < 25  # not the 40 lines of torch's frames
    gus = (term["out"] / "feedback" / "gus" / "01_rmsnorm.md").stat().st_size
    assert gus < 20_000  # 12 MB of output do not reach the feedback


def test_the_text_report_names_cells_as_students_count_them(term):
    out = term["first"].stdout
    assert f"! code cell {ANSWER_CELL} (Exercise 1): AttributeError: 'Wrapper' object has no attribute 'missing'" in out
    assert out.count("exercises: ") == len(term["expected"])


def test_a_student_grades_their_own_notebook_where_no_sandbox_starts(tmp_path):
    mine = write(tmp_path, "me", "01_rmsnorm", answered("01_rmsnorm", dict(ex1_rms=RIGHT_RMS)))
    no_bwrap = dict(os.environ, PATH=str(tmp_path / "empty"))  # bubblewrap cannot be found
    refused = run(mine, env=no_bwrap)
    assert refused.returncode == 2 and "bubblewrap" in refused.stderr and "add --self" in refused.stderr
    own = run(mine, "--self", env=no_bwrap)
    assert own.returncode == 1, own.stderr
    assert "self-graded WITHOUT isolation" in own.stdout and "bubblewrap is not installed" in own.stdout
    note = next(line for line in own.stdout.splitlines() if "WITHOUT isolation" in line)
    assert "Install" not in note and not note.rstrip().endswith((",", " a", " the")), note  # the reason, whole
    assert "✓ Exercise 1: the root mean square" in own.stdout and "1/2 points (50%)" in own.stdout
    for others in ([tmp_path, "--self"], [mine, mine, "--self"]):  # a folder, several notebooks: the sandbox
        assert run(*others, env=no_bwrap).returncode == 2
    sandboxed = run(mine, "--self")  # where the sandbox starts, --self uses it
    assert sandboxed.returncode == 1 and "WITHOUT isolation" not in sandboxed.stdout
