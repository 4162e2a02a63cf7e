"""scripts/time_lessons.py: each lesson timed in a fresh kernel in full and quick mode, the times written with the
machine and torch, and the README's table generated from them (the committed table is the committed file's)."""

import json

import nbformat
import pytest
from repo_files import ROOT, load_module

times = load_module("scripts/time_lessons.py")


def test_the_readme_table_is_the_committed_measurement():
    results = times.load()
    assert times.table(results) in (ROOT / "README.md").read_text(), "run python scripts/time_lessons.py --readme"
    ids = {times.lesson_id(p) for p in times.lessons()}
    assert set(results["lessons"]) <= ids, "an entry for a lesson that is not in notebooks/"
    for lesson in results["lessons"].values():
        for mode, entry in lesson.items():
            assert mode in times.MODES and ("seconds" in entry) != ("error" in entry) and entry["date"]
    if results["lessons"]:
        assert {"cpu", "cores", "torch", "python"} <= set(results["machine"])
    assert "runs in about a minute" not in (ROOT / "README.md").read_text()


def lesson(folder, name, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "notebooks" / name)


def test_each_lesson_runs_in_a_fresh_kernel_in_both_modes_and_lands_in_the_table(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    # each mode must see its own setting, and the kernel is fresh (nothing left from the previous run)
    lesson(tmp_path, "00_first.ipynb", "import os, sys\nassert 'seen' not in dir(sys)\nsys.seen = 1",
           "mode = os.environ.get('MODERN_BLOCK_QUICK')\nprint(mode)\nassert mode in (None, '1')")
    lesson(tmp_path, "01_broken.ipynb", "raise ValueError('a broken lesson')")
    monkeypatch.setenv("MODERN_BLOCK_QUICK", "1")  # the full mode must remove it
    out = tmp_path / "times.json"
    results = times.measure(["00", "01"], list(times.MODES), timeout=60, path=out, root=tmp_path)
    assert json.loads(out.read_text()) == results
    first = results["lessons"]["00"]
    assert set(first) == {"full", "quick"} and all(0 < e["seconds"] < 60 for e in first.values())
    assert first["full"]["slowest_cell"] in (0, 1) and "load_before" in first["quick"]
    assert "ValueError: a broken lesson" in results["lessons"]["01"]["quick"]["error"]
    assert results["machine"]["cores"] >= 1 and results["machine"]["torch"]
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{times.BEGIN}\nold\n{times.END}\nafter\n")
    assert times.write_readme(results, readme, tmp_path) and not times.write_readme(results, readme, tmp_path)
    text = readme.read_text()
    assert "| 00 | " in text and "| 01 | failed | failed | 90 s |" in text and "old" not in text
    assert text.startswith("before\n") and text.endswith("after\n")
    with pytest.raises(SystemExit, match="no lesson 07"):
        times.measure(["07"], ["quick"], 60, out, tmp_path)
    again = times.measure(["00"], ["quick"], 60, out, tmp_path)  # one entry replaced, the others kept
    assert set(again["lessons"]) == {"00", "01"} and "full" in again["lessons"]["00"]
