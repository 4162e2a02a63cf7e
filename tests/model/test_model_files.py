"""The model files read like the lessons: they import only torch and the files of earlier lessons,
never the fast layer, never a private torch name, and they do no `.data` surgery."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "modern_block"
# the plain layer in course order; each file may import the ones before it (and the argument checks)
MODEL_FILES = [
    "decoder", "causal", "gpt2", "rmsnorm", "ffn", "rope", "attention", "kv_cache", "mla", "llama", "generate",
]
HELPERS = {"validate", "params"}  # argument checks and parameter counting, no model code
AROUND_THE_MODEL = {  # no model code
    "presets",  # real models' numbers for lesson 04: imports the cache formulas
}
STDLIB = {"math", "dataclasses", "functools", "collections", "typing", "__future__"}


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(package modules imported relatively, top-level external modules) of one file."""
    ours, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                ours.add(node.module or "")
            else:
                external.add(node.module)
        elif isinstance(node, ast.Import):
            external.update(alias.name for alias in node.names)
    return ours, external


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_file_imports_only_torch_and_earlier_lessons(name):
    ours, external = imports_of(PACKAGE / f"{name}.py")
    earlier = set(MODEL_FILES[:MODEL_FILES.index(name)]) | HELPERS
    assert ours <= earlier, f"{name}.py imports {sorted(ours - earlier)}: not an earlier lesson"
    assert "fast" not in ours
    roots = {m.split(".")[0] for m in external}
    assert roots <= {"torch"} | STDLIB, f"{name}.py imports {sorted(roots - {'torch'} - STDLIB)}"


@pytest.mark.parametrize("name", MODEL_FILES + sorted(HELPERS))
def test_model_file_uses_no_private_torch_names_and_no_data_surgery(name):
    text = (PACKAGE / f"{name}.py").read_text()
    private = re.findall(r"\btorch(?:\.\w+)*\._\w+|from torch[\w.]* import [^\n]*\b_\w+", text)
    assert not private, f"{name}.py uses private torch names: {private}"
    assert not re.search(r"\.data\s*=(?!=)", text), f"{name}.py reassigns a tensor's .data"
    assert "__dict__" not in text and "data_ptr" not in text, f"{name}.py keeps hidden state"


def test_every_model_file_has_its_place_in_the_course_order():
    """Found by scanning: a new file at the top of the package is a model file, and must be placed in the
    course order above (or be a helper), so the import rule covers it."""
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    unplaced = top - set(MODEL_FILES) - HELPERS - AROUND_THE_MODEL
    assert not unplaced, f"modern_block/{sorted(unplaced)}: place it in MODEL_FILES (course order) or HELPERS"
    assert all((PACKAGE / f"{name}.py").exists() for name in MODEL_FILES + sorted(HELPERS | AROUND_THE_MODEL))
