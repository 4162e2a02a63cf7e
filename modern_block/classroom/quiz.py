""""Check your understanding" quizzes: interactive with ipywidgets, still readable without them.

``quiz(questions)`` displays one bundle per question holding both a widget view (radio buttons, a
"Check" button and a "Show answer" button) and an HTML version with the answer folded in a
<details> element. JupyterLab and Colab render the widget; GitHub, nbviewer and a kernel-less
export render the HTML. Works with ipywidgets 7.7 (Colab) and 8.x.
"""

import html
from dataclasses import dataclass


@dataclass
class Question:
    prompt: str
    options: list[str]
    answer: int  # index into options
    explanation: str

    def __post_init__(self):
        if not 0 <= self.answer < len(self.options):
            raise ValueError(f"answer must index options (0..{len(self.options) - 1}), got {self.answer}")

    def feedback(self, choice: int | None) -> str:
        """What the learner is told after choosing ``choice``."""
        if choice is None:
            return "Pick an option first."
        if choice == self.answer:
            return f"Right. {self.explanation}"
        return f"Not quite: '{self.options[choice]}' is not it. Think again, or show the answer."

    def to_html(self) -> str:
        items = "".join(f"<li>{html.escape(o)}</li>" for o in self.options)
        return (f"<p><b>{html.escape(self.prompt)}</b></p><ol type='a'>{items}</ol>"
                f"<details><summary>Show answer</summary><p>{html.escape(self.options[self.answer])}. "
                f"{html.escape(self.explanation)}</p></details>")


def _widget(q: Question):
    import ipywidgets as widgets

    choices = widgets.RadioButtons(options=[(o, i) for i, o in enumerate(q.options)], value=None,
                                   layout=widgets.Layout(width="auto"))
    check, reveal = widgets.Button(description="Check"), widgets.Button(description="Show answer")
    out = widgets.HTML()

    def on_check(_):
        out.value = html.escape(q.feedback(choices.value))

    def on_reveal(_):
        out.value = f"<b>Answer:</b> {html.escape(q.options[q.answer])}. {html.escape(q.explanation)}"

    check.on_click(on_check)
    reveal.on_click(on_reveal)
    return widgets.VBox([widgets.HTML(f"<b>{html.escape(q.prompt)}</b>"), choices,
                         widgets.HBox([check, reveal]), out])


def widget_bundle(widget, fallback_html: str) -> dict:
    """A display bundle with a widget view and an HTML fallback (ipywidgets 7.7 and 8.x)."""
    return {
        "application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                      "model_id": widget.model_id},
        "text/html": fallback_html,
        "text/plain": "(interactive widget; the HTML version is shown where widgets do not render)",
    }


def quiz(questions) -> None:
    """Display each question (dicts with prompt/options/answer/explanation, or ``Question``s).

    Returns None, so a cell ending in ``quiz([...])`` shows the quiz and nothing else."""
    from IPython.display import display

    qs = [q if isinstance(q, Question) else Question(**q) for q in questions]
    for n, q in enumerate(qs, 1):
        display(widget_bundle(_widget(q), f"<p>Question {n}</p>" + q.to_html()), raw=True)
