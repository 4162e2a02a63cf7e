"""Students' notebooks for the grader's tests: the handed-out exercise notebooks with some answer cells
replaced (right answers, wrong ones, cheats, hostile code), written into a class folder."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def sandbox_problem() -> str | None:
    """Why no grading sandbox starts here, or None; the launcher started is kept for the tests that grade in
    this process."""
    from modern_block.classroom.grading import grade
    from modern_block.classroom.grading.sandbox import SandboxError

    try:
        grade.launcher_for(None, grade.Limits())
    except SandboxError as err:
        return str(err)
    return None


def read_report(text: str) -> dict:
    """The grader's JSON lines (``--json``, ``--json-file``), one report per notebook, as one document."""
    import json

    return {"notebooks": [json.loads(line) for line in text.splitlines() if line.strip()]}


def exercise(lesson: str):
    return nbformat.read(ROOT / "exercises" / f"{lesson}.ipynb", as_version=4)


def solution(lesson: str):
    return nbformat.read(ROOT / "solutions" / f"{lesson}.ipynb", as_version=4)


def answered(lesson: str, answers: dict[str, str] | None = None, before_first: str | None = None,
             base: str = "exercises"):
    """The lesson's exercise (or solution) notebook with the answer cells named by their nbgrader grade_id
    replaced; ``before_first`` adds a code cell before the first exercise (a setup cell)."""
    nb = copy.deepcopy(exercise(lesson) if base == "exercises" else solution(lesson))
    answers = dict(answers or {})
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers.pop(grade_id)
    assert not answers, f"no cells {sorted(answers)} in {lesson}"
    if before_first is not None:
        first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercise" in c.source)
        nb.cells.insert(first, nbformat.v4.new_code_cell(before_first))
    return nb


def write(folder: Path, student: str, lesson: str, nb) -> Path:
    path = folder / student / f"{lesson}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, bytes):
        path.write_bytes(nb)
    else:
        nbformat.write(nb, path)
    return path


RIGHT_RMS = "def rms(x, eps=1e-6):\n    return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()"
WRONG_RMS = "def rms(x, eps=1e-6):\n    return (x.float().var(-1, unbiased=False, keepdim=True) + eps).sqrt()"
IDENTITY_RMSNORM = ("class RMSNorm(nn.Module):\n    def __init__(self, d, eps=1e-6):\n        super().__init__()\n"
                    "        self.eps = eps\n        self.weight = nn.Parameter(torch.ones(d))\n\n"
                    "    def forward(self, x):\n        return x")
LAYERNORM_RMSNORM = ("class RMSNorm(nn.Module):\n    def __init__(self, d, eps=1e-6):\n        super().__init__()\n"
                     "        self.eps = eps\n        self.weight = nn.Parameter(torch.ones(d))\n\n"
                     "    def forward(self, x):\n        x32 = x.float() - x.float().mean(-1, keepdim=True)\n"
                     "        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)\n"
                     "        return y.type_as(x) * self.weight")


def solution_source(lesson: str, grade_id: str) -> str:
    """The answer cell ``grade_id`` of the lesson's solution notebook."""
    for cell in solution(lesson).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell.source
    raise KeyError(f"no cell {grade_id} in {lesson}")


def injected(lesson: str, grade_id: str, after: str, lines: str) -> str:
    """The solution's answer cell with ``lines`` inserted before the first line containing ``after``, at
    that line's indentation (an attack hidden inside a right answer)."""
    source = solution_source(lesson, grade_id)
    out, done = [], False
    for line in source.split("\n"):
        if not done and after in line:
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + extra for extra in lines.split("\n")]
            done = True
        out.append(line)
    assert done, f"no line with {after!r} in {lesson}/{grade_id}"
    return "\n".join(out)
