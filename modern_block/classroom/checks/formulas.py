"""Reference formulas in float64, with one keyword per common mistake: the candidates the checks
compare a wrong output with are these formulas with a knob turned."""

from __future__ import annotations

import torch


def rms64(x, eps, *, center=False, unbiased=False, eps_outside=False, no_sqrt=False, use_sum=False, dim=-1):
    """sqrt(mean(x², dim) + eps) (keepdim), with a knob per common mistake."""
    x = x.double()
    if center:
        x = x - x.mean(dim, keepdim=True)
    n = x.shape[dim]
    ms = x.pow(2).sum(dim, keepdim=True) / (1 if use_sum else (n - 1) if unbiased else n)
    return ms + eps if no_sqrt else ms.sqrt() + eps if eps_outside else (ms + eps).sqrt()


def rms_norm64(x, weight, eps, *, center=False, multiply=False, dim=-1, **knobs):
    """x / rms64(x), times ``weight`` unless it is None (``multiply``: times the RMS instead)."""
    x = x.double()
    if center:
        x = x - x.mean(dim, keepdim=True)
    denom = rms64(x, eps, dim=dim, **knobs)
    y = x * denom if multiply else x / denom
    return y if weight is None else y * weight.double()


def rope64(x, cos, sin, layout="half", sign=1.0, swap_halves=False, swap_tables=False):
    """RoPE in float64 with knobs: layout half/interleaved, rotation sign, output halves swapped,
    cos and sin swapped."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    if swap_tables:
        cos, sin = sin, cos
    sin = sign * sin
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        return torch.cat([b, a] if swap_halves else [a, b], dim=-1)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        if swap_halves:  # results written back half-split instead of re-interleaved
            return torch.cat([a, b], dim=-1)
        return torch.stack([a, b], dim=-1).flatten(-2)
    if layout == "none":
        return x
    if layout == "cos_only":
        return x * torch.cat([cos, cos], dim=-1)
    raise ValueError(layout)
