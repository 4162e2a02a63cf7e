""""Check your understanding" quizzes: interactive with ipywidgets, still readable without them.

A lesson's questions live in this package (``quizzes/<lesson>.json``), so its cell reads ``quiz("03_rope")`` and
shows no answer. Each question is a bundle with two views: a widget (one button per lettered option, feedback for
the chosen one, a "Show answer" fold; with ipywidgets 8 they run in the browser, so a saved notebook answers
before its kernel runs, with 7.7 a kernel callback does the same) and an HTML version for pages without widgets.
"""

import html
import json
from dataclasses import dataclass
from importlib import resources

from .widgets import widget_bundle

LETTERS = "abcdefgh"
GREEN, RED = "46, 125, 50", "198, 40, 40"  # rgb: readable on JupyterLab's light and dark themes at 12-15% alpha
# A quiz restored from a saved notebook works without a kernel: no "disconnected" mark on its parts
QUIZ_CSS = ("<style>.course-quiz.jupyter-widgets-disconnected::before, .course-quiz "
            ".jupyter-widgets-disconnected::before { content: none; }</style>")


@dataclass
class Question:
    prompt: str
    options: list[str]
    answer: int  # index into options
    explanation: str

    def __post_init__(self):
        if not isinstance(self.options, list) or not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"options must be a list of 2 to {len(LETTERS)} strings, got {self.options!r}")
        if not all(isinstance(o, str) and o.strip() for o in [self.prompt, self.explanation, *self.options]):
            raise ValueError("prompt, explanation and every option must be non-empty strings")
        if len(set(self.options)) != len(self.options):
            raise ValueError(f"options must differ from each other, got {self.options!r}")
        if not isinstance(self.answer, int) or not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer must index options (0..{len(self.options) - 1}), got {self.answer!r}")

    def feedback(self, choice: int) -> str:
        """The HTML a learner reads after choosing option ``choice``: right (green) or not (red)."""
        if choice == self.answer:
            return _note("right", GREEN, "✓", "Right.", self.explanation)
        return _note("wrong", RED, "✗", "Not quite.",
                     f"({LETTERS[choice]}) is not it. Think again, or open \"Show answer\".")

    def reveal(self) -> str:
        return (f"<div style='line-height:1.4'><b>({LETTERS[self.answer]}) {html.escape(self.options[self.answer])}"
                f"</b><br>{html.escape(self.explanation)}</div>")

    def body(self, number: int) -> str:
        """The prompt and the lettered options, as HTML (the widget's top and the fallback's)."""
        items = "".join(f"<li style='margin:2px 0'>{html.escape(o)}</li>" for o in self.options)
        return (f"<div style='line-height:1.4'><p style='margin:4px 0'><b>Question {number}.</b> "
                f"{html.escape(self.prompt)}</p><ol type='a' style='margin:4px 0; padding-left:2.2em'>{items}</ol>"
                "</div>")

    def to_html(self, number: int = 1) -> str:
        """The readable version, for where widgets do not render: the answer folded in <details>."""
        return (self.body(number) + "<details><summary>Show answer</summary>"
                f"<p>({LETTERS[self.answer]}) {html.escape(self.options[self.answer])}. "
                f"{html.escape(self.explanation)}</p></details>")


def _note(kind: str, rgb: str, mark: str, word: str, text: str) -> str:
    return (f"<div class='quiz-feedback quiz-{kind}' style='border-left:4px solid rgb({rgb}); "
            f"background:rgba({rgb}, 0.13); padding:4px 8px; line-height:1.4'>"
            f"<span style='color:rgb({rgb}); font-weight:bold'>{mark} {word}</span> {html.escape(text)}</div>")


def lessons() -> list[str]:
    """The lessons that have a quiz (their notebooks' names without .ipynb)."""
    return sorted(p.name.removesuffix(".json") for p in resources.files(__package__).joinpath("quizzes").iterdir()
                  if p.name.endswith(".json"))


def load_questions(lesson: str) -> list[Question]:
    """The questions of ``lesson`` (a notebook's name without .ipynb, e.g. "03_rope")."""
    if lesson not in lessons():
        raise ValueError(f"lesson must be one of {lessons()}, got {lesson!r}")
    text = resources.files(__package__).joinpath("quizzes").joinpath(f"{lesson}.json").read_text(encoding="utf-8")
    return [Question(**q) for q in json.loads(text)]


def _widget(q: Question, number: int = 1):
    import ipywidgets as widgets

    letters = list(LETTERS[:len(q.options)])
    choices = widgets.ToggleButtons(options=[(x, i) for i, x in enumerate(letters)], value=None,
                                    description="Your answer:", tooltips=q.options,
                                    style={"button_width": "3em", "description_width": "initial"},
                                    layout=widgets.Layout(display="flex", align_items="center"))
    panes = [widgets.HTML(q.feedback(i)) for i in range(len(letters))]
    reveal = widgets.Accordion(children=[widgets.HTML(q.reveal())], selected_index=None)
    reveal.set_title(0, "Show answer")
    if hasattr(widgets, "Stack"):  # ipywidgets 8: the browser shows the chosen pane, kernel or not
        feedback = widgets.Stack(panes, selected_index=None)
        feedback.link = widgets.jsdlink((choices, "index"), (feedback, "selected_index"))
    else:  # ipywidgets 7.7 (Colab): the kernel swaps the pane
        feedback = widgets.Box([])

        def show(change):
            feedback.children = [] if change["new"] is None else [panes[change["new"]]]

        choices.observe(show, names="index")
    box = widgets.VBox([widgets.HTML(QUIZ_CSS + q.body(number)), choices, feedback, reveal])
    box.add_class("course-quiz")
    return box


def quiz(questions) -> None:
    """Display a lesson's quiz: ``quiz("03_rope")`` (the package's questions), or a list of questions (dicts with
    prompt/options/answer/explanation, or ``Question``s).

    Returns None, so a cell ending in ``quiz(...)`` shows the quiz and nothing else."""
    from IPython.display import display

    if isinstance(questions, str):
        qs = load_questions(questions)
    else:
        qs = [q if isinstance(q, Question) else Question(**q) for q in questions]
    for n, q in enumerate(qs, 1):
        display(widget_bundle(_widget(q, n), q.to_html(n)), raw=True)
