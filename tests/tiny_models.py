"""Small models shared by the cache and decoding tests: GQA with QK-norm, tied MQA, GPT-2."""

import torch

from modern_block import GPT2LM, LlamaStyleLM


def tiny_models():
    """Three tiny seeded models on V = 64: the cache and decoding tests run each."""
    torch.manual_seed(0)
    return [LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64),
            LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=64, max_len=64, tie=True,
                         qk_norm=False),
            GPT2LM(64, d=32, n_layers=2, n_heads=4, max_len=64)]
