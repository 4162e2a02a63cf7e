"""Feedback files: ``DIR/<student>/<lesson>.md``, each exercise's status, points and diagnosis, then the cells
that raised. Student text is escaped as in the report and fenced so it never renders as markup; file names are
made safe, with a short hash of the original where anything changed (``a/b`` and ``a_b`` stay apart).
"""

from __future__ import annotations

import hashlib
import os

from .class_folder import OutputError, write_atomic
from .grade_report import NOT_ATTEMPTED, PASSED, Report, number_text, one_line, printable, short_traceback

MAX_NAME = 80
_MARK = {PASSED: "✓", NOT_ATTEMPTED: "·"}
_MARKUP = set("\\`*_[]<>|~&")


def safe_name(name: str) -> str:
    """``name`` as a file or folder name on any system: no separators, no leading dot, bounded length."""
    kept = "".join(ch if ch.isalnum() or ch in "-_. " else "_" for ch in name).strip(" .")[:MAX_NAME]
    if not kept or kept != name or kept.upper().split(".")[0] in ("CON", "PRN", "AUX", "NUL"):
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        kept = f"{kept or '_'}-{digest}"
    return kept


def md(text: str) -> str:
    """A student's text inside a Markdown line: one line, markup characters escaped (an underscore inside a
    word, which Markdown leaves alone, stays as it is)."""
    text = one_line(text)
    out = []
    for k, ch in enumerate(text):
        inside = 0 < k < len(text) - 1 and text[k - 1].isalnum() and text[k + 1].isalnum()
        out.append("\\" + ch if ch in _MARKUP and not (ch == "_" and inside) else ch)
    return "".join(out)


def fenced(text: str) -> list[str]:
    """``text`` (escaped) as a fenced block that no run of backticks inside it can close."""
    run, longest = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *printable(text).splitlines(), fence]


def render(report: Report, graded_at: str = "") -> str:
    """The feedback file's text for one graded notebook."""
    lesson = report.lesson or os.path.basename(report.notebook)
    lines = [f"# Feedback: {md(lesson)}", "", f"Student: {md(report.student)}  ", f"Notebook: {md(report.notebook)}  "]
    if graded_at:
        lines.append(f"Graded: {md(graded_at)}  ")
    if report.max_score:
        lines.append(f"Score: **{number_text(report.score)} / {number_text(report.max_score)} points "
                     f"({report.percent:g}%)**")
    lines.append("")
    lines += [f"> {md(note)}" for note in report.notes] + ([""] if report.notes else [])
    if report.error:
        lines += ["This notebook could not be graded:", "", *fenced(report.error), ""]
    if report.exercises:
        lines += ["| exercise | result | points |", "|---|---|---|"]
        for e in report.exercises:
            lines.append(f"| {e.number}. {md(e.title)} | {_MARK.get(e.status, '✗')} {md(e.status)} | "
                         f"{number_text(e.points)} / {number_text(e.max_points)} |")
        lines.append("")
    for e in report.exercises:
        if e.status == PASSED or not e.detail:
            continue
        lines += [f"## Exercise {e.number}: {md(e.title)} ({md(e.status)})", "", *fenced(e.detail), ""]
    for cell in report.cells:
        lines += [f"## {md(report.label(cell['cell']))} raised an error", "", *fenced(cell["error"])]
        output = short_traceback(str(cell.get("output", ""))).strip()
        if output:
            lines += ["", "Its output (the traceback shows your code only):", "", *fenced(output)]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_all(root: str, reports: list[Report], graded_at: str = "") -> list[str]:
    """Write every report's feedback file under ``root``; returns the paths written. Raises OutputError
    for the first that cannot be written (the others are still tried first)."""
    if not os.path.isdir(root) or os.path.islink(root):
        raise OutputError(f"--feedback {root}: no such folder")
    written, problems = [], []
    for report in reports:
        lesson = report.lesson or os.path.splitext(os.path.basename(report.notebook))[0]
        folder = os.path.join(root, safe_name(report.student))
        try:
            if not os.path.lexists(folder):
                os.mkdir(folder)
            elif os.path.islink(folder) or not os.path.isdir(folder):
                raise OutputError(f"--feedback {folder}: not a folder of its own (a link?); not written through")
            path = os.path.join(folder, safe_name(lesson) + ".md")
            write_atomic(path, render(report, graded_at), "--feedback")
            written.append(path)
        except OSError as err:
            problems.append(f"--feedback {root}: {err.strerror or err}")
        except OutputError as err:
            problems.append(str(err))
    if problems:
        raise OutputError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return written
