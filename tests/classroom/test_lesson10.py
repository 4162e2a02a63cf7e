"""Lesson 10's checks (modern_block/classroom/checks/lesson10.py): the right answers pass, a stub is not attempted,
and each known mistake gets its diagnosis. The right implementations are shared with test_exercises.py's RIGHT."""

import pytest
import torch
from check_helpers import passes_and_a_stub_is_not_attempted, rejects

from modern_block.classroom import checks
from modern_block.classroom.checks.lesson10 import SMOLLM2, _bytes
from modern_block.fast.weights import Int8Linear, dequantize_int8, quantize_int8


def bytes_per_token_ok(shapes, fmt, *, mistake=None):
    per = {"fp32": 4, "bf16": 2}
    total = 0
    for n_out, n_in in shapes:
        n = n_out * n_in
        if fmt in per:
            total += n * (4 if mistake == "bf16_4" else per[fmt])
        elif fmt == "int8":
            total += n + (0 if mistake == "no_scales" else 2 * n_out)
        else:
            total += n // 2 if mistake == "half_byte" else n // 32 * 20
    return total * 8 if mistake == "bits" else total


def floor_ms_ok(weight_bytes, copy_bytes, copy_seconds, *, mistake=None):
    bandwidth = (1 if mistake == "read_only" else 2) * copy_bytes / copy_seconds
    if mistake == "tokens_per_s":
        return bandwidth / weight_bytes
    return weight_bytes / bandwidth * (1 if mistake == "seconds" else 1e3)


def quantize_row_int8_ok(w, *, mistake=None):
    amax = w.max() if mistake == "max" else w.abs().max()
    s = amax / (128 if mistake == "128" else 127)
    r = w / s
    q = r.to(torch.int8) if mistake == "trunc" else r.round().to(torch.int8)
    return (q.float() if mistake == "float_q" else q), s


@pytest.mark.parametrize("check, impl", [(checks.check_bytes_per_token, bytes_per_token_ok),
                                         (checks.check_floor_ms, floor_ms_ok),
                                         (checks.check_quantize_row_int8, quantize_row_int8_ok)])
def test_the_right_answer_passes_and_a_stub_is_not_attempted(check, impl, capsys):
    passes_and_a_stub_is_not_attempted(check, impl, capsys)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("bf16_4", "bf16 is 2 bytes"), ("no_scales", "scales were left out"), ("half_byte", "half a byte"),
    ("bits", "bits, not bytes")])
def test_check_bytes_per_token_diagnoses(mistake, diagnosis):
    rejects(checks.check_bytes_per_token, lambda s, f: bytes_per_token_ok(s, f, mistake=mistake), diagnosis)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("read_only", "reads and writes"), ("seconds", "that is seconds"), ("tokens_per_s", "tokens per second")])
def test_check_floor_ms_diagnoses(mistake, diagnosis):
    rejects(checks.check_floor_ms, lambda *a: floor_ms_ok(*a, mistake=mistake), diagnosis)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("128", "does not fit in int8"), ("max", "max(|w|)"), ("trunc", "truncated toward zero"),
    ("float_q", "torch.int8")])
def test_check_quantize_row_int8_diagnoses(mistake, diagnosis):
    rejects(checks.check_quantize_row_int8, lambda w: quantize_row_int8_ok(w, mistake=mistake), diagnosis)


def test_the_checks_formulas_agree_with_the_package():
    """The check's byte counts against the real ones: SmolLM2's matrices in fp32 (lesson 10's table), its 210 layer
    matrices in Q4_1 (the GGUF file's 106,168,320 Q4_1 weights in 66,355,200 bytes), and an int8 matrix as the fast
    layer stores it (int8 weights and one bf16 scale per row)."""
    assert _bytes(SMOLLM2, "fp32") == 4 * 134_479_872
    assert sum(n * k for n, k in SMOLLM2[:-1]) == 106_168_320 and _bytes(SMOLLM2[:-1], "q4_1") == 66_355_200
    stored = Int8Linear.from_weight(torch.randn(6, 64))
    assert sum(p.numel() * p.element_size() for p in stored.parameters()) == _bytes([(6, 64)], "int8")
    torch.manual_seed(0)
    w = torch.randn(6, 64)
    q, s = quantize_int8(w)
    row_q, row_s = quantize_row_int8_ok(w[2])
    assert (q[2].float() - row_q.float()).abs().max() <= 1  # the package rounds its scale up to bf16: q may move 1
    assert (w - dequantize_int8(q, s)).abs().max() <= s.float().max() / 2
