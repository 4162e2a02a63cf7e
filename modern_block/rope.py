"""Rotary position embeddings (Su et al., 2021).

Each head vector is split into d_h/2 pairs; pair i of the token at position m is rotated by the
angle m·θ_i with θ_i = base^(-2i/d_h). Rotating q and k by their own positions makes the score
q_m·k_n depend on the offset n - m only, because R(a)ᵀR(b) = R(b - a).

Two layouts pair the dimensions differently, and weights trained with one only work with it:
  * half-split ("rotate half", Llama/Hugging Face): dimension i pairs with i + d_h/2;
  * interleaved (the RoFormer paper, Meta's original Llama code): dimension 2i pairs with 2i+1.
A fixed permutation of each head's q/k output rows converts one into the other.
"""

import torch

from ._validate import even, positive_int


def rope_frequencies(dh: int, base: float = 10000.0) -> torch.Tensor:
    """θ_i = base^(-2i/dh) for i = 0 .. dh/2-1, in radians per token. Shape [dh/2]."""
    positive_int("dh", dh)
    even("dh", dh, "for RoPE (dimensions are rotated in pairs)")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base}")
    return 1.0 / (base ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))  # [dh/2]


def rope_cache(T: int, dh: int, base: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles m·θ_i for positions m = 0 .. T-1. Each of shape [T, dh/2]."""
    positive_int("T", T)
    theta = rope_frequencies(dh, base).to(device)  # [dh/2]
    angles = torch.outer(torch.arange(T, dtype=torch.float32, device=device), theta)  # [T, dh/2]
    return angles.cos(), angles.sin()


def _broadcast_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Check the tables against x and shape them to broadcast over heads; cast to x's dtype."""
    dh = x.shape[-1]
    even("the head dimension x.shape[-1]", dh, "for RoPE")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {list(cos.shape)} and {list(sin.shape)}")
    if cos.shape[-1] != dh // 2:
        raise ValueError(f"cos/sin last dim must be head_dim/2 = {dh // 2}, got {cos.shape[-1]}")
    if cos.dim() == 3 and x.dim() == 4:  # per-sequence tables [B, T, dh/2] -> [B, 1, T, dh/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if cos.dtype != x.dtype:  # bf16/fp16 activations: rotate in their dtype, as Hugging Face does
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x in the half-split layout: pair (i, i + dh/2).

    x: [B, heads, T, dh]; cos, sin: [T, dh/2] (same positions for every sequence) or [B, T, dh/2].
    """
    cos, sin = _broadcast_tables(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)  # [B, heads, T, dh/2] each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # [B, heads, T, dh]


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x in the interleaved layout: pair (2i, 2i + 1). Same shapes as ``apply_rope``."""
    cos, sin = _broadcast_tables(x, cos, sin)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # [B, heads, T, dh/2] each
    rotated = torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1)  # [..., dh/2, 2]
    return rotated.flatten(-2)  # [B, heads, T, dh]


def interleaved_to_half_split(dh: int) -> torch.Tensor:
    """Index permutation p with x_half = x_interleaved[..., p]: evens first, then odds. Shape [dh]."""
    positive_int("dh", dh)
    even("dh", dh, "for RoPE")
    return torch.cat([torch.arange(0, dh, 2), torch.arange(1, dh, 2)])


def permute_qk_weight(weight: torch.Tensor, n_heads: int, to: str = "half_split") -> torch.Tensor:
    """Reorder the output rows of a q or k projection (or its bias) between the RoPE layouts.

    weight: [n_heads * dh, d_in] (or [n_heads * dh] for a bias), laid out head after head.
    ``to="half_split"`` converts interleaved-trained weights for ``apply_rope``;
    ``to="interleaved"`` goes the other way. The attention scores are unchanged by the conversion.
    """
    positive_int("n_heads", n_heads)
    if to not in ("half_split", "interleaved"):
        raise ValueError(f"to must be 'half_split' or 'interleaved', got {to!r}")
    rows = weight.shape[0]
    if rows % n_heads:
        raise ValueError(f"weight.shape[0] ({rows}) must be divisible by n_heads ({n_heads})")
    dh = rows // n_heads
    perm = interleaved_to_half_split(dh).to(weight.device)
    if to == "interleaved":
        perm = torch.argsort(perm)
    per_head = weight.reshape(n_heads, dh, *weight.shape[1:])  # [n_heads, dh, ...]
    return per_head[:, perm].reshape(weight.shape)
