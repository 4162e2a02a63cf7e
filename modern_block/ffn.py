"""The gated feed-forward network of Llama: SwiGLU, and the rule that sizes it.

GPT-2's MLP (``gpt2.GeluMLP``, 2 matrices, d_ff = 4d):  y = W2 · gelu(W1 x + b1) + b2          -> 8·d² weights
SwiGLU (3 matrices):                                    y = W_down · (silu(W_gate x) ⊙ W_up x) -> 3·d·d_ff weights

Matching the parameters, 3·d·d_ff = 8·d², gives d_ff = 8/3·d; Llama then rounds up to a
multiple of 256 (``swiglu_hidden_dim``).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .validate import positive_ints, positive_number


def swiglu_hidden_dim(d: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """Llama's rule for the SwiGLU hidden size: int(8/3·d), times the optional multiplier,
    rounded up to a multiple of ``multiple_of``.

    >>> swiglu_hidden_dim(4096), swiglu_hidden_dim(5120), swiglu_hidden_dim(4096, 1024, 1.3)
    (11008, 13824, 14336)
    """
    positive_ints(d=d, multiple_of=multiple_of)
    hidden = int(2 * (4 * d) / 3)  # parameter-matched to a 4d GELU MLP
    if ffn_dim_multiplier is not None:
        hidden = int(positive_number("ffn_dim_multiplier", ffn_dim_multiplier) * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """Gated FFN: one projection (through SiLU) gates the other, then project back to d."""

    def __init__(self, d: int, d_ff: int):
        super().__init__()
        positive_ints(d=d, d_ff=d_ff)
        self.w_gate = nn.Linear(d, d_ff, bias=False)
        self.w_up = nn.Linear(d, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d, bias=False)

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.w_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))  # [..., d_ff] gated, back to [..., d]
