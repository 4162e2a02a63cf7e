"""The arithmetic of model FLOPs utilisation (MFU): FLOPs per token and the share of a peak.

FLOPs per token (nanoGPT's estimate, from the PaLM paper's appendix):

    6·N + 12·L·H·Q·T

N: parameters used in matrix multiplies (all parameters except embedding tables that are only looked
up: learned positions, and the input embedding when the head is untied); 6 = 2 (multiply-add)
× 3 (forward, and backward for activations and for weights). 12·L·H·Q·T: the attention scores and
the weighted sum of values, L layers, H query heads of size Q, context T (counted for the full
T × T square, as nanoGPT does; causal kernels skip about half of it). GQA does not change this term:
every query head still scores every key.

MFU = FLOPs per token × tokens per second / the GPU's peak dense 16-bit tensor-core FLOP/s.

With several devices (torchrun), FLOPs per token is unchanged (a property of the model), tokens per
second is the whole run's (all devices together), and MFU divides by the peak of all the devices,
N × one GPU's: it is the utilisation of an average device.
"""

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
