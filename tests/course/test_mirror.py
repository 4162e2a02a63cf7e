"""The tests mirror the parts: every module of ``modern_block/`` (all subpackages, found by scanning) has a test
file that imports it and tests it, or an exemption below with its reason; every test file sits in the folder of its
part.

The rule: ``modern_block/.../<name>.py`` of part P (model, fast, interop, training, classroom) is tested by
``tests/P/test_<name>.py``, or by the test files ``TESTED_BY`` lists for it (the training part is tested by topic,
the grader's parts by one file); tests of the whole course (notebooks, claims, README, layout, project) are in
``tests/course/``. A file counts only if it imports the module, read from its source (``ast``):
``import modern_block.x``, ``from modern_block.x import ...``, ``from modern_block import x``, or a name (or an
attribute of an imported package) that a package's ``__init__`` takes from the module. A file that exists but does
not import the module does not count; a file ``TESTED_BY`` names must import it. A package ``__init__`` that only
re-exports (docstring, imports, ``__all__``, ``__version__``) is tested by its modules' tests; one that gains code
needs a test too.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE, TESTS = ROOT / "modern_block", ROOT / "tests"
PARTS = ("model", "fast", "interop", "training", "classroom")
FOLDERS = PARTS + ("course",)  # tests/<folder>/: one per part, and the course as a whole

TESTED_BY = {  # module -> the test files named after its topic (besides tests/<part>/test_<name>.py)
    "modern_block.__main__": ["training/test_laptop.py"],
    "modern_block.fast.decoding": ["fast/test_fast.py"],
    "modern_block.interop.compare_layers": ["interop/test_hf.py", "interop/test_hf_families.py"],
    "modern_block.interop.gguf_quants": ["interop/test_gguf.py"],
    "modern_block.interop.pretrained": ["interop/test_gguf.py"],
    "modern_block.interop.verify": ["interop/test_gguf.py"],
    "modern_block.training.checkpoint": ["training/test_run_folder.py"],
    "modern_block.training.files": ["training/test_run_folder.py"],
    "modern_block.training.config": ["training/test_train.py"],
    "modern_block.training.parts": ["training/test_train.py"],
    "modern_block.training.trainer": ["training/test_train.py"],
    "modern_block.training.cli": ["training/test_train.py"],
    "modern_block.training.device": ["training/test_device.py"],
    "modern_block.training.ladder": ["training/test_ladder.py"],
    "modern_block.training.workers": ["training/test_study.py"],
    "modern_block.training.report": ["training/test_study.py"],
    "modern_block.classroom.checks.core": ["classroom/test_checks_graded.py"],
    "modern_block.classroom.checks.errors": ["classroom/test_in_notebook.py", "classroom/test_exercises.py"],
    **{f"modern_block.classroom.checks.lesson{n:02d}": ["classroom/test_exercises.py"] for n in range(10)},
    "modern_block.classroom.checks.lesson08b": ["classroom/test_exercises.py"],
    "modern_block.classroom.checks.lesson09b": ["classroom/test_exercises.py"],
    **{f"modern_block.classroom.grading.{name}": ["classroom/test_sandbox.py"] for name in (
        "bwrap", "class_folder", "grade_report", "notebook", "package_copy", "remote", "runner", "session", "wire")},
    "modern_block.classroom.grading.names": ["classroom/test_engine.py"],
    "modern_block.classroom.grading.autograde": ["classroom/test_nbgrader.py"],
}

EXEMPT = {  # module -> why no test file imports it
    "modern_block.interop.hf_config": "hf.py's config translation (private names only): every from_hf/to_hf in "
                                      "test_hf.py and test_hf_families.py goes through it, including each refusal",
    "modern_block.interop.hf_names": "hf.py's name tables (data and one private expander): every round trip in "
                                     "test_hf.py and test_hf_families.py loads each weight by these names, strictly",
    "modern_block.classroom.grading.zygote": "runs only as the sandbox's pre-loaded child process (started by "
                                             "sandbox.py, it enters namespaces and drops capabilities): "
                                             "test_sandbox.py drives it through sandbox.py",
}


def part_of(module: str) -> str:
    """The part a module belongs to: its first subpackage, or the model."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in PARTS[1:] else "model"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names (relative imports resolved against ``importer``)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")[:None if is_package else -1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def reexports(package: str) -> dict[str, str]:
    """Name -> the module a package's ``__init__`` imports it from."""
    names = {}
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = absolute(package, True, node)
    return names


REEXPORTS = {p: reexports(p) for p in PACKAGES}


def origin(module: str, name: str) -> str:
    """The module that defines ``module.name``: a submodule, or the module a package re-exports it from."""
    for _ in range(len(MODULES)):
        if f"{module}.{name}" in MODULES:
            return f"{module}.{name}"
        source = REEXPORTS.get(module, {}).get(name)
        if source is None or source == module:
            return module
        module = source
    return module


def modules_imported_by(path: Path) -> set[str]:
    """Every ``modern_block`` module a test file imports, directly or through a package's re-exports."""
    tree = ast.parse(path.read_text())
    found, aliases = set(), {}  # aliases: a local name bound to a module (for ``checks.check_rms``)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "modern_block" \
                and not node.level:
            found.add(node.module)
            for alias in node.names:
                found.add(origin(node.module, alias.name))
                if origin(node.module, alias.name) in MODULES and f"{node.module}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "modern_block":
                    found.add(alias.name)
                    if alias.asname:  # import modern_block.x as y: y is modern_block.x
                        aliases[alias.asname] = alias.name
                    else:  # import modern_block.x: the name bound is modern_block
                        aliases["modern_block"] = "modern_block"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.add(origin(aliases[node.value.id], node.attr))
    return found & set(MODULES)


TEST_FILES = {p.relative_to(TESTS).as_posix(): p for p in sorted(TESTS.rglob("test_*.py"))}  # "model/test_x.py"
IMPORTS = {name: modules_imported_by(path) for name, path in TEST_FILES.items()}


def only_reexports(package: str) -> bool:
    """True if a package's ``__init__`` holds nothing but a docstring, imports, ``__all__`` and ``__version__``."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id in ("__all__", "__version__")
                                                for t in node.targets):
            continue
        return False
    return True


def named_test(module: str) -> str:
    """The test file the rule names for a module: ``<part>/test_<name>.py``."""
    return f"{part_of(module)}/test_{MODULES[module].stem}.py"


def mirror(module: str) -> list[str]:
    """The test files that import and test ``module`` under the rule."""
    named = named_test(module)
    return sorted({f for f in [named, *TESTED_BY.get(module, [])] if module in IMPORTS.get(f, set())})


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_has_a_test_file_that_imports_it(module):
    if module in EXEMPT or (module in PACKAGES and only_reexports(module)):
        return
    named = named_test(module)
    hint = f"tests/{named} does not import it" if (TESTS / named).is_file() else f"write tests/{named}"
    assert mirror(module), f"{module} has no test file that imports it: {hint}, or list its test file in TESTED_BY"


@pytest.mark.parametrize("module", sorted(TESTED_BY))
def test_every_listed_test_file_imports_its_module(module):
    assert module in MODULES, f"TESTED_BY names {module}, which no longer exists"
    for name in TESTED_BY[module]:
        assert (TESTS / name).is_file(), f"TESTED_BY names tests/{name} for {module}; there is no such file"
        assert module in IMPORTS[name], f"tests/{name} does not import {module}, so it does not test it"


@pytest.mark.parametrize("module", sorted(EXEMPT))
def test_exemptions_are_current(module):
    assert module in MODULES, f"EXEMPT names {module}, which no longer exists"
    assert not mirror(module), f"{module} now has a test file ({mirror(module)}): remove its exemption"
    assert module not in TESTED_BY, f"{module} is both exempt and listed in TESTED_BY"


def test_the_scan_sees_what_it_should():
    """The import reading itself: re-exports, attributes of an imported package, and a file that does not count."""
    assert origin("modern_block", "RMSNorm") == "modern_block.rmsnorm"
    assert origin("modern_block.classroom.checks", "check_rms") == "modern_block.classroom.checks.lesson01"
    assert "modern_block.classroom.checks.lesson01" in IMPORTS["classroom/test_checks_graded.py"]  # checks.check_rms
    assert "modern_block.rmsnorm" in IMPORTS["model/test_rmsnorm.py"]
    assert "modern_block.rmsnorm" not in IMPORTS["training/test_train.py"]
    assert named_test("modern_block.interop.hf") == "interop/test_hf.py" and named_test("modern_block.rope") == \
        "model/test_rope.py"


@pytest.mark.parametrize("name", sorted(TEST_FILES))
def test_every_test_file_sits_in_the_folder_of_its_part(name):
    """A new test file goes to tests/<part>/ (or tests/course/): never at the top of tests/, never in a folder
    that is not a part; one named after a module goes to that module's part."""
    folder = name.split("/")[0]
    assert "/" in name and folder in FOLDERS, f"tests/{name}: put it in tests/<part>/, one of {list(FOLDERS)}"
    owners = {part_of(m) for m, p in MODULES.items() if f"test_{p.stem}.py" == name.split("/")[-1]
              and p.name != "__init__.py"}
    assert not owners or folder in owners, f"tests/{name} is named after a module of {sorted(owners)}: move it there"
    assert only_reexports("modern_block") and only_reexports("modern_block.classroom.checks")
