"""The repository's own promises: requirements agree, CI runs the README's command, the code is lint-clean."""

import os
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CONDA_TO_PIP = {"pytorch": "torch"}


def _split(req: str) -> tuple[str, str]:
    req = req.split(";", 1)[0]  # environment markers (python_version) have no conda counterpart
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


def _pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs: dict[str, str] = {}
    for r in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        if r.startswith(project["name"] + "["):  # an extra that pulls others (dev: lab and classroom)
            continue
        name, spec = _split(r)
        reqs[name] = f"{reqs[name]},{spec}" if name in reqs else spec  # an extra may narrow a requirement
    return reqs


def _environment_requirements() -> dict[str, str]:
    reqs = {}
    text = (ROOT / "environment.yml").read_text().split("\ndependencies:\n", 1)[1]
    for line in text.splitlines():
        m = re.match(r"^  - ([^:#\s][^#]*?)\s*$", line) or re.match(r"^      - ([A-Za-z][^#\s]*)", line)
        if m:  # conda's dependencies, and pip's where conda-forge has no package (not pip's options)
            name, spec = _split(m.group(1))
            if name not in ("python", "pip"):
                reqs[CONDA_TO_PIP.get(name, name)] = spec
    return reqs


def test_environment_yml_agrees_with_pyproject():
    py, env = _pyproject_requirements(), _environment_requirements()
    assert "torch" in py and py["torch"] == ">=2.5"  # a range: Colab's own torch is never replaced
    assert env == py, f"only in pyproject: {set(py.items()) - set(env.items())}; " \
                      f"only in environment.yml: {set(env.items()) - set(py.items())}"


def test_the_core_install_is_the_model_interop_and_training_only():
    """``pip install modern-block`` pulls no notebook server, no grader and no developer tool; the extras do."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_split(r)[0] for r in project["dependencies"]}
    assert {"torch", "safetensors", "transformers", "gguf"} <= core
    assert not core & {"jupyterlab", "ipywidgets", "nbgrader", "pyseccomp", "pytest", "nbformat"}
    extras = project["optional-dependencies"]
    assert {"jupyterlab", "ipywidgets"} <= {_split(r)[0] for r in extras["lab"]}
    assert {"nbgrader", "pyseccomp"} <= {_split(r)[0] for r in extras["classroom"]}
    assert "modern-block[lab,classroom]" in extras["dev"]
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[lab]"' in makefile and '-e ".[dev]"' in makefile  # make lab and make test install what they use


def test_python_floor_agrees():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert "  - python>=3.10" in (ROOT / "environment.yml").read_text().splitlines()


def _readme_quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_readme_has_exactly_two_quick_start_commands_and_ci_runs_the_test_one():
    commands = _readme_quick_start_commands()
    assert commands == ["make lab", "make test"], commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in [line.strip() for line in ci], ".ci/run must run the README's test command as written"
    assert any("torch==2.13.0" in line for line in ci)


def test_readme_course_map_lists_only_notebooks_that_exist():
    text = (ROOT / "README.md").read_text()
    for name in re.findall(r"notebooks/(\d\d[a-z]?_[a-z0-9_]+\.ipynb)", text):
        assert (ROOT / "notebooks" / name).exists(), f"README links notebooks/{name}, which does not exist"


def test_ci_runs_the_linters_through_make_lint():
    """ruff and mypy run in one place, ``make lint``, which .ci/run calls (not a test that hides inside pytest)."""
    ci = (ROOT / ".ci" / "run").read_text()
    make = (ROOT / "Makefile").read_text()
    assert "make lint" in ci and "ruff check" in make.split("\nlint:")[1] and "mypy" in make.split("\nlint:")[1]


def test_each_xdist_worker_gets_its_share_of_the_cores():
    """The root conftest.py, as xdist's controller and a worker of ``-n 2`` read it: the worker's processes (a
    notebook's kernel among them) get cores // 2 intra-op threads, or the user's value. The controller sets
    nothing: the workers inherit its environment, and a value set there passed for the user's (the workers ran
    2 threads each on 2 cores)."""
    def omp_after_conftest(**env):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "OMP_NUM_THREADS"))}
        code = "import os, runpy; runpy.run_path('conftest.py'); print(os.environ.get('OMP_NUM_THREADS', 'unset'))"
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True,
                              text=True, check=True).stdout.strip()

    worker = dict(PYTEST_XDIST_WORKER="gw0", PYTEST_XDIST_WORKER_COUNT="2")
    assert omp_after_conftest() == "unset", "the controller (or a run without xdist) leaves it alone"
    assert omp_after_conftest(**worker) == str(max(1, (os.cpu_count() or 1) // 2))
    assert omp_after_conftest(**worker, OMP_NUM_THREADS="3") == "3", "the user's value is kept"
