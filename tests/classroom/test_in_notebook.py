"""The student's loop (``Mode.notebook``, ``checks.in_notebook``): in a notebook no check stops Run All, the last
cell sums up, untouched stubs (value items included) are "not attempted", a value typed in or looked up is refused,
a value or a function that uses the package's own answer is flagged as the grader flags it, and a torch function
the exercise's text forbids is refused.

The first tests run in this process (``Mode.notebook`` stands in for a kernel); the last ones execute exercise
notebooks in a real Jupyter kernel, top to bottom, as Run All does."""

import ast
import re
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks import Mode, in_notebook
from modern_block.classroom.checks.errors import CheckFailed, NotAttempted
from modern_block.classroom.checks.in_notebook import answer_sources, not_computed

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
NOTEBOOK = Mode.notebook([], {})


@pytest.fixture(autouse=True)
def fresh_results():
    in_notebook.reset()
    yield
    in_notebook.reset()


def test_in_a_notebook_a_failing_check_prints_and_the_summary_counts(capsys):
    def stub(T, dh, base=10000.0):
        raise NotImplementedError("one speed per pair")

    checks.check_rms(lambda x, eps=1e-6: x.float().pow(2).mean(-1, keepdim=True).sqrt() + eps, mode=NOTEBOOK)
    checks.check_rope_cache(stub, mode=NOTEBOOK)
    checks.check_rmsnorm(mb.RMSNorm, mode=NOTEBOOK)  # the package's own: flagged
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
    assert Mode.current() == Mode.script()
    with pytest.raises(CheckFailed):
        checks.check_rms(lambda x, eps=1e-6: x.float().pow(2).mean(-1, keepdim=True).sqrt() + eps)
    assert in_notebook.results() == {}


def test_the_packages_own_implementation_is_flagged_in_a_notebook_and_restored_after(capsys):
    checks.check_rope_cache(mb.rope_cache, mode=NOTEBOOK)
    checks.check_rmsnorm(mb.RMSNorm, mode=NOTEBOOK)

    def mine(positions, dh, base=10000.0):  # a wrapper around the package's function
        return mb.rope_cache(int(positions.max()) + 1, dh, base)

    checks.check_rope_cache(mine, mode=NOTEBOOK)

    class Sub(mb.DecoderLM):  # subclassing the base of the package's LM answers exercise 07.2 too: refused
        pass

    checks.check_llama_lm(Sub, mode=NOTEBOOK)
    err = capsys.readouterr().err
    assert err.count("modern_block.rope_cache is not available while this notebook is graded") == 2
    assert "modern_block.RMSNorm is not available while this notebook is graded" in err
    assert "modern_block.DecoderLM is not available while this notebook is graded" in err
    cos, _ = mb.rope_cache(4, 8)  # restored
    assert cos.shape == (4, 4) and mb.RMSNorm(8)(torch.ones(2, 8)).shape == (2, 8)
    checks.check_rmsnorm(mb.RMSNorm, mode=Mode.script())  # outside a notebook (the right answers) nothing is hidden


def test_what_the_graders_copy_lacks_is_flagged_in_a_notebook(capsys):
    """The grader's copy of the package holds the model files only: an answer that reads a config card (interop)
    or the trainer's schedule fails in the grader, and in the notebook as well."""
    from modern_block.interop.config_card import ConfigCard, config_card

    card = config_card("Qwen3-0.6B")
    assert isinstance(card, ConfigCard)

    def from_the_card(cfg):
        return config_card("Qwen3-0.6B").kv_bytes_per_token()

    checks.check_kv_bytes_per_token(from_the_card, mode=NOTEBOOK)
    assert "modern_block.interop.config_card is not available while this notebook is graded" in capsys.readouterr().err
    assert config_card("Qwen3-0.6B").kv_bytes_per_token() == card.kv_bytes_per_token()  # restored


def test_a_torch_function_the_text_forbids_is_refused_however_it_was_imported(capsys):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def fused(q, k, v):
        return sdpa(q, k, v, is_causal=True)

    checks.check_causal_attention(fused, mode=Mode.script())  # the same numbers: only the rule refuses it
    checks.check_causal_attention(fused, mode=NOTEBOOK)
    err = capsys.readouterr().err
    assert "torch.nn.functional.scaled_dot_product_attention is not available in this exercise" in err
    q = torch.randn(1, 1, 3, 4)
    assert sdpa(q, q, q).shape == q.shape  # restored
    checks.check_gpt2_attention(_gpt2_with_sdpa, mode=NOTEBOOK)  # allowed in exercise 3
    assert in_notebook.results()["check_gpt2_attention"][0] == "passed"


def _gpt2_with_sdpa(x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    B, T, d = x.shape
    q, k, v = ((t.view(B, T, n_heads, d // n_heads).transpose(1, 2)) for t in (x @ w_qkv.T + b_qkv).split(d, -1))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(B, T, d) @ w_proj.T + b_proj


@pytest.mark.parametrize("check", [checks.check_gpt2_small_params, checks.check_llama3_70b_d_ff,
                                   checks.check_kimi_k2_cache_bytes, checks.check_llama3_8b_train_flops,
                                   checks.check_smollm2_cache_bytes])
def test_an_untouched_value_item_is_not_attempted(check):
    with pytest.raises(NotAttempted, match="is still None"):
        check(None, mode=Mode.script())


@pytest.mark.parametrize("source, why", [
    ("gpt2_small_params = 124_439_808", "typed in"), ("gpt2_small_params = 124_439_808 * 1", "typed in"),
    ("gpt2_small_params = int('124439808')", "typed in"), ("gpt2_small_params = 7 * 4096", "typed in"),
    ("x = 124_439_808\ngpt2_small_params = x", "typed in"), ("gpt2_small_params = int(1.24439808e8)", "typed in"),
    ("gpt2_small_params = math.prod([7, 4096])", "typed in"),
    ("gpt2_small_params = mb.PRESETS['x'].d_ff", None),
    ("V, d = 50257, 768\ngpt2_small_params = V * d", None),
    ("def count():\n    return 1\ngpt2_small_params = count()", None),
])
def test_what_counts_as_typed_in(source, why):
    got = not_computed(["import math", *source.split("\n")], "gpt2_small_params", ())
    assert (got is None) if why is None else (why in got), got


def test_a_value_read_from_the_packages_table_of_answers_is_looked_up():
    assert "looked up in modern_block.PRESETS" in not_computed(
        ["llama3_70b_d_ff = mb.PRESETS['Llama 3 70B'].d_ff"], "llama3_70b_d_ff", ("PRESETS",))
    with pytest.raises(CheckFailed, match="looked up in modern_block.PRESETS"):
        checks.check_llama3_70b_d_ff(28672, mode=Mode.graded(3, ["llama3_70b_d_ff = mb.PRESETS['Llama 3 70B'].d_ff"]))


def test_a_value_computed_with_the_packages_answer_fails_in_the_notebook_as_in_the_grader():
    namespace = {"mb": mb}
    source = "kimi_k2_cache_bytes = mb.mla_cache_bytes_per_token(61, 512, 64)"
    exec(source, namespace)
    mode = Mode.notebook([source], namespace)
    checks.check_kimi_k2_cache_bytes(namespace["kimi_k2_cache_bytes"], mode=mode)
    status, message = in_notebook.results()["check_kimi_k2_cache_bytes"]
    assert status == "failed" and "fails as the grader runs it" in message
    assert "modern_block.mla_cache_bytes_per_token is not available" in message
    computed = "n_layers, d_c, d_r = 61, 512, 64\nkimi_k2_cache_bytes = n_layers * (d_c + d_r) * 2"
    exec(computed, namespace)
    checks.check_kimi_k2_cache_bytes(namespace["kimi_k2_cache_bytes"], mode=Mode.notebook([computed], namespace))
    assert in_notebook.results()["check_kimi_k2_cache_bytes"][0] == "passed"


def test_the_grader_can_pass_the_cells_a_value_item_came_from():
    computed = ["import math", "n_layers, d_c, d_r = 61, 512, 64", "kimi_k2_cache_bytes = n_layers * (d_c + d_r) * 2"]
    typed = computed + ["kimi_k2_cache_bytes = 61 * (512 + 64) * 2  # overwritten later"]
    with answer_sources(computed):
        checks.check_kimi_k2_cache_bytes(70_272)
    with answer_sources(typed), pytest.raises(CheckFailed, match="typed in"):
        checks.check_kimi_k2_cache_bytes(70_272)
    checks.check_kimi_k2_cache_bytes(70_272)  # without sources, outside a notebook: only the value is judged


def test_in_the_grader_a_typed_in_value_fails_per_thread():
    """The grader runs its checks in threads, one submission each: each thread's cells decide for its own check
    (the mode is per context), and a computed value passes beside a typed-in one."""
    import threading

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
               threading.Thread(target=grade, args=("computed", "L = 61\nkimi_k2_cache_bytes = L * (512 + 64) * 2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes["computed"] == "passed"
    assert "typed in" in outcomes["typed"]


def test_every_name_a_hint_uses_is_imported_in_its_notebook():
    """A hint's code names a module (math, torch, F, nn, mb) only where the notebook's imports bind it."""
    modules = {"math", "torch", "F", "nn", "mb", "np", "itertools"}
    for path in EXERCISES:
        nb = nbformat.read(path, as_version=4)
        bound: set[str] = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.get("id") in ("setup", "imports"):
                for node in ast.walk(ast.parse(cell.source)):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
                    elif isinstance(node, ast.Assign):
                        bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for cell in nb.cells:
            if cell.cell_type == "markdown" and re.fullmatch(r"ex\d+-hints", cell.get("id") or ""):
                for span in re.findall(r"`([^`]*)`", cell.source):
                    used = set(re.findall(r"\b([A-Za-z_]\w*)\.", span)) & modules
                    assert used <= bound, f"{path.name} {cell.id}: {span!r} uses {used - bound}, not imported"


# ---- Run All in a real kernel ----------------------------------------------------------------------------


def run_all(nb) -> list:
    # 30 s a cell (the slowest takes 1.3 s alone): nbclient's asyncio poll can miss a reply's wake-up and then
    # waits out the whole timeout (tests/classroom/test_ipywidgets77.py)
    NotebookClient(nb, timeout=30, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
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


def answer(nb, cell_id: str, source: str) -> None:
    (cell,) = [c for c in nb.cells if c.get("id") == cell_id]
    cell.source = source


def test_in_a_kernel_the_packages_answer_is_flagged_in_a_function_and_in_a_value():
    nb = nbformat.read(ROOT / "exercises" / "05_mla.ipynb", as_version=4)
    answer(nb, "ex1-solution", "from modern_block import kv_cache_bytes_per_token\n\n\n"
                               "def mla_cache_bytes(L, dc, dr, b=2):\n"
                               "    return kv_cache_bytes_per_token(L, 1, dc + dr, b) // 2")
    answer(nb, "ex5-solution", "import modern_block as mb\n"
                               "kimi_k2_cache_bytes = mb.mla_cache_bytes_per_token(61, 512, 64)")
    out = {c.get("id"): text_of(c) for c in run_all(nb)}
    assert "modern_block.kv_cache_bytes_per_token is not available while this notebook is graded" in out["ex1-check"]
    assert "fails as the grader runs it" in out["ex5-check"]
    assert "0 of 5 passed, 2 failed, 3 not attempted." in out["summary"]


def test_in_a_kernel_a_typed_in_value_and_a_forbidden_torch_function_are_refused():
    nb = nbformat.read(ROOT / "exercises" / "00_gpt2_block.ipynb", as_version=4)
    answer(nb, "ex2-solution", "def causal_attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v, "
                               "is_causal=True)")
    answer(nb, "ex4-solution", "gpt2_small_params = 124_439_808 * 1")
    out = {c.get("id"): text_of(c) for c in run_all(nb)}
    assert "scaled_dot_product_attention is not available in this exercise" in out["ex2-check"]
    assert "gpt2_small_params is typed in" in out["ex4-check"]
    assert "0 of 4 passed, 2 failed, 2 not attempted." in out["summary"]
