"""Static checks over the committed lesson notebooks (nbval executes them separately).

* every notebook agrees with scripts/stamp_notebooks.py (Colab badge and setup cell);
* each notebooks/*.ipynb is a valid notebook with the required sections, saved with the outputs of
  one clean top-to-bottom run (every code cell executed, in order), with no errors, stderr,
  warnings or memory addresses in its outputs, and small enough to review.

Parametrised over the notebooks that exist, so lessons added later are covered too.
"""

import re
from pathlib import Path

import nbformat
import pytest
from repo_files import load_module

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REQUIRED_SECTIONS = ("What you'll learn", "Common pitfalls", "Check your understanding", "Key takeaways")
MAX_BYTES = 1_500_000
MEMORY_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]+")


stamp_notebooks = load_module("scripts/stamp_notebooks.py")


def _output_texts(cell) -> list[str]:
    """Every piece of text a code cell's outputs show: streams, plain/HTML/markdown data, tracebacks."""
    texts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            texts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            for mime in ("text/plain", "text/html", "text/markdown", "text/latex"):
                if mime in out.get("data", {}):
                    texts.append(out.data[mime])
        elif out.output_type == "error":
            texts.append("\n".join(out.traceback))
    return texts


@pytest.fixture(params=LESSONS, ids=lambda p: p.name)
def lesson(request):
    return request.param, nbformat.read(request.param, as_version=4)


# ---- the stamp ---------------------------------------------------------------------------------------


def test_notebooks_agree_with_the_stamp():
    problems = stamp_notebooks.check(ROOT)
    assert not problems, "run `python scripts/stamp_notebooks.py`:\n" + "\n".join(problems)


def _write_project(root: Path, url: str) -> Path:
    (root / "pyproject.toml").write_text(f'[project]\nname = "x"\n[project.urls]\nRepository = "{url}"\n')
    (root / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 09 · Test\n\n[![Open In Colab](old.svg)](https://example.org/old)\n\nText."),
        nbformat.v4.new_code_cell("# Setup: stale text", execution_count=1),
        nbformat.v4.new_code_cell("print(1)", execution_count=2,
                                  outputs=[nbformat.v4.new_output("stream", name="stdout", text="1\n")]),
    ]
    path = root / "notebooks" / "09_test.ipynb"
    nbformat.write(nb, path)
    return path


def test_stamp_finds_and_fixes_a_stale_notebook(tmp_path):
    path = _write_project(tmp_path, "https://github.com/someone/course")
    before = nbformat.read(path, as_version=4)
    assert stamp_notebooks.check(tmp_path) == ["notebooks/09_test.ipynb: Colab badge, setup cell out of date"]
    assert stamp_notebooks.main(["--check", "--root", str(tmp_path)]) == 1

    stamp_notebooks.stamp_all(tmp_path)
    after = nbformat.read(path, as_version=4)
    assert stamp_notebooks.check(tmp_path) == []
    assert stamp_notebooks.main(["--check", "--root", str(tmp_path)]) == 0
    assert after.cells[0].source == (
        "# 09 · Test\n\n[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/someone/course/blob/main/notebooks/09_test.ipynb)\n\nText.")
    assert 'REPO_URL = "https://github.com/someone/course"' in after.cells[1].source
    assert after.cells[1].source == stamp_notebooks.setup_source("https://github.com/someone/course")
    # outputs, execution counts and the other cells are untouched
    assert after.cells[1].execution_count == 1
    assert after.cells[2] == before.cells[2]


def test_stamp_inserts_a_missing_setup_cell(tmp_path):
    path = _write_project(tmp_path, "https://github.com/someone/course")
    nb = nbformat.read(path, as_version=4)
    del nb.cells[1]
    nbformat.write(nb, path)
    stamp_notebooks.stamp_all(tmp_path)
    cells = nbformat.read(path, as_version=4).cells
    assert [c.cell_type for c in cells] == ["markdown", "code", "code"]
    assert cells[1].source.startswith("# Setup:") and cells[2].source == "print(1)"


def test_stamp_rejects_a_bad_repository_address(tmp_path):
    _write_project(tmp_path, "git@github.com:someone/course")
    with pytest.raises(ValueError, match="Repository"):
        stamp_notebooks.check(tmp_path)


# ---- structure of each lesson notebook --------------------------------------------------------------


def test_valid_nbformat_and_kernel(lesson):
    path, nb = lesson
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel must be python3"


def test_title_cell(lesson):
    path, nb = lesson
    number = re.match(r"\d\d[a-z]?", path.name).group()  # 09, 09b
    assert nb.cells[0].source.startswith(f"# {number} · "), f"{path.name}: cell 0 must start with '# {number} · '"


def test_required_sections(lesson):
    path, nb = lesson
    headings = [line for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("#")]
    missing = [s for s in REQUIRED_SECTIONS if not any(s in h for h in headings)]
    assert not missing, f"{path.name}: missing section headings {missing}"


def test_saved_with_outputs_of_one_clean_run(lesson):
    path, nb = lesson
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    unexecuted = [i for i, n in enumerate(counts, 1) if n is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} (counting code cells) were never executed"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(counts)}: save one fresh top-to-bottom run")


def test_outputs_are_clean(lesson):
    path, nb = lesson
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            assert out.output_type != "error", f"{path.name} cell {i}: error output {out.get('ename')}"
            assert not (out.output_type == "stream" and out.name == "stderr"), (
                f"{path.name} cell {i}: stderr output {out.text[:200]!r}")
        for text in _output_texts(cell):
            assert "Warning" not in text, f"{path.name} cell {i}: warning in the output: {text[:300]!r}"
            assert not MEMORY_ADDRESS.search(text), f"{path.name} cell {i}: memory address in the output"


def test_size(lesson):
    path, _ = lesson
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{path.name}: {size:,} bytes (limit {MAX_BYTES:,}); lower plot dpi or trim outputs"
