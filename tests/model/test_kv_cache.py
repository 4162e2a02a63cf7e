"""The KV cache: bytes equal to the formula, chunked prefill, clear errors, the chapter's cache figures."""

import re

import pytest
import torch
from tiny_models import tiny_models

from modern_block import (
    GPT2LM,
    PRESETS,
    KVCache,
    LayerCache,
    LlamaStyleLM,
    cache_size,
    kv_cache_bytes_per_token,
    mla_cache_bytes_per_token,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


@pytest.mark.parametrize("which", [0, 2])
def test_chunked_prefill_with_cache_equals_full_forward(which):
    model = tiny_models()[which].eval()
    idx = torch.randint(0, 64, (2, 20))
    full = model(idx)
    cache = KVCache(len(model.blocks), 20)
    parts = [model(idx[:, a:b], cache) for a, b in [(0, 7), (7, 8), (8, 15), (15, 20)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == 20


def test_cache_bytes_equal_formula():
    for model, n_kv, dh in [(LlamaStyleLM(V=64, d=64, n_layers=3, n_heads=8, n_kv_heads=2, d_ff=64), 2, 8),
                            (GPT2LM(64, d=48, n_layers=2, n_heads=6), 6, 8)]:
        n, B = 37, 3
        L = len(model.blocks)
        cache = KVCache(L, n)
        assert cache.nbytes() == 0  # nothing allocated before the first token
        model(torch.randint(0, 64, (B, n)), cache)
        assert cache.length == n
        assert cache.nbytes() == kv_cache_bytes_per_token(L, n_kv, dh, bytes_per_elem=4) * n * B
        bf16 = KVCache(L, n)
        model.to(torch.bfloat16)(torch.randint(0, 64, (1, 5)), bf16)  # the cache takes the dtype it is given
        assert bf16.nbytes() == kv_cache_bytes_per_token(L, n_kv, dh) * n


def test_cache_overflow_and_batch_mismatch_are_clear_errors():
    model = tiny_models()[0]
    cache = KVCache(len(model.blocks), 4)
    model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        model(torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="batch size"):
        model(torch.zeros(2, 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="the cache has 3 layers but the model has 2"):
        model(torch.zeros(1, 1, dtype=torch.long), KVCache(3, 4))
    with pytest.raises(ValueError, match="capacity must be positive"):
        KVCache(2, 0)
    with pytest.raises(ValueError, match=r"^n_layers must be positive, got 0$"):
        KVCache(0, 4)


def test_a_layer_cache_holds_any_number_of_tensors_and_refuses_another_count():
    """One stored tensor (or three) works like K and V: the views hold everything so far, the old length comes back."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 3):
        cache = LayerCache(5)
        first = [torch.randn(2, 3, 4 + i, generator=g) for i in range(n)]
        *held, start = cache.append(*first)
        assert start == 0 and all(torch.equal(h, x) for h, x in zip(held, first, strict=True))
        second = [torch.randn(2, 2, 4 + i, generator=g) for i in range(n)]
        *held, start = cache.append(*second)
        assert start == 3 and cache.length == 5
        assert all(torch.equal(h, torch.cat([a, b], dim=1)) for h, a, b in zip(held, first, second, strict=True))
        other = LayerCache(9)
        other.append(*first)
        with pytest.raises(ValueError, match=rf"^append got {n + 1} tensors but this cache stores {n} per token$"):
            other.append(*first, first[0])  # one more than it stores (a K/V cache handed to an MLA layer, ...)
        if n > 1:
            with pytest.raises(ValueError, match=rf"^append got 1 tensors but this cache stores {n} per token$"):
                other.append(first[0])


@pytest.mark.parametrize("stored,new,layout", [
    ([(1, 2, 3, 8)] * 2, [(3, 2, 1, 8)] * 2, "[1, 2] + [T, 8]"),  # K and V [B, n_kv, T, d_h]: the batch changed
    ([(1, 2, 3, 8)] * 2, [(1, 4, 1, 8)] * 2, "[1, 2] + [T, 8]"),  # the KV heads changed
    ([(1, 3, 16), (1, 3, 4)], [(2, 1, 16), (2, 1, 4)], "[1] + [T, 16]"),  # MLA's latent [B, T, d_c] and key
])
def test_a_changed_batch_or_head_count_is_refused_showing_the_cache_layout(stored, new, layout):
    cache = LayerCache(6)
    cache.append(*(torch.zeros(s) for s in stored))
    message = f"cache entries of shape {list(new[0])} do not match the cache's {layout} (batch size or heads changed?)"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        cache.append(*(torch.zeros(s) for s in new))


def test_llama3_70b_cache_table():
    per_token = {n_kv: kv_cache_bytes_per_token(80, n_kv, 128, 2) for n_kv in (64, 8, 1)}
    assert per_token == {64: 2_621_440, 8: 327_680, 1: 40_960}
    assert per_token[64] == 2.5 * MiB and per_token[8] == 320 * KiB and per_token[1] == 40 * KiB
    assert [per_token[n] * 131_072 / GiB for n in (64, 8, 1)] == [320, 40, 5]
    assert cache_size("Llama 3 70B", 131_072) == 40 * GiB


def test_small_gqa_example_and_ratio():
    per_token = kv_cache_bytes_per_token(32, 8, 128, 2)
    assert per_token == 131_072 == 128 * KiB
    assert per_token * 32_768 == 4 * GiB
    assert kv_cache_bytes_per_token(32, 32, 128) / per_token == 4  # h / n_kv, not 8x


def test_deepseek_v3_mla_cache():
    mla = mla_cache_bytes_per_token(61, 512, 64, 2)
    assert mla == 70_272 == PRESETS["DeepSeek-V3"].bytes_per_token()
    assert cache_size("DeepSeek-V3", 131_072) == mla * 131_072 and round(mla * 131_072 / GiB, 1) == 8.6


def test_cache_sizes_default_to_two_bytes_per_element():
    assert kv_cache_bytes_per_token(3, 2, 8) == 2 * 3 * 2 * 8 * 2  # K and V, bf16
    assert mla_cache_bytes_per_token(3, 16, 8) == 3 * (16 + 8) * 2
