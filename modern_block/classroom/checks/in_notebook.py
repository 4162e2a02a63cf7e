"""The student's loop in Jupyter, and how a value item's answer is read.

A failing or not-attempted check prints its message on stderr instead of raising, so Run All goes on (nbgrader
scores such a cell as failed); ``summary()`` lists every check that ran. A value item is read from the cells that
ran (the input history, or the submission's cells in the grader): the latest cell assigning it must compute it,
not type a number in (``7 * 4096``) or look it up in a table (``PRESETS``); in a notebook that cell runs again
with the exercise's pieces hidden, as in the grader.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import sys

from .errors import NotAttempted
from .mode import answer_sources  # noqa: F401  (the grader's way of passing the submission's cells)

_RESULTS: dict[str, tuple[str, str]] = {}  # check name -> (status, message): the latest run of each
_PURE = {"int", "float", "round", "abs", "pow", "eval", "str", "sum", "max", "min", "divmod", "complex"}


def report(name: str, error: BaseException | None, summary: str = "") -> None:
    """Print a check's result in the notebook and remember it for ``summary``."""
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


def summary() -> None:
    """Print the result of every check that ran in this notebook (the exercise notebooks' last cell)."""
    if not _RESULTS:
        print("No check has run yet: run the notebook's cells (Run All) first.")
        return
    width = max(len(n) for n in _RESULTS)
    marks = {"passed": "✓", "failed": "✗", "not attempted": "…"}
    lines = ["Checks run in this notebook:"]
    for name, (status, message) in _RESULTS.items():
        first = message.split("\n", 1)[0].split(": ", 1)[-1] if status != "passed" else ""
        lines.append(f"  {marks[status]} {name:<{width}}  {status}" + (f": {first}" if status == "failed" else ""))
    counts = {s: sum(1 for st, _ in _RESULTS.values() if st == s) for s in marks}
    lines.append(f"{counts['passed']} of {len(_RESULTS)} passed, {counts['failed']} failed, "
                 f"{counts['not attempted']} not attempted.")
    print("\n".join(lines))


# ---- value items ---------------------------------------------------------------------------------------


def _statements(body: list[ast.stmt]):
    """The statements of a cell that run in its namespace: the top level and the blocks of with, if, for, while
    and try (not the bodies of functions and classes)."""
    for stmt in body:
        yield stmt
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                yield from _statements(getattr(stmt, field, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _statements(handler.body)


def _assignments(source: str, name: str) -> list[ast.expr]:
    """The values a cell assigns to ``name`` in its namespace, in order."""
    from .hiding import parse_python

    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a student's cell: any parse failure
        return []
    found = []
    for stmt in _statements(tree.body):
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found.append(value)
    return found


def answer_cell(sources, name: str) -> tuple[str, ast.expr] | None:
    """The latest cell that assigns ``name`` (outside a function), and the value it assigns last."""
    for source in reversed(list(sources)):
        if name in source and (values := _assignments(source, name)):
            return source, values[-1]
    return None


def _literal_only(node: ast.AST) -> bool:
    """Numbers and strings, and arithmetic or builtin conversions of them only: no name of the problem."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, str, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _literal_only(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal_only(node.left) and _literal_only(node.right)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal_only(e) for e in node.elts)
    if isinstance(node, ast.Call):
        func = node.func
        pure = (isinstance(func, ast.Name) and func.id in _PURE) or (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math")
        return pure and all(_literal_only(a) for a in node.args) and all(_literal_only(k.value) for k in node.keywords)
    return False


def _resolved(sources, value: ast.expr, depth: int = 0) -> ast.expr:
    """``value`` with a bare name (or a conversion of one, ``int(x)``) replaced by what the cells assigned to it."""
    inner = value
    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id in _PURE and \
            len(inner.args) == 1 and not inner.keywords:
        inner = inner.args[0]
    if depth < 8 and isinstance(inner, ast.Name) and not hasattr(builtins, inner.id):
        found = answer_cell(sources, inner.id)
        if found is not None:
            return _resolved(sources, found[1], depth + 1)
    return value


def not_computed(sources, name: str, tables: tuple[str, ...]) -> str | None:
    """Why the latest cell assigning ``name`` does not compute it (typed in, or read from one of ``tables``), or
    None when it does (or no cell assigns it)."""
    found = answer_cell(sources, name)
    if found is None:
        return None
    value = _resolved(sources, found[1])
    if _literal_only(value):
        return (f"{name} is typed in (a number, or arithmetic on numbers only); the exercise asks for it computed: "
                "name the model's sizes (n_layers = 61, ...) and write the formula with those names, or call a "
                "function of your own, so the cell shows how the value comes about.")
    read = sorted({n.id for n in ast.walk(value) if isinstance(n, ast.Name)} |
                  {n.attr for n in ast.walk(value) if isinstance(n, ast.Attribute)})
    looked_up = [t for t in tables if t in read]
    if looked_up:
        return (f"{name} is looked up in modern_block.{looked_up[0]}, the package's table of answers; the exercise "
                "asks for it computed from the model's sizes.")
    return None


def rerun_hidden(source: str, name: str, namespace, hidden: tuple[str, ...]) -> str | None:
    """Run ``source`` (the cell that assigned ``name``) again in a copy of ``namespace`` with ``hidden`` hidden,
    as the grader runs it; why it no longer assigns ``name``, or None when it does."""
    from .hiding import grader_view

    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)  # line magics, as the kernel ran them
    except Exception:  # no IPython (a plain process): the cell as written
        pass
    if "run_cell_magic" in source:  # a cell magic runs in the kernel's own namespace: not repeatable here
        return None
    scope = dict(namespace)
    scope.pop(name, None)
    error: BaseException | None = None
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            grader_view(hidden):
        try:
            exec(compile(source, "<answer cell>", "exec"), scope)
        except Exception as err:
            error = err
    if name in scope:
        return None
    why = f"{type(error).__name__}: {error}" if error is not None else "it no longer assigns it"
    return (f"{name}'s cell fails as the grader runs it, with the package's own answer hidden ({why}); compute "
            "the value yourself.")
