"""Fixtures for the browser tests: one private JupyterLab server and one headless Chromium per session.

Without Playwright or Chromium the tests skip, except under CI=true, where they fail: CI must run them.
Screenshots go to artifacts/browser/ (git-ignored); a failing test also leaves a screenshot of the page there.
"""

import os
import re
import time
from pathlib import Path

import lab_harness as lab_h
import pytest

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "artifacts" / "browser"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def chromium_ready():
    reason = lab_h.chromium_missing_reason()
    if reason:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests cannot run under CI: {reason}", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def lab(chromium_ready, tmp_path_factory):
    """JupyterLab serving a throwaway copy of notebooks/; always shut down, whatever the tests did."""
    work = tmp_path_factory.mktemp("jupyterlab")
    root = lab_h.copy_notebooks(ROOT / "notebooks", work / "notebooks")
    server = lab_h.JupyterLab(root, work / "server", pythonpath=ROOT)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(chromium_ready):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = lab_h.launch_chromium(pw)
        try:
            yield b
        finally:
            b.close()


class Lesson:
    """A lesson open in its own browser tab, with its widget cells (lesson widgets and quizzes) run."""

    def __init__(self, browser, lab, notebook: Path):
        self.notebook = notebook
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        lab_h.keep_offline(self.context, lab)
        self.page = self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.js_errors = lab_h.collect_js_errors(self.page)
        started = time.monotonic()
        try:
            self.panel, cells = lab_h.open_and_run_widgets(self.page, lab, notebook, kind="all")
        except BaseException:
            self.page.screenshot(path=str(ARTIFACTS / f"FAILED_opening_{notebook.stem}.png"))
            self.context.close()
            raise
        self.seconds_to_run = time.monotonic() - started
        self.lesson_cells, self.quiz_cells = cells["lesson"], cells["quiz"]


@pytest.fixture(scope="session")
def lessons(browser, lab, artifacts):
    """Open a lesson (by its number, "03") once per session; later requests get the same tab."""
    opened: dict[str, Lesson] = {}
    failed: dict[str, str] = {}

    def get(prefix: str) -> Lesson:
        if prefix in failed:  # do not spend the time twice on a lesson that could not be opened
            pytest.fail(f"opening lesson {prefix} failed earlier: {failed[prefix]}", pytrace=False)
        if prefix not in opened:
            found = sorted(Path(lab.root_dir).glob(f"{prefix}_*.ipynb"))
            assert found, f"no notebooks/{prefix}_*.ipynb"
            try:
                opened[prefix] = Lesson(browser, lab, found[0])
            except Exception as exc:
                failed[prefix] = f"{type(exc).__name__}: {exc}"
                raise
        return opened[prefix]

    try:
        yield get
    finally:
        for lesson in opened.values():
            lesson.context.close()


def _lesson_fixture(prefix: str):
    @pytest.fixture
    def fixture(lessons, artifacts, request):
        lesson = lessons(prefix)
        yield lesson
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            name = re.sub(r"\W+", "_", request.node.name)
            lesson.page.screenshot(path=str(artifacts / f"FAILED_{name}.png"))
    return fixture


rope_lesson = _lesson_fixture("03")
kv_cache_lesson = _lesson_fixture("04")
config_lesson = _lesson_fixture("11")
