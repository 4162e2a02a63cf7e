"""The course package as a submission sees it: the model files, with the exercised pieces' code removed.

Every function, class or method an exercise asks for (each check's ``components``), and every package class such
a class derives from, keeps its signature but raises; ``checks`` becomes names that do nothing (the checks run in
the grader); and the two modules the sandboxed process runs (``runner``, ``wire``) are copied. The rest of the
package holds implementations of exercised pieces and is left out. What each exercise hides is ``checks.hiding``.
"""

from __future__ import annotations

import ast
import compileall
import hashlib
import shutil
from pathlib import Path

from .. import checks
from ..checks.hiding import PACKAGE, hidden_message, model_files, parse_python, sandbox_stub, with_bases

RUNNER_FILES = ("classroom/grading/runner.py", "classroom/grading/wire.py")


def _raise(name: str) -> list[ast.stmt]:
    call = ast.Call(ast.Name("RuntimeError", ast.Load()), [ast.Constant(hidden_message(name))], [])
    return [ast.Raise(exc=call, cause=None)]


def hide(source: str, names: set[str]) -> tuple[str, set[str]]:
    """``source`` with the bodies of the top-level functions and classes named in ``names``, and of the methods
    named ``Class.method``, replaced by a ``raise`` (docstrings and comments go too); and the names found."""
    tree = parse_python(source)
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
    (target / "classroom" / "checks" / "__init__.py").write_text(sandbox_stub(hidden_all, checks.__all__))
    compileall.compile_dir(str(staging), quiet=2)
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    staging.rename(site)
    return site
