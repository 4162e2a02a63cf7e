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
        # d and eps also as fp32 0-d CPU tensors: arithmetic with a Python number wraps it in a new
        # tensor on every call, which costs as much as the op itself when decoding one token on a CPU.
        # Used only for CPU inputs, so they stay on the CPU (even under a meta or CUDA default device)
        # and are not buffers: .to() and state_dict leave them alone.
        self._d = torch.tensor(float(d), dtype=torch.float32, device="cpu")
        self._eps = torch.tensor(eps, dtype=torch.float32, device="cpu")

    def inv_rms(self, x32: torch.Tensor) -> torch.Tensor:
        """1 / sqrt(mean(x²) + eps) over the last dim of an fp32 tensor: [..., d] -> [..., 1].

        Bit for bit ``torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`` (a mean is a sum, then a
        division by d), in fewer and cheaper ops: x·x, then in-place updates of the small sum.
        """
        sum_sq = (x32 * x32).sum(-1, keepdim=True)  # [..., 1]
        if x32.device.type == "cpu":
            return sum_sq.div_(self._d).add_(self._eps).rsqrt_()
        return sum_sq.div_(x32.shape[-1]).add_(self.eps).rsqrt_()  # same numbers, as Python scalars

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        if x.dtype == torch.float32:  # already fp32: the same formula without the casts
            return x * self.inv_rms(x) * self.weight
        x32 = x.float()
        # back to x's dtype, then the scale (in x's dtype too, so fp32 weights under autocast keep bf16 out)
        return (x32 * self.inv_rms(x32)).type_as(x) * self.weight.to(x.dtype)  # [..., d]

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
