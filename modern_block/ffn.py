"""The two feed-forward networks: GPT-2's GELU MLP and the gated SwiGLU of Llama.

GELU MLP (2 matrices, d_ff = 4d):   y = W2 · gelu(W1 x + b1) + b2          -> 8·d² weights
SwiGLU   (3 matrices):              y = W_down · (silu(W_gate x) ⊙ W_up x) -> 3·d·d_ff weights

Matching the parameters, 3·d·d_ff = 8·d², gives d_ff = 8/3·d; Llama then rounds up to a
multiple of 256 (``swiglu_hidden_dim``).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validate import positive_int
from .packed import stacked_weight


def swiglu_hidden_dim(d: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """Llama's rule for the SwiGLU hidden size: int(8/3·d), times the optional multiplier,
    rounded up to a multiple of ``multiple_of``.

    >>> swiglu_hidden_dim(4096), swiglu_hidden_dim(5120), swiglu_hidden_dim(4096, 1024, 1.3)
    (11008, 13824, 14336)
    """
    positive_int("d", d)
    positive_int("multiple_of", multiple_of)
    hidden = int(2 * (4 * d) / 3)  # parameter-matched to a 4d GELU MLP
    if ffn_dim_multiplier is not None:
        if not ffn_dim_multiplier > 0:
            raise ValueError(f"ffn_dim_multiplier must be positive, got {ffn_dim_multiplier}")
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """Gated FFN: one projection (through SiLU) gates the other, then project back to d."""

    def __init__(self, d: int, d_ff: int):
        super().__init__()
        positive_int("d", d)
        positive_int("d_ff", d_ff)
        self.w_gate = nn.Linear(d, d_ff, bias=False)
        self.w_up = nn.Linear(d, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        # one matmul over [W_gate; W_up] in inference and under torch.compile; two in eager training,
        # where splitting one output costs the backward a copy of the whole [..., 2·d_ff] gradient
        # (measured slower than the two matmuls; the compiled graph avoids that copy)
        stacked = stacked_weight(self, ("w_gate", "w_up"), with_autograd=torch.compiler.is_compiling())
        if stacked is not None:
            gate, up = F.linear(x, stacked).chunk(2, dim=-1)  # [..., d_ff] each
        else:
            gate, up = self.w_gate(x), self.w_up(x)  # [..., d_ff] each
        return self.w_down(F.silu(gate) * up)  # [..., d]


class GeluMLP(nn.Module):
    """GPT-2's MLP: expand to d_ff (4d by default), GELU with the tanh approximation, project back."""

    def __init__(self, d: int, d_ff: int | None = None, bias: bool = True):
        super().__init__()
        positive_int("d", d)
        d_ff = 4 * d if d_ff is None else positive_int("d_ff", d_ff)
        self.fc = nn.Linear(d, d_ff, bias=bias)
        self.proj = nn.Linear(d_ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # [..., d_ff] -> [..., d]
