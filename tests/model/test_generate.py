"""Decoding: the same tokens with and without the cache, seeded sampling, top-k."""

import warnings

import pytest
import torch
from decodes import assert_decodes_agree, cached_logits
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import tiny_models

from modern_block import (
    LlamaStyleLM,
    generate,
)
from modern_block.generate import next_token

GiB, MiB, KiB = 2**30, 2**20, 2**10


@settings(max_examples=12, deadline=None)
@given(prompt_len=st.integers(1, 12), new=st.integers(1, 20), batch=st.integers(1, 3), seed=st.integers(0, 1000))
def test_cached_decoding_equals_recomputation(prompt_len, new, batch, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 64, (batch, prompt_len), generator=g)
    for model in tiny_models():
        with_cache = generate(model, idx, new, use_cache=True)
        without = generate(model, idx, new, use_cache=False)
        assert with_cache.shape == (batch, prompt_len + new)
        # the cache computes the same logits with other shapes (other kernels): the margin rule, not equality
        assert_decodes_agree(model, lambda s, m=model: cached_logits(m, s, prompt_len), without, with_cache,
                             prompt_len, 1e-5, "cached against recomputed")
        assert torch.equal(with_cache[:, :prompt_len], idx)  # the prompt itself, copied


def test_sampling_is_seeded_and_cache_independent():
    """The same seed on the same path (the same kernels): exactly the same tokens. With and without the cache the
    sampler draws the same random numbers from the same distributions (up to rounding), so a differing token can
    only be a near-tie of the kernels' rounding: reported, not failed."""
    model = tiny_models()[0].eval()
    idx = torch.zeros(2, 3, dtype=torch.long)
    gens = [torch.Generator().manual_seed(7) for _ in range(3)]
    runs = [generate(model, idx, 15, use_cache=c, temperature=0.8, top_k=10, generator=g)
            for c, g in zip((True, False, True), gens, strict=True)]
    assert torch.equal(runs[0], runs[2])
    assert torch.equal(gens[0].get_state(), gens[1].get_state())  # the same draws with and without the cache
    with torch.no_grad():
        probs = [torch.softmax(x[:, 2:-1] / 0.8, -1) for x in (model(runs[0]), cached_logits(model, runs[0], 3))]
    torch.testing.assert_close(probs[1], probs[0], atol=1e-6, rtol=0)
    if not torch.equal(runs[0], runs[1]):
        warnings.warn(f"sampled tokens differ with and without the cache: {runs[0].tolist()} {runs[1].tolist()}",
                      stacklevel=1)
    other = generate(model, idx, 15, temperature=0.8, top_k=10, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(runs[0], other)


def test_top_k_one_is_greedy():
    model = tiny_models()[2]
    idx = torch.randint(0, 64, (2, 4))
    assert torch.equal(generate(model, idx, 10, temperature=1.5, top_k=1), generate(model, idx, 10))


def test_a_tiny_temperature_is_greedy_not_an_error():
    # logits / 1e-45 overflow to inf and inf - inf is nan inside softmax; shifting by the max first avoids it
    for model in tiny_models():
        idx = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(1))
        tiny_t = generate(model, idx, 8, temperature=1e-45, generator=torch.Generator().manual_seed(0))
        assert torch.equal(tiny_t, generate(model, idx, 8))


def test_next_token_is_greedy_by_default():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(next_token(logits), logits.argmax(dim=-1, keepdim=True))


def test_top_k_samples_each_row_from_its_own_k_largest():
    """top_k below V filters every row, whatever the batch size (here top_k = 5 > B = 4)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    allowed = logits.topk(5, dim=-1).indices  # [B, 5]
    drawn = torch.cat([next_token(logits, 1.0, top_k=5, generator=g) for _ in range(200)], dim=1)  # [B, 200]
    assert all(set(row.tolist()) <= set(ok.tolist()) for row, ok in zip(drawn, allowed, strict=True))
    assert all(len(set(row.tolist())) > 1 for row in drawn)  # sampled, not greedy


def test_the_last_new_token_needs_no_room():
    """prompt + max_new_tokens - 1 positions are run (the last token is never fed back): that may equal max_len."""
    model = LlamaStyleLM(V=50, d=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_len=8)
    idx = torch.zeros(1, 4, dtype=torch.long)
    for use_cache in (True, False):
        assert generate(model, idx, 5, use_cache=use_cache).shape == (1, 9)
    with pytest.raises(ValueError, match=r"^prompt length \(4\) \+ max_new_tokens \(6\) - 1 = 9 exceeds the model's "
                                         r"max_len \(8\)$"):
        generate(model, idx, 6)


def test_bad_requests_are_refused_naming_the_argument():
    model = tiny_models()[0]
    with pytest.raises(ValueError, match=r"^top_k must be positive, got 0$"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 2, temperature=1.0, top_k=0)
    rule = r"^idx must be a \[batch, seq_len\] tensor of token ids, got "
    with pytest.raises(ValueError, match=rule + r"torch.Size\(\[4\]\)$"):  # a tensor: its shape
        generate(model, torch.zeros(4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=rule + r"\[\[1, 2\]\]$"):  # anything else: itself
        generate(model, [[1, 2]], 2)
