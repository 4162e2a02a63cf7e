"""Step 2 of the fast layer (modern_block/fast/static_cache.py): the static cache implements the plain cache's
interface with fixed shapes and a position tensor, and the plain model decodes with it unchanged."""

import pytest
import torch
from test_fast import model_for, prompts

from modern_block import KVCache, kv_cache_bytes_per_token
from modern_block.fast.static_cache import StaticKVCache


@pytest.mark.parametrize("name", ["gqa-qknorm", "gpt2", "mla", "dynamic-ntk"])
def test_the_plain_model_gives_the_same_logits_with_either_cache(name):
    """Chunked prefill and single tokens, through each model's own attention (GQA, GPT-2's, MLA's latents)."""
    model = model_for(name)
    idx = prompts(length=14)
    chunks = [(0, 6), (6, 7), (7, 11), (11, 12), (12, 14)]
    dynamic, static = KVCache(len(model.blocks), 14), StaticKVCache(len(model.blocks), 20)
    with torch.no_grad():
        want = torch.cat([model(idx[:, a:b], dynamic) for a, b in chunks], 1)
        got = torch.cat([model(idx[:, a:b], static) for a, b in chunks], 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert int(static.length) == dynamic.length == 14


def test_append_returns_the_whole_buffers_and_advances_one_position_tensor():
    cache = StaticKVCache(n_layers=1, capacity=8)
    layer, length = cache[0], cache[0].length
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    k_all, v_all, past = layer.append(k, v)
    assert k_all.shape == (2, 3, 8, 4) and int(past) == 0 and torch.equal(k_all[:, :, :5], k)
    k_all, v_all, past = layer.append(k[:, :, :1], v[:, :, :1])
    assert k_all.shape == (2, 3, 8, 4) and int(past) == 5 and torch.equal(v_all[:, :, 5], v[:, :, 0])
    assert layer.length is length and int(cache.length) == 6  # advanced in place: the same tensor
    buffers = list(layer.buffers)
    cache.reset()
    assert int(cache.length) == 0 and all(a is b for a, b in zip(layer.buffers, buffers, strict=True))
    assert cache.fits(2, 8, torch.float32, "cpu") and not cache.fits(1, 8, torch.float32, "cpu")
    assert not cache.fits(2, 16, torch.float32, "cpu") and not cache.fits(2, 8, torch.bfloat16, "cpu")
    assert cache.nbytes() == 2 * 2 * 3 * 8 * 4 * 4


def test_cache_bytes_equal_the_formula_at_capacity():
    model = model_for("gqa-qknorm")
    cache = StaticKVCache(len(model.blocks), 16)
    with torch.no_grad():
        model(prompts(batch=3, length=4), cache)
    assert cache.nbytes() == kv_cache_bytes_per_token(2, 2, 8, bytes_per_elem=4) * 16 * 3  # allocated once, full


def test_mismatched_entries_are_a_clear_error():
    model = model_for("gqa-qknorm")
    cache = StaticKVCache(len(model.blocks), 16)
    with torch.no_grad():
        model(prompts(batch=2), cache)
        with pytest.raises(ValueError, match="batch size"):
            model(prompts(batch=1, length=1), cache)
    with pytest.raises(ValueError, match="capacity must be positive"):
        StaticKVCache(2, 0)
    layer = StaticKVCache(1, 8).layers[0]  # the same refusal as the plain cache's when the count differs
    k = torch.zeros(1, 2, 3, 4)
    layer.append(k, k)
    with pytest.raises(ValueError, match=r"^append got 3 tensors but this cache stores 2 per token$"):
        layer.append(k, k, k)
    with pytest.raises(ValueError, match=r"^append got 1 tensors but this cache stores 2 per token$"):
        layer.append(k)
