"""Shared by the tests that compare two greedy decodes computed by different kernels (weight formats, fused or
plain, cached or not, compiled or eager, ours or transformers'): the margin rule of modern_block/fast/agreement.py
with the logit error held to a stated budget, and the plain model's logits through its own KV cache."""

import warnings

import torch

from modern_block import KVCache
from modern_block.fast.agreement import DecodeComparison, compare_decodes


def assert_decodes_agree(ref_forward, other_forward, ref_seq, other_seq, prompt_len, max_err, what) -> DecodeComparison:
    """The margin rule (the same tokens wherever the reference's top-2 margin exceeds twice the measured logit
    error) and the error itself within ``max_err``, the budget the test states for these two numerics. A flip the
    rule explains is reported as a warning, not failed."""
    cmp = compare_decodes(ref_forward, other_forward, ref_seq, other_seq, prompt_len, what)
    assert cmp.err <= max_err, f"{what}: {cmp}, over the budget {max_err:g}: not rounding"
    if not cmp.same:
        warnings.warn(f"{what}, a flip the margin rule explains: {cmp}", stacklevel=2)
    return cmp


def cached_logits(model, idx: torch.Tensor, prefill: int) -> torch.Tensor:
    """The plain model's logits at every position of idx [B, T] through its own KV cache: the first ``prefill``
    tokens at once, then one at a time, as ``generate`` computes them. [B, T, V]"""
    cache = KVCache(len(model.blocks), idx.shape[1])
    with torch.inference_mode():
        first = model(idx[:, :prefill], cache)
        steps = [model(idx[:, t:t + 1], cache) for t in range(prefill, idx.shape[1])]
    return torch.cat([first, *steps], 1)
