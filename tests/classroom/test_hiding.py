"""What each exercise hides (``checks.hiding``): the table the grader's copy of the package is built from, the same
view of the package in a notebook while the student's code runs, and the torch functions an exercise forbids,
hidden in the sandbox's checks module however they are imported."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import modern_block as mb
from modern_block.classroom.checks import hiding
from modern_block.classroom.checks.hiding import SDPA, grader_view, sandbox_stub, with_bases
from modern_block.classroom.grading import package_copy


def test_a_hidden_piece_and_its_bases_raise_inside_the_view_and_work_after():
    with grader_view(("LlamaStyleLM", "swiglu_hidden_dim")):
        with pytest.raises(RuntimeError, match="modern_block.swiglu_hidden_dim is not available"):
            mb.swiglu_hidden_dim(4096)
        with pytest.raises(RuntimeError, match="modern_block.DecoderLM is not available"):  # its base, too
            mb.DecoderLM.forward(None, None)
        assert mb.RMSNorm(4)(torch.ones(1, 4)).shape == (1, 4)  # what is not hidden works
    assert mb.swiglu_hidden_dim(4096) == 11008
    assert with_bases(frozenset({"LlamaStyleLM"}), [p.read_text() for p in hiding.model_files()]) == {
        "LlamaStyleLM", "DecoderLM"}


def test_outside_the_model_files_nothing_of_the_package_runs_inside_the_view():
    from modern_block.interop.config_card import load_config

    with grader_view(()):
        with pytest.raises(RuntimeError, match="modern_block.interop.config_source is not available while this "
                                               "notebook is graded"):  # the module load_config is written in
            load_config("Qwen3-0.6B")
        assert mb.kv_cache_bytes_per_token(1, 1, 1) == 4  # a model file
    assert load_config("Qwen3-0.6B")["num_hidden_layers"] == 28


def test_a_method_hidden_alone_and_a_dataclass_keep_the_rest():
    preset = mb.PRESETS["Llama 3 8B"]
    with grader_view(("GQAttention.forward", "ModelPreset")):
        attention = mb.GQAttention(8, 2, 1)  # its __init__ is not hidden
        with pytest.raises(RuntimeError, match="GQAttention.forward"):
            attention(torch.ones(1, 2, 8), *mb.rope_cache(2, 4))
        with pytest.raises(RuntimeError, match="ModelPreset"):
            preset.bytes_per_token()
        assert mb.ModelPreset("x", 1, 1, 1, 2).n_layers == 1  # the dataclass's own __init__: not the model's code
    assert preset.bytes_per_token() == 131_072


def test_a_forbidden_torch_function_raises_in_the_view_however_imported():
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q = torch.randn(1, 1, 3, 4)
    with grader_view((SDPA,)):
        for fn in (sdpa, F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention):
            with pytest.raises(RuntimeError, match="not available in this exercise"):
                fn(q, q, q)
        assert (q @ q.transpose(-1, -2)).softmax(-1).shape == (1, 1, 3, 3)
    assert sdpa(q, q, q).shape == q.shape


def test_the_sandbox_stub_names_every_check_and_hides_the_forbidden_torch_functions(tmp_path):
    from modern_block.classroom import checks

    stub = sandbox_stub(frozenset({"RMSNorm"}), checks.__all__)
    namespace: dict = {}
    exec(compile(stub, "stub", "exec"), namespace)
    assert namespace["__all__"] == checks.__all__ and namespace["check_rms"](None) is None
    assert "TorchFunctionMode" not in stub and "TorchFunctionMode" in sandbox_stub(frozenset({SDPA}), checks.__all__)
    site = package_copy.build(tmp_path, frozenset({SDPA, "causal_attention"}))
    probe = ("import torch, torch.nn.functional as F\n"
             "from modern_block.classroom import checks\n"
             "q = torch.randn(1, 1, 2, 4)\n"
             "try:\n    F.scaled_dot_product_attention(q, q, q)\nexcept RuntimeError as err:\n    print(err)\n"
             "import modern_block as mb\n"
             "try:\n    mb.causal_attention(q, q, q)\nexcept RuntimeError as err:\n    print(err)\n"
             "print(mb.rope_cache(2, 4)[0].shape)\n")
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + probe],
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("torch.nn.functional.scaled_dot_product_attention is not available"), done
    assert lines[1].startswith("modern_block.causal_attention is not available"), done
    assert lines[2] == "torch.Size([2, 2])", done


def test_the_grader_imports_the_table_and_the_checks_never_import_the_grader():
    import ast
    from pathlib import Path

    folder = Path(hiding.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "grading" not in (node.module or ""), f"{path.name} imports {node.module}"
    assert package_copy.hidden_message is hiding.hidden_message and package_copy.with_bases is hiding.with_bases



PARSE_IN_THREADS = """
import threading, time
from modern_block.classroom.checks import hiding

source = (hiding.PACKAGE / "attention.py").read_text()


class Cycle:  # only the collector frees it, and its finaliser is Python code that lets another thread run
    def __init__(self):
        self.me = self

    def __del__(self):
        time.sleep(1e-4)


failures = []


def parse_many():
    for _ in range(100):
        for _ in range(50):
            Cycle()
        try:
            hiding.parse_python(source)
        except SystemError as err:
            failures.append(repr(err))


threads = [threading.Thread(target=parse_many) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(failures), failures[:1])
"""


def test_the_graders_threads_parse_python_one_at_a_time():
    """Four threads parse a model file while the collector runs finalisers inside the AST constructor, as the
    grader's threads do with two jobs (in a process of its own: under pytest's assertion rewriting the race did
    not show). With a bare ``ast.parse``, CPython 3.11.7 failed a parse with ``SystemError: AST constructor
    recursion depth mismatch`` in each run here, and a class of 40 lost a row to it in CI."""
    proc = subprocess.run([sys.executable, "-c", PARSE_IN_THREADS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "0", proc.stdout
