"""The gradebook across runs: a regrade replaces only its (student, lesson) rows and says what changed; a
file that is not a gradebook is refused; the one-row-per-student export adds up; two notebooks of one lesson
keep the higher score."""

import csv
import io

import pytest

from modern_block.classroom.grading import gradebook as book
from modern_block.classroom.grading.report import COLUMNS, Exercise, Report, gradebook, gradebook_rows


def report(student, lesson, results, error=None, notebook=None):
    """A report whose exercises have 1 point each (passed: earned)."""
    exercises = [Exercise(n, f"title {n}", [f"check_{n}"], status, id=f"ex{n}_{lesson}",
                          points=float(status == "passed"), max_points=1.0)
                 for n, status in enumerate(results, start=1)]
    return Report(notebook or f"class/{student}/{lesson}.ipynb", student, f"{lesson}.ipynb", exercises, error,
                  lesson=lesson)


def table(text):
    return list(csv.reader(io.StringIO(text)))


CLASS = [report("ada", "01_rmsnorm", ["passed", "passed"]), report("ben", "01_rmsnorm", ["failed", "not attempted"]),
         report("ada", "03_rope", ["passed", "failed", "passed"]), report("=eve", "01_rmsnorm", ["passed", "failed"])]


def test_the_long_gradebook_has_one_row_per_student_and_exercise():
    rows = table(gradebook(CLASS, "2026-12-03T10:00:00Z"))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 1 + 2 + 2 + 3 + 2
    ada = [r for r in rows[1:] if r[0] == "ada" and r[4] == "03_rope"]
    assert [(r[5], r[8], r[9], r[10]) for r in ada] == [("ex1_03_rope", "passed", "1", "1"),
                                                        ("ex2_03_rope", "failed", "0", "1"),
                                                        ("ex3_03_rope", "passed", "1", "1")]
    assert {r[0] for r in rows[1:]} == {"ada", "ben", "'=eve"}  # a formula never starts a cell


def test_a_regrade_of_one_student_replaces_only_their_rows_and_says_what_changed():
    old = book.parse(gradebook(CLASS))
    regrade = gradebook_rows([report("ben", "01_rmsnorm", ["passed", "failed"])])
    merged = book.merge(old, regrade)
    assert len(merged.rows) == len(old)  # no row lost
    untouched = [r for r in old if r[0] != "ben"]
    assert [r for r in merged.rows if r[0] != "ben"] == sorted(untouched, key=book.key)
    assert [r[8] for r in merged.rows if r[0] == "ben"] == ["passed", "failed"]
    assert merged.kept == 3 and merged.new == [] and merged.replaced == [
        ("ben", "01_rmsnorm", ["ex1_01_rmsnorm: failed 0/1 -> passed 1/1",
                               "ex2_01_rmsnorm: not attempted 0/1 -> failed 0/1"])]
    assert "regraded ben 01_rmsnorm: ex1_01_rmsnorm: failed 0/1 -> passed 1/1" in "\n".join(merged.summary())
    again = book.merge(merged.rows, regrade)
    assert again.rows == merged.rows and again.replaced == [("ben", "01_rmsnorm", [])]
    added = book.merge(old, gradebook_rows([report("cy", "01_rmsnorm", ["passed", "passed"])]))
    assert added.new == [("cy", "01_rmsnorm")] and len(added.rows) == len(old) + 2


def test_a_regrade_that_errors_replaces_the_rows_with_error_rows():
    old = book.parse(gradebook(CLASS))
    broken = report("ada", "01_rmsnorm", [], error="not a notebook: not valid JSON")
    merged = book.merge(old, gradebook_rows([broken]))
    ada = [r for r in merged.rows if r[0] == "ada" and r[4] == "01_rmsnorm"]
    assert [(r[5], r[8], r[9]) for r in ada] == [("", "error", "0")]
    assert "error: not a notebook" in ada[0][11]
    assert merged.replaced[0][2][-1].startswith("ex2_01_rmsnorm: no longer graded")


@pytest.mark.parametrize("text", ["", "an old gradebook",
                                  "student,notebook,reference,status,passed\nada,x,y,graded,2\n",
                                  ",".join(COLUMNS) + "\nada,too,few\n"])
def test_a_file_that_is_not_a_gradebook_is_refused(text):
    with pytest.raises(book.GradebookError, match="--overwrite-gradebook"):
        book.parse(text)


def test_the_wide_export_adds_up():
    text = book.wide(book.parse(gradebook(CLASS)))
    rows = table(text)
    assert rows[0] == ["student", "01_rmsnorm", "03_rope", "total", "max", "percent"]
    by = {r[0]: r[1:] for r in rows[1:]}
    assert by["ada"] == ["2", "2", "4", "5", "80"]
    assert by["ben"] == ["0", "", "0", "5", "0"]  # no lesson 03 handed in: empty, counted as 0 of its 3
    assert by["'=eve"] == ["1", "", "1", "5", "20"]
    for r in rows[1:]:
        assert sum(float(x or 0) for x in r[1:3]) == float(r[3])


def test_two_notebooks_of_one_lesson_keep_the_higher_score():
    first = report("hank", "03_rope", ["failed", "failed", "passed"], notebook="class/hank/03_rope.ipynb")
    renamed = report("hank", "03_rope", ["passed", "passed", "passed"], notebook="class/hank/Copy of 03_rope (1).ipynb")
    chosen, notes = book.pick([first, renamed, CLASS[0]])
    assert chosen == [renamed, CLASS[0]]
    assert "hank handed in two notebooks of 03_rope" in notes[0] and "Copy of 03_rope (1).ipynb (3/3)" in notes[0]


def test_a_notebook_stopped_at_its_time_limit_keeps_what_was_graded():
    stopped = report("dee", "01_rmsnorm", ["passed", "not graded"], error="the notebook ran past its time limit")
    rows = gradebook_rows([stopped])
    assert [(r[5], r[3], r[8], r[9], r[11]) for r in rows] == [
        ("ex1_01_rmsnorm", "error", "passed", "1", ""),
        ("ex2_01_rmsnorm", "error", "error", "0", "error: the notebook ran past its time limit")]
