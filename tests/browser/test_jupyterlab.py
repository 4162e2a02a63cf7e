"""The interactive parts of the course, used the way a learner uses them: in JupyterLab, in a real browser.

Each test opens a lesson from a throwaway copy of notebooks/ in JupyterLab (headless Chromium, driven by
Playwright), runs the lesson's widget cells and the cells they need (clicking each cell and pressing Ctrl+Enter),
then works the widget with the keyboard and the mouse and checks what is on the screen:

* lesson 03, the RoPE explorer: moving the "position", "pair" and "base" sliders redraws the figure; moving a
  slider back restores the very same picture, so the picture follows the sliders' state;
* lesson 04, the KV-cache calculator: picking a model preset (and a context length and batch size) shows the GiB
  and bytes per token that ``modern_block.presets.cache_size`` gives for that choice;
* lesson 04's quiz: a wrong pick gets "Not quite", "Show answer" reveals the answer, picking it gets "Right.".

Every test fails on JavaScript errors (uncaught exceptions or console errors, which is where the widget manager
reports widgets it cannot render). Screenshots land in artifacts/browser/.
"""

import lab_harness as lab_h
import pytest

from modern_block.presets import BYTES_PER_ELEM, PRESETS, GiB, cache_size

pytestmark = pytest.mark.browser


def _wait(page, predicate, what: str, timeout_s: float = 60):
    return lab_h.wait_until(predicate, timeout_s, what, page=page)


def _no_js_errors(lesson):
    assert not lesson.js_errors, "JavaScript errors in JupyterLab:\n" + "\n".join(lesson.js_errors)


def test_every_widget_cell_renders_a_widget(rope_lesson, kv_cache_lesson):
    for lesson in (rope_lesson, kv_cache_lesson):
        assert lesson.lesson_cells and lesson.quiz_cells, lesson.notebook.name
        for c in lesson.lesson_cells + lesson.quiz_cells:
            lab_h.widget_view(c)
        print(f"{lesson.notebook.name}: opened and ran its widget cells in {lesson.seconds_to_run:.0f} s")
        _no_js_errors(lesson)


def test_rope_explorer_redraws_when_the_sliders_move(rope_lesson, artifacts):
    page = rope_lesson.page
    explorer = next(c for c in rope_lesson.lesson_cells if c.locator(".widget-slider").count())
    view = lab_h.widget_view(explorer)
    position, pair, base = (lab_h.control(view, "slider", d) for d in ("position", "pair", "base"))
    figure = view.locator(".widget-output")
    start = _wait(page, lambda: lab_h.image_src(figure), what="the explorer's first figure")
    assert start.startswith("data:image/png;base64,")
    explorer.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "03_rope_explorer_start.png"))

    def move(slider, key, times=1):
        """Press ``key`` on the slider; wait for the readout to change and a new figure to replace the shown one."""
        shown, value = lab_h.image_src(figure), lab_h.slider_value(slider)
        lab_h.press_on_slider(slider, key, times)
        _wait(page, lambda: lab_h.slider_value(slider) != value, what="the slider readout to change")
        return _wait(page, lambda: (src := lab_h.image_src(figure)) and src != shown and src,
                                what="the figure to redraw")

    p0 = lab_h.slider_value(position)
    one_step = move(position, "ArrowRight")
    assert lab_h.slider_value(position) == p0 + 1
    page.screenshot(path=str(artifacts / "03_rope_explorer_position_moved.png"))
    back = move(position, "ArrowLeft")
    assert lab_h.slider_value(position) == p0
    assert back == start, "the same slider state should draw the same figure"

    pair_moved = move(pair, "ArrowRight")
    assert lab_h.slider_value(pair) == 1 and pair_moved not in (start, one_step)
    base_moved = move(base, "End")
    assert lab_h.slider_value(base) == 1_000_000 and base_moved != pair_moved
    page.screenshot(path=str(artifacts / "03_rope_explorer_pair_base_moved.png"))
    _no_js_errors(rope_lesson)


def _report(view) -> dict:
    """What the calculator shows: the preset, the bytes per token and the total, as the learner reads them."""
    return {"preset": view.locator(".kv-cache-report b").first.inner_text(),
            "bytes_per_token": view.locator(".kv-bytes-per-token").inner_text(),
            "total_gib": view.locator(".kv-total-gib").inner_text()}


def _expected(preset: str, context_len: int, batch: int, dtype: str) -> dict:
    return {"preset": preset,
            "bytes_per_token": f"{PRESETS[preset].bytes_per_token(BYTES_PER_ELEM[dtype]):,} B",
            "total_gib": f"{cache_size(preset, context_len, batch, dtype) / GiB:,.2f} GiB"}


def test_cache_calculator_shows_the_gib_of_the_chosen_preset(kv_cache_lesson, artifacts):
    page = kv_cache_lesson.page
    calculator = next(c for c in kv_cache_lesson.lesson_cells if c.locator(".kv-cache-report").count())
    view = lab_h.widget_view(calculator)
    preset, context, dtype = (lab_h.control(view, "dropdown", d).locator("select") for d in
                              ("preset", "context", "dtype"))
    batch = lab_h.control(view, "slider", "batch")

    def state():  # the calculator's inputs as displayed
        ctx = int(context.evaluate("s => s.options[s.selectedIndex].text").replace(",", ""))
        return preset.input_value(), ctx, int(lab_h.slider_value(batch)), dtype.input_value()

    assert _report(view) == _expected(*state())
    calculator.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "04_cache_calculator_start.png"))

    for name in [p for p in ("DeepSeek-V3", "Llama 2 7B", "gpt-oss-120b") if p != preset.input_value()]:
        before = _report(view)
        preset.select_option(label=name)
        _wait(page, lambda old=before: _report(view) != old, what=f"the report for {name}")
        assert state()[0] == name
        assert _report(view) == _expected(*state())
    page.screenshot(path=str(artifacts / "04_cache_calculator_preset.png"))

    before = _report(view)
    context.select_option(index=context.locator("option").count() - 1)  # the longest context
    lab_h.press_on_slider(batch, "ArrowRight", times=3)
    _wait(page, lambda: state()[2] == 4 and _report(view) != before, what="the report for batch 4")
    _wait(page, lambda: _report(view) == _expected(*state()), timeout_s=30, what="the report to settle")
    assert state()[1] == 2**20
    page.screenshot(path=str(artifacts / "04_cache_calculator_context_batch.png"))
    _no_js_errors(kv_cache_lesson)


def test_quiz_checks_and_reveals_the_answer(kv_cache_lesson, artifacts):
    page = kv_cache_lesson.page
    quiz_cell = kv_cache_lesson.quiz_cells[0]
    view = lab_h.widget_view(quiz_cell)
    question = quiz_cell.locator(".jp-OutputArea-output .widget-vbox").first
    options = question.locator(".widget-radio-box label")
    feedback = question.locator(".widget-html").last
    check, reveal = (question.get_by_role("button", name=n, exact=True) for n in ("Check", "Show answer"))
    assert options.count() >= 2 and not feedback.inner_text().strip()

    check.click()
    _wait(page, lambda: "Pick an option" in feedback.inner_text(), what="the no-choice feedback")
    reveal.click()
    answer_text = _wait(page, lambda: (t := feedback.inner_text()).startswith("Answer:") and t,
                                   what="the revealed answer")
    labels = [options.nth(i).inner_text().strip() for i in range(options.count())]
    right = next(i for i, label in enumerate(labels) if answer_text.startswith(f"Answer: {label}."))
    wrong = (right + 1) % len(labels)

    options.nth(wrong).click()
    check.click()
    _wait(page, lambda: feedback.inner_text().startswith("Not quite"), what="'Not quite'")
    assert labels[wrong] in feedback.inner_text()
    options.nth(right).click()
    check.click()
    _wait(page, lambda: feedback.inner_text().startswith("Right."), what="'Right.'")
    assert view.is_visible()
    quiz_cell.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "04_quiz.png"))
    _no_js_errors(kv_cache_lesson)
