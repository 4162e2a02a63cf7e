"""How a check runs (``checks.mode.Mode``): one explicit object; without it a Jupyter kernel is a notebook and
anything else a script; the grader's ``graded`` and ``answer_sources`` blocks set the same object."""

import pytest

from modern_block.classroom.checks import Mode, answer_sources, graded
from modern_block.classroom.checks.mode import using


def test_the_three_modes_and_what_each_does():
    notebook, script, grader = Mode.notebook(["x = 1"], {"x": 1}), Mode.script(), Mode.graded(42, ["x = 1"])
    assert (notebook.prints, notebook.hides, notebook.is_graded) == (True, True, False)
    assert (script.prints, script.hides, script.is_graded) == (False, False, False)
    assert (grader.prints, grader.hides, grader.is_graded) == (False, False, True)
    assert notebook.sources == ("x = 1",) and grader.sources == ("x = 1",) and script.sources is None
    assert script.seeded(5) == 5 and grader.seeded(5) != 5 and grader.seeded(5) == Mode.graded(42).seeded(5)


def test_a_mode_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="kind must be"):
        Mode("lecture")
    with pytest.raises(ValueError, match="secret"):
        Mode("graded")
    with pytest.raises(ValueError, match="secret"):
        Mode("script", secret=3)


def test_without_a_mode_a_plain_process_is_a_script_and_the_blocks_set_it():
    assert Mode.current() == Mode.script()
    with graded(7), answer_sources(["a = 1"]):
        assert Mode.current() == Mode.graded(7, ["a = 1"])
    with answer_sources(["b = 2"]), graded(8):  # either order
        assert Mode.current() == Mode.graded(8, ["b = 2"])
    with using(Mode.notebook()):
        assert Mode.current().kind == "notebook"
    assert Mode.current() == Mode.script()
