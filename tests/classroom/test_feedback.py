"""Feedback files: one Markdown file per student and notebook, readable, with nothing a student wrote
rendering as markup, under names that are safe on any system and never collide."""

import os

import pytest

from modern_block.classroom.grading import feedback
from modern_block.classroom.grading.class_folder import OutputError
from modern_block.classroom.grading.grade_report import Exercise, Report

TRACEBACK = """before
---------------------------------------------------------------------------
ValueError                                Traceback (most recent call last)
Cell In[1], line 3
      1 x = 1
----> 3 f(x)

File /usr/lib/python3/site-packages/torch/nn/modules/module.py:1778, in Module._wrapped_call_impl(self)
-> 1778     return self._call_impl(*args, **kwargs)

Cell In[1], line 2, in f(x)
----> 2     raise ValueError("bad")

ValueError: bad
"""


def a_report(student="ben"):
    return Report("class/ben/01_rmsnorm.ipynb", student, "01_rmsnorm.ipynb", [
        Exercise(1, "the root mean square", ["check_rms"], "passed", id="ex1_rms", points=1, max_points=1),
        Exercise(2, "an RMSNorm layer", ["check_rmsnorm"], "failed", "check_rmsnorm: the mean was subtracted\n"
                 "```\n<script>alert(1)</script>", id="ex2_rmsnorm", points=0, max_points=1)],
        notes=["a *note*"], cells=[{"cell": 6, "error": "ValueError: bad", "output": TRACEBACK}],
        lesson="01_rmsnorm", labels={6: "code cell 4 (Exercise 2)"})


def test_the_file_says_status_points_and_the_diagnosis():
    text = feedback.render(a_report(), "2026-12-03T10:00:00Z")
    assert "# Feedback: 01_rmsnorm" in text and "Score: **1 / 2 points (50%)**" in text
    assert "| 1. the root mean square | ✓ passed | 1 / 1 |" in text
    assert "| 2. an RMSNorm layer | ✗ failed | 0 / 1 |" in text
    assert "## Exercise 2: an RMSNorm layer (failed)" in text and "the mean was subtracted" in text
    assert "## code cell 4 (Exercise 2) raised an error" in text
    assert "Module._wrapped_call_impl" not in text and "1 frame in libraries" in text  # the student's frames only
    assert "> a \\*note\\*" in text


def test_a_diagnosis_cannot_close_its_fence_or_inject_html():
    text = feedback.render(a_report())
    lines = text.splitlines()
    start = lines.index("````text")  # longer than the ``` inside the diagnosis
    assert lines[start + 2] == "```" and lines[start + 4] == "````"
    assert "<script>" not in text.replace("<script>alert(1)</script>", "", 1)  # only inside the fenced block
    assert feedback.md("<b>x</b> | *y* a_b _c") == "\\<b\\>x\\</b\\> \\| \\*y\\* a_b \\_c"


@pytest.mark.parametrize("name, expected_start", [
    ("ada", "ada"), ("Hank Lee", "Hank Lee"), ("../../etc", "_.._etc-"), ("a/b", "a_b-"), (".hidden", "hidden-"),
    ("CON", "CON-"), ("", "_-"), ("x" * 300, "x" * 80 + "-"), ("bad\udcffname", "bad_name-")])
def test_names_are_safe_and_distinct(name, expected_start):
    safe = feedback.safe_name(name)
    assert safe.startswith(expected_start) and "/" not in safe and not safe.startswith(".") and len(safe) <= 89
    assert feedback.safe_name("a/b") != feedback.safe_name("a_b")


def test_write_all_writes_one_file_per_student_and_notebook(tmp_path):
    reports = [a_report("ben"), a_report("../escape"), a_report("=eve")]
    written = feedback.write_all(str(tmp_path), reports)
    assert len(written) == 3 and all(p.startswith(str(tmp_path) + os.sep) for p in written)
    assert (tmp_path / "ben" / "01_rmsnorm.md").read_text().startswith("# Feedback: 01_rmsnorm")
    assert not (tmp_path.parent / "escape").exists()
    assert oct((tmp_path / "ben" / "01_rmsnorm.md").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_link_planted_as_a_students_folder_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ben").symlink_to(target)
    with pytest.raises(OutputError, match="not a folder of its own"):
        feedback.write_all(str(tmp_path / "out"), [a_report("ben"), a_report("cy")])
    assert list(target.iterdir()) == [] and (tmp_path / "out" / "cy" / "01_rmsnorm.md").is_file()


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
