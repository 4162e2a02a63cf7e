"""The lessons' matplotlib style, set in one place: each lesson's first code cell calls ``use_course_style()``.

Figures are drawn at 80 dpi (small notebooks, crisp enough on a laptop), and every size that matplotlib derives
from ``font.size`` by default (titles, axis labels, tick labels, legends) is at least ``MIN_FONT_PT`` points, about
10 pixels at that dpi. A lesson that sets a size itself keeps to the same floor (tests/classroom/test_style.py checks).
"""

MIN_FONT_PT = 9
COURSE_STYLE = {
    "figure.dpi": 80,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9.5,
    "legend.title_fontsize": 10,
    "figure.titlesize": 12,
}


def use_course_style() -> None:
    """Apply ``COURSE_STYLE`` to matplotlib (after ``%matplotlib inline``, which sets its own defaults)."""
    import matplotlib.style

    matplotlib.style.use(COURSE_STYLE)
