"""Reading notebooks, finding the reference's exercises, and planning a submission's run.

The reference (trusted) has an exercise per ``## Exercise N: title`` section, else per check cell (a cell calling
``checks.check_...``); points and ids are nbgrader's, read from the reference only. A submission's code cells run
in order, except the reference's check cells: each exercise is checked by the grader where its check cell stands.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field

MAX_NOTEBOOK_BYTES = 20 << 20
TOO_LARGE = f"the file is larger than {MAX_NOTEBOOK_BYTES >> 20} MB"
MAX_CELLS = 5_000  # a course notebook has about a hundred
MAX_VALUES = 1_000_000  # JSON containers and strings of one notebook, counted in its text before it is parsed
MAX_HEADING = 500  # characters: a longer line is never taken for a heading
MAX_LITERAL = 1 << 64  # a number a check cell may pass (a larger one is no exercise's argument)
SEPARATORS = ":.·—–-"
DEFAULT_POINTS = 1.0
MAX_POINTS = 1000.0  # a cell worth more is a typing slip, not a weight: it counts DEFAULT_POINTS
CHECK_CALL = re.compile(r"\bcheck_\w+\s*\(")


def heading(line: str) -> tuple[int, str] | None:
    """(level, text) of a markdown heading line ``# text`` (levels 1-6), else None (no regular expression meets a
    student's text)."""
    line = line.strip()
    if len(line) > MAX_HEADING or not line.startswith("#"):
        return None
    level = len(line) - len(line.lstrip("#"))
    rest = line[level:]
    if level > 6 or (rest and not rest[0].isspace()):
        return None
    return level, rest.strip()


def exercise_heading(line: str) -> tuple[int, int, str] | None:
    """(level, number, title) of a heading ``## Exercise N: title`` (any case; ``:``, ``.``, a dash or
    nothing after the number), else None."""
    line = line.strip()
    level = len(line) - len(line.lstrip("#"))
    if len(line) > MAX_HEADING or not 1 <= level <= 6:
        return None
    text = line[level:].lstrip()
    if text[:8].lower() != "exercise" or not text[8:9].isspace():
        return None
    rest = text[9:].lstrip()
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not 1 <= digits <= 6:
        return None
    title = rest[digits:].strip()
    if title[:1] and title[0] in SEPARATORS:
        title = title[1:].strip()
    return level, int(rest[:digits]), title


def calls_a_check(source: str) -> bool:
    """Whether ``source`` calls something named ``check_...(``: the pattern's parts match disjoint character
    classes, so the search is linear on any text (``tests/classroom/test_grade.py`` times it)."""
    return CHECK_CALL.search(source) is not None


class NotebookError(ValueError):
    """A file that cannot be graded; the message is the reason shown in the student's row."""


class BadReference(ValueError):
    """A reference notebook the grader cannot use (the grader stops: exit status 2)."""


@dataclass
class Cell:
    index: int
    kind: str  # "code", "markdown" or "raw"
    source: str
    id: str | None = None
    generated_from: str | None = None
    nbgrader: dict = field(default_factory=dict)  # the cell's nbgrader metadata (trusted in a reference only)


@dataclass
class CheckCall:
    check: str  # a name in modern_block.classroom.checks
    args: list  # ("name", str) or ("value", literal) per positional argument
    kwargs: dict

    @property
    def names(self) -> list[str]:
        return [v for kind, v in self.args + list(self.kwargs.values()) if kind == "name"]


@dataclass
class CheckCell:
    calls: list[CheckCall]
    points: float = DEFAULT_POINTS
    id: str | None = None
    grade_id: str = ""
    source: str = ""  # normalised: how a submission's copy is recognised


@dataclass
class RefExercise:
    number: int
    title: str
    cells: list[CheckCell] = field(default_factory=list)
    id: str = ""  # stable across runs: the answer cell's nbgrader grade_id, else exN

    @property
    def calls(self) -> list[CheckCall]:
        return [call for cell in self.cells for call in cell.calls]

    @property
    def check_ids(self) -> set:
        return {cell.id for cell in self.cells if cell.id}

    @property
    def check_sources(self) -> set:
        return {cell.source for cell in self.cells}

    @property
    def weights(self) -> list[float]:
        """The points of each check call, in order: a cell's points shared by its calls."""
        return [cell.points / len(cell.calls) for cell in self.cells for _ in cell.calls]


@dataclass
class Reference:
    name: str
    exercises: list[RefExercise]
    generated_from: str | None = None
    unchecked: list[tuple[int, str]] = field(default_factory=list)  # exercise sections without a check cell


def read_notebook(data: bytes) -> list[Cell]:
    """The cells of a notebook file's bytes; NotebookError says why a file is not a usable notebook."""
    if not data.strip():
        raise NotebookError("the file is empty")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(TOO_LARGE)
    # parsed, 20 MB of `[],` would be 7 million lists (400 MB): the grader counts before it parses
    if data.count(b"[") + data.count(b"{") + data.count(b'"') // 2 > MAX_VALUES:
        raise NotebookError(f"the notebook holds more than {MAX_VALUES:,} JSON values: not graded")
    if data.count(b'"cell_type"') > 2 * MAX_CELLS:
        raise NotebookError(f"the notebook has more than {MAX_CELLS:,} cells: not graded")
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise NotebookError("not a notebook: the file is not UTF-8 text (a binary file?)") from None
    except json.JSONDecodeError as err:
        raise NotebookError(f"not a notebook: not valid JSON ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise NotebookError("not a notebook: JSON nested too deeply") from None
    except ValueError:  # an integer of thousands of digits (Python's int() refuses it)
        raise NotebookError("not a notebook: its JSON holds a number of thousands of digits") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise NotebookError("not a notebook: the JSON has no cells")
    version = raw.get("nbformat")
    if version != 4:
        raise NotebookError(f"nbformat {version!r} is not supported (the grader reads version 4 notebooks; "
                            "open and save it in a current Jupyter)")
    cells = raw.get("cells")
    if not isinstance(cells, list):
        raise NotebookError("not a notebook: 'cells' is not a list")
    if not cells:
        raise NotebookError("the notebook has no cells")
    if len(cells) > MAX_CELLS:
        raise NotebookError(f"the notebook has more than {MAX_CELLS:,} cells: not graded")
    meta = raw["metadata"].get("modern_block") if isinstance(raw.get("metadata"), dict) else None
    generated = meta.get("generated_from") if isinstance(meta, dict) else None
    out = []
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise NotebookError(f"not a valid notebook: cell {i} has no cell_type code, markdown or raw")
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise NotebookError(f"not a valid notebook: cell {i} has no source text")
        cell_id = cell.get("id") if isinstance(cell.get("id"), str) else None
        cell_meta = cell.get("metadata")
        grader = cell_meta.get("nbgrader") if isinstance(cell_meta, dict) else None
        out.append(Cell(i, cell["cell_type"], source, cell_id, nbgrader=grader if isinstance(grader, dict) else {}))
    out[0].generated_from = generated if isinstance(generated, str) else None  # cells were checked non-empty
    return out


def normalised(source: str) -> str:
    """A cell's text as a check cell is recognised by: each line stripped, blank lines dropped."""
    return "\n".join(line.strip() for line in source.strip().splitlines() if line.strip())


def sections(cells: list[Cell]) -> list[tuple[int, str, list[Cell]]]:
    """(number, title, cells) of each ``Exercise N`` section, in order."""
    found: list[tuple[int, str, list[Cell]]] = []
    current: tuple[int, str, list[Cell]] | None = None
    level = 0
    for cell in cells:
        if cell.kind == "markdown":
            for line in cell.source.splitlines():
                exercise = exercise_heading(line)
                if exercise:
                    level, number, title = exercise
                    current = (number, title or f"Exercise {number}", [])
                    found.append(current)
                elif current is not None and (other := heading(line)) and other[0] <= level:
                    current = None
        elif current is not None:
            current[2].append(cell)
    return found


def parse_check_cell(cell: Cell) -> list[CheckCall]:
    """The check calls of a reference check cell: each statement ``[checks.]check_x(name or literal, ...)``."""
    from .. import checks
    from ..checks.hiding import parse_python

    try:
        tree = parse_python(cell.source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise BadReference(f"cell {cell.index}: not valid Python ({getattr(err, 'msg', None) or err})") from None
    calls = []
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        func = call.func if isinstance(call, ast.Call) else None
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if not isinstance(call, ast.Call) or name not in checks.__all__ or not name.startswith("check_"):
            raise BadReference(f"cell {cell.index}: a check cell must only call modern_block.classroom.checks "
                               f"functions, as in `checks.check_rms(rms)`; found {_shown(stmt)}")

        calls.append(CheckCall(name, [_argument(cell, a) for a in call.args],
                               {k.arg: _argument(cell, k.value) for k in call.keywords}))
    return calls


def _argument(cell: Cell, node: ast.AST) -> tuple:
    if isinstance(node, ast.Name):
        return ("name", node.id)
    if isinstance(node, ast.Constant) and not (isinstance(node.value, int) and abs(node.value) >= MAX_LITERAL) and \
            not (isinstance(node.value, (str, bytes)) and len(node.value) > 1000):
        return ("value", node.value)
    raise BadReference(f"cell {cell.index}: pass names or short literals to a check, not "
                       f"{_shown(node)}")


def _shown(node: ast.AST) -> str:
    """A node's source for a message, short (a huge number literal has no decimal text)."""
    try:
        return repr(ast.unparse(node)[:80])
    except (ValueError, RecursionError):
        return "an expression that cannot be shown"


def cell_points(meta: dict) -> float:
    """A check cell's points: nbgrader's ``points`` when it is a number from 0 to ``MAX_POINTS``, else 1."""
    value = meta.get("points")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_POINTS
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= MAX_POINTS else DEFAULT_POINTS


def reference_from(cells: list[Cell], name: str) -> Reference:
    """The exercises of a reference notebook, with their points and ids. Raises BadReference."""
    exercises, unchecked = [], []
    found = sections(cells)
    if not found:  # no headings: each check cell closes an exercise
        found = [(n, "", [c]) for n, c in enumerate(
            (c for c in cells if c.kind == "code" and calls_a_check(c.source)), start=1)]
    for number, title, section in found:
        ex = RefExercise(number, title)
        answer = ""
        for cell in section:
            if cell.kind == "code" and calls_a_check(cell.source):
                ex.cells.append(CheckCell(parse_check_cell(cell), cell_points(cell.nbgrader), cell.id,
                                          str(cell.nbgrader.get("grade_id", "")), normalised(cell.source)))
            elif cell.kind == "code" and cell.nbgrader.get("solution") and not answer:
                answer = str(cell.nbgrader.get("grade_id", ""))
        if not title and ex.calls:
            ex.title = ex.calls[0].check
        if ex.calls:
            checked = next((c.grade_id for c in ex.cells if c.grade_id), "").removesuffix("_check")
            ex.id = answer or checked or f"ex{number}"
            exercises.append(ex)
        else:
            unchecked.append((number, title))
    ids = [e.id for e in exercises]
    for ex in exercises:  # ids are unique within a lesson
        if ids.count(ex.id) > 1:
            ex.id = f"{ex.id}-{ex.number}"
    if not exercises:
        raise BadReference("no exercises found: expected sections headed '## Exercise N: title' with a cell "
                              "calling a modern_block.classroom.checks function")
    numbers = [e.number for e in exercises]
    if len(set(numbers)) != len(numbers):
        raise BadReference(f"exercise numbers repeat: {numbers}")
    return Reference(name, exercises, cells[0].generated_from if cells else None, unchecked)


@dataclass
class Plan:
    steps: list[tuple[str, Cell | RefExercise]]  # what to run, in order
    answers: dict[int, list[int]]  # exercise number -> the code cells that answer it (to say which failed)


def plan_run(cells: list[Cell], ref: Reference) -> Plan:
    """Where each of the reference's exercises is checked in the submission ``cells``. Raises NotebookError
    when the submission is plainly another lesson's notebook."""
    generated = cells[0].generated_from if cells else None
    if ref.generated_from and generated and generated != ref.generated_from:
        raise NotebookError(f"this notebook is {generated.rsplit('/', 1)[-1]}, the reference is "
                            f"{ref.generated_from.rsplit('/', 1)[-1]}: graded against the wrong lesson?")
    code = [c for c in cells if c.kind == "code"]
    all_ids = {i for e in ref.exercises for i in e.check_ids}
    all_sources = {s for e in ref.exercises for s in e.check_sources}
    is_check = {c.index for c in code if (c.id and c.id in all_ids) or normalised(c.source) in all_sources}
    by_number = {number: (title, section) for number, title, section in sections(cells)}
    end = cells[-1].index + 1
    points: dict[int, float] = {}  # exercise -> where its check goes among the cells
    matched = 0
    for ex in ref.exercises:
        by_id = [c.index for c in code if c.id and c.id in ex.check_ids]
        by_text = [c.index for c in code if normalised(c.source) in ex.check_sources]
        title, section = by_number.get(ex.number, ("", None))
        matched += bool(by_id or by_text or (section is not None and title.lower() == ex.title.lower()))
        if by_id or by_text:
            points[ex.number] = min(by_id or by_text)
        elif section:
            points[ex.number] = section[-1].index + 0.5
        else:
            points[ex.number] = end
    if not matched:
        raise NotebookError(f"none of the exercises of {ref.name} is in this notebook (no matching check cell "
                            "or 'Exercise N' heading): graded against the wrong lesson?")
    steps: list[tuple[float, int, tuple[str, Cell | RefExercise]]] = [
        *((c.index, 1, ("cell", c)) for c in code if c.index not in is_check and c.source.strip()),
        *((points[ex.number], 0, ("check", ex)) for ex in ref.exercises)]
    steps.sort(key=lambda s: s[:2])
    answers, previous = {}, -1.0
    for ex in sorted(ref.exercises, key=lambda e: points[e.number]):
        answers[ex.number] = [c.index for c in code
                              if previous < c.index < points[ex.number] and c.index not in is_check]
        previous = points[ex.number]
    return Plan([s for _, _, s in steps], answers)
