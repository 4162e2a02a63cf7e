"""The engine's bookkeeping, without a sandbox: points and ids read from the trusted reference only, partial
credit per check call, and the verdicts written into check cells exactly where nbgrader reads a grade
(``nbgrader.utils.determine_grade`` scores the annotated cells as the course's grader did)."""

import copy

import nbformat
import pytest
from submissions import ROOT

from modern_block.classroom.grading import names
from modern_block.classroom.grading.engine import MAX_CELL_ROWS, annotate, finish, score
from modern_block.classroom.grading.grade_report import Exercise, Report, bounded
from modern_block.classroom.grading.notebook import read_notebook, reference_from


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


def reference(nb):
    return reference_from(read_notebook(nbformat.writes(nb).encode()), "01_rmsnorm.ipynb")


def test_every_course_lesson_has_ids_and_points_from_its_metadata():
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        answers = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                   if c.metadata.get("nbgrader", {}).get("solution")]
        ref = reference(nb)
        assert [e.id for e in ref.exercises] == answers, path.name  # the answer cells' grade_ids, in order
        assert all(e.weights == [1.0] for e in ref.exercises), path.name


def test_a_cells_points_are_shared_by_its_checks_and_each_passing_check_earns_its_share():
    ref = reference(weighted_lesson01())
    assert [(e.id, e.weights) for e in ref.exercises] == [("ex1_rms", [2.0]), ("ex2_rmsnorm", [1.5, 1.5])]
    report = Report("n", "s", exercises=[Exercise(1, "a", ["check_rms"], "failed"),
                                         Exercise(2, "b", ["check_rmsnorm", "check_rms"], "failed",
                                                  passed_checks=[1])])
    score(report, ref)
    assert [(e.id, e.points, e.max_points) for e in report.exercises] == [("ex1_rms", 0, 2.0),
                                                                         ("ex2_rmsnorm", 1.5, 3.0)]
    assert (report.score, report.max_score, report.percent) == (1.5, 5.0, 30.0)
    score(report, None)  # no trusted reference: 1 point per check, whatever the notebook says
    assert [(e.id, e.max_points) for e in report.exercises] == [("ex1", 1.0), ("ex2", 2.0)]


@pytest.mark.parametrize("value", [None, "3", True, -1, float("nan"), 1e9])
def test_an_unusable_points_value_counts_one(value):
    nb = weighted_lesson01()
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ex1_rms_check":
            cell.metadata["nbgrader"]["points"] = value
    assert reference(nb).exercises[0].weights == [1.0]


def graded_report():
    return Report("01_rmsnorm.ipynb", "bob", exercises=[
        Exercise(1, "a", ["check_rms"], "passed"),
        Exercise(2, "b", ["check_rmsnorm", "check_rms"], "failed", "check_rmsnorm: the mean was subtracted",
                 passed_checks=[1])])


def test_the_verdicts_are_written_where_nbgrader_reads_a_grade():
    nbgrader_utils = pytest.importorskip("nbgrader.utils")
    nb = weighted_lesson01()
    ref = reference(nb)
    report = finish(graded_report(), ref)
    setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    report.cells = [{"cell": setup, "error": "ValueError: bad", "output": "printed"}]
    annotate(nb, report, ref)
    nb = nbformat.from_dict(nb)
    checks = {c.metadata.nbgrader["grade_id"]: c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
    assert [o["output_type"] for o in checks["ex1_rms_check"].outputs] == ["stream"]
    assert [o["output_type"] for o in checks["ex2_rmsnorm_check"].outputs] == ["stream", "execute_result"]
    assert "the mean was subtracted" in checks["ex2_rmsnorm_check"].outputs[0]["text"]
    assert {k: nbgrader_utils.determine_grade(c) for k, c in checks.items()} == {
        "ex1_rms_check": (2.0, 2.0), "ex2_rmsnorm_check": (1.5, 3.0)}  # nbgrader's score = the course's
    assert [o["output_type"] for o in nb.cells[setup].outputs] == ["stream", "error"]
    report.exercises[0].status, report.exercises[0].detail = "failed", "check_rms: wrong"
    report.exercises[1].passed_checks = []
    annotate(nb, report, ref)
    nb = nbformat.from_dict(nb)
    checks = {c.metadata.nbgrader["grade_id"]: c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
    assert [(o["output_type"], o["ename"]) for o in checks["ex1_rms_check"].outputs] == [("error", "CheckFailed")]
    assert {k: nbgrader_utils.determine_grade(c)[0] for k, c in checks.items()} == {"ex1_rms_check": 0,
                                                                                    "ex2_rmsnorm_check": 0}


def test_a_report_is_bounded_whatever_the_notebook_did():
    rows = [{"cell": k, "error": "E: " + "\u202e" * 3000, "output": "\u2066" * 50_000} for k in range(3000)]
    report = finish(Report("n", "s", cells=rows, exercises=[Exercise(1, "a", ["check_rms"], "failed",
                                                                     "\u200b" * 100_000)]), None)
    assert len(report.cells) == MAX_CELL_ROWS and "2,980 more cells raised errors" in report.notes[0]
    assert all(len(c["output"]) <= 1_500 + 10 and len(c["error"]) <= 1_200 + 10 for c in report.cells)
    assert len(report.exercises[0].detail) <= 4_000 + 10 and "\u200b" not in report.exercises[0].detail
    assert bounded("\x1b" * 10, 8) == "\\x1b\\x1b [... cut]"  # escaped first, then cut


def test_names_are_compared_as_a_person_reads_them():
    pytest.importorskip("icu")
    assert names.shown("zed\x07") == "zed\\x07" != names.shown("zed\\x07") == "zed\\\\x07"  # never shown the same
    assert names.invisible("ada\ufe0f") == "invisible (default-ignorable) characters (U+FE0F)"
    assert "U+115F" in names.invisible("ada\u115f") and "U+200B" in names.invisible("a\u200bda")
    assert names.invisible(" ada") == names.invisible("ada ") == "space before or after it"
    assert names.invisible("Ada Lovelace") is None and names.invisible("Zoë") is None
    found = names.look_alikes(["honest01", "HONEST01", "honestOl", "ace", "\u0430\u0441\u0435", "ABE",
                               "\u0391\u0392\u0395", "ada", "bob"])
    assert found == {"honest01": ["HONEST01", "honestOl"], "HONEST01": ["honest01", "honestOl"],
                     "honestOl": ["HONEST01", "honest01"], "ace": ["\u0430\u0441\u0435"],
                     "\u0430\u0441\u0435": ["ace"], "ABE": ["\u0391\u0392\u0395"], "\u0391\u0392\u0395": ["ABE"]}
