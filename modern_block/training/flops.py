"""Model FLOPs utilisation: FLOPs per token, 6·N + 12·L·H·Q·T (nanoGPT's estimate: N the parameters used in
matrix products, the attention term over the full T × T square), and its share of a device's peak."""

import torch.nn as nn


def matmul_parameters(model: nn.Module) -> int:
    """N in 6·N: parameters minus embedding tables used only for look-ups (a table tied to the
    output head is a matrix multiply there, so it counts)."""
    in_linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight): m.weight.numel() for m in model.modules()
               if isinstance(m, nn.Embedding) and id(m.weight) not in in_linear}
    return sum(p.numel() for p in model.parameters()) - sum(lookups.values())


def flops_per_token(n_matmul_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, 6·N + 12·L·H·Q·T (forward and backward)."""
    return 6 * n_matmul_params + 12 * n_layers * n_heads * head_dim * seq_len


def model_flops_per_token(model: nn.Module, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> int:
    return flops_per_token(matmul_parameters(model), n_layers, n_heads, head_dim, seq_len)


def mfu(flops_per_tok: float, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]; None when the peak is unknown (CPU, unlisted GPU)."""
    if peak is None:
        return None
    return flops_per_tok * tokens_per_s / peak
