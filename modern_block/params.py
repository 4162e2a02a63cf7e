"""Counting parameters (shared tensors once) and the GPT-2-style initialisation every language model uses."""

import math
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


def init_gpt2_style(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation of a ``decoder.DecoderLM``: Normal(0, 0.02) weights for every linear layer and
    embedding, zero biases (norm scales keep their ones). The linears that write into the residual stream,
    which each block names in ``residual_projections()``, get std 0.02/sqrt(2·n_layers): every layer adds
    two such outputs to the stream, and the smaller std keeps the stream's variance from growing with depth.

    The draws follow ``model.modules()`` (the order the parts were registered in), so a model built from the
    same parts in the same order gets the same weights from the same seed."""
    n_layers = len(model.blocks)
    residual = [linear for block in model.blocks for linear in block.residual_projections()]
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * n_layers) if module in residual else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
