"""A lesson as a learner keeps it: opened fresh, run, saved, closed for the day, and opened again (JupyterLab at
1280×800, with the settings ``make lab`` installs).

* opened fresh from the repository (an untrusted notebook: JupyterLab does not run its widget views), every widget
  cell shows its static version, the HTML card or the explorer's figure, never a ``VBox(children=...`` repr;
* run (lesson 03: Run All; lesson 04, whose section 9 trains models for minutes on a busy machine: its widget cells
  and the cells they need, the other outputs cleared first), then File > Save: the notebook on disk holds the state
  of every widget its outputs show;
* with the kernel shut down, the page reloaded and the lesson opened again, every widget cell shows a working widget,
  not "Error displaying widget: model not found"; the quiz answers without a kernel (the feedback pane and the
  "Show answer" fold run in the browser), and the page logs no JavaScript error.
"""

import json
import shutil
import time
from pathlib import Path

import lab_harness as lab_h
import pytest

from modern_block.classroom.quiz import LETTERS, load_questions

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[3]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _widget_outputs(page, panel, nb) -> list[tuple[int, int]]:
    """(cell, output) positions of every output the saved notebook shows as a widget."""
    return [(i, k) for i in lab_h.widget_cells(nb, "all") for k, o in enumerate(nb.cells[i].outputs)
            if WIDGET_VIEW in o.get("data", {})]


def _output(panel, cell: int, k: int):
    return lab_h.cell(panel, cell).locator(".jp-OutputArea-child .jp-OutputArea-output").nth(k)


def _open(browser, lab, name: str, shot: Path):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    lab_h.keep_offline(context, lab)
    page = context.new_page()
    page.set_default_timeout(90_000)
    errors = lab_h.collect_js_errors(page)
    panel = lab_h.open_notebook(page, lab, name)
    page.screenshot(path=str(shot))
    return context, page, panel, errors


@pytest.mark.parametrize("prefix, run", [("03", "all"), ("04", "widget cells")])
def test_a_lesson_reopened_after_a_run_shows_its_widgets(prefix, run, browser, lab, artifacts):
    lesson = sorted((ROOT / "notebooks").glob(f"{prefix}_*.ipynb"))[0]
    name = f"reopen/{lesson.name}"
    root = Path(lab.root_dir)
    (root / "reopen").mkdir(exist_ok=True)
    shutil.copyfile(lesson, root / name)
    nb = lab_h.read_notebook(root / name)
    quiz_cell = lab_h.widget_cells(nb, "quiz")[0]

    # the server runs with make lab's default: the widget manager saves the widgets' state
    assert lab_h.lab_settings(lab, "@jupyter-widgets/jupyterlab-manager:plugin")["saveState"] is True

    # 1. fresh from the repository: the static versions
    context, page, panel, errors = _open(browser, lab, name, artifacts / f"reopen_{prefix}_fresh.png")
    shown = {pos: lab_h.shown_output(_output(panel, *pos)) for pos in _widget_outputs(page, panel, nb)}
    assert shown and set(shown.values()) <= {"html", "image"}, shown
    explorer = [pos for pos, kind in shown.items() if kind == "image"]
    assert (prefix == "03") == bool(explorer), shown  # lesson 03's explorer falls back to its figure
    assert "VBox(" not in panel.inner_text()
    first = min(shown)
    _output(panel, *first).scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / f"reopen_{prefix}_fresh_widget.png"))

    # 2. run, then save
    started = time.monotonic()
    if run == "all":
        lab_h.run_all(page, panel, timeout_s=600)
    else:
        context.close()
        targets = lab_h.widget_cells(nb, "all")
        lab_h.prepare_copy(root / name, [i for i, c in enumerate(nb.cells) if c.cell_type == "code"])
        context, page, panel, errors = _open(browser, lab, name, artifacts / f"reopen_{prefix}_cleared.png")
        lab_h.run_cells(panel, lab_h.cells_to_run(nb, targets))
    print(f"{lesson.name}: ran ({run}) in {time.monotonic() - started:.0f} s")
    lab_h.save_notebook(page, lab, name)
    saved = json.loads((root / name).read_text())
    state = saved["metadata"]["widgets"][WIDGET_STATE]["state"]
    views = [o["data"][WIDGET_VIEW]["model_id"] for c in saved["cells"] if c["cell_type"] == "code"
             for o in c["outputs"] if WIDGET_VIEW in o.get("data", {})]
    assert views and all(v in state for v in views), "the saved notebook lacks the state of its widgets"
    assert not errors, errors
    context.close()

    # 3. the next day: no kernel, a fresh page
    lab_h.shut_down_kernel(lab, name)
    context, page, panel, errors = _open(browser, lab, name, artifacts / f"reopen_{prefix}_reopened.png")
    nb = lab_h.read_notebook(root / name)
    for pos in _widget_outputs(page, panel, nb):
        out = _output(panel, *pos)
        lab_h.wait_until(lambda o=out: "Loading widget" not in o.inner_text(), 60, what="the widget", page=page)
        assert lab_h.shown_output(out) == "widget", (pos, out.inner_text()[:300])

    _output(panel, *first).scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / f"reopen_{prefix}_reopened_widget.png"))

    # the quiz works with its models restored from the file: pick a wrong letter, then the right one
    q = load_questions(lesson.stem)[0]
    first = lab_h.cell(panel, quiz_cell).locator(".course-quiz").first
    first.scroll_into_view_if_needed()
    wrong = (q.answer + 1) % len(q.options)
    first.get_by_role("button", name=LETTERS[wrong], exact=True).click()
    feedback = first.locator(".quiz-feedback:visible")
    lab_h.wait_until(lambda: feedback.count() == 1 and "Not quite" in feedback.inner_text(), 30,
                     what="'Not quite'", page=page)
    first.get_by_role("button", name=LETTERS[q.answer], exact=True).click()
    lab_h.wait_until(lambda: feedback.count() == 1 and "Right." in feedback.inner_text(), 30,
                     what="'Right.'", page=page)
    page.screenshot(path=str(artifacts / f"reopen_{prefix}_quiz_without_kernel.png"))
    assert not errors, errors
    context.close()
