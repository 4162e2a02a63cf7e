"""Counting parameters: in all (shared tensors once) and by component."""

from collections import defaultdict

import torch.nn as nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters; a tied matrix is counted once (``parameters()`` deduplicates)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


_COMPONENT_OF = {  # module name in the path -> component (the first one found, left to right)
    "attn_norm": "norms", "ffn_norm": "norms", "norm": "norms", "ln1": "norms", "ln2": "norms",
    "attn": "attention", "ffn": "ffn", "mlp": "ffn",
    "emb": "embedding", "wpe": "positions", "head": "head",
}


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters per component (embedding, positions, attention, ffn, norms, head); a tied matrix
    counts once, under the embedding that owns it."""
    counts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():  # deduplicated: a tied head does not appear
        parts = name.split(".")
        component = next((_COMPONENT_OF[x] for x in parts if x in _COMPONENT_OF), "other")
        counts[component] += p.numel()
    return dict(counts)
