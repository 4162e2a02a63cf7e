"""Regression guards on performance, as ratios inside one process (never absolute times)."""

import statistics
import time

import pytest
import torch
from repo_files import load_module

from modern_block import KVCache, LlamaStyleLM, generate


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_cached_decoding_beats_recomputation_by_a_wide_margin():
    """256 new tokens: recomputing the whole prefix each step costs O(T²); the cache makes it O(T).
    The benchmark measures ~10x or more at this size; fail well below that, at 3x."""
    torch.manual_seed(0)
    model = LlamaStyleLM(V=256, d=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=352, max_len=512).eval()
    prompt = torch.randint(0, 256, (1, 8))
    cached = lambda: generate(model, prompt, 256, use_cache=True)  # noqa: E731
    uncached = lambda: generate(model, prompt, 256, use_cache=False)  # noqa: E731
    cached(), uncached()  # warm-up
    t_cached, t_uncached = [], []
    for _ in range(3):  # interleaved, so background load hits both alike
        t_cached.append(_median_time(cached, 1))
        t_uncached.append(_median_time(uncached, 1))
    speedup = statistics.median(t_uncached) / statistics.median(t_cached)
    assert speedup > 3, f"cached decoding is only {speedup:.1f}x faster than recomputation"


def test_cache_append_does_not_reallocate():
    """The cache is written in place: its buffers keep their storage while it fills."""
    model = LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64).eval()
    cache = KVCache(len(model.blocks), 40)
    with torch.inference_mode():
        model(torch.zeros(1, 8, dtype=torch.long), cache)
        ptrs = [b.data_ptr() for layer in cache.layers for b in layer.buffers]  # allocated by the prefill
        for _ in range(30):
            model(torch.zeros(1, 1, dtype=torch.long), cache)
    assert cache.length == 38
    assert ptrs == [b.data_ptr() for layer in cache.layers for b in layer.buffers]


def test_benchmark_script_measures_both_models_on_the_same_tokens():
    """benchmarks/cpu_vs_hf.py in miniature: the converted model decodes exactly Hugging Face's
    tokens, the ratios come out, and the cache holds the formula's bytes."""
    pytest.importorskip("transformers")
    bench = load_module("benchmarks/cpu_vs_hf.py")
    ours, hf = bench.build_pair()
    row = bench.bench_decode(ours, hf, 8, repeats=1)
    assert row["decode8_same_tokens"] and row["decode8_ratio"] > 0 and row["decode8_ratio_best"] > 0
    row = bench.bench_cache_speedup(ours, 8, repeats=1)
    assert row["speedup8_same_tokens"]
    sizes = bench.bench_cache_bytes()
    assert sizes["cache_bytes_gqa"] == sizes["cache_bytes_gqa_formula"] == 307_200
    assert sizes["cache_bytes_mla"] == sizes["cache_bytes_mla_formula"] == 192_000
