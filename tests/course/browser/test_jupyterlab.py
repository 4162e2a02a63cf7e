"""The interactive parts of the course, used the way a learner uses them: in JupyterLab, in a real browser.

Each test opens a lesson from a throwaway copy of notebooks/ in JupyterLab (headless Chromium, driven by
Playwright), runs the lesson's widget cells and the cells they need (clicking each cell and pressing Ctrl+Enter),
then works the widget with the keyboard and the mouse and checks what is on the screen:

* lesson 03, the RoPE explorer: moving the "position", "pair" and "base" sliders redraws the figure; moving a
  slider back restores the very same picture, so the picture follows the sliders' state;
* lesson 04, the KV-cache calculator: picking a model preset (and a context length and batch size) shows the GiB
  and bytes per token that ``modern_block.presets.cache_size`` gives for that choice;
* lesson 04's quiz: a wrong letter gets a red "✗ Not quite", the right one replaces it with a green "✓ Right." and
  the explanation, "Show answer" unfolds the answer; at 480 px the long options wrap, one under the other;
* lesson 11's config reader: typing a path shows no error until Enter (then one short line, and the card still says
  what it shows); emptying the box takes the error away; a folder holding a config.json is read; a preset, a path
  or an upload each empties the other inputs, and the card names its source; reading the GGUF shows a busy sign;
  at 1280 px with the file browser open the card fits and no word wraps in the middle.

Every test fails on JavaScript errors (uncaught exceptions or console errors, which is where the widget manager
reports widgets it cannot render). Screenshots land in artifacts/browser/.
"""

import json

import lab_harness as lab_h
import pytest

from modern_block.classroom.quiz import LETTERS, load_questions
from modern_block.interop.config_card import config_card, load_config
from modern_block.interop.gguf import smollm2_path
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


def _feedback(question) -> str:
    """The feedback pane on show under a quiz question ("" before any choice)."""
    shown = question.locator(".quiz-feedback:visible")
    return shown.first.inner_text().strip() if shown.count() else ""


def test_quiz_tells_right_from_wrong_and_reveals_the_answer(kv_cache_lesson, artifacts):
    page = kv_cache_lesson.page
    quiz_cell = kv_cache_lesson.quiz_cells[0]
    questions = quiz_cell.locator(".course-quiz")
    lesson_questions = load_questions(kv_cache_lesson.notebook.stem)
    assert questions.count() == len(lesson_questions)
    assert "explanation" not in lab_h.cell_source(quiz_cell) and "answer=" not in lab_h.cell_source(quiz_cell)
    question, q = questions.first, lesson_questions[0]
    question.scroll_into_view_if_needed()
    assert not _feedback(question)
    wrong = (q.answer + 1) % len(q.options)

    question.get_by_role("button", name=LETTERS[wrong], exact=True).click()
    _wait(page, lambda: _feedback(question).startswith("✗ Not quite."), what="'Not quite'")
    red = question.locator(".quiz-wrong:visible").evaluate("e => getComputedStyle(e).borderLeftColor")
    question.get_by_role("button", name=LETTERS[q.answer], exact=True).click()
    _wait(page, lambda: _feedback(question).startswith("✓ Right."), what="'Right.' replacing 'Not quite'")
    assert q.explanation in _feedback(question) and "Not quite" not in question.inner_text()
    green = question.locator(".quiz-right:visible").evaluate("e => getComputedStyle(e).borderLeftColor")
    assert (red, green) == ("rgb(198, 40, 40)", "rgb(46, 125, 50)")  # red and green, with ✗ and ✓
    page.screenshot(path=str(artifacts / "04_quiz_right.png"))

    answer = question.locator(".jupyter-widget-Collapse-contents")
    assert not answer.is_visible()
    question.get_by_text("Show answer", exact=True).click()
    _wait(page, lambda: answer.is_visible() and q.options[q.answer] in answer.inner_text(), what="the answer")
    _no_js_errors(kv_cache_lesson)


def test_long_quiz_options_wrap_without_overlapping(kv_cache_lesson, artifacts):
    """At 480 px (a narrow window) the longest options wrap inside their list item, one under the other."""
    page = kv_cache_lesson.page
    page.set_viewport_size({"width": 480, "height": 800})
    page.wait_for_timeout(1500)  # JupyterLab lays the panels out again
    try:
        questions = kv_cache_lesson.quiz_cells[0].locator(".course-quiz")
        wrapped = 0
        for n in range(questions.count()):
            items = questions.nth(n).locator("ol li")
            boxes = [items.nth(i).bounding_box() for i in range(items.count())]
            for upper, lower in zip(boxes, boxes[1:], strict=False):
                assert upper["y"] + upper["height"] <= lower["y"] + 0.5, (n, upper, lower)
            line = float(items.first.evaluate("e => getComputedStyle(e).lineHeight").removesuffix("px"))
            wrapped += sum(b["height"] > 1.5 * line for b in boxes)  # two lines or more
            buttons = questions.nth(n).locator(".widget-toggle-button")
            assert all(buttons.nth(i).is_visible() for i in range(buttons.count()))
        assert wrapped, "at 480 px some option should take two lines"
        questions.nth(3).scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "04_quiz_480px.png"))
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})


# ---- lesson 11: the config reader ----------------------------------------------------------------------------------


def _reader(lesson):
    cell = next(c for c in lesson.lesson_cells if c.locator(".config-card").count())
    view = lab_h.widget_view(cell)
    path = view.locator(".widget-text input")
    preset = lab_h.control(view, "dropdown", "preset").locator("select")
    return cell, view, path, preset


def _status(view) -> str:
    """The status line's text, "" while there is none (read without waiting: the line may go as it is read)."""
    return " ".join(t.strip() for t in view.locator(".config-reader-status").all_inner_texts()).strip()


def _showing(view) -> str:
    return view.locator(".config-card-source").inner_text().strip()


def test_config_reader_reads_when_asked_and_says_what_it_shows(config_lesson, artifacts, tmp_path):
    page = config_lesson.page
    cell, view, path, preset = _reader(config_lesson)
    assert _showing(view) == "Showing the preset Llama 3.1 8B:"

    # typing is not asking: no error at any keystroke; Enter asks, and gets one short line
    path.click()
    for ch in "/no/such/config":
        path.type(ch)
        page.wait_for_timeout(150)
        assert not _status(view), f"an error while typing: {_status(view)!r}"
    path.press("Enter")
    _wait(page, lambda: _status(view).startswith("✗"), what="the error after Enter")
    assert _status(view) == "✗ No file or folder at /no/such/config." and len(_status(view)) < 100
    assert _showing(view) == "Showing the preset Llama 3.1 8B:"  # the card still says what it is
    page.screenshot(path=str(artifacts / "11_reader_error.png"))
    path.fill("")
    path.press("Enter")
    _wait(page, lambda: not _status(view), what="the error to leave with the path")

    # a folder holding a config.json: read, and the preset box empties (one source of truth)
    folder = config_lesson.notebook.parent / "my_model"
    folder.mkdir(exist_ok=True)
    folder.joinpath("config.json").write_text(json.dumps(load_config("Qwen3-0.6B")))
    path.fill(str(folder))
    path.press("Enter")
    _wait(page, lambda: _showing(view) == f"Showing the file {folder / 'config.json'}:", what="the folder's card")
    assert preset.input_value() == "" and "596,049,920" in view.inner_text()
    # choosing a preset empties the path
    preset.select_option(label="DeepSeek-V3")
    _wait(page, lambda: _showing(view) == "Showing the preset DeepSeek-V3:", what="the preset's card")
    assert path.input_value() == ""

    # an upload (a config.json that is not JSON, then one that is), through the browser's file chooser
    upload_button = view.locator(".widget-upload")

    def upload(path):
        with page.expect_file_chooser() as chooser:
            upload_button.click()
        chooser.value.set_files(str(path))

    bad = tmp_path / "broken.json"
    bad.write_text("{")
    upload(bad)
    _wait(page, lambda: _status(view).startswith("✗ broken.json is not JSON"), what="the upload's error")
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(load_config("Mistral 7B v0.3")))
    upload(good)
    _wait(page, lambda: _showing(view) == "Showing the uploaded file mine.json:", what="the upload's card")
    assert preset.input_value() == "" and path.input_value() == "" and not _status(view)

    # the GGUF takes seconds: the reader says it is reading (every change of the card is recorded in the page)
    view.evaluate("""v => { window.__readerStates = [];
        new MutationObserver(() => window.__readerStates.push(v.innerText)).observe(v,
            {childList: true, subtree: true, characterData: true}); }""")
    gguf = smollm2_path()
    path.fill(str(gguf))
    view.get_by_role("button", name="Read", exact=True).click()
    _wait(page, lambda: _showing(view) == f"Showing the file {gguf}:", timeout_s=120, what="the GGUF's card")
    states = page.evaluate("window.__readerStates")
    assert any("⏳ Reading the file" in s for s in states), "no busy sign while the GGUF was read"
    assert preset.input_value() == ""
    _no_js_errors(config_lesson)


def test_config_reader_table_reads_at_1280_px_with_the_file_browser_open(config_lesson, artifacts):
    page = config_lesson.page
    lab_h.show_left_sidebar(page)
    try:
        cell, view, _, preset = _reader(config_lesson)
        preset.select_option(label="Gemma 3 27B")
        _wait(page, lambda: _showing(view) == "Showing the preset Gemma 3 27B:", what="the card")
        table = view.locator("table.config-fields")
        table.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "11_reader_table_1280_sidebar.png"))
        area = cell.locator(".jp-Cell-outputArea")
        assert area.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "the card is wider than the output area"
        # no word of the summary or the meanings is split across two lines
        split = view.evaluate(r"""v => {
            const bad = [];
            for (const el of v.querySelectorAll('.config-card div, table.config-fields td:last-child')) {
                const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
                for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                    for (const m of node.data.matchAll(/\S+/g)) {
                        const r = document.createRange();
                        r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
                        const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
                        if (tops.size > 1) bad.push(m[0]);
                    }
                }
            }
            return bad; }""")
        assert not split, f"words split across lines: {split[:10]}"
        rows = table.locator("tr").count()
        assert rows == len(config_card("Gemma 3 27B").fields) + 1
    finally:
        lab_h.hide_left_sidebar(page)
    _no_js_errors(config_lesson)
