"""SwiGLU and the sizing rule against the chapter's figures."""

import pytest
import torch
import torch.nn.functional as F

from modern_block import (
    GeluMLP,
    SwiGLU,
    count_parameters,
    swiglu_hidden_dim,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_swiglu_is_silu_gate_times_up_then_down():
    torch.manual_seed(0)
    ffn = SwiGLU(32, 80)
    x = torch.randn(2, 5, 32)
    expected = (F.silu(x @ ffn.w_gate.weight.T) * (x @ ffn.w_up.weight.T)) @ ffn.w_down.weight.T
    torch.testing.assert_close(ffn(x), expected)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 32 * 80


def test_swiglu_sizing_figures():
    assert swiglu_hidden_dim(4096) == 11008  # Llama 1/2 7B
    assert swiglu_hidden_dim(5120) == 13824  # 13B
    assert swiglu_hidden_dim(4096, multiple_of=1024, ffn_dim_multiplier=1.3) == 14336  # Llama 3 8B
    assert swiglu_hidden_dim(256, multiple_of=16) == 688  # the chapter's d_ff
    d = 4096
    with torch.device("meta"):  # the modules' own weights, not a formula: SwiGLU at 8/3·d matches GELU at 4d
        gelu = count_parameters(GeluMLP(d, 4 * d, bias=False))
        swiglu = count_parameters(SwiGLU(d, swiglu_hidden_dim(d)))
        copied = count_parameters(SwiGLU(d, 4 * d))
    assert round(gelu / 1e6, 1) == 134.2 and round(swiglu / 1e6, 1) == 135.3 and abs(swiglu / gelu - 1) < 0.01
    assert copied / gelu == 1.5  # copying d_ff = 4d into SwiGLU: +50%


@pytest.mark.parametrize("d,multiple_of,want", [
    (48, 64, 128),  # int(8/3·48) = 128, a multiple already: kept
    (48, 127, 254),  # 128 = 127 + 1: one over a multiple rounds up to the next
    (48, 1, 128),  # multiple_of 1: no rounding
])
def test_the_hidden_size_rounds_up_to_the_next_multiple_only(d, multiple_of, want):
    assert swiglu_hidden_dim(d, multiple_of) == want


@pytest.mark.parametrize("d,d_ff,name,bad", [(0, 8, "d", 0), (-4, 8, "d", -4), (8, 0, "d_ff", 0)])
def test_swiglu_refuses_sizes_by_name(d, d_ff, name, bad):
    with pytest.raises(ValueError, match=rf"^{name} must be positive, got {bad}$"):
        SwiGLU(d, d_ff)
    with pytest.raises(TypeError, match=r"^d must be an int, got float$"):
        SwiGLU(8.0, 16)
