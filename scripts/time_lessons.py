"""Measure how long each lesson takes, as a learner runs it: every notebook in a fresh Jupyter kernel, one at a
time, top to bottom, in full mode and in quick mode (``MODERN_BLOCK_QUICK=1``), on all the machine's cores.

The times go to ``benchmarks/lesson_times.json`` with the machine (CPU, cores), torch, Python and the date, and
the README's table of lesson times is generated from that file (a test checks that the two agree):

    python scripts/time_lessons.py                      # every lesson, both modes (then --readme)
    python scripts/time_lessons.py --mode quick 00 03   # some lessons, one mode: their entries are replaced
    python scripts/time_lessons.py --readme             # only rewrite the README's table from the JSON file

A lesson that fails is recorded with its error and no time. Other processes on the machine slow every lesson
down: measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "lesson_times.json"
README = ROOT / "README.md"
MODES = ("full", "quick")
BEGIN, END = "<!-- lesson times: begin (scripts/time_lessons.py) -->", "<!-- lesson times: end -->"
BUDGET_S = {"quick": 90, "capstone": 180}  # the course's budgets on 2 cores in quick mode (COURSE.md)
CAPSTONES = ("08", "09", "10", "11")


def lesson_id(path: Path) -> str:
    """'08b' for notebooks/08b_ladder_and_ablations.ipynb."""
    return path.name.split("_", 1)[0]


def lessons(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9]*.ipynb"))


def machine() -> dict:
    import torch

    from modern_block.training.device import cpu_name

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name(), "cores": cores, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "platform": platform.platform()}


def run_lesson(path: Path, mode: str, timeout: int) -> dict:
    """Execute one notebook in a fresh kernel (started and shut down here) in its own folder; the wall time
    covers the kernel's start and every cell. Returns {"seconds", "slowest_cell", "slowest_cell_s"} or
    {"error"}."""
    import nbformat
    from nbclient import NotebookClient

    env = dict(os.environ)
    env.pop("MODERN_BLOCK_QUICK", None)
    if mode == "quick":
        env["MODERN_BLOCK_QUICK"] = "1"
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])  # no start-up chatter
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except Exception as exc:  # a failing cell, a timeout, a dead kernel: recorded, the next lesson runs
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # without the traceback's colours
        return {"error": f"{type(exc).__name__}: {text.splitlines()[-1][:200] if text else ''}"}
    seconds = time.perf_counter() - start
    cells = [(i, cell_seconds(c)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    slowest = max(cells, key=lambda c: c[1])
    return {"seconds": round(seconds, 1), "slowest_cell": slowest[0], "slowest_cell_s": round(slowest[1], 1)}


def cell_seconds(cell) -> float:
    """A cell's own run time from the timestamps nbclient records (0 when it has none)."""
    t = cell.get("metadata", {}).get("execution", {})
    a, b = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (a and b):
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(b) - parse(a)).total_seconds()


def load(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"machine": None, "lessons": {}}


def measure(ids: list[str], modes: list[str], timeout: int, path: Path = RESULTS, root: Path = ROOT) -> dict:
    """Run the chosen lessons in the chosen modes and write each result into the JSON file as it comes."""
    results = load(path)
    found = {lesson_id(p): p for p in lessons(root)}
    unknown = [i for i in ids if i not in found]
    if unknown:
        raise SystemExit(f"no lesson {', '.join(unknown)} in {root / 'notebooks'} (lessons: {', '.join(found)})")
    here = machine()
    if results.get("machine") not in (None, here):  # one file, one machine and torch: the table names them once
        print(f"the file's times came from {results['machine']}; this is {here}: starting a new file")
        results = {"machine": None, "lessons": {}}
    results["machine"] = here
    for i in ids or list(found):
        for mode in modes:
            print(f"lesson {i}, {mode} mode ...", end=" ", flush=True)
            load_before = os.getloadavg()[0]  # other processes' load: the times are true only on a quiet machine
            entry = run_lesson(found[i], mode, timeout)
            entry.update(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         load_before=round(load_before, 2))
            results["lessons"].setdefault(i, {})[mode] = entry
            print(entry.get("error") or f"{entry['seconds']:.0f} s (slowest cell {entry['slowest_cell']}: "
                                         f"{entry['slowest_cell_s']:.0f} s)")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return results


def fmt_time(entry: dict | None) -> str:
    if not entry:
        return "not measured"
    if "error" in entry:
        return "failed"
    s = entry["seconds"]
    return f"{s:.0f} s" if s < 120 else f"{s:.0f} s ({s / 60:.1f} min)"


def table(results: dict, root: Path = ROOT) -> str:
    """The README's table: one row per lesson in notebooks/, its measured full and quick times."""
    m = results.get("machine") or {}
    measured = [e for lesson in results.get("lessons", {}).values() for e in lesson.values() if "date" in e]
    dates = sorted(e["date"][:10] for e in measured)
    load = max((e.get("load_before", 0.0) for e in measured), default=0.0)
    where = (f"Measured by `python scripts/time_lessons.py` ({dates[0] if dates else 'not yet run'}"
             f"{' to ' + dates[-1] if dates and dates[-1] != dates[0] else ''}) on {m.get('cpu', '?')}, "
             f"{m.get('cores', '?')} cores, torch {m.get('torch', '?')}: each lesson alone, top to bottom in a "
             f"fresh kernel (its start included); the largest 1-minute load average before a lesson was {load:.1f}. "
             f"Quick mode's budget on 2 cores: {BUDGET_S['quick']} s a lesson, {BUDGET_S['capstone']} s for the "
             f"capstones {', '.join(CAPSTONES)}.")
    rows = ["| lesson | full mode | quick mode (`MODERN_BLOCK_QUICK=1`) | quick budget |", "|---|---|---|---|"]
    for path in lessons(root):
        i = lesson_id(path)
        e = results.get("lessons", {}).get(i, {})
        budget = BUDGET_S["capstone" if i in CAPSTONES else "quick"]
        rows.append(f"| {i} | {fmt_time(e.get('full'))} | {fmt_time(e.get('quick'))} | {budget} s |")
    return "\n".join([BEGIN, textwrap.fill(where, 116), "", *rows, END])


def write_readme(results: dict, readme: Path = README, root: Path = ROOT) -> bool:
    """Replace the table between the markers; True when the README changed."""
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no table markers ({BEGIN} ... {END})")
    new = pattern.sub(lambda _: table(results, root), text)
    if new != text:
        readme.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lessons", nargs="*", help="lesson numbers (00, 08b, ...); all by default")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run (default 1800)")
    parser.add_argument("--readme", action="store_true", help="only rewrite the README's table from the JSON file")
    args = parser.parse_args(argv)
    if not args.readme:
        measure(args.lessons, list(MODES) if args.mode == "both" else [args.mode], args.timeout)
    changed = write_readme(load())
    print(f"README's table {'updated' if changed else 'unchanged'} ({RESULTS.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
