"""The package's layout is its architecture: five parts, imports in one direction, no import circle, no file over
500 lines.

Every import of every module is found by reading the source (``ast``: relative and absolute imports, at the top of
a file, inside a function or under ``if TYPE_CHECKING``), so a new module or a new import is held to the rules
without being listed.

    the model      modern_block/*.py (the files the lessons read)
    fast           modern_block/fast/        may import the model
    interop        modern_block/interop/     may import the model
    training       modern_block/training/    may import the model and interop
    classroom      modern_block/classroom/   may import the model, the fast layer, interop and training

``modern_block/__main__.py`` is the command dispatcher: it may name any part. Across parts only public names
are imported (no ``_private`` module or name), so each part's public API is what the others use.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "modern_block"
MAX_LINES = 500
PARTS = ("model", "fast", "interop", "training", "classroom")
MAY_IMPORT = {  # the design: each part and the parts it may import (besides itself)
    "model": set(),
    "fast": {"model"},
    "interop": {"model"},
    "training": {"model", "interop"},
    "classroom": {"model", "fast", "interop", "training"},
}
ENTRY_POINTS = {"modern_block.__main__"}  # may import any part


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """The part a ``modern_block...`` module belongs to: its first subpackage, or the model."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in PARTS[1:] else "model"


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_in(source: str, importer: str, is_package: bool) -> list[tuple[str, list[str], int]]:
    """(imported module, the names taken from it, line) for every import of a ``modern_block`` module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = resolve(importer, is_package, node)
            if target == "modern_block" or target.startswith("modern_block."):
                found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("modern_block")]
    return found


def imported_modules(target: str, names: list[str], modules) -> list[tuple[str, str | None]]:
    """(module, name or None) pairs: ``from pkg import sub`` imports the module ``pkg.sub``."""
    pairs = []
    for name in names or [None]:
        sub = f"{target}.{name}" if name else None
        pairs.append((sub, None) if sub in modules else (target, name))
    return pairs


def violations(module: str, source: str, is_package: bool, modules) -> list[str]:
    """Every import in ``source`` (the text of ``module``) that breaks the direction or takes a private name."""
    if module in ENTRY_POINTS:
        return []
    here, found = part_of(module), []
    for target, names, line in imports_in(source, module, is_package):
        for imported, name in imported_modules(target, names, modules):
            there = part_of(imported)
            if there == here:
                continue
            if there not in MAY_IMPORT[here]:
                found.append(f"{module} (line {line}) imports {imported}: the {here} part may import "
                             f"{sorted(MAY_IMPORT[here]) or 'no other part'}, not {there}")
            private = [p for p in imported.split(".") if p.startswith("_") and p not in ("__init__", "__main__")]
            if private or (name or "").startswith("_"):
                found.append(f"{module} (line {line}) imports the private "
                             f"{imported}{'.' + name if name else ''} of another part")
    return found


MODULES = package_modules()


def test_the_parts_exist_as_folders_and_every_module_belongs_to_one():
    for part in PARTS[1:]:
        assert (PACKAGE / part / "__init__.py").is_file(), f"modern_block/{part}/ is a part of the design"
    folders = {p.parent.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert folders <= set(PARTS[1:]), f"folders that are not parts: {sorted(folders - set(PARTS))}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_in_one_direction_and_take_only_public_names(module):
    path = MODULES[module]
    assert violations(module, path.read_text(), path.name == "__init__.py", MODULES) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_is_over_500_lines(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {n} lines: split it along its own structure"


def test_no_two_modules_share_a_file_name():
    """One name, one thing: a file name says which module it is wherever it is quoted (two report.py or two
    files.py would not)."""
    stems: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            stems.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not {n: p for n, p in stems.items() if len(p) > 1}, "rename one of each: " + str(
        {n: sorted(p) for n, p in stems.items() if len(p) > 1})


@pytest.mark.parametrize("module, source, expected", [
    ("modern_block.llama", "from .training.trainer import train\n", ["the model part may import no other part"]),
    ("modern_block.llama", "def f():\n    import modern_block.fast\n", ["not fast"]),
    ("modern_block.training.trainer", "from ..classroom import checks\n", ["not classroom"]),
    ("modern_block.training.trainer", "from ..interop.hf import _family\n",
     ["the private modern_block.interop.hf._family"]),
    ("modern_block.fast.decoding", "from .. import validate\n", []),
    ("modern_block.classroom.grading.grade", "from ...training.trainer import train\n", []),
])
def test_the_rules_catch_what_they_should(module, source, expected):
    """The scanner itself, on made-up sources: upward imports (at the top or inside a function), imports of
    private names across parts, and imports that are allowed."""
    found = violations(module, source, False, MODULES)
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True)), found


def import_graph(modules) -> dict[str, set[str]]:
    """module -> the package modules it imports, of every kind: at the top of the file, inside a function, under
    ``if TYPE_CHECKING`` (a lazy import still ties the two modules: the circle is in the design, loaded or not)."""
    graph = {}
    for module, path in modules.items():
        found = imports_in(path.read_text(), module, path.name == "__init__.py")
        graph[module] = {m for target, names, _ in found for m, _ in imported_modules(target, names, modules)
                         if m in modules and m != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: the strongly connected components of more than one module (Tarjan's algorithm), each
    sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:  # m is the root of a component: everything above it on the stack
            component = stack[stack.index(m):]
            del stack[stack.index(m):]
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(found)


def test_the_structure_drawn_from_the_imports_has_no_circle():
    found = circles(import_graph(MODULES))
    assert not found, "import circles (move the shared piece to its owner or to a lower module): " + "; ".join(
        " <-> ".join(c) for c in found)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}, [["a", "b"], ["c", "d"]]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
])
def test_the_circle_finder_sees_every_circle(graph, expected):
    assert circles(graph) == expected


def test_every_kind_of_import_is_an_arrow():
    """An import inside a function and one under ``if TYPE_CHECKING`` count as much as one at the top."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .study import Results\n"
              "def f():\n    from . import workers\n")
    found = imports_in(source, "modern_block.training.report", False)
    assert {t for t, _, _ in found} == {"modern_block.training.study", "modern_block.training"}
