"""The checks' float64 reference formulas (modern_block/classroom/checks/formulas.py): with every knob off they
are the package's own RMSNorm and RoPE; each knob is the one mistake it names, and no two knobs coincide."""

import itertools

import pytest
import torch

from modern_block import RMSNorm, apply_rope, apply_rope_interleaved, rope_cache
from modern_block.classroom.checks.formulas import rms_norm64, rope64

torch.manual_seed(0)
X, W = torch.randn(3, 5, 8) + 0.5, torch.rand(8) + 0.5
COS, SIN = rope_cache(5, 8)  # [5, 4] each
Q = torch.randn(2, 3, 5, 8)
RMS_KNOBS = ["center", "eps_outside", "use_sum", "no_sqrt", "multiply", "unbiased"]


def test_rms_norm_without_knobs_is_the_package_rmsnorm():
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(W)
    got = rms_norm64(X, W, 1e-5)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.float(), norm(X), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rms_norm64(X, None, 1e-5) * W.double(), got)


def test_each_rms_knob_is_its_formula_and_changes_the_output():
    x, eps = X.double(), 0.1
    ms = x.pow(2).mean(-1, keepdim=True)
    centered = x - x.mean(-1, keepdim=True)
    expected = {
        "center": centered / (centered.pow(2).mean(-1, keepdim=True) + eps).sqrt(),
        "eps_outside": x / (ms.sqrt() + eps),
        "use_sum": x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt(),
        "no_sqrt": x / (ms + eps),
        "multiply": x * (ms + eps).sqrt(),
        "unbiased": x / (ms * 8 / 7 + eps).sqrt(),
    }
    outputs = {k: rms_norm64(X, None, eps, **{k: True}) for k in RMS_KNOBS}
    for knob in RMS_KNOBS:
        torch.testing.assert_close(outputs[knob], expected[knob], msg=knob)
    outputs["none"] = rms_norm64(X, None, eps)
    for a, b in itertools.combinations(outputs, 2):
        assert not torch.allclose(outputs[a], outputs[b], rtol=1e-3), (a, b)
    torch.testing.assert_close(rms_norm64(X.transpose(1, 2), None, eps, dim=1).transpose(1, 2), outputs["none"])


def test_rope_without_knobs_is_the_package_rope_in_both_layouts():
    torch.testing.assert_close(rope64(Q, COS, SIN).float(), apply_rope(Q, COS, SIN), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rope64(Q, COS, SIN, layout="interleaved").float(), apply_rope_interleaved(Q, COS, SIN),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_each_rope_knob_is_a_different_mistake(layout):
    right = rope64(Q, COS, SIN, layout)
    torch.testing.assert_close(rope64(right, COS, SIN, layout, sign=-1.0), Q.double())  # sign -1 undoes it
    wrong = {"sign": rope64(Q, COS, SIN, layout, sign=-1.0),
             "swap_halves": rope64(Q, COS, SIN, layout, swap_halves=True),
             "swap_tables": rope64(Q, COS, SIN, layout, swap_tables=True),
             "other_layout": rope64(Q, COS, SIN, "interleaved" if layout == "half" else "half")}
    for name, out in wrong.items():
        assert out.shape == right.shape and not torch.allclose(out, right, atol=1e-3), name
    for a, b in itertools.combinations(wrong, 2):
        assert not torch.allclose(wrong[a], wrong[b], atol=1e-3), (a, b)


def test_rope_without_rotation_and_with_cos_only():
    torch.testing.assert_close(rope64(Q, COS, SIN, "none"), Q.double())
    torch.testing.assert_close(rope64(Q, COS, SIN, "cos_only"), Q.double() * torch.cat([COS, COS], -1).double())
    with pytest.raises(ValueError, match="diagonal"):
        rope64(Q, COS, SIN, "diagonal")
