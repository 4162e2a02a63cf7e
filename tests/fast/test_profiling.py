"""modern_block/profiling.py: the profile summary counts what a call dispatches, its parts add up, the
profiler's banner stays off stderr, the decoding floor counts the right weights, and a decoding step's time is
measured by difference in interleaved rounds, and the benchmarks' table of decoding paths."""

import pytest
import torch

from modern_block import LlamaStyleLM, generate
from modern_block.fast.profiling import (
    decode_step_seconds,
    decode_weight_bytes,
    memory_bandwidth,
    profile_ops,
    step_table_lines,
)


def test_profile_counts_outermost_ops_and_its_parts_add_up(capfd):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    p = profile_ops(lambda: [torch.mm(a, b) for _ in range(3)] + [torch.softmax(a, -1)])
    assert p.ops == 4  # three matmuls and a softmax; the kernels they call inside are not counted again
    assert p.by_kind["matmul"] > 0 and p.by_kind["attention"] == 0
    assert abs(sum(p.by_kind.values()) - p.seconds) < 1e-3 * p.seconds + 1e-6
    half = p.per(2)
    assert half.ops == 2 and half.seconds == p.seconds / 2
    assert "ops" in str(p) and "matmul" in str(p)
    assert "profiler" not in capfd.readouterr().err  # the C++ library's start/stop lines are silenced


def test_profile_of_a_decode_sees_the_layers():
    model = LlamaStyleLM(V=64, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64).eval()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    one, two = (profile_ops(lambda n=n: generate(model, prompt, n)).ops for n in (2, 3))
    assert two - one > 20  # one more decoding step: every layer's operators again


def test_decode_weight_bytes_counts_one_embedding_row():
    untied = LlamaStyleLM(V=100, d=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    tied = LlamaStyleLM(V=100, d=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, tie=True)
    everything = 4 * sum(p.numel() for p in untied.parameters())
    assert decode_weight_bytes(untied) == everything - 4 * 100 * 16 + 4 * 16  # the table is looked up, not read
    # tied: the matrix is one parameter (counted once), read whole by the head, plus the looked-up row
    assert decode_weight_bytes(tied) == 4 * sum(p.numel() for p in tied.parameters()) + 4 * 16
    assert decode_weight_bytes(tied) == everything - 4 * 100 * 16 + 4 * 16
    with pytest.raises(TypeError, match="model must be a DecoderLM"):
        decode_weight_bytes(torch.nn.Linear(16, 100))  # a head alone: no embedding to tell apart


def test_memory_bandwidth_is_positive():
    bw = memory_bandwidth(4 * 2**20, repeats=2)
    assert bw["best"] >= bw["median"] > 0 and bw["bytes"] == 4 * 2**20


def test_memory_bandwidth_uses_the_clock_it_is_given():
    ticks = iter(range(100))
    bw = memory_bandwidth(2**20, repeats=3, clock=lambda: next(ticks))  # every copy takes one tick
    assert bw["best"] == bw["median"] == 2 * 2**20


def test_decode_step_seconds_takes_the_difference_in_interleaved_rounds():
    now, order = [0.0], []

    def decoder(name, fixed, per_token):
        def decode(n):  # a fake decoder on a fake clock: a fixed cost (the prefill) plus n steps
            order.append((name, n))
            now[0] += fixed + n * per_token
            return torch.full((1, n), per_token)
        return decode

    seconds, tokens = decode_step_seconds({"a": decoder("a", 5.0, 0.5), "b": decoder("b", 1.0, 0.25)}, rounds=2,
                                          short=2, long=6, clock=lambda: now[0])
    assert seconds == {"a": [0.5, 0.5], "b": [0.25, 0.25]}  # the fixed cost cancels
    assert order == [("a", 2), ("a", 6), ("b", 2), ("b", 6)] * 2  # a, b, a, b: interleaved
    assert tokens["a"].shape == (1, 6)
    with pytest.raises(ValueError, match="long"):
        decode_step_seconds({}, 1, short=4, long=4)


def test_step_table_lines_show_ms_the_median_ratio_its_range_and_the_floor_share():
    step_s = {"plain": [0.100, 0.120, 0.110], "fast": [0.050, 0.080, 0.044]}  # per-round ratios 2.0, 1.5, 2.5
    header, plain, fast = step_table_lines(step_s, floor_ms=22.0, same_tokens={"plain": True, "fast": False})
    assert header.split() == ["path", "ms/token", "x", "plain", "rounds", "of", "floor", "same", "tokens"]
    assert plain.split() == ["plain", "110.0", "1.00x", "1.00-1.00", "20%", "True"]
    # the median of the rounds' ratios (2.0x), not the ratio of the medians (110 / 50 = 2.2x)
    assert fast.split() == ["fast", "50.0", "2.00x", "1.50-2.50", "44%", "False"]
    for row, ms in ((plain, "110.0"), (fast, "50.0")):  # the numbers end under their headings
        assert row.index(ms) + len(ms) == header.index("ms/token") + len("ms/token")
        assert row.index("%") + 1 == header.index("of floor") + len("of floor")
    no_tokens = step_table_lines(step_s, 22.0, baseline="fast")
    assert "same" not in no_tokens[0] and "x fast" in no_tokens[0]
    assert no_tokens[1].split()[2:4] == ["0.50x", "0.40-0.67"]
    with pytest.raises(ValueError, match="baseline"):
        step_table_lines(step_s, 22.0, baseline="hf")
