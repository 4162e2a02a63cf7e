"""RMSNorm (Zhang & Sennrich, 2019): LayerNorm without the mean subtraction and without the bias.

    y = x / sqrt(mean(x²) + eps) · weight

The statistics are computed in fp32 even when the model runs in bf16/fp16: a sum of squares
in half precision overflows (fp16) or loses the small entries (bf16). The result goes back to
the input dtype before the learned scale is applied, as Llama and Qwen do, so the output always
has the input's dtype.
"""

import torch
import torch.nn as nn

from .validate import positive_int, positive_number


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        positive_int("d", d)
        self.eps = positive_number("eps", eps)
        self.weight = nn.Parameter(torch.ones(d))  # [d], the learned per-feature scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        if not x.is_floating_point():
            raise TypeError(f"RMSNorm needs a floating-point input, got dtype {x.dtype}")
        x32 = x.float()  # the statistics in fp32, whatever the model's dtype
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., d]
        return normed.type_as(x) * self.weight.to(x.dtype)  # back to x's dtype, then the learned scale

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
