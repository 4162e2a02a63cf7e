"""The "Check your understanding" quizzes (modern_block/classroom/quiz.py): the feedback a learner reads, the HTML
fallback (escaped, with the answer folded away), and one display bundle per question carrying both views.
The widgets themselves are driven in a kernel of each ipywidgets version by test_ipywidgets77.py."""

import pytest

from modern_block.classroom import quiz as quiz_module
from modern_block.classroom.quiz import Question, quiz, widget_bundle

Q = {"prompt": "Which norm has no mean subtraction?", "options": ["LayerNorm", "RMSNorm <b>"], "answer": 1,
     "explanation": "RMSNorm divides by the root mean square & keeps the mean."}


def test_an_answer_must_index_the_options():
    for bad in (2, -1):
        with pytest.raises(ValueError, match=r"answer must index options \(0..1\), got " + str(bad)):
            Question(**{**Q, "answer": bad})


def test_feedback_for_no_choice_the_right_one_and_a_wrong_one():
    q = Question(**Q)
    assert q.feedback(None) == "Pick an option first."
    assert q.feedback(1) == "Right. " + Q["explanation"]
    assert q.feedback(0) == "Not quite: 'LayerNorm' is not it. Think again, or show the answer."


def test_the_html_fallback_escapes_and_folds_the_answer():
    page = Question(**Q).to_html()
    assert "<li>LayerNorm</li><li>RMSNorm &lt;b&gt;</li>" in page
    question, answer = page.split("<details>")
    assert "RMSNorm divides" not in question and "root mean square &amp; keeps" in answer
    assert answer.startswith("<summary>Show answer</summary><p>RMSNorm &lt;b&gt;. ")


def test_one_bundle_per_question_with_both_views(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda bundle, raw: shown.append((bundle, raw)))
    assert quiz([Q, Question(**{**Q, "prompt": "Second?"})]) is None
    assert len(shown) == 2 and all(raw for _, raw in shown)
    first, second = (bundle for bundle, _ in shown)
    assert first["text/html"].startswith("<p>Question 1</p><p><b>Which norm")
    assert second["text/html"].startswith("<p>Question 2</p><p><b>Second?")
    view = first["application/vnd.jupyter.widget-view+json"]
    assert view["version_major"] == 2 and view["model_id"] != second["application/vnd.jupyter.widget-view+json"][
        "model_id"]


def test_the_widget_checks_and_reveals():
    box = quiz_module._widget(Question(**Q))
    _, choices, buttons, out = box.children
    check, reveal = buttons.children
    check.click()
    assert out.value == "Pick an option first."
    choices.value = 0
    check.click()
    assert out.value.startswith("Not quite: &#x27;LayerNorm&#x27;")
    reveal.click()
    assert out.value == ("<b>Answer:</b> RMSNorm &lt;b&gt;. "
                         "RMSNorm divides by the root mean square &amp; keeps the mean.")
    assert widget_bundle(box, "x")["text/html"] == "x"
