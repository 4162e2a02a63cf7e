"""Points: nbgrader's ``points`` metadata read from the reference, partial credit per check call, and a grading
run whose scores add up (lesson 01 with an exercise of two checks)."""

import copy
import json

import nbformat
import pytest
from submissions import IDENTITY_RMSNORM, RIGHT_RMS, ROOT, answered, sandbox_problem, write

from modern_block.classroom import grade
from modern_block.classroom.grading import points
from modern_block.classroom.grading.notebook import read_notebook, reference_from
from modern_block.classroom.grading.report import Exercise, Report


def _scheme(nb) -> points.Scheme:
    data = nbformat.writes(nb).encode()
    return points.scheme_of(data, reference_from(read_notebook(data), "x.ipynb"))


def weighted_lesson01():
    """Lesson 01's exercise notebook with exercise 1 worth 2 points and exercise 2 checked twice, 3 points."""
    nb = copy.deepcopy(nbformat.read(ROOT / "exercises" / "01_rmsnorm.ipynb", as_version=4))
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") == "ex1_rms_check":
            meta["points"] = 2
        if meta.get("grade_id") == "ex2_rmsnorm_check":
            meta["points"] = 3
            cell.source = "checks.check_rmsnorm(RMSNorm)\nchecks.check_rms(rms)"
    return nb


def test_every_course_lesson_has_ids_and_points_from_its_metadata():
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        answers = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                   if c.metadata.get("nbgrader", {}).get("solution")]
        scheme = _scheme(nb)
        assert list(scheme.ids.values()) == answers, path.name  # the answer cells' grade_ids, in order
        assert all(w == [1.0] for w in scheme.weights.values()), path.name


def test_a_cells_points_are_shared_by_its_checks():
    scheme = _scheme(weighted_lesson01())
    assert scheme.ids == {1: "ex1_rms", 2: "ex2_rmsnorm"} and scheme.weights == {1: [2.0], 2: [1.5, 1.5]}
    report = Report("n", "s", exercises=[Exercise(1, "a", ["check_rms"], "failed"),
                                         Exercise(2, "b", ["check_rmsnorm", "check_rms"], "failed",
                                                  passed_checks=[1])])
    points.score(report, scheme)
    assert [(e.id, e.points, e.max_points) for e in report.exercises] == [("ex1_rms", 0, 2.0),
                                                                         ("ex2_rmsnorm", 1.5, 3.0)]
    assert (report.score, report.max_score, report.percent) == (1.5, 5.0, 30.0)
    report.exercises[0].status = "passed"
    points.score(report, scheme)
    assert (report.score, report.percent) == (3.5, 70.0)


@pytest.mark.parametrize("value", [None, "3", True, -1, float("nan"), 1e9])
def test_points_that_are_no_weight_count_one(value):
    assert points.cell_points({} if value is None else {"points": value}) == 1.0
    assert points.cell_points({"points": 0.5}) == 0.5 and points.cell_points({"points": 0}) == 0.0


def test_a_notebook_without_nbgrader_metadata_gets_exercise_numbers_and_one_point_each():
    nb = weighted_lesson01()
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    scheme = _scheme(nb)
    assert scheme.ids == {1: "ex1", 2: "ex2"} and scheme.weights == {1: [1.0], 2: [0.5, 0.5]}
    own = Report("n", "s", exercises=[Exercise(1, "a", ["check_rms"]), Exercise(3, "c", [], "failed")])
    assert points.default_scheme(own).weights == {1: [1.0], 3: [1.0]}



@pytest.mark.skipif(sandbox_problem() is not None, reason="no sandbox here")
def test_partial_credit_when_an_exercise_has_two_checks(tmp_path):
    ref = tmp_path / "ref" / "01_rmsnorm.ipynb"
    ref.parent.mkdir()
    nbformat.write(weighted_lesson01(), ref)
    write(tmp_path / "class", "half", "01_rmsnorm", answered("01_rmsnorm", dict(ex1_rms=RIGHT_RMS,
                                                                                  ex2_rmsnorm=IDENTITY_RMSNORM)))
    write(tmp_path / "class", "all", "01_rmsnorm", answered("01_rmsnorm", base="solutions"))
    assert grade.main([str(tmp_path / "class"), "--reference", str(ref), "--json-file", str(tmp_path / "r.json")]) == 1
    rows = {r["student"]: r for r in json.loads((tmp_path / "r.json").read_text())["notebooks"]}
    half = rows["half"]
    assert [(e["status"], e["points"], e["max_points"]) for e in half["exercises"]] == [("passed", 2.0, 2.0),
                                                                                       ("failed", 1.5, 3.0)]
    assert half["exercises"][1]["passed_checks"] == [1]  # check_rms passed, check_rmsnorm did not
    assert (half["summary"]["score"], half["summary"]["max_score"], half["summary"]["percent"]) == (3.5, 5.0, 70.0)
    assert rows["all"]["summary"]["score"] == 5.0
