"""No exercise is answered by copying the lesson's worked code: each exercise varies the lesson's case (other
positions, per-sequence tables, a fused checkpoint matrix, Gemma's norms and embedding scale, Qwen2's biases, a
model's config instead of its frequencies, Q4_0 instead of Q4_1). The lesson's own definitions are taken from
the lesson notebooks as they stand and handed to the exercise's check, which must refuse them."""

import ast
import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks import CheckFailed

ROOT = Path(__file__).resolve().parents[2]


def lesson_definition(lesson: str, name: str):
    """The function or class ``name`` as a code cell of notebooks/<lesson>.ipynb defines it (only its
    definition is run, with the names the lesson imports)."""
    nb = nbformat.read(ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code" or name not in cell.source:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell with IPython magics
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                namespace = {"torch": torch, "math": math, "nn": nn, "F": F, "mb": mb,
                             **{n: getattr(mb, n) for n in ("RMSNorm", "GQAttention", "SwiGLU", "Block", "rope_cache",
                                                            "apply_rope", "rope_frequencies")}}
                exec(compile(ast.Module([node], []), f"{lesson}:{name}", "exec"), namespace)
                return namespace[name]
    raise AssertionError(f"{name} is no longer defined in notebooks/{lesson}.ipynb: update this test")


@pytest.mark.parametrize("lesson, name, check", [
    ("03_rope", "my_rope_cache", checks.check_rope_cache),
    ("03_rope", "my_apply_rope", checks.check_apply_rope),
    ("07_llama_block", "MyBlock", checks.check_block),
    ("07_llama_block", "MyLlamaLM", checks.check_llama_lm),
    ("09b_rope_scaling", "my_llama3", checks.check_llama3_rope_scaling),
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_lessons_worked_code_does_not_answer_the_exercise(lesson, name, check):
    with pytest.raises(CheckFailed):
        check(lesson_definition(lesson, name))


def test_the_lessons_mla_reading_does_not_answer_the_fused_layout():
    # lesson 05 reads W_UK as mla.w_uk.weight.view(h, d_nope, d_c): on the fused kv_b_proj matrix that takes the
    # first h·d_nope rows, the wrong ones
    def absorb_query(q_nope, w_kv_b):
        h, d_nope = q_nope.shape[1], q_nope.shape[-1]
        return torch.einsum("bhtn,hnc->bhtc", q_nope, w_kv_b[:h * d_nope].view(h, d_nope, -1))

    with pytest.raises(CheckFailed, match="its rows go head by head"):
        checks.check_absorb_query(absorb_query)


def test_the_lessons_q4_1_reading_does_not_answer_q4_0():
    from modern_block.interop import dequantize_q4_1

    with pytest.raises(CheckFailed):
        checks.check_dequantize_q4_0(dequantize_q4_1)
