"""Shared by the tests that compare two greedy decodes computed by different kernels (weight formats, fused or
plain, cached or not, compiled or eager, ours or transformers'): the margin rule of modern_block/fast/agreement.py
with the logit error held to a stated budget."""

import warnings

from modern_block.fast.agreement import DecodeComparison, cached_logits, compare_decodes

__all__ = ["assert_decodes_agree", "cached_logits"]


def assert_decodes_agree(ref_forward, other_forward, ref_seq, other_seq, prompt_len, max_err, what) -> DecodeComparison:
    """The margin rule (the same tokens wherever the reference's top-2 margin exceeds twice the measured logit
    error) and the error itself within ``max_err``, the budget the test states for these two numerics. A flip the
    rule explains is reported as a warning, not failed."""
    cmp = compare_decodes(ref_forward, other_forward, ref_seq, other_seq, prompt_len, what)
    assert cmp.err <= max_err, f"{what}: {cmp}, over the budget {max_err:g}: not rounding"
    if not cmp.same:
        warnings.warn(f"{what}, a flip the margin rule explains: {cmp}", stacklevel=2)
    return cmp
