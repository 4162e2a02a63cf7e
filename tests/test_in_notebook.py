"""The student's loop (``checks.in_notebook``): in a notebook no check stops Run All, the last cell sums up,
untouched stubs (value items included) are "not attempted", a value typed in is refused, and handing in the
package's own implementation is flagged as the grader flags it.

The first tests run in this process (``notebook_mode`` stands in for a kernel); the last ones execute every
exercise notebook, stubs untouched, in a real Jupyter kernel, top to bottom, as Run All does."""

import re
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks import CheckFailed, NotAttempted, in_notebook
from modern_block.classroom.checks.in_notebook import notebook_mode

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


@pytest.fixture(autouse=True)
def fresh_results():
    in_notebook.reset()
    yield
    in_notebook.reset()


def test_in_a_notebook_a_failing_check_prints_and_the_summary_counts(capsys):
    def stub(T, dh, base=10000.0):
        raise NotImplementedError("one speed per pair")

    with notebook_mode():
        checks.check_rms(lambda x, eps=1e-6: x.float().pow(2).mean(-1, keepdim=True).sqrt() + eps)  # no raise
        checks.check_rope_cache(stub)
        checks.check_rmsnorm(mb.RMSNorm)  # the package's own: flagged
        checks.summary()
    captured = capsys.readouterr()
    assert "✗ check_rms: " in captured.err and "eps was added outside the square root" in captured.err
    assert "… check_rope_cache: not implemented yet" in captured.err  # stderr: nbgrader scores the cell 0
    lines = captured.out.splitlines()
    assert "Checks run in this notebook:" in lines
    assert any(re.match(r"\s+✗ check_rms\s+failed: ", line) for line in lines)
    assert any(re.match(r"\s+… check_rope_cache\s+not attempted$", line) for line in lines)
    assert lines[-1] == "0 of 3 passed, 2 failed, 1 not attempted."


def test_outside_a_notebook_the_checks_raise():
    with notebook_mode(False), pytest.raises(CheckFailed):
        checks.check_rms(lambda x, eps=1e-6: x.float().pow(2).mean(-1, keepdim=True).sqrt() + eps)
    assert in_notebook.results() == {}


def test_the_packages_own_implementation_is_flagged_in_a_notebook_and_restored_after(capsys):
    with notebook_mode():
        checks.check_rope_cache(mb.rope_cache)
        checks.check_rmsnorm(mb.RMSNorm)

        def mine(T, dh, base=10000.0):  # a wrapper around the package's function
            return mb.rope_cache(T, dh, base)

        checks.check_rope_cache(mine)
    err = capsys.readouterr().err
    assert err.count("modern_block.rope_cache is not available while this notebook is graded") == 2
    assert "modern_block.RMSNorm is not available while this notebook is graded" in err
    cos, _ = mb.rope_cache(4, 8)  # restored
    assert cos.shape == (4, 4) and mb.RMSNorm(8)(torch.ones(2, 8)).shape == (2, 8)
    checks.check_rmsnorm(mb.RMSNorm)  # outside a notebook (the tests' right answers) nothing is hidden


@pytest.mark.parametrize("check", [checks.check_gpt2_small_params, checks.check_llama3_70b_d_ff,
                                   checks.check_kimi_k2_cache_bytes, checks.check_llama3_8b_train_flops,
                                   checks.check_smollm2_cache_bytes])
def test_an_untouched_value_item_is_not_attempted(check):
    with pytest.raises(NotAttempted, match="is still None"):
        check(None)


def test_the_grader_can_pass_the_cells_a_value_item_came_from():
    computed = ["import math", "kimi_k2_cache_bytes = 61 * (512 + 64) * 2"]
    typed = computed + ["kimi_k2_cache_bytes = 70_272  # overwritten later"]
    with in_notebook.answer_sources(computed):
        checks.check_kimi_k2_cache_bytes(70_272)
    with in_notebook.answer_sources(typed), pytest.raises(CheckFailed, match="typed in as a number"):
        checks.check_kimi_k2_cache_bytes(70_272)
    checks.check_kimi_k2_cache_bytes(70_272)  # without sources, outside a notebook: only the value is judged


def test_a_typed_in_value_is_recognised_from_the_input_history():
    assert in_notebook._is_literal(__import__("ast").parse("70_272").body[0].value)
    assert in_notebook._is_literal(__import__("ast").parse("int(70272.0)").body[0].value)
    assert not in_notebook._is_literal(__import__("ast").parse("61 * (512 + 64) * 2").body[0].value)
    assert not in_notebook._is_literal(__import__("ast").parse("mla_cache_bytes(61, 512, 64)").body[0].value)


# ---- Run All in a real kernel ----------------------------------------------------------------------------


def run_all(nb) -> list:
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb.cells


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_run_all_of_an_untouched_exercise_notebook_reaches_the_summary(path):
    nb = nbformat.read(path, as_version=4)
    n_checks = sum(1 for c in nb.cells if re.fullmatch(r"ex\d+-check", c.get("id") or ""))
    cells = run_all(nb)  # raises CellExecutionError if any cell stops the run
    assert cells[-1].get("id") == "summary"
    summary = text_of(cells[-1])
    assert f"0 of {n_checks} passed, 0 failed, {n_checks} not attempted." in summary, summary
    assert "Error" not in "".join(text_of(c) for c in cells)


def test_in_a_kernel_a_typed_in_value_and_the_packages_function_are_flagged():
    nb = nbformat.read(ROOT / "exercises" / "05_mla.ipynb", as_version=4)
    (answer,) = [c for c in nb.cells if c.get("id") == "ex5-solution"]
    answer.source = "kimi_k2_cache_bytes = 70_272"
    (first,) = [c for c in nb.cells if c.get("id") == "ex1-solution"]
    first.source = "from modern_block import mla_cache_bytes_per_token as mla_cache_bytes"
    cells = run_all(nb)
    out = {c.get("id"): text_of(c) for c in cells}
    assert "kimi_k2_cache_bytes is typed in as a number" in out["ex5-check"]
    assert "not available while this notebook is graded" in out["ex1-check"]
    assert "0 of 5 passed, 2 failed, 3 not attempted." in out["summary"]


def test_in_the_grader_a_typed_in_value_fails_per_thread():
    """The grader runs its checks in threads, one submission each: each thread's cells decide for its own
    check (``answer_sources`` is per context), and a computed value passes beside a typed-in one."""
    import threading

    from modern_block.classroom.checks.in_notebook import answer_sources

    right = mb.mla_cache_bytes_per_token(61, 512, 64, 2)
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def grade(key: str, source: str) -> None:
        with checks.graded(7), answer_sources(["import modern_block as mb", source]):
            barrier.wait()
            try:
                checks.check_kimi_k2_cache_bytes(right)
                outcomes[key] = "passed"
            except CheckFailed as err:
                outcomes[key] = str(err)

    threads = [threading.Thread(target=grade, args=("typed", f"kimi_k2_cache_bytes = {right}")),
               threading.Thread(target=grade, args=("computed", "kimi_k2_cache_bytes = 61 * (512 + 64) * 2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes["computed"] == "passed"
    assert "typed in as a number" in outcomes["typed"]
