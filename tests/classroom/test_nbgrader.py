"""nbgrader is the instructor's workflow, with the course's engine as its autograde step: a term, end to end.

``python -m modern_block exercises course`` writes the nbgrader course (its config and ``source/`` from
``solutions/``); nbgrader releases the assignment, collects submissions (folders, and ``zip_collect`` of an LMS
download with submission times), autogrades them (the student's cells in the course's sandbox, the checks in
the grader), takes a manual adjustment, writes feedback (the checks' diagnoses in it) and exports one row per
student of its roster. nbgrader alone runs the checks in the student's kernel: the submission that replaces
the check function scores there, and 0 here.
"""

import copy
import csv
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from submissions import LAYERNORM_RMSNORM, RIGHT_RMS, ROOT, WRONG_RMS, answered, sandbox_problem, solution_source

pytest.importorskip("nbgrader", reason="nbgrader comes with the classroom extra (pip install -e '.[dev]')")

ASSIGNMENT = "01_rmsnorm"
CHEAT = WRONG_RMS + "\nchecks.check_rms = lambda *a, **k: None"
# round 3 flooded 3,000 cells (test_attacks.py grades that many through `grade`); here 300: 15 times the 20 error
# rows kept, and at least 7 MB (24 KB a cell in UTF-8) against the 2 MB asserted if every cell's text were written.
# This file took 104 s with 3,000 cells, 66 s with 300 (autograde and feedback of the flood, one core)
FLOOD_CELLS = 300
ZIP_CONFIG = """
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[a-z]+)_(?P<timestamp>[0-9T:-]+)_(?P<file_id>.+)"
c.LateSubmissionPlugin.penalty_method = "zero"
c.SandboxedExecute.timeout = 30
"""


def weighted(nb):
    """Lesson 01 with exercise 2's check cell calling two checks for 3 points (1.5 each: partial credit)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ex2_rmsnorm_check":
            cell.metadata.nbgrader["points"] = 3
            cell.source = "checks.check_rmsnorm(RMSNorm)\nchecks.check_rms(rms)"
    return nb


def student(answers=None, base="exercises"):
    return weighted(answered(ASSIGNMENT, answers, base=base))


def nbgrader(course: Path, *args, check=True):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=900)
    assert not check or done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    problem = sandbox_problem()
    if problem:
        pytest.skip(f"no sandbox here: {problem}")
    base = tmp_path_factory.mktemp("nbgrader")
    done = subprocess.run([sys.executable, "-m", "modern_block", "exercises", "course", str(base / "course"),
                           "--lessons", ASSIGNMENT], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    course = base / "course"
    with open(course / "nbgrader_config.py", "a") as f:
        f.write(ZIP_CONFIG)
    source = course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    nbformat.write(weighted(nbformat.read(source, as_version=4)), source)
    # the roster in one call, as an instructor imports it (a student added per call costs a 3 s start each)
    roster = ("alice", "bob", "carol", "dan", "eve", "fay", "lin", "mallory", "ned", "rich")  # dan: nothing
    (base / "roster.csv").write_text("id\n" + "".join(f"{name}\n" for name in roster))
    nbgrader(course, "db", "student", "import", str(base / "roster.csv"))
    nbgrader(course, "db", "assignment", "add", ASSIGNMENT, "--duedate=2026-03-01 12:00:00 UTC")
    nbgrader(course, "generate_assignment", ASSIGNMENT)

    many = student(base="solutions")  # round 3's flood: cells that print format characters and raise
    first = next(i for i, c in enumerate(many.cells) if c.cell_type == "markdown" and "## Exercise" in c.source)
    many.cells[first:first] = [nbformat.v4.new_code_cell("print('\\u202e' * 5000)\nraise ValueError('\\u2066' * 3000)")
                               for _ in range(FLOOD_CELLS)]
    rich = student(base="solutions")  # round 3: a notebook that sets its own points and adds an exercise
    for cell in rich.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader["points"] = 50
    rich.cells.append(nbformat.v4.new_markdown_cell("## Exercise 3: free points"))
    rich.cells.append(nbformat.v4.new_code_cell("checks.check_rms(rms)"))
    for name, nb in {"alice": student(base="solutions"), "carol": student(dict(ex1_rms=CHEAT)), "mallory": many,
                     "rich": rich}.items():
        folder = course / "submitted" / name / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
        (folder / "timestamp.txt").write_text("2026-02-28 10:00:00 UTC")
    # links in submitted/ (a folder copied with its links): a notebook linked to the source with its solutions,
    # an assignment folder that is a link to a right answer outside the course
    (course / "submitted" / "lin" / ASSIGNMENT).mkdir(parents=True)
    (course / "submitted" / "lin" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").symlink_to(source)
    outside = base / "outside"
    outside.mkdir()
    nbformat.write(student(base="solutions"), outside / f"{ASSIGNMENT}.ipynb")
    (course / "submitted" / "ned").mkdir()
    (course / "submitted" / "ned" / ASSIGNMENT).symlink_to(outside, target_is_directory=True)
    deleted = student(dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=solution_source(ASSIGNMENT, "ex2_rmsnorm")))
    deleted.cells = [c for c in deleted.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "ex1_rms_check"]
    download = {  # an LMS download: student, submission time, file
        "bob_2026-02-27T09:00:00": student(dict(ex1_rms=RIGHT_RMS, ex2_rmsnorm=LAYERNORM_RMSNORM)),
        "eve_2026-03-02T09:00:00": student(base="solutions"),  # late: the policy gives 0
        "fay_2026-02-27T10:00:00": deleted,  # exercise 1's check cell deleted: nbgrader puts it back
    }
    archive = course / "downloaded" / ASSIGNMENT / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "lms-download.zip", "w") as z:
        for key, nb in download.items():
            z.writestr(f"{key}_{ASSIGNMENT}.ipynb", nbformat.writes(nb))
    nbgrader(course, "zip_collect", ASSIGNMENT)
    auto = nbgrader(course, "autograde", ASSIGNMENT)
    return {"course": course, "autograde": auto}


def gradebook(course: Path):
    """nbgrader's gradebook of ``course``, opened in this process (a subprocess would pay nbgrader's 2-3 s import
    again)."""
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course / 'gradebook.db'}")


def scores(course: Path) -> dict[str, tuple]:
    """Each student's (score, max score, late penalty)."""
    with gradebook(course) as gb:
        return {s.student.id: (float(s.score), float(s.max_score),
                               None if s.late_submission_penalty is None else float(s.late_submission_penalty))
                for s in gb.assignment_submissions(ASSIGNMENT)}


@pytest.mark.slow
def test_release_copy_is_nbgraders_with_the_course_ids(term):
    released = nbformat.read(term["course"] / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    sources = "\n".join(c.source for c in released.cells)
    assert "### BEGIN SOLUTION" not in sources and "checks.check_rms(rms)" in sources
    ids = [c.metadata.nbgrader["grade_id"] for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert ids == ["ex1_rms_check", "ex2_rmsnorm_check"]


@pytest.mark.slow
def test_autograde_runs_the_course_engine_with_partial_credit_and_the_late_policy(term):
    got = scores(term["course"])
    assert got["alice"] == (4.0, 4.0, 0.0)
    assert got["carol"][:2] == (0.0, 4.0)  # the replaced check: 0 here (nbgrader's kernel gives it the point)
    assert got["bob"][:2] == (2.5, 4.0)  # rms right (1), RMSNorm wrong: 1.5 of exercise 2's 3 (check_rms passes)
    assert got["eve"] == (4.0, 4.0, 4.0)  # right, but after the due date: the penalty takes all 4 (exported as 0)
    assert got["fay"][:2] == (4.0, 4.0)  # the deleted check cell was put back and graded
    assert "dan" not in got  # nothing handed in: no submission (the export gives the roster's row)
    assert got["mallory"][:2] == got["rich"][:2] == (4.0, 4.0)  # the points are the source's, never the notebook's
    assert got["lin"][:2] == got["ned"][:2] == (0.0, 4.0)  # no link in submitted/ is followed
    for name in ("lin", "ned"):
        text = (term["course"] / "autograded" / name / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text()
        assert "a symbolic link" in text and "BEGIN SOLUTION" not in text and "def rms(" not in text, text[:2000]
    graded = term["course"] / "autograded" / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert graded.stat().st_size < 2 << 20  # 20 of the flood's errors written, each bounded (unbounded: 7 MB)
    assert "alice: exercise 1 passed 1/1; exercise 2 passed 3/3" in term["autograde"].stderr


@pytest.mark.slow
def test_manual_grading_feedback_and_export(term):
    course = term["course"]
    with gradebook(course) as gb:  # the teaching assistant's mark
        gb.find_grade("ex2_rmsnorm_check", ASSIGNMENT, ASSIGNMENT, "bob").manual_score = 3.0
        gb.db.commit()
    assert scores(course)["bob"][:2] == (4.0, 4.0)  # the teaching assistant's mark replaces the autograde's
    nbgrader(course, "generate_feedback", ASSIGNMENT)
    carol = (course / "feedback" / "carol" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "CheckFailed" in carol and "the mean was subtracted" in carol  # the check's diagnosis, in the feedback
    bob = (course / "feedback" / "bob" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "LayerNorm" in bob
    nbgrader(course, "export")
    with open(course / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: float(r["score"]) for s, r in rows.items()} == {"alice": 4.0, "bob": 4.0, "carol": 0.0, "dan": 0.0,
                                                               "eve": 0.0, "fay": 4.0, "lin": 0.0, "mallory": 4.0,
                                                               "ned": 0.0, "rich": 4.0}
    assert {float(r["max_score"]) for r in rows.values()} == {4.0}  # the assignment's maximum, for everyone


@pytest.mark.slow
def test_a_regrade_of_one_student_keeps_the_others(term):
    course = term["course"]
    before = scores(course)
    nb = student(base="solutions")
    nbformat.write(nb, course / "submitted" / "carol" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    nbgrader(course, "autograde", ASSIGNMENT, "--student", "carol", "--force")
    after = scores(course)
    assert after["carol"][:2] == (4.0, 4.0)
    assert {k: v for k, v in after.items() if k != "carol"} == {k: v for k, v in before.items() if k != "carol"}


def test_the_config_puts_the_engine_in_place_of_nbgraders_kernel(tmp_path):
    from modern_block.classroom.exercises import course

    course(tmp_path / "c", ["01_rmsnorm"], ROOT)
    text = (tmp_path / "c" / "nbgrader_config.py").read_text()
    assert "modern_block.classroom.grading.autograde.SandboxedExecute" in text and "preprocessors.Execute" not in text
    assert (tmp_path / "c" / "source" / "01_rmsnorm" / "01_rmsnorm.ipynb").read_bytes() == \
        (ROOT / "solutions" / "01_rmsnorm.ipynb").read_bytes()
    (tmp_path / "c" / "nbgrader_config.py").write_text("c = get_config()  # the instructor's own\n")
    course(tmp_path / "c", ["01_rmsnorm"], ROOT)
    assert "instructor's own" in (tmp_path / "c" / "nbgrader_config.py").read_text()
    with pytest.raises(FileNotFoundError, match="99_nothing"):
        course(tmp_path / "c", ["99_nothing"], ROOT)
    shutil.rmtree(tmp_path / "c")


def test_a_submission_is_read_again_without_following_a_link(tmp_path):
    """nbgrader's own read (which follows links) is replaced: a regular file as it is, a link by a notebook of
    empty cells that keeps only nbgrader's ids (nothing of the file it names), the refusal in the metadata."""
    from traitlets.config import Config

    from modern_block.classroom.grading.autograde import NOT_READ, ReadSubmission

    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    folder = tmp_path / "submitted" / "ada" / ASSIGNMENT
    folder.mkdir(parents=True)
    forged = student(base="solutions")
    forged.metadata[NOT_READ] = "a note of the student's own"  # only the step sets it
    nbformat.write(forged, folder / f"{ASSIGNMENT}.ipynb")
    resources = {"nbgrader": {"student": "ada", "assignment": ASSIGNMENT, "notebook": ASSIGNMENT}}
    read, _ = ReadSubmission(config=config).preprocess(nbformat.v4.new_notebook(), resources)
    assert NOT_READ not in read.metadata and [c.source for c in read.cells] == [c.source for c in forged.cells]
    (folder / f"{ASSIGNMENT}.ipynb").unlink()
    (folder / f"{ASSIGNMENT}.ipynb").symlink_to(ROOT / "solutions" / f"{ASSIGNMENT}.ipynb")
    followed = nbformat.read(folder / f"{ASSIGNMENT}.ipynb", as_version=4)  # what nbgrader read through it
    refused, _ = ReadSubmission(config=config).preprocess(followed, resources)
    assert "a symbolic link" in refused.metadata[NOT_READ] and "a symbolic link" in refused.cells[0].source
    assert all(c.source == "" for c in refused.cells[1:]) and len(refused.cells) == len(followed.cells) + 1
    assert [c.metadata.get("nbgrader") for c in refused.cells[1:]] == [c.metadata.get("nbgrader")
                                                                       for c in followed.cells]


def test_the_exercise_notebooks_carry_nbgraders_cell_metadata():
    """Handing out exercises/ instead of nbgrader's release copy works because the cells keep nbgrader's ids."""
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert answers and len(tests) == len(answers), path.name
        assert all(c.metadata["nbgrader"]["locked"] and c.metadata["nbgrader"]["points"] == 1 for c in tests)
        assert len({c.metadata["nbgrader"]["grade_id"] for c in answers + tests}) == 2 * len(answers)
