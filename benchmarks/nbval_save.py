"""A pytest plugin: keep the notebooks that nbval executed, with this run's outputs.

nbval runs every code cell of a notebook in one kernel and compares the outputs with the stored
ones, but writes nothing. With this plugin (``-p nbval_save``, this folder on ``PYTHONPATH``) and
``NBVAL_SAVE_DIR=DIR``, each notebook is also written to ``DIR/<name>.ipynb`` with the outputs it
just produced and execution counts 1, 2, 3, ... in order: one execution both checks the lesson and
gives the copy to commit (``benchmarks/gpu_check.py``, part 3).
"""

import os
from pathlib import Path

import nbformat

_notebooks: dict[str, object] = {}  # path -> the notebook nbval read, its cells now holding new outputs
_counts: dict[str, int] = {}


def pytest_runtest_makereport(item, call):
    if call.when != "call" or getattr(item, "test_outputs", None) is None or not hasattr(item, "cell"):
        return None
    path = str(item.parent.fspath)
    _notebooks[path] = item.parent.nb
    _counts[path] = _counts.get(path, 0) + 1
    cell = item.cell  # the cell object of item.parent.nb: nbval has already compared its old outputs
    cell.execution_count = _counts[path]
    for out in item.test_outputs:
        if out.get("output_type") == "execute_result":
            out["execution_count"] = _counts[path]
    cell.outputs = list(item.test_outputs)
    return None


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("NBVAL_SAVE_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for path, nb in _notebooks.items():
        nbformat.write(nb, Path(folder) / Path(path).name)
