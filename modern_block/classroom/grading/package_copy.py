"""The course package as a submission sees it: the model files, with the exercised pieces' code removed.

The sandbox (``sandbox``) shows the submission a copy of the package made here, read-only, instead of the
installed one (which it hides). The copy holds:

* the model files (the top of ``modern_block``: what the lessons import), where every function, class or
  method the graded exercises ask the student to write (each check's ``components``), and every class of the
  package such a class derives from (``DecoderLM`` under ``LlamaStyleLM``: subclassing it would answer the
  exercise), keeps its signature but has its body replaced by a ``raise``: handing in ``modern_block.RMSNorm``,
  subclassing it or calling it inside one's own function fails in the student's process, with a message that
  says why;
* ``modern_block.classroom.checks`` as names that do nothing (the notebook's ``from modern_block.classroom
  import checks`` works; the checks and their reference formulas run in the grader only);
* the two modules the sandboxed process runs (``grading.runner``, ``grading.wire``).

The fast layer, interop, training and the rest of the classroom are not in it: none of the exercise notebooks
uses them, and each holds implementations of the pieces the exercises ask for.
"""

from __future__ import annotations

import ast
import compileall
import hashlib
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2]  # modern_block/classroom/grading/package_copy.py -> modern_block
RUNNER_FILES = ("classroom/grading/runner.py", "classroom/grading/wire.py")
CHECKS_STUB = '''"""The checks run in the grader, not in the submission's process: here every check does nothing."""

import contextlib


class CheckFailed(AssertionError):
    pass


class NotAttempted(AssertionError):
    pass


@contextlib.contextmanager
def graded(secret):
    yield


def _not_here(*args, **kwargs):
    return None


'''


def hidden_message(name: str) -> str:
    return (f"modern_block.{name} is not available while this notebook is graded: the exercise asks for your "
            "own implementation, written with plain PyTorch")


def _raise(name: str) -> list[ast.stmt]:
    return [ast.parse(f"raise RuntimeError({hidden_message(name)!r})").body[0]]


def hide(source: str, names: set[str]) -> tuple[str, set[str]]:
    """``source`` with the bodies of the top-level functions and classes named in ``names``, and of the methods
    named ``Class.method``, replaced by a ``raise`` (docstrings and comments go too); and the names found."""
    tree = ast.parse(source)
    found: set[str] = set()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and node.name in names:
            node.body = _raise(node.name)
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            whole = node.name in names
            if whole:
                found.add(node.name)
                node.body = [item for item in node.body if not (isinstance(item, ast.Expr) and
                                                                 isinstance(item.value, ast.Constant))] or [ast.Pass()]
            for item in node.body:
                qualified = f"{node.name}.{item.name}" if isinstance(item, functions) else ""
                if isinstance(item, functions) and (whole or qualified in names):
                    item.body = _raise(node.name if whole else qualified)
                    found.add(qualified)
    return ast.unparse(tree) + "\n", found


def model_files() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.name != "__main__.py")


def with_bases(hidden: frozenset[str], sources: list[str]) -> frozenset[str]:
    """``hidden`` and, for each class in it, the classes of ``sources`` (the model files) it derives from,
    transitively (a base named directly or as ``module.Name``)."""
    bases: dict[str, set[str]] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                                    if isinstance(b, (ast.Name, ast.Attribute))}
    out, todo = set(hidden), list(hidden)
    while todo:
        for base in bases.get(todo.pop(), set()) & set(bases):
            if base not in out:
                out.add(base)
                todo.append(base)
    return frozenset(out)


def build(root: Path, hidden: frozenset[str]) -> Path:
    """Write the copy for the components ``hidden`` under ``root`` (once per set) and return the folder to
    put on ``sys.path``. Components defined outside the model files (the trainer's ``lr_at``) are not in the
    copy at all."""
    key = hashlib.sha256("\n".join(sorted(hidden)).encode()).hexdigest()[:16]
    site = root / f"site-{key}"
    if site.is_dir():
        return site
    staging = root / f".staging-{key}"
    shutil.rmtree(staging, ignore_errors=True)
    target = staging / PACKAGE.name
    target.mkdir(parents=True)
    sources = {path: path.read_text(encoding="utf-8") for path in model_files()}
    hidden_all = with_bases(hidden, list(sources.values()))
    for path, text in sources.items():
        source, _ = hide(text, set(hidden_all))
        (target / path.name).write_text(source, encoding="utf-8")
    (target / "classroom" / "checks").mkdir(parents=True)
    (target / "classroom" / "grading").mkdir()
    (target / "classroom" / "__init__.py").write_text('"""The classroom, as a submission sees it."""\n')
    (target / "classroom" / "grading" / "__init__.py").write_text("")
    for name in RUNNER_FILES:
        shutil.copyfile(PACKAGE / name, target / name)
    from .. import checks

    stub = CHECKS_STUB + "".join(f"{name} = _not_here\n" for name in checks.__all__
                                  if name not in ("CheckFailed", "NotAttempted", "graded"))
    (target / "classroom" / "checks" / "__init__.py").write_text(stub + f"__all__ = {list(checks.__all__)!r}\n")
    compileall.compile_dir(str(staging), quiet=2)
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    staging.rename(site)
    return site
