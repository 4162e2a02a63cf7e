"""nbgrader, for real: install it (into a folder of its own, the course's environment untouched), run its
``generate_assignment`` on lesson 01's solution notebook and its ``autograde`` on two submissions.

What it shows, and what docs/instructors.md says: the markers and cell metadata are nbgrader's, so nbgrader
releases the assignment and scores it (2 of 2 for the solution); but nbgrader decides a point inside the
student's kernel, so a submission that replaces the check function scores there, and only
``python -m modern_block grade`` refuses it.
"""

import csv
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from submissions import RIGHT_RMS, ROOT, WRONG_RMS, answered

from modern_block.classroom import grade

NBGRADER = "nbgrader==0.9.6"
# nbgrader's requirements that the course's environment lacks; the rest (jupyter_server, nbconvert,
# nbclient, ...) are the course's own
MISSING_REQUIREMENTS = ["mako", "rapidfuzz", "sqlalchemy", "alembic"]


@pytest.fixture(scope="module")
def nbgrader_env():
    """PYTHONPATH and PATH that put nbgrader (installed from PyPI once, into a cache folder) before the course."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modern_block"
    # one folder per environment: pip writes this environment's interpreter into the scripts in bin/ (nbgrader
    # runs `alembic` from PATH), so a folder shared by two environments breaks when the first one is deleted
    env_id = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
    target = cache / f"nbgrader-0.9.6-py{sys.version_info.major}{sys.version_info.minor}-{env_id}"
    if not (target / "nbgrader" / "__init__.py").is_file():
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        NBGRADER, *MISSING_REQUIREMENTS], check=True, timeout=600)
    env = dict(os.environ, PYTHONPATH=str(target), PATH=f"{target / 'bin'}{os.pathsep}{os.environ['PATH']}",
               MPLBACKEND="Agg")
    return env


def nbgrader(env, course: Path, *args):
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_nbgrader_releases_and_autogrades_lesson_01(nbgrader_env, tmp_path):
    course = tmp_path / "course"
    (course / "source" / "lesson01").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "modern-block"\n')
    shutil.copy(ROOT / "solutions" / "01_rmsnorm.ipynb", course / "source" / "lesson01")
    nbgrader(nbgrader_env, course, "generate_assignment", "lesson01", "--create")
    released = nbformat.read(course / "release" / "lesson01" / "01_rmsnorm.ipynb", as_version=4)
    sources = "\n".join(c.source for c in released.cells)
    assert "### BEGIN SOLUTION" not in sources and sources.count("raise NotImplementedError()") == 3
    assert "checks.check_rms(rms)" in sources and "checks.check_rmsnorm(RMSNorm)" in sources

    submissions = {
        "alice": answered("01_rmsnorm", base="solutions"),  # the solution: full marks
        # a wrong rms and the check replaced, RMSNorm left as the stub: a cheat nbgrader cannot see
        "carol": answered("01_rmsnorm", dict(ex1_rms=WRONG_RMS + "\nchecks.check_rms = lambda *a, **k: None")),
    }
    for student, nb in submissions.items():
        folder = course / "submitted" / student / "lesson01"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "01_rmsnorm.ipynb")
    nbgrader(nbgrader_env, course, "autograde", "lesson01", "--create")
    scores = subprocess.run(
        [sys.executable, "-c", "from nbgrader.api import Gradebook\n"
         "with Gradebook('sqlite:///gradebook.db') as gb:\n"
         "    for s in ('alice', 'carol'):\n"
         "        sub = gb.find_submission('lesson01', s)\n"
         "        print(s, sub.score, sub.max_score)"],
        cwd=course, env=nbgrader_env, capture_output=True, text=True, check=True).stdout.split("\n")
    assert scores[:2] == ["alice 2.0 2.0", "carol 1.0 2.0"]  # nbgrader gives the cheat its point ...

    reports = grade.grade_all(grade.collect([course / "submitted"]),
                              grade.load_reference(ROOT / "exercises" / "01_rmsnorm.ipynb"))
    assert [(r.student, [e.status for e in r.exercises]) for r in reports] == [
        ("alice", ["passed", "passed"]), ("carol", ["failed", "not attempted"])]  # ... the course's grader not

    # a student's self-check in nbgrader: validate runs the notebook in the student's own kernel
    validate = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(course / "release" / "lesson01" /
                                                                                "01_rmsnorm.ipynb")],
                              cwd=course, env=nbgrader_env, capture_output=True, text=True, timeout=600)
    assert "VALIDATION FAILED ON 2 CELL(S)" in validate.stdout + validate.stderr

    # the rest of an instructor's term in nbgrader, for the comparison in docs/instructors.md: feedback files,
    # a one-student regrade, the export
    nbgrader(nbgrader_env, course, "generate_feedback", "lesson01")
    feedback = sorted(p.relative_to(course / "feedback").as_posix() for p in (course / "feedback").rglob("*.html"))
    assert feedback == ["alice/lesson01/01_rmsnorm.html", "carol/lesson01/01_rmsnorm.html"]
    nbformat.write(answered("01_rmsnorm", base="solutions"), course / "submitted" / "carol" / "lesson01" /
                   "01_rmsnorm.ipynb")
    nbgrader(nbgrader_env, course, "autograde", "lesson01", "--student", "carol")
    export = subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=course, env=nbgrader_env,
                            capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stderr[-2000:]
    with open(course / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}  # one row per student and assignment
    assert {s: (float(r["score"]), float(r["max_score"])) for s, r in rows.items()} == {
        "alice": (2.0, 2.0), "carol": (2.0, 2.0)}  # the regrade replaced carol's score, alice's stayed


def test_the_exercise_notebooks_carry_nbgraders_cell_metadata():
    """Handing out exercises/ instead of nbgrader's release copy works because the cells keep nbgrader's ids."""
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert answers and len(tests) == len(answers), path.name
        assert all(c.metadata["nbgrader"]["locked"] and c.metadata["nbgrader"]["points"] == 1 for c in tests)
        assert len({c.metadata["nbgrader"]["grade_id"] for c in answers + tests}) == 2 * len(answers)
    assert RIGHT_RMS  # the submissions module is the one the grader's tests use
