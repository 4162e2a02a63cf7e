"""Legible at a laptop's width: the course's matplotlib style (modern_block/classroom/style.py) and the lessons.

* ``use_course_style()`` sets every font size matplotlib derives (titles, labels, ticks, legends) to at least
  ``MIN_FONT_PT``, and a figure drawn under it has no smaller text;
* every lesson applies it in its imports and sets no font size below the floor itself;
* a lesson's code lines fit the editor with the file browser open (100 characters at 1280 px), and so do the lines
  it prints (the output area).

The setup cell (cell 1) is written by scripts/stamp_notebooks.py and is held to its own template.
"""

import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

from modern_block.classroom.style import COURSE_STYLE, MIN_FONT_PT, use_course_style

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDTH = 100
SETUP_CELL = 1
SMALL = re.compile(r"\b(?:fontsize|labelsize|title_fontsize)\s*=\s*"
                   r"(?:(\d+(?:\.\d+)?)|[\"']((?:xx?-)?small|smaller)[\"'])")
COURSE_WIDGETS = re.compile(r"\b(?:quiz|\w*explorer|\w*calculator|\w*reader)\(")  # the cells this issue keeps


def _lessons(rule: str):
    """Every lesson, one test each (``rule`` names the rule in the test's purpose)."""
    return [pytest.param(p, id=p.stem) for p in LESSONS]


def _code(path: Path):
    return [(i, c) for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == "code"]


def _quiz_or_widget(cell) -> bool:
    """A cell that shows one of the course's widgets (a quiz, an explorer, a calculator, the config reader)."""
    return bool(COURSE_WIDGETS.search(cell.source)) and any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.get("outputs", []))


def _printed_lines(cell) -> list[str]:
    lines = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            lines += out.text.splitlines()
        elif out.output_type in ("execute_result", "display_data") and set(out.data) <= {"text/plain"}:
            lines += out.data["text/plain"].splitlines()
    return lines


def test_the_course_style_keeps_every_derived_font_at_the_floor():
    from matplotlib.font_manager import FontProperties

    use_course_style()
    sizes = {k: FontProperties(size=matplotlib.rcParams[k]).get_size_in_points()
             for k in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize",
                       "legend.fontsize", "legend.title_fontsize", "figure.titlesize")}
    assert min(sizes.values()) >= MIN_FONT_PT, sizes
    assert matplotlib.rcParams["figure.dpi"] == COURSE_STYLE["figure.dpi"] == 80


def test_a_figure_drawn_in_the_course_style_has_no_small_text():
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    use_course_style()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set(title="title", xlabel="x", ylabel="y")
    ax.legend(title="legend")
    ax.text(0.5, 0.5, "a note")
    fig.suptitle("figure")
    fig.canvas.draw()
    texts = [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert len(texts) > 8 and min(t.get_fontsize() for t in texts) >= MIN_FONT_PT
    plt.close(fig)


@pytest.mark.parametrize("lesson", _lessons("style"))
def test_every_lesson_uses_the_course_style(lesson):
    sources = [c.source for _, c in _code(lesson)]
    assert any(re.search(r"^use_course_style\(\)$", s, re.M) for s in sources[:3]), lesson.name
    assert not any("rcParams" in s for s in sources), f"{lesson.name} sets rcParams itself"


@pytest.mark.parametrize("lesson", _lessons("fonts"))
def test_no_lesson_sets_a_font_below_the_floor(lesson):
    small = [(i, m.group(0)) for i, c in _code(lesson) for m in SMALL.finditer(c.source)
             if m.group(2) or float(m.group(1)) < MIN_FONT_PT]
    assert not small, f"{lesson.name}: font sizes below {MIN_FONT_PT} pt in cells {small}"


@pytest.mark.parametrize("lesson", _lessons("code width"))
def test_code_lines_fit_the_editor_with_the_file_browser_open(lesson):
    long = [(i, len(line)) for i, c in _code(lesson) if i != SETUP_CELL for line in c.source.splitlines()
            if len(line) > WIDTH]
    assert not long, f"{lesson.name}: (cell, characters) of lines over {WIDTH}: {long}"


@pytest.mark.parametrize("lesson", _lessons("printed width"))
def test_printed_lines_fit_the_output_area(lesson):
    long = [(i, len(line)) for i, c in _code(lesson) for line in _printed_lines(c) if len(line) > WIDTH]
    assert not long, f"{lesson.name}: (cell, characters) of printed lines over {WIDTH}: {long}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_quiz_and_widget_cells_fit_and_use_no_small_fonts(lesson):
    cells = [(i, c) for i, c in _code(lesson) if _quiz_or_widget(c)]
    assert cells, lesson.name
    for i, c in cells:
        assert all(len(line) <= WIDTH for line in c.source.splitlines()), (lesson.name, i)
        assert all(len(line) <= WIDTH for line in _printed_lines(c)), (lesson.name, i)
        assert not SMALL.search(c.source), (lesson.name, i)
