"""Write the exercise notebooks (exercises/) from the solution notebooks (solutions/), the single source.

Each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block (nbgrader's markers) becomes one stub line whose hint
is the block's first ``# HINT:`` comment (``strip_solutions``; docs/instructors.md, "Changing or adding
exercises"). Outputs are cleared and the Colab badge points at the copy; the output is deterministic, and
``--check`` compares content, not JSON layout.

    python -m modern_block exercises build           # (re)write exercises/ from solutions/
    python -m modern_block exercises build --check   # list stale files and exit 1; write nothing
    python -m modern_block exercises course DIR      # an nbgrader course: its config and source/ from solutions/
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import sys
from pathlib import Path

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
HINT = "# HINT:"
DEFAULT_HINT = "replace this line with your code"
SOLUTIONS, EXERCISES = "solutions", "exercises"
GENERATED_KEY = "modern_block"  # notebook metadata key marking a generated exercise notebook
CELL_METADATA_DROPPED = ("execution", "collapsed", "scrolled")


class SolutionMarkerError(ValueError):
    """The solution markers of a cell are malformed (unmatched, nested or misspelt)."""


def _answer_name(block: list[str], where: str) -> str:
    """The name a top-level solution block assigns last (``llama3_70b_d_ff = ...``): the value item's answer."""
    try:
        tree = ast.parse("\n".join(block))
    except SyntaxError as err:
        raise SolutionMarkerError(f"{where}: the solution block is not valid Python ({err.msg})") from None
    names = [t.id for stmt in tree.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
             for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]) if isinstance(t, ast.Name)]
    if not names:
        raise SolutionMarkerError(f"{where}: a solution block at the top level of a cell must assign the answer "
                                  "(name = ...), which the exercise's stub sets to None")
    return names[-1]


def strip_solutions(source: str, where: str = "cell") -> str:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block of ``source`` by a stub line: inside a
    ``def`` or ``class``, ``raise NotImplementedError("<hint>")``; at the top level of a cell (a value item),
    ``<answer> = None  # <hint>``, so that the cell runs and the check says "not attempted"."""
    out: list[str] = []
    block: list[str] = []
    block_start, indent, hint = None, "", None
    for n, line in enumerate(source.split("\n"), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if block_start is not None:
                raise SolutionMarkerError(f"{where}, line {n}: {BEGIN} inside the block opened on line {block_start}")
            block_start, indent, hint, block = n, line[: len(line) - len(line.lstrip())], None, []
        elif stripped == END:
            if block_start is None:
                raise SolutionMarkerError(f"{where}, line {n}: {END} without a {BEGIN}")
            if indent:  # the hint as a Python string literal: JSON escapes are valid Python escapes
                out.append(f"{indent}raise NotImplementedError({json.dumps(hint or DEFAULT_HINT, ensure_ascii=False)})")
            else:
                out.append(f"{_answer_name(block, f'{where}, line {block_start}')} = None  # your answer: "
                           f"{hint or DEFAULT_HINT}")
            block_start = None
        elif "BEGIN SOLUTION" in line or "END SOLUTION" in line:
            raise SolutionMarkerError(f"{where}, line {n}: malformed marker {stripped!r}; write exactly "
                                      f"{BEGIN!r} or {END!r} on a line of its own")
        elif block_start is not None:
            block.append(line)
            if hint is None and stripped.startswith(HINT):
                hint = stripped[len(HINT):].strip()
        else:
            out.append(line)
    if block_start is not None:
        raise SolutionMarkerError(f"{where}, line {block_start}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def has_solution(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.split("\n"))


def exercise_notebook(solution, solution_path: str, exercise_path: str):
    """The exercise version of a solution notebook (a new NotebookNode; the input is not changed)."""
    nb = copy.deepcopy(solution)
    for i, cell in enumerate(nb.cells):
        where = f"{solution_path}, cell {i}"
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, where)
            cell.outputs = []
            cell.execution_count = None
            try:
                compile("\n".join(line for line in cell.source.split("\n") if not line.lstrip().startswith(("%", "!"))),
                        where, "exec")
            except SyntaxError as err:
                raise SolutionMarkerError(f"{where}: the stubbed cell is not valid Python ({err.msg}, line "
                                          f"{err.lineno}); put the markers around whole statements") from None
        elif "BEGIN SOLUTION" in cell.source or "END SOLUTION" in cell.source:
            raise SolutionMarkerError(f"{where}: solution markers are only supported in code cells")
        for key in CELL_METADATA_DROPPED:
            cell.metadata.pop(key, None)
    if nb.cells and nb.cells[0].cell_type == "markdown":  # the Colab badge opens this copy, not the solution
        nb.cells[0].source = nb.cells[0].source.replace(f"/{solution_path})", f"/{exercise_path})")
    nb.metadata.pop("widgets", None)
    nb.metadata[GENERATED_KEY] = {"generated_from": solution_path,
                                  "generator": "python -m modern_block exercises build"}
    return nb


def render(nb) -> str:
    """The exact file text: nbformat's own JSON (sorted keys, one-space indent) and a final newline."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def _content(text: str):
    """A notebook's content, independent of how its JSON is laid out."""
    try:
        return nbformat.reads(text, as_version=4)
    except Exception:  # unreadable: compare the raw text
        return text


def default_root() -> Path:
    """The current directory if it has solutions/, else the checkout this package lives in."""
    cwd = Path.cwd()
    if (cwd / SOLUTIONS).is_dir():
        return cwd
    return Path(__file__).resolve().parents[2]  # modern_block/classroom/exercises.py -> the checkout


def _is_generated(path: Path) -> bool:
    try:
        return GENERATED_KEY in json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return False


def build(root: Path | None = None, check: bool = False) -> list[str]:
    """Bring exercises/ in line with solutions/. Returns one line per file that was (check=True: would
    be) written or removed; an empty list means everything was up to date."""
    root = Path(root) if root is not None else default_root()
    src_dir, dst_dir = root / SOLUTIONS, root / EXERCISES
    if not src_dir.is_dir():
        raise FileNotFoundError(f"no {SOLUTIONS}/ folder in {root}")
    changes = []
    wanted = set()
    for src in sorted(src_dir.glob("*.ipynb")):
        dst = dst_dir / src.name
        wanted.add(dst.name)
        src_rel, dst_rel = f"{SOLUTIONS}/{src.name}", f"{EXERCISES}/{dst.name}"
        text = render(exercise_notebook(nbformat.read(src, as_version=4), src_rel, dst_rel))
        current = dst.read_text(encoding="utf-8") if dst.exists() else None
        if current == text:
            continue
        if current is None:  # --check lists what is missing; a build says what it writes
            changes.append(f"{dst_rel}: {'missing' if check else 'written, new'} (from {src_rel})")
        elif _content(current) != _content(text):
            changes.append(f"{dst_rel}: {'out of date' if check else 'rewritten, was out of date'} (from {src_rel})")
        elif check:  # same notebook, other JSON formatting (another nbformat version wrote it): not stale
            continue
        if not check:
            dst_dir.mkdir(exist_ok=True)
            dst.write_text(text, encoding="utf-8")
    for extra in sorted(dst_dir.glob("*.ipynb")) if dst_dir.is_dir() else []:
        if extra.name not in wanted and _is_generated(extra):
            changes.append(f"{EXERCISES}/{extra.name}: generated from a solution that no longer exists")
            if not check:
                extra.unlink()
    return changes


def course(folder: Path, lessons: list[str] | None = None, root: Path | None = None) -> list[str]:
    """An nbgrader course in ``folder``: ``nbgrader_config.py`` (the course's autograde engine in place of
    nbgrader's kernel; kept when it exists) and ``source/<lesson>/<lesson>.ipynb`` from each solution notebook
    (its markers, ids and points are nbgrader's). Returns one line per file written."""
    from .grading.autograde import CONFIG

    src_dir = (Path(root) if root is not None else default_root()) / SOLUTIONS
    names = sorted(p.stem for p in src_dir.glob("*.ipynb"))
    unknown = sorted(set(lessons or []) - set(names))
    if not names or unknown:
        raise FileNotFoundError(f"no solution notebook {', '.join(unknown)} in {src_dir}" if unknown
                                else f"no {SOLUTIONS}/ notebooks in {src_dir.parent}")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    config = folder / "nbgrader_config.py"
    if not config.exists():
        config.write_text(CONFIG, encoding="utf-8")
        written.append(f"{config}: written")
    for name in lessons or names:
        dst = folder / "source" / name / f"{name}.ipynb"
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((src_dir / f"{name}.ipynb").read_bytes())
        written.append(f"{dst}: written (from {SOLUTIONS}/{name}.ipynb)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modern_block exercises",
                                     description="Generate the exercise notebooks from the solution notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write exercises/ from solutions/")
    b.add_argument("--check", action="store_true", help="only list stale exercise notebooks; exit 1 if any")
    b.add_argument("--root", type=Path, default=None, help="folder holding solutions/ and exercises/")
    c = sub.add_parser("course", help="write an nbgrader course (nbgrader_config.py, source/) from solutions/")
    c.add_argument("folder", type=Path, help="the course folder (created; its nbgrader_config.py is kept)")
    c.add_argument("--lessons", nargs="+", default=None, help="only these lessons (01_rmsnorm ...)")
    c.add_argument("--root", type=Path, default=None, help="folder holding solutions/")
    args = parser.parse_args(argv)
    try:
        if args.command == "course":
            for line in course(args.folder, args.lessons, args.root):
                print(line)
            return 0
        changes = build(args.root, check=args.check)
    except (SolutionMarkerError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in changes:
        print(line)
    if args.check:
        if changes:
            print(f"{len(changes)} exercise notebook(s) are stale: run `python -m modern_block exercises build`")
            return 1
        print("exercises/ is up to date with solutions/")
        return 0
    print(f"wrote {len(changes)} exercise notebook(s)" if changes else "exercises/ was already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
