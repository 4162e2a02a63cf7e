"""The notebooks' setup cell, as Colab runs it: it must install the course package so that it imports.

The cell's text is taken from a lesson notebook. It runs in a throwaway virtual environment that sees this
environment's packages through a .pth file placed after its own site-packages (so torch and the other
dependencies are there, and nothing needs downloading except the build backend), with the source pointed at a
copy of this checkout (``MODERN_BLOCK_SOURCE``) and Colab simulated by the ``MODERN_BLOCK_FORCE_SETUP`` variable.
Afterwards ``import modern_block`` in that environment must resolve to the copy the cell installed into the venv,
not to this checkout. The other signal, a ``google.colab`` module in ``sys.modules``, must take the same branch
(shown with a source pip cannot install, so the install is not paid twice); without either signal the cell
must install nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup_cell() -> str:
    lesson = sorted((ROOT / "notebooks").glob("*.ipynb"))[0]
    source = nbformat.read(lesson, as_version=4).cells[1].source
    assert source.startswith("# Setup:") and "MODERN_BLOCK_SOURCE" in source, f"{lesson.name} cell 1 is not the setup"
    return source


def _checkout_copy(dst: Path) -> Path:
    """The files of this checkout that git tracks or would track (what a clone holds), copied to ``dst``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                capture_output=True).stdout.decode().split("\0")
        files = [f for f in listed if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts
                 and ".venv" not in p.parts]
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst / f)
    return dst


def _venv(path: Path) -> Path:
    """A venv without pip of its own that sees this environment's site-packages after its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    site_dirs = dict.fromkeys(p for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))
    Path(purelib, "_parent_env.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in site_dirs))
    return python


# Runs inside the venv: simulate Colab as asked, execute the cell, then report where modern_block comes from
# in a fresh interpreter (a new Python, as after Colab's runtime picks up the install).
RUN_CELL = r'''
import json, os, subprocess, sys, types
cell = open(sys.argv[1]).read()
if sys.argv[2] == "google.colab":
    sys.modules["google"] = types.ModuleType("google")
    sys.modules["google.colab"] = types.ModuleType("google.colab")
exec(compile(cell, "setup-cell", "exec"), {"__name__": "__main__"})
probe = ("import importlib.metadata as md, json, modern_block, sys; "
         "print(json.dumps({'file': modern_block.__file__, 'prefix': sys.prefix, "
         "'version': md.version('modern-block'), 'has_model': hasattr(modern_block, 'LlamaStyleLM')}))")
print(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout)
'''


def _run_setup(tmp_path: Path, signal: str, source: Path) -> tuple[Path, dict | None, subprocess.CompletedProcess]:
    python = _venv(tmp_path / "venv")
    cell = tmp_path / "setup_cell.py"
    cell.write_text(_setup_cell())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODERN_BLOCK_FORCE_SETUP", "PIP_TARGET",
                                                            "PIP_USER", "PYTHONUSERBASE")}
    env["MODERN_BLOCK_SOURCE"] = str(source)
    if signal == "env":
        env["MODERN_BLOCK_FORCE_SETUP"] = "1"
    proc = subprocess.run([str(python), "-c", RUN_CELL, str(cell), signal], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return python, (json.loads(lines[-1]) if lines else None), proc


def _installed_in_venv(python: Path) -> list[str]:
    venv = python.parents[1]
    return sorted(p.name for p in venv.glob("lib/python*/site-packages/modern_block*"))


@pytest.mark.slow
def test_setup_cell_installs_the_package_on_colab(tmp_path):
    source = _checkout_copy(tmp_path / "checkout")
    python, found, proc = _run_setup(tmp_path, "env", source)
    if proc.returncode and "Could not find a version" in proc.stderr and not os.environ.get("CI"):
        pytest.skip(f"no package index for the build backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, f"the setup cell failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert found is not None, f"modern_block does not import after the setup cell:\n{proc.stdout}\n{proc.stderr}"
    venv = python.parents[1]
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), \
        f"modern_block imports from {found['file']}, not from the venv {venv}"
    assert not Path(found["file"]).resolve().is_relative_to(ROOT.resolve())
    assert found["has_model"] and found["version"]
    assert "modern_block" in _installed_in_venv(python)


def test_setup_cell_installs_when_google_colab_is_imported(tmp_path):
    """The other signal, ``google.colab`` in ``sys.modules``, takes the same branch as the variable above; that
    the branch installs is shown there, so here the source is a folder that does not exist: pip must be run on it
    (and fail, naming it) before anything else happens."""
    missing = tmp_path / "no-such-source"
    python, found, proc = _run_setup(tmp_path, "google.colab", missing)
    assert proc.returncode != 0 and found is None, "the cell went on although pip could not install the source"
    assert "CalledProcessError" in proc.stderr and "pip" in proc.stderr, proc.stderr[-2000:]
    assert str(missing) in proc.stderr, f"pip was not run on MODERN_BLOCK_SOURCE:\n{proc.stderr[-2000:]}"
    assert _installed_in_venv(python) == []


def test_setup_cell_does_nothing_outside_colab(tmp_path):
    python, _, proc = _run_setup(tmp_path, "none", tmp_path / "no-such-source")  # pip would fail on it
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _installed_in_venv(python) == []
