"""Import a file of this repository by its path: scripts/, benchmarks/ and tests/course/browser/ are not packages."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_module(relative_path: str):
    """The module at ROOT / relative_path, executed fresh (its name is the file's stem)."""
    path = ROOT / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
