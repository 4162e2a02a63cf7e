"""The checks in a Jupyter notebook: the student's loop.

* A failing or not-attempted check prints its message (``✗`` / ``…``, on stderr) instead of raising, so Run All
  goes to the end of the notebook (nbgrader's autograde, which runs the notebook in a kernel too, scores a check
  cell with output on stderr as failed, as one that raised); ``summary()``, the notebook's last cell, lists
  every check that ran and its result.
* While the student's code runs inside a check, the package's own implementation of what the exercise asks
  for (the check's ``components``) raises, as it does in the grader's copy of the package: handing in
  ``modern_block.rope_cache``, subclassing it or calling it from one's own function is flagged here too.
* A value item typed in as a number literal is recognised from the notebook's input history.

A notebook is an IPython kernel (Jupyter, JupyterLab, VS Code, Colab); anywhere else (a script, pytest, the
grader) the checks raise as before.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import sys
import types

_RESULTS: dict[str, tuple[str, str]] = {}  # check name -> (status, message): the latest run of each
_FORCED: list[bool] = []


def active() -> bool:
    """Whether the checks run in a Jupyter kernel (or in ``notebook_mode()``)."""
    if _FORCED:
        return _FORCED[-1]
    shell = _shell()
    return shell is not None and getattr(shell, "kernel", None) is not None


@contextlib.contextmanager
def notebook_mode(on: bool = True):
    """Behave as in a notebook (or not) inside the block, whatever runs it (for tests)."""
    _FORCED.append(on)
    try:
        yield
    finally:
        _FORCED.pop()


def _shell():
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def report(name: str, error: BaseException | None, summary: str = "") -> None:
    """Print a check's result in the notebook and remember it for ``summary``."""
    from .core import NotAttempted

    if error is None:
        _RESULTS[name] = ("passed", summary)
        print(f"✓ {name} passed ({summary})")
    elif isinstance(error, NotAttempted):  # stderr too: nbgrader's autograde scores such a cell 0
        _RESULTS[name] = ("not attempted", str(error))
        print(f"… {error}", file=sys.stderr)
    else:
        _RESULTS[name] = ("failed", str(error))
        print(f"✗ {error}", file=sys.stderr)


def results() -> dict[str, tuple[str, str]]:
    return dict(_RESULTS)


def reset() -> None:
    _RESULTS.clear()


def summary_text() -> str:
    if not _RESULTS:
        return "No check has run yet: run the notebook's cells (Run All) first."
    width = max(len(n) for n in _RESULTS)
    marks = {"passed": "✓", "failed": "✗", "not attempted": "…"}
    lines = ["Checks run in this notebook:"]
    for name, (status, message) in _RESULTS.items():
        first = message.split("\n", 1)[0].split(": ", 1)[-1] if status != "passed" else ""
        lines.append(f"  {marks[status]} {name:<{width}}  {status}" + (f": {first}" if status == "failed" else ""))
    counts = {s: sum(1 for st, _ in _RESULTS.values() if st == s) for s in marks}
    lines.append(f"{counts['passed']} of {len(_RESULTS)} passed, {counts['failed']} failed, "
                 f"{counts['not attempted']} not attempted.")
    return "\n".join(lines)


def summary() -> None:
    """Print the result of every check that ran in this notebook (the exercise notebooks' last cell)."""
    print(summary_text())


# ---- the package's own implementations, hidden while the student's code runs ---------------------------


def _targets(name: str):
    """(owner, attribute) pairs to replace for the component ``name`` (``f``, ``Class`` or ``Class.method``),
    among the package's loaded modules outside the classroom."""
    top, _, method = name.partition(".")
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("modern_block.") or module_name.startswith("modern_block.classroom"):
            continue
        obj = vars(module).get(top)
        if obj is None or getattr(obj, "__module__", None) != module_name:
            continue
        if isinstance(obj, type):
            attrs = [method] if method else [k for k, v in vars(obj).items() if isinstance(v, types.FunctionType)]
            yield from ((obj, a) for a in attrs if isinstance(vars(obj).get(a), types.FunctionType))
        elif isinstance(obj, types.FunctionType) and not method and not obj.__code__.co_freevars:
            yield obj, None


def _raising_code(message: str) -> types.CodeType:
    namespace: dict = {}
    exec(f"def hidden(*args, **kwargs):\n    raise RuntimeError({message!r})\n", namespace)
    return namespace["hidden"].__code__


@contextlib.contextmanager
def hiding(components: tuple[str, ...]):
    """Inside the block, the package's ``components`` raise the grader's message when called."""
    if not components:
        yield
        return
    from ..grading.package_copy import hidden_message

    undo = []
    try:
        for name in components:
            for owner, attr in _targets(name):
                code = _raising_code(hidden_message(name))
                if attr is None:  # a function: every reference to it (from ... import) sees the new code
                    undo.append((owner, "__code__", owner.__code__))
                    owner.__code__ = code
                else:
                    original = vars(owner)[attr]
                    replacement = types.FunctionType(code, original.__globals__, attr)
                    undo.append((owner, attr, original))
                    setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


# ---- value items -------------------------------------------------------------------------------------


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float"):
        return len(node.args) == 1 and _is_literal(node.args[0])
    return False


_SOURCES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("modern_block_answer_sources",
                                                                                  default=None)


@contextlib.contextmanager
def answer_sources(sources: list[str]):
    """Inside the block ``typed_in`` reads these cell sources (in the order they ran) instead of the notebook's
    input history: the grader, which runs the checks outside the student's process, passes the submission's
    cells this way, so a value typed in fails there too (one context per grading thread)."""
    token = _SOURCES.set(tuple(sources))
    try:
        yield
    finally:
        _SOURCES.reset(token)


def has_sources() -> bool:
    return _SOURCES.get() is not None


def typed_in(name: str) -> bool:
    """Whether the latest cell that assigns ``name`` at its top level assigns a number literal (the cells: the
    grader's ``answer_sources``, else the notebook's input history)."""
    given = _SOURCES.get()
    if given is not None:
        history = list(given)
    else:
        shell = _shell()
        history = list(shell.user_ns.get("In", [])) if shell is not None else []
    for source in reversed(list(history)):
        if name not in source:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # a student's cell: any parse failure
            continue
        value: ast.expr | None = None
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign):
                targets, assigned = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, assigned = [stmt.target], stmt.value
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                value = assigned
        if value is not None:
            return _is_literal(value)
    return False
