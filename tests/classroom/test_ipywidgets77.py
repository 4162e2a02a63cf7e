"""The course's widgets on ipywidgets 7.7, what Colab ships, as well as on the installed 8.x.

A throwaway virtual environment gets ``ipywidgets>=7.7,<7.8``, the three small packages it needs that 8.x does
not and ipykernel 6 (``WIDGETS_77``) on top of this environment's packages (a .pth
file adds this environment's site-packages after the venv's own, so the venv's ipywidgets 7.7 shadows 8.x and
torch is not installed again). It is built once and cached in the temporary folder.

* every lesson that displays widgets (explorers, calculators, quizzes) has its widget cells run, together with the
  cells they need, by nbclient in a kernel of that environment: each must display its widgets (outputs of type
  application/vnd.jupyter.widget-view+json whose models exist in the saved widget state), with no error or stderr;
* the package's widget code (modern_block.classroom: quiz, widgets) is driven in a kernel of each environment:
  choosing gives the same feedback on 7.7 (a kernel callback swaps the pane in) and on 8.x (the pane a jsdlink
  shows in the browser, applied here by hand), and the calculator the same numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from repo_files import load_module

ROOT = Path(__file__).resolve().parents[2]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PIN = "ipywidgets>=7.7,<7.8"
# what ipywidgets 7.7 needs that this environment's 8.x stack lacks, each at a version 7.7 accepts, installed without
# dependencies: pip's own resolution adds the classic notebook server (for widgetsnbextension's extension, which a
# kernel never imports) and about 30 s of downloads on a fresh machine. The kernel is ipykernel 6: ipykernel 7
# sends shell replies past its own ZMQ stream and can miss the wake-up of the next request (ipython/ipykernel#1554),
# which left this kernel idle for 2 minutes before one cell in most full suites
WIDGETS_77 = [PIN, "widgetsnbextension>=3.6.5,<3.7", "jupyterlab_widgets>=1.0,<2", "ipython_genutils>=0.2,<0.3",
              "ipykernel>=6.29,<7"]
# nbclient waits for each reply with pyzmq's asyncio poll, whose wake-up can be missed (an edge-triggered socket);
# the poll then finds the reply only when its timeout ends, with a poll of its own: the cell's whole timeout. With
# ipykernel 6 one cell still waited out 120 s in two of five full suites (131.9 s and 133.9 s for this test's setup
# against 14-16 s). The slowest cell here takes 2.4 s alone, so 30 s leaves room for a loaded machine and bounds
# such a wait to 30 s.
CELL_TIMEOUT_S = 30


def _site_dirs() -> list[str]:
    """This environment's site-packages folders, in import order (the venv adds them after its own)."""
    dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    return list(dict.fromkeys(dirs))


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _build_venv(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = _venv_python(venv)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in _site_dirs()]
    Path(purelib, "_modern_block_parent_env.pth").write_text("\n".join(lines) + "\n")
    # this environment's pip installs into the venv (pip >= 22.3); it never removes the parent's ipywidgets 8
    # because that lies outside the venv
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", *WIDGETS_77], check=True)


def _widgets_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import ipywidgets; print(ipywidgets.__version__)"],
                          check=True, capture_output=True, text=True).stdout.strip()


def build_python77() -> Path:
    """A Python whose ipywidgets is 7.7.x and which sees every other package of this environment: built once
    (under a lock, since another test run may be building the same one) and reused."""
    key = hashlib.sha1("|".join([sys.prefix, sys.version, *WIDGETS_77, *_site_dirs()]).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"modern_block_ipywidgets77_{key}"
    lock = Path(tempfile.gettempdir()) / f"modern_block_ipywidgets77_{key}.lock"
    with open(lock, "w") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:  # Windows: no lock; runs there are rare enough
            pass
        python, done = _venv_python(venv), venv / "built.ok"
        if not (done.exists() and python.exists()):
            if venv.exists():
                subprocess.run(["rm", "-rf", str(venv)], check=True)
            _build_venv(venv)
            done.write_text(_widgets_version(python))
    return python


@pytest.fixture(scope="module")
def python77() -> Path:
    try:
        python = build_python77()
    except (subprocess.CalledProcessError, OSError) as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise
        pytest.skip(f"could not build an environment with {PIN}: {exc}")
    version = _widgets_version(python)
    assert version.startswith("7.7."), f"the venv has ipywidgets {version}"
    return python


# ---- executing notebooks in another environment's kernel ------------------------------------------------


def execute_in(python: Path, nb, tmp_path: Path, name: str):
    """Run ``nb`` with nbclient under ``python`` (so its kernel is that Python) and return the executed copy."""
    src, dst = tmp_path / f"{name}.in.ipynb", tmp_path / f"{name}.out.ipynb"
    nbformat.write(nb, src)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"),
                                                                      os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    env.pop("MODERN_BLOCK_FORCE_SETUP", None)
    proc = subprocess.run([str(python), __file__, str(src), str(dst)], cwd=ROOT / "notebooks", env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode:
        pytest.fail(f"{name} failed under {python}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", pytrace=False)
    return nbformat.read(dst, as_version=4)


def _execute_main(src: str, dst: str) -> None:
    """Entry point when this file runs as a script inside the other environment."""
    from nbclient import NotebookClient

    nb = nbformat.read(src, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, store_widget_state=True,
                   resources={"metadata": {"path": os.getcwd()}}).execute()
    nbformat.write(nb, dst)


def _problems(cell) -> list[str]:
    found = []
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            found.append(f"{out.ename}: {out.evalue}")
        elif out.output_type == "stream" and out.name == "stderr":
            found.append(f"stderr: {out.text[:300]}")
    return found


def _widget_views(cell) -> list[dict]:
    return [o.data[WIDGET_VIEW] for o in cell.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]


VERSION_CELL = ("import ipykernel, ipywidgets\n"
                "print('ipywidgets', ipywidgets.__version__, 'ipykernel', ipykernel.__version__)")
RESET_CELL = "%reset -f"  # each lesson starts from an empty namespace, so one lesson cannot feed another

DRIVE_WIDGETS = r'''
import json
import ipywidgets
from modern_block.presets import GiB, cache_size
from modern_block.classroom.quiz import Question, _widget
from modern_block.classroom.widgets import cache_calculator

seen = {"version": ipywidgets.__version__}
w = _widget(Question(prompt="2 + 2?", options=["3", "4", "5"], answer=1, explanation="Arithmetic."))
body, choices, feedback, reveal = w.children


def choose(i):
    # a learner picks letter i; on ipywidgets 8 the browser's jsdlink shows the pane, done here by hand
    choices.value = i
    if hasattr(ipywidgets, "Stack"):
        assert feedback.link.source == (choices, "index")
        feedback.selected_index = choices.index
        return feedback.children[feedback.selected_index].value
    return feedback.children[0].value  # 7.7: the kernel swapped the pane in


seen["before"] = len(feedback.children) if not hasattr(ipywidgets, "Stack") else feedback.selected_index
seen["wrong"] = choose(0)
seen["right"] = choose(1)
seen["labels"] = [label for label, _ in choices.options]
seen["reveal"] = [reveal.get_title(0), reveal.selected_index, reveal.children[0].value]

calc = cache_calculator()
controls = {c.description: c for row in calc.children[:2] for c in row.children}
report = calc.children[2]
seen["start"] = "40.00 GiB" in report.value
controls["preset"].value = "DeepSeek-V3"
controls["batch"].value = 3
controls["dtype"].value = "fp8"
want = cache_size("DeepSeek-V3", controls["context"].value, 3, "fp8") / GiB
seen["after"] = f"{want:,.2f} GiB" in report.value
print(json.dumps(seen))
'''

harness = load_module("tests/course/browser/lab_harness.py")
LESSONS_WITH_WIDGETS = [p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
                        if harness.widget_cells(nbformat.read(p, as_version=4), "all")]


@pytest.fixture(scope="module")
def run77(python77, tmp_path_factory):
    """One kernel of the 7.7 environment runs, lesson after lesson, each lesson's widget cells and the cells
    they need (after a namespace reset), then the widget driver. Returns (executed notebook, where each
    lesson's cells landed: {lesson: [(lesson cell index, executed cell index)]}, index of the driver cell)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(VERSION_CELL))
    placed = {}
    for lesson in LESSONS_WITH_WIDGETS:
        src = nbformat.read(lesson, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(RESET_CELL))
        placed[lesson] = []
        for i in harness.cells_to_run(src, harness.widget_cells(src, "all")):
            placed[lesson].append((i, len(nb.cells)))
            nb.cells.append(nbformat.v4.new_code_cell(src.cells[i].source))
    nb.cells.append(nbformat.v4.new_code_cell(RESET_CELL))
    nb.cells.append(nbformat.v4.new_code_cell(DRIVE_WIDGETS))
    run = execute_in(python77, nb, tmp_path_factory.mktemp("ipywidgets77"), "lessons77")
    assert run.cells[0].outputs[0].text.startswith("ipywidgets 7.7."), run.cells[0].outputs
    assert " ipykernel 6." in run.cells[0].outputs[0].text, run.cells[0].outputs  # the kernel is the venv's
    return run, placed, len(nb.cells) - 1


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS_WITH_WIDGETS, ids=lambda p: p.stem)
def test_lesson_widgets_display_on_ipywidgets_77(lesson, run77):
    run, placed, _ = run77
    committed = nbformat.read(lesson, as_version=4)
    targets = harness.widget_cells(committed, "all")
    state = run.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for i, j in placed[lesson]:
        cell = run.cells[j]
        assert not _problems(cell), f"{lesson.name} cell {i}: {_problems(cell)}"
        if i not in targets:
            continue
        views = _widget_views(cell)
        assert views, f"{lesson.name} cell {i} displayed no widget on ipywidgets 7.7"
        for view in views:
            assert view["version_major"] == 2 and view["model_id"] in state, (lesson.name, i, view)
        if committed.cells[i].get("outputs"):  # as many widgets as the committed run (on 8.x) displayed
            assert len(views) == len(_widget_views(committed.cells[i])), f"{lesson.name} cell {i}"


def _check_driven(seen: dict) -> None:
    assert seen["before"] in (0, None)  # no feedback before a choice
    assert "quiz-wrong" in seen["wrong"] and "✗ Not quite." in seen["wrong"] and "(a) is not it" in seen["wrong"]
    assert "quiz-right" in seen["right"] and "✓ Right.</span> Arithmetic." in seen["right"]
    assert seen["labels"] == ["a", "b", "c"]
    assert seen["reveal"][:2] == ["Show answer", None] and "(b) 4</b><br>Arithmetic." in seen["reveal"][2]
    assert seen["start"] and seen["after"]


@pytest.mark.slow
def test_package_widgets_work_on_ipywidgets_77(run77):
    run, _, driver = run77
    assert not _problems(run.cells[driver]), _problems(run.cells[driver])
    seen = json.loads(run.cells[driver].outputs[-1].text)
    assert seen["version"].startswith("7.7.")
    _check_driven(seen)


def test_package_widgets_work_on_the_installed_ipywidgets(capsys):
    exec(compile(DRIVE_WIDGETS, "drive_widgets", "exec"), {})
    seen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _check_driven(seen)


if __name__ == "__main__":
    if sys.argv[1:] == ["--build"]:  # CI builds the environment ahead, while its downloads overlap other tests
        print("ipywidgets 7.7 environment:", build_python77())
    else:
        _execute_main(sys.argv[1], sys.argv[2])


@pytest.mark.parametrize("source, defined, used", [
    ("x = [a for a in b]", {"x"}, {"b"}),
    # a later generator's iterable reads the earlier loop variables (lesson 09 once failed the harness here)
    ("x = [(a, i) for a, c in d.items() for i in (range(L) if a else [0])]", {"x"}, {"d", "L"}),
    ("for k in ks:\n    y = k + z", {"k", "y"}, {"ks", "z"}),
    ("def f(u):\n    return u + w\nv = f(1)", {"f", "v"}, {"w"}),
])
def test_the_harness_finds_the_names_a_cell_needs_from_earlier_cells(source, defined, used):
    assert harness.cell_names(source) == (defined, used)


def test_the_harness_finds_the_widget_cells_of_a_notebook_saved_without_outputs():
    cells = ["x = 1", 'quiz("03_rope")', 'config_reader("Llama 3.1 8B")', "rope_explorer()", "print(reader)",
             'cache_calculator(preset="Llama 3 70B")']
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cells])
    assert harness.widget_cells(nb, "quiz") == [1]
    assert harness.widget_cells(nb, "lesson") == [2, 3, 5]
