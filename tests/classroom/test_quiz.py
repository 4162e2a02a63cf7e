"""The "Check your understanding" quizzes (modern_block/classroom/quiz.py and its quizzes/*.json).

* every quiz is fair: the answer's letter is spread over the options in each lesson and over the course, the answer
  cannot be picked out by its length, and options stay short enough to scan;
* every lesson's quiz cell is ``quiz("<its name>")``: the answers and explanations are not in the notebook's code;
* the feedback (right in green with a check mark, wrong in red with a cross), the fold that reveals the answer, the
  HTML fallback (escaped, answer in <details>) and one display bundle per question carrying both views;
* on ipywidgets 8 the feedback is wired in the browser (choosing a letter shows that letter's pane, so a quiz
  restored from a saved notebook answers without a kernel); tests/course/browser clicks it, test_ipywidgets77.py drives
  the 7.7 version.

``python -m pytest tests/classroom/test_quiz.py -s -k statistics`` prints the course's quiz statistics.
"""

import collections
import json
from pathlib import Path

import nbformat
import pytest

from modern_block.classroom import quiz as quiz_module
from modern_block.classroom.quiz import LETTERS, Question, lessons, load_questions, quiz

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
Q = {"prompt": "Which norm has no mean subtraction?", "options": ["LayerNorm", "RMSNorm <b>"], "answer": 1,
     "explanation": "RMSNorm divides by the root mean square & keeps the mean."}
ALL = [(lesson, q) for lesson in lessons() for q in load_questions(lesson)]


# ---- the rules every quiz is held to -------------------------------------------------------------------------------


def statistics(questions) -> dict:
    """Where the answers sit and whether their length gives them away, over a list of questions."""
    positions = collections.Counter(LETTERS[q.answer] for q in questions)
    longest = shortest = 0
    for q in questions:
        answer, wrong = len(q.options[q.answer]), [len(o) for i, o in enumerate(q.options) if i != q.answer]
        longest += answer > max(wrong)
        shortest += answer < min(wrong)
    return {"questions": len(questions), "positions": dict(sorted(positions.items())),
            "answer is the longest option": longest, "answer is the shortest option": shortest}


def test_statistics_of_the_course(capsys):
    s = statistics([q for _, q in ALL])
    with capsys.disabled():
        print(f"\nquiz statistics over {len(lessons())} lessons: {s}")
    assert s["questions"] == len(ALL) >= 4 * len(NOTEBOOKS)


def test_every_lesson_has_a_quiz_and_every_quiz_a_lesson():
    assert lessons() == [p.stem for p in NOTEBOOKS]
    assert all(4 <= len(load_questions(lesson)) <= 8 for lesson in lessons())


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_quiz_cell_shows_no_answer(notebook):
    """The cell a learner sees reads quiz("03_rope"): the questions, answers and explanations live in the package."""
    cells = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code" and "quiz(" in c.source]
    assert [c.source.strip() for c in cells] == [f'quiz("{notebook.stem}")']
    for q in load_questions(notebook.stem):
        assert q.explanation not in json.dumps([c.source for c in cells], ensure_ascii=False)


def test_answer_positions_are_spread_in_each_lesson():
    for lesson in lessons():
        answers = collections.Counter(q.answer for q in load_questions(lesson))
        letter, most = answers.most_common(1)[0]
        n = sum(answers.values())
        assert most <= (n + 1) // 2, f"{lesson}: {most} of {n} answers are ({LETTERS[letter]})"
        assert len(answers) >= min(n, 3), f"{lesson}: answers only at {sorted(LETTERS[a] for a in answers)}"


def test_answer_positions_are_spread_over_the_course():
    four = [q for _, q in ALL if len(q.options) == 4]
    share = {LETTERS[i]: sum(q.answer == i for q in four) / len(four) for i in range(4)}
    assert all(0.15 <= s <= 0.35 for s in share.values()), share


def test_the_answer_cannot_be_told_by_its_length():
    """Per question: the answer is at most 10% (+3 characters) longer than the longest wrong option, and the options
    are of comparable length. Over the course: the answer is the longest option, or the shortest, about as often as
    chance would have it (a quarter with four options), never in more than a third of the questions."""
    for lesson, q in ALL:
        lengths = [len(o) for o in q.options]
        wrong = max(n for i, n in enumerate(lengths) if i != q.answer)
        assert lengths[q.answer] <= 1.1 * wrong + 3, (lesson, q.prompt, lengths)
        assert max(lengths) - min(lengths) <= max(20, max(lengths) / 2), (lesson, q.prompt, lengths)
        assert max(lengths) <= 80, (lesson, q.prompt, "options this long are read, not scanned")
    s = statistics([q for _, q in ALL])
    assert s["answer is the longest option"] <= len(ALL) / 3 and s["answer is the shortest option"] <= len(ALL) / 3, s


def test_every_question_is_well_formed():
    for lesson, q in ALL:
        assert q.prompt.strip().endswith("?"), (lesson, q.prompt)
        assert len(set(o.casefold() for o in q.options)) == len(q.options), (lesson, q.options)
        assert q.explanation.strip() and q.explanation != q.options[q.answer], (lesson, q.prompt)


def test_the_rules_catch_an_unfair_quiz():
    """The same rules on the quizzes as the course had them before: every answer of a lesson at (b), and the
    longest option the answer."""
    unfair = [Question(prompt=f"Q{i}?", options=["short", "the long and very telling right answer here", "tiny",
                                                 "small"], answer=1, explanation="x") for i in range(4)]
    s = statistics(unfair)
    assert s["positions"] == {"b": 4} and s["answer is the longest option"] == 4


# ---- the question itself ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [
    (dict(answer=2), r"answer must index options \(0..1\), got 2"),
    (dict(answer=-1), r"answer must index options \(0..1\), got -1"),
    (dict(options=["only one"], answer=0), "options must be a list of 2 to 8 strings"),
    (dict(options=["same", "same"]), "options must differ"),
    (dict(explanation=" "), "non-empty strings"),
])
def test_a_question_is_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        Question(**{**Q, **bad})


def test_an_unknown_lesson_is_named():
    with pytest.raises(ValueError, match=r"lesson must be one of \['00_gpt2_block'.*got '03'"):
        load_questions("03")


def test_feedback_tells_right_from_wrong_at_a_glance():
    q = Question(**Q)
    right, wrong = q.feedback(1), q.feedback(0)
    assert "quiz-right" in right and "✓ Right." in right and "rgb(46, 125, 50)" in right
    assert "root mean square &amp; keeps" in right  # the explanation, escaped
    assert "quiz-wrong" in wrong and "✗ Not quite." in wrong and "rgb(198, 40, 40)" in wrong
    assert "(a) is not it" in wrong and "root mean square" not in wrong


def test_the_html_fallback_escapes_and_folds_the_answer():
    page = Question(**Q).to_html(3)
    assert "<b>Question 3.</b> Which norm" in page
    assert "LayerNorm</li><li style='margin:2px 0'>RMSNorm &lt;b&gt;</li>" in page
    question, answer = page.split("<details>")
    assert "RMSNorm divides" not in question and "root mean square &amp; keeps" in answer
    assert answer.startswith("<summary>Show answer</summary><p>(b) RMSNorm &lt;b&gt;. ")


def test_one_bundle_per_question_with_both_views(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda bundle, raw: shown.append((bundle, raw)))
    assert quiz([Q, Question(**{**Q, "prompt": "Second?"})]) is None
    assert len(shown) == 2 and all(raw for _, raw in shown)
    first, second = (bundle for bundle, _ in shown)
    assert "<b>Question 1.</b> Which norm" in first["text/html"]
    assert "<b>Question 2.</b> Second?" in second["text/html"]
    view = first["application/vnd.jupyter.widget-view+json"]
    assert view["version_major"] == 2 and view["model_id"] != second["application/vnd.jupyter.widget-view+json"][
        "model_id"]
    shown.clear()
    quiz("03_rope")
    assert len(shown) == len(load_questions("03_rope"))


def test_the_widget_shows_the_chosen_letters_feedback_in_the_browser():
    """ipywidgets 8: the letters' index drives a Stack of one feedback pane per letter through a jsdlink (no kernel
    callback), so a choice replaces the last feedback; the answer sits in a closed "Show answer" fold."""
    import ipywidgets

    box = quiz_module._widget(Question(**Q), 2)
    body, choices, feedback, reveal = box.children
    assert "<b>Question 2.</b>" in body.value and "<ol type='a'" in body.value
    assert [label for label, _ in choices.options] == ["a", "b"] and choices.value is None
    assert list(choices.tooltips) == Q["options"]
    assert isinstance(feedback, ipywidgets.Stack) and feedback.selected_index is None
    assert feedback.link.source == (choices, "index") and feedback.link.target == (feedback, "selected_index")
    assert isinstance(feedback.link, ipywidgets.widgets.widget_link.DirectionalLink)
    assert [pane.value for pane in feedback.children] == [Question(**Q).feedback(0), Question(**Q).feedback(1)]
    assert reveal.selected_index is None and reveal.get_title(0) == "Show answer"
    assert "(b) RMSNorm &lt;b&gt;" in reveal.children[0].value and "root mean square" in reveal.children[0].value
