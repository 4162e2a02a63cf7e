"""RMSNorm (Zhang & Sennrich, 2019): LayerNorm without the mean subtraction and without the bias.

    y = x / sqrt(mean(x**2) + eps) * weight

The statistics are computed in fp32 even when the model runs in bf16/fp16: a sum of squares
in half precision overflows (fp16) or loses the small entries (bf16). The result goes back to
the input dtype before the learned scale is applied, as Llama and Qwen do, so the output always
has the input's dtype.
"""

import torch
import torch.nn as nn

from ._validate import positive_int


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        positive_int("d", d)
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # [d], the learned per-feature scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        if x.dtype == torch.float32:  # already fp32: the same formula without the casts
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., 1]
        # back to x's dtype, then the scale (in x's dtype too, so fp32 weights under autocast keep bf16 out)
        return (x32 * inv_rms).type_as(x) * self.weight.to(x.dtype)  # [..., d]

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
