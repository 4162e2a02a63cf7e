"""Small models shared by the cache and decoding tests: GQA with QK-norm, tied MQA, GPT-2."""

import torch
import torch.nn as nn

from modern_block import GPT2LM, CausalSelfAttention, GQAttention, LlamaStyleLM, MLAttention


def tiny_models():
    """Three tiny seeded models on V = 64: the cache and decoding tests run each."""
    torch.manual_seed(0)
    return [LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64),
            LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=64, max_len=64, tie=True,
                         qk_norm=False),
            GPT2LM(64, d=32, n_layers=2, n_heads=4, max_len=64)]


def dropout_rates(model: nn.Module) -> list[float]:
    """The rate of every dropout of a model: each nn.Dropout module, and each attention's dropout on its weights."""
    return ([m.p for m in model.modules() if isinstance(m, nn.Dropout)]
            + [m.dropout for m in model.modules() if isinstance(m, CausalSelfAttention | GQAttention | MLAttention)])
