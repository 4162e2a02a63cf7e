"""Run the course in a real browser: a private JupyterLab server driven by headless Chromium.

Used by the browser tests (tests/course/browser/test_jupyterlab.py) and by scripts/screenshots.py.

* ``JupyterLab`` starts ``jupyter lab`` on 127.0.0.1 with a random free port, a random token and its own
  settings, workspaces, runtime, config and data folders, serving a temporary copy of the notebooks; ``stop()``
  shuts the server down through its API and then kills its process group and any kernel it started.
* ``JupyterLab`` also takes the course's JupyterLab defaults, ``scripts/jupyterlab_overrides.json``, exactly as
  ``make lab`` installs them (an ``overrides.d`` file in its settings folder): the widgets' state is saved with
  the notebook, so a lesson reopened after a run shows its widgets.
* ``launch_chromium`` starts Debian's Chromium (never a downloaded browser) through Playwright.
* ``open_notebook``, ``run_cells`` and ``widget_cells`` open a lesson in JupyterLab, find the cells that display
  a widget and the cells those need (a small slice of the lesson, found from the names each cell defines and uses),
  and run them as a learner would: click the cell, press Ctrl+Enter, wait for its execution count.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat

# the server is on 127.0.0.1: never through an http_proxy the user has set for the outside world
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))

CHROMIUM = os.environ.get("MODERN_BLOCK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
OVERRIDES = Path(__file__).resolve().parents[3] / "scripts" / "jupyterlab_overrides.json"  # what make lab installs
SERVER_START_S = 120  # first start of JupyterLab on a loaded 2-core machine can be slow
CELL_RUN_S = 90

# JupyterLab settings for a quiet, fully rendered notebook: every cell in the DOM (no windowing), no news or
# update checks, no autosave writing into the copy while the test reads it.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A private JupyterLab server over ``root_dir``; its state lives under ``work_dir``."""

    def __init__(self, root_dir: Path, work_dir: Path, pythonpath: Path | None = None):
        self.root_dir, self.work_dir = Path(root_dir), Path(work_dir)
        self.pythonpath = pythonpath  # the checkout, so kernels import modern_block even where it is not installed
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.log_path = self.work_dir / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def _env(self) -> dict:
        dirs = {name: self.work_dir / name for name in ("settings", "workspaces", "runtime", "config", "data",
                                                        "app_settings")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (dirs["app_settings"] / "overrides.d").mkdir(exist_ok=True)
        shutil.copyfile(OVERRIDES, dirs["app_settings"] / "overrides.d" / "modern-block.json")
        for rel, value in LAB_SETTINGS.items():
            path = dirs["settings"] / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        env = dict(os.environ)
        env.update(JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]), JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
                   JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTER_CONFIG_DIR=str(dirs["config"]),
                   JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_PLATFORM_DIRS="1", PYTHONUNBUFFERED="1")
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.pythonpath), env.get("PYTHONPATH")]))
        for name in ("JUPYTER_TOKEN", "JUPYTER_PATH", "MPLBACKEND"):  # a learner's kernel draws inline
            env.pop(name, None)
        return env

    def start(self) -> JupyterLab:
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
               "--ServerApp.open_browser=False", "--ServerApp.terminals_enabled=False", "--LabApp.news_url=",
               "--LabApp.extension_manager=readonly",
               f"--LabApp.app_settings_dir={self.work_dir / 'app_settings'}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI often run as root
            cmd.append("--allow-root")
        env = self._env()  # creates work_dir and the server's folders
        self.log = open(self.log_path, "w")  # closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with LOCAL.open(self.url("api/status"), timeout=5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_S} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def _kernel_pids(self) -> list[int]:
        """Processes whose command line names this server's runtime folder (its kernels)."""
        marker = str(self.work_dir / "runtime").encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if marker in (entry / "cmdline").read_bytes():
                        pids.append(int(entry.name))
                except OSError:
                    pass
        return pids

    def stop(self) -> None:
        """Shut down the kernels and the server, politely first, then by force. Safe to call twice."""
        if self.proc is None:
            return
        kernels = self._kernel_pids() if Path("/proc").is_dir() else []
        if self.proc.poll() is None:
            try:
                req = urllib.request.Request(self.url("api/shutdown"), method="POST")
                LOCAL.open(req, timeout=5).close()
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # the server is gone; its process group may still hold helpers
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in kernels:  # kernels run in their own session; normally the shutdown above ended them
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.log.close()
        self.proc = None

    def __enter__(self) -> JupyterLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def copy_notebooks(src: Path, dst: Path) -> Path:
    """A throwaway copy of the lesson notebooks for the server to open (the learner's tree, untouched)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return dst


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install playwright)"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


# ---- which cells to run: the widget cells of a lesson and what they need --------------------------------

_BUILTINS = set(dir(builtins)) | {"display", "get_ipython", "__file__"}


def _python_source(source: str) -> str:
    """Cell source with IPython magics and shell escapes blanked out, so ``ast`` can parse it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _bound_and_free(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names a statement list binds at its own level, names it reads that it does not bind)."""
    bound, read = set(), set()

    def visit(n, scope_bound, scope_read):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if not isinstance(n, ast.Lambda):
                scope_bound.add(n.name)
                for d in n.decorator_list:
                    visit(d, scope_bound, scope_read)
            inner_bound, inner_read = set(), set()
            if not isinstance(n, ast.ClassDef):
                a = n.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
                    if arg is not None:
                        inner_bound.add(arg.arg)
                for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
                    visit(d, scope_bound, scope_read)
            for child in (n.body if isinstance(n.body, list) else [n.body]):
                visit(child, inner_bound, inner_read)
            scope_read |= inner_read - inner_bound
            return
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner_bound, inner_read = set(), set()
            for k, gen in enumerate(n.generators):  # loop variables are bound before the element reads them
                if k == 0:  # only the first iterable is evaluated in the enclosing scope
                    visit(gen.iter, scope_bound, scope_read)
                else:  # later ones may read the earlier loop variables
                    visit(gen.iter, inner_bound, inner_read)
                visit(gen.target, inner_bound, inner_read)
                for cond in gen.ifs:
                    visit(cond, inner_bound, inner_read)
            for part in ((n.key, n.value) if isinstance(n, ast.DictComp) else (n.elt,)):
                visit(part, inner_bound, inner_read)
            scope_read |= inner_read - inner_bound
            return
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                scope_bound.add((alias.asname or alias.name).split(".")[0])
            return
        if isinstance(n, ast.Name):
            (scope_bound if isinstance(n.ctx, (ast.Store, ast.Del)) else scope_read).add(n.id)
            return
        for child in ast.iter_child_nodes(n):
            visit(child, scope_bound, scope_read)

    visit(node, bound, read)
    return bound, read - _BUILTINS


def _scan(stmts, defined: set[str], used: set[str]) -> None:
    """Walk statements in order: a name read before any statement so far bound it comes from an earlier cell."""
    for stmt in stmts:
        bodies = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, f, None), list)]
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not bodies:
            b, r = _bound_and_free(stmt)
            used |= r - defined
            defined |= b
            continue
        # a compound statement (if/for/while/with/try): its header first, then its blocks in order
        header = [getattr(stmt, f) for f in ("test", "iter", "target", "items") if getattr(stmt, f, None) is not None]
        for h in header:
            for node in (h if isinstance(h, list) else [h]):
                b, r = _bound_and_free(node)
                used |= r - defined
                defined |= b
        for handler in getattr(stmt, "handlers", []):
            bodies.append(handler.body)
            if handler.name:
                defined.add(handler.name)
        for body in bodies:
            _scan(body, defined, used)


def cell_names(source: str) -> tuple[set[str], set[str]]:
    """(names a code cell defines, names it uses from earlier cells)."""
    defined, used = set(), set()
    _scan(ast.parse(_python_source(source)).body, defined, used)
    return defined, used


WIDGET_OUTPUT = "application/vnd.jupyter.widget-view+json"


QUIZ_CALL = re.compile(r"\bquiz\(")
WIDGET_MAKERS = re.compile(r"quiz|explorer|calculator|reader|widget_bundle|interactive")


def _shows_a_widget(source: str) -> bool:
    """For a notebook saved without outputs: does a top-level expression of the cell display a widget
    (``quiz("03_rope")``, ``rope_explorer()``, ``cache_calculator()``, ``config_reader()``)?"""
    def called(node):
        return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""

    for stmt in ast.parse(_python_source(source)).body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            name = called(stmt.value)
            if name == "display" and any(WIDGET_MAKERS.search(called(a)) for a in stmt.value.args):
                return True
            if name != "display" and WIDGET_MAKERS.search(name):
                return True
    return False


def widget_cells(nb, kind: str = "all") -> list[int]:
    """Indices of the code cells that display a widget: ``kind`` "quiz" (cells calling ``quiz(``), "lesson"
    (the other ones: explorers, calculators) or "all". A widget cell is one whose saved outputs hold a widget
    view; in a notebook saved without any outputs, one whose code visibly displays a widget."""
    if kind not in ("all", "quiz", "lesson"):
        raise ValueError(f"kind must be 'all', 'quiz' or 'lesson', got {kind!r}")
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if any(c.get("outputs") for _, c in code):
        shown = [i for i, c in code if any(WIDGET_OUTPUT in o.get("data", {}) for o in c.outputs)]
    else:
        shown = [i for i, c in code if _shows_a_widget(c.source)]
    return [i for i in shown if kind == "all" or (kind == "quiz") == bool(QUIZ_CALL.search(nb.cells[i].source))]


def cells_to_run(nb, targets: list[int], always: tuple[int, ...] = (1,)) -> list[int]:
    """``targets`` plus every earlier code cell that defines a name they need (transitively), plus ``always``
    (the setup cell), in notebook order. Cells with magics such as ``%matplotlib inline`` that define nothing
    are kept when they sit in a needed cell, which is where the lessons put them."""
    chosen = set(targets) | {i for i in always if i < len(nb.cells) and nb.cells[i].cell_type == "code"}
    needed: set[str] = set()
    for i in targets:
        needed |= cell_names(nb.cells[i].source)[1]
    for i in range(max(targets) - 1, -1, -1):
        cell = nb.cells[i]
        if cell.cell_type != "code":
            continue
        defined, used = cell_names(cell.source)
        if i in chosen or defined & needed:
            chosen.add(i)
            needed = (needed - defined) | used
    unresolved = needed - {"In", "Out", "_"}
    if unresolved:
        raise ValueError(f"cells {targets} use {sorted(unresolved)}, which no earlier cell defines")
    return sorted(chosen)


def read_notebook(path: Path):
    return nbformat.read(path, as_version=4)


# ---- driving JupyterLab ---------------------------------------------------------------------------------


def open_notebook(page, lab: JupyterLab, name: str, timeout_s: float = 120):
    """Open ``name`` (relative to the server root) in a fresh workspace and wait for its kernel to be ready."""
    page.goto(lab.url(f"lab/tree/{name}?reset"), wait_until="domcontentloaded", timeout=timeout_s * 1000)
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    panel.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_s * 1000)
    wait_kernel_ready(page, lab, name, timeout_s)
    return panel


def _api(lab: JupyterLab, path: str):
    with LOCAL.open(lab.url(f"api/{path}"), timeout=10) as r:
        return json.load(r)


def lab_settings(lab: JupyterLab, plugin: str) -> dict:
    """The settings JupyterLab gives a plugin: its schema's defaults (with the overrides applied) under the user's
    own."""
    with LOCAL.open(lab.url(f"lab/api/settings/{plugin}"), timeout=10) as r:
        found = json.load(r)
    defaults = {k: v.get("default") for k, v in found["schema"].get("properties", {}).items()}
    return defaults | found["settings"]


def wait_kernel_ready(page, lab: JupyterLab, name: str, timeout_s: float = 120):
    """Wait until the server reports the notebook's kernel idle with the page connected to it, and the
    notebook's toolbar shows it idle too."""
    def ready():
        sessions = [s for s in _api(lab, "sessions") if s.get("path") == name and s.get("kernel")]
        if not sessions:
            return False
        kernel = _api(lab, f"kernels/{sessions[0]['kernel']['id']}")
        return kernel.get("execution_state") == "idle" and kernel.get("connections", 0) >= 1

    wait_until(ready, timeout_s, what=f"the kernel of {name}", interval_s=0.5, page=page)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status='idle']") \
        .first.wait_for(timeout=timeout_s * 1000)


def _prompt(cell_locator) -> str:
    return cell_locator.locator(".jp-InputPrompt").first.inner_text().strip()


def run_cells(panel, indices: list[int], timeout_s: float = CELL_RUN_S):
    """Run each cell as a learner would: click its prompt, press Ctrl+Enter, wait for its ``[n]:``.

    The cells must show no execution count beforehand (``prepare_copy`` clears them), so ``[n]:`` can only
    come from this run. A press that JupyterLab did not take (the cell shows neither ``[*]:`` nor a count
    after a few seconds) is repeated, twice at most."""
    page = panel.page
    for i in indices:
        c = cell(panel, i)
        c.scroll_into_view_if_needed()
        if _prompt(c) != "[ ]:":
            raise AssertionError(f"cell {i} shows {_prompt(c)!r} before running; clear it first")
        for _attempt in range(3):
            c.locator(".jp-InputPrompt").first.click()
            page.keyboard.press("Control+Enter")
            try:
                wait_until(lambda c=c: _prompt(c) != "[ ]:", 5, what=f"cell {i} to start", page=page)
                break
            except TimeoutError:
                continue
        wait_until(lambda c=c: re.fullmatch(r"\[\d+\]:", _prompt(c)), timeout_s, what=f"cell {i} to finish",
                   page=page)
        errors = c.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        if errors.count():
            raise AssertionError(f"cell {i} wrote to stderr or raised:\n{errors.first.inner_text()}")


def keep_offline(context, lab: JupyterLab) -> None:
    """Answer every request that would leave the machine (the Colab badge, fonts) with a placeholder, so a
    test never waits on the network and an offline machine logs no load errors. (Playwright's synchronous API
    answers routed requests only while Python calls into it: ``wait_until`` with a page keeps it listening.)"""
    placeholder = '<svg xmlns="http://www.w3.org/2000/svg" width="117" height="20"><rect width="117" height="20" ' \
                  'fill="#ddd"/></svg>'
    elsewhere = re.compile(rf"^(?!{re.escape(lab.base_url)}/)https?://")  # the server's own requests stay untouched

    def answer(route):
        route.fulfill(status=200, content_type="image/svg+xml", body=placeholder)

    context.route(elsewhere, answer)


def collect_js_errors(page) -> list[str]:
    """A list that fills with the page's uncaught exceptions and console errors (the widget manager reports
    failures to render or to reach a model through console.error)."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on("console", lambda msg: errors.append(f"console.error: {msg.text}") if msg.type == "error" else None)
    return errors


def hide_left_sidebar(page) -> None:
    """Collapse the file browser so the notebook gets the whole width (View > Show Left Sidebar)."""
    if page.locator("#jp-left-stack:not(.lm-mod-hidden)").count():
        page.keyboard.press("Escape")
        page.keyboard.press("Control+b")
        page.locator("#jp-left-stack.lm-mod-hidden").wait_for(state="attached")


def show_left_sidebar(page) -> None:
    """Open the file browser again (the width a learner has with it open)."""
    if page.locator("#jp-left-stack.lm-mod-hidden").count():
        page.keyboard.press("Escape")
        page.keyboard.press("Control+b")
        page.locator("#jp-left-stack:not(.lm-mod-hidden)").wait_for(state="attached")


def cell_source(cell_locator) -> str:
    """The code a learner sees in a cell's editor."""
    return cell_locator.locator(".jp-InputArea-editor").inner_text()


def control(scope, kind: str, description: str):
    """The ipywidgets control of ``kind`` ("slider" or "dropdown") whose label reads ``description``."""
    css = {"slider": ".widget-slider", "dropdown": ".widget-dropdown"}[kind]
    label = scope.page.locator("label.widget-label", has_text=re.compile(rf"^\s*{re.escape(description)}\s*$"))
    found = scope.locator(css, has=label)
    found.first.wait_for()
    assert found.count() == 1, f"expected one {kind} described {description!r}, found {found.count()}"
    return found.first


def slider_value(slider) -> float:
    """The number the slider's readout shows (what the learner reads)."""
    return float(slider.locator(".widget-readout").inner_text().replace(",", "").strip())


def press_on_slider(slider, key: str, times: int = 1) -> None:
    """Focus the slider's handle and press ``key`` (ArrowRight, ArrowLeft, Home, End), as a keyboard user does."""
    handle = slider.locator(".noUi-handle, .ui-slider-handle").first
    handle.focus()
    for _ in range(times):
        handle.press(key)


def wait_until(predicate, timeout_s: float = 60, what: str = "the condition", interval_s: float = 0.2, page=None):
    """Poll ``predicate`` until it returns something true (returned) or ``timeout_s`` passes (TimeoutError).
    With ``page``, the pauses run inside Playwright, so the page's events and routes are served meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        if page is not None:
            page.wait_for_timeout(interval_s * 1000)
        else:
            time.sleep(interval_s)


def image_src(scope) -> str | None:
    """The src of the image the scope shows now (a data: URL for matplotlib figures), or None while it redraws."""
    img = scope.locator("img")
    return img.first.get_attribute("src") if img.count() == 1 else None


def cell(panel, index: int):
    return panel.locator(".jp-Notebook .jp-Cell").nth(index)


WIDGET_FAILURES = re.compile(r"Error displaying widget|javascript error|Failed to (load|create|display|render)", re.I)


def widget_view(cell_locator, timeout_s: float = 60):
    """The rendered widget in a cell's output area; fails if the widget manager showed an error instead
    ("Error displaying widget: model not found", "Click to show javascript error", ...)."""
    area = cell_locator.locator(".jp-Cell-outputArea")
    view = area.locator(".jupyter-widgets").first
    view.wait_for(timeout=timeout_s * 1000)

    def loaded():
        text = area.inner_text()
        return None if "Loading widget" in text else [text]

    (text,) = wait_until(loaded, timeout_s, what="the widget to finish loading", page=cell_locator.page)
    bad = WIDGET_FAILURES.search(text)
    assert not bad, f"the widget did not render: {text[:500]!r}"
    return view


def prepare_copy(notebook: Path, indices: list[int]) -> None:
    """Clear the outputs and execution counts of the cells a test will run, in the server's copy of the lesson,
    so that whatever those cells show in the browser comes from this session."""
    nb = read_notebook(notebook)
    for i in indices:
        nb.cells[i].outputs, nb.cells[i].execution_count = [], None
    nbformat.write(nb, notebook)


def open_and_run_widgets(page, lab: JupyterLab, notebook: Path, kind: str = "lesson"):
    """Open the lesson ``notebook`` (a copy inside the server's root), run its widget cells of ``kind`` and the
    cells they need. Returns (notebook panel, {"lesson": [cell locators], "quiz": [cell locators]})."""
    notebook = Path(notebook)
    name = notebook.relative_to(lab.root_dir).as_posix()  # never touches a file outside the server's copy
    nb = read_notebook(notebook)
    targets = widget_cells(nb, kind)
    if not targets:
        raise AssertionError(f"{notebook.name} has no {kind} widget cell")
    quizzes = set(widget_cells(nb, "quiz"))
    to_run = cells_to_run(nb, targets)
    prepare_copy(notebook, to_run)
    panel = open_notebook(page, lab, name)
    hide_left_sidebar(page)
    run_cells(panel, to_run)
    return panel, {"lesson": [cell(panel, i) for i in targets if i not in quizzes],
                   "quiz": [cell(panel, i) for i in targets if i in quizzes]}


# ---- a whole lesson: run all, save, close, reopen -----------------------------------------------------------------


def run_all(page, panel, timeout_s: float = 300) -> None:
    """Run > Run All Cells, as a learner does, and wait until every code cell shows its ``[n]:``."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    code = panel.locator(".jp-Notebook .jp-CodeCell")

    def done():
        prompts = code.locator(".jp-InputPrompt").all_inner_texts()
        return all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts)

    wait_until(done, timeout_s, what="every cell to run", interval_s=1, page=page)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status='idle']") \
        .first.wait_for(timeout=timeout_s * 1000)


def save_notebook(page, lab: JupyterLab, name: str, timeout_s: float = 60) -> None:
    """File > Save (Ctrl+S) and wait until the file on disk is newer than before."""
    path = Path(lab.root_dir) / name
    before = path.stat().st_mtime_ns
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    wait_until(lambda: path.stat().st_mtime_ns != before, timeout_s, what=f"{name} to be saved", page=page)
    page.wait_for_timeout(500)  # the file is written in one go, but give the server a moment


def shut_down_kernel(lab: JupyterLab, name: str) -> None:
    """End the notebook's session and its kernel (what closing JupyterLab for the day does)."""
    for s in _api(lab, "sessions"):
        if s.get("path") == name:
            req = urllib.request.Request(lab.url(f"api/sessions/{s['id']}"), method="DELETE")
            LOCAL.open(req, timeout=30).close()


def shown_output(output_locator) -> str:
    """What one output (a ``.jp-OutputArea-output``) shows a learner: "widget", "widget error", "html", "image" or
    "text" (a repr). The renderer's classes sit on the output element itself."""
    text = output_locator.inner_text()
    if WIDGET_FAILURES.search(text):
        return "widget error"
    classes = output_locator.evaluate("e => [...e.classList, ...[...e.querySelectorAll('*')].flatMap(c => "
                                      "[...c.classList])]")
    if "jupyter-widgets" in classes:
        return "widget"
    if "jp-RenderedHTMLCommon" in classes:
        return "html"
    if "jp-RenderedImage" in classes:
        return "image"
    return "text"
