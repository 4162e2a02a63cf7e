"""Counting parameters (shared tensors once) and the GPT-2-style initialisation both models use."""

import math
from collections import defaultdict

import torch.nn as nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters; a tied matrix is counted once (``parameters()`` deduplicates)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


_COMPONENT_OF = {  # module name in the path -> component (the first one found, left to right)
    "attn_norm": "norms", "ffn_norm": "norms", "norm": "norms", "ln1": "norms", "ln2": "norms", "ln_f": "norms",
    "attn": "attention", "ffn": "ffn", "mlp": "ffn",
    "emb": "embedding", "wte": "embedding", "wpe": "positions", "head": "head",
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


RESIDUAL_OUTPUTS = ("wo", "w_down", "proj")  # layers that write into the residual stream


def init_gpt2_style(model: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """Normal(0, 0.02) weights, zero biases, unit norm scales; the projections that write into the
    residual stream get std 0.02/sqrt(2·n_layers) so the stream's variance does not grow with depth."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            scaled = name.rsplit(".", 1)[-1] in RESIDUAL_OUTPUTS
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * n_layers) if scaled else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
