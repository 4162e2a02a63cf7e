"""modern_block/profiling.py: the profile summary counts what a call dispatches, its parts add up, the
profiler's banner stays off stderr, and the decoding floor counts the right weights."""

import torch

from modern_block import LlamaStyleLM, generate
from modern_block.fast.profiling import decode_weight_bytes, memory_bandwidth, profile_ops


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


def test_memory_bandwidth_is_positive():
    bw = memory_bandwidth(4 * 2**20, repeats=2)
    assert bw["best"] >= bw["median"] > 0 and bw["bytes"] == 4 * 2**20
