"""RMSNorm against torch.nn.RMSNorm, computed in fp32."""

import pytest
import torch
import torch.nn as nn

from modern_block import (
    RMSNorm,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


@pytest.mark.parametrize("shape", [(3, 7, 64), (5, 1), (2, 4, 8, 32)])
def test_rmsnorm_matches_torch(shape):
    torch.manual_seed(0)
    d = shape[-1]
    ours, ref = RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(d))
        ref.weight.copy_(ours.weight)
    x = torch.randn(shape) * 3
    torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=1e-5)


def test_rmsnorm_computes_in_fp32_and_returns_input_dtype():
    torch.manual_seed(0)
    x = torch.randn(4, 256) * 300  # squares reach ~1e5-1e6: past fp16's max of 65,504
    norm = RMSNorm(256)
    out = norm(x.half())
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), norm(x), atol=2e-3, rtol=2e-3)
    # the same formula evaluated in fp16 overflows: this is what the upcast prevents
    xh = x.half()
    naive = xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert not torch.isfinite(xh.pow(2)).all() and (naive == 0).any()
    assert norm(x.bfloat16()).dtype == torch.bfloat16


def test_rmsnorm_refuses_integer_input():
    # integers would come back as integers: [1, 2, 3, 4] normalised to [0, 0, 1, 1] without a word
    with pytest.raises(TypeError, match="RMSNorm needs a floating-point input, got dtype torch.int64"):
        RMSNorm(4)(torch.tensor([1, 2, 3, 4]))
    out = RMSNorm(4)(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([1.0, 2.0, 3.0, 4.0]) / 7.5**0.5)
