"""The committed side-by-side run of weight formats and llama.cpp (benchmarks/results_formats_cpu.json, written by
benchmarks/llama_cpp_bench.py, shown by lesson 10): every row keyed by its weight format, its numbers consistent
with each other and with the bytes each format stores; the benchmark's divergence helper on a tiny model."""

import json
import statistics
import sys

import pytest
import torch
from repo_files import ROOT, load_module
from test_fast import model_for, prompts

from modern_block import generate

RESULTS = ROOT / "benchmarks" / "results_formats_cpu.json"
PATHS = {"fast_fp32", "fast_bf16", "fast_int8", "transformers_fp32", "llama_cpp_q4_1"}


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return load_module("benchmarks/llama_cpp_bench.py")


def test_every_row_is_keyed_by_its_format_and_consistent(results):
    assert set(results["formats"]) == PATHS and set(results["threads"]) == {"1", "2"}
    assert results["gpu"] is None and results["torch"] and results["date"] and "load average" in results["machine"]
    for block in results["threads"].values():
        assert set(block["rows"]) == PATHS
        for name, row in block["rows"].items():
            assert len(row["step_s"]) == results["rounds"]
            assert row["ms_per_token"] == pytest.approx(1e3 * statistics.median(row["step_s"]))
            assert row["tokens_per_s"] == pytest.approx(1e3 / row["ms_per_token"])
            assert row["bytes_per_token"] == results["formats"][name]["bytes_per_token"]
            assert row["floor_ms"] == pytest.approx(1e3 * row["bytes_per_token"] / block["bandwidth_best_bytes_per_s"])
            assert row["floor_share"] == pytest.approx(row["floor_ms"] / row["ms_per_token"])
            assert isinstance(row["same_tokens"], bool)
        assert block["rows"]["fast_fp32"]["x_fast_fp32_median"] == 1.0


def test_the_bytes_per_token_are_the_formats(results):
    b = {name: f["bytes_per_token"] for name, f in results["formats"].items()}
    assert b["fast_fp32"] == b["transformers_fp32"] == 538_062_336  # lesson 10's count
    assert b["fast_bf16"] == pytest.approx(b["fast_fp32"] / 2, rel=1e-3)  # the fp32 norms stay
    # int8: one byte per weight, a 2-byte scale per row, the fp32 norms
    assert b["fast_int8"] == pytest.approx(b["fast_fp32"] / 4, rel=0.01) and b["fast_int8"] > b["fast_fp32"] / 4
    assert b["llama_cpp_q4_1"] == 96_576_768 + 612  # the file's tensors, + one Q8_0 row of the embedding


def test_tokens_and_bits_per_character_are_recorded(results):
    for name, f in results["formats"].items():
        assert len(f["tokens"]) == 3
        for t in f["tokens"]:
            d = t["divergence"]
            assert d is None or (0 <= d["new_token"] < results["check_new_tokens"] and d["fp32_margin"] >= 0)
        assert f["same_tokens_all_prompts"] == all(t["divergence"] is None for t in f["tokens"])
        if name.startswith("fast_"):
            b = f["bits_per_char"]
            assert b["windows"] > 1 and b["min"] <= b["pooled"] <= b["max"]
    assert results["formats"]["fast_fp32"]["same_tokens_all_prompts"]
    bpc = {n: results["formats"][n]["bits_per_char"]["pooled"] for n in ("fast_fp32", "fast_bf16", "fast_int8")}
    assert abs(bpc["fast_bf16"] - bpc["fast_fp32"]) < 0.02 and abs(bpc["fast_int8"] - bpc["fast_fp32"]) < 0.02


def test_first_divergence_and_the_table(bench, results):
    model = model_for("gqa-qknorm")
    idx = prompts(batch=1)
    ref = generate(model, idx, 6)
    assert bench.first_divergence(model, ref, ref.clone(), idx.shape[1]) is None
    other = ref.clone()
    with torch.no_grad():
        logits = model(ref[:, :idx.shape[1] + 2])[0, -1]  # before the third new token
    other[0, idx.shape[1] + 2] = int(logits.argsort()[-2])  # the runner-up instead
    d = bench.first_divergence(model, ref, other, idx.shape[1])
    assert d["new_token"] == 2
    assert d["fp32_margin"] == pytest.approx((logits.max() - logits.sort().values[-2]).item(), abs=1e-5)
    lines = bench.table_lines(results)
    assert len(lines) == 1 + 2 * len(PATHS) and all(name in "".join(lines) for name in PATHS)
