"""The GPU benchmark's smoke mode and its time budgeting, on the CPU."""

import json

from repo_files import load_module
from training_setup import never_online  # noqa: F401 (an autouse fixture: keeps these tests offline)

from modern_block.ladder import RUNG_NAMES


def test_gpu_benchmark_smoke_mode(tmp_path):
    bench = load_module("benchmarks/gpu_train.py")
    assert bench.main(["--smoke", "--out", str(tmp_path), "--seeds", "0", "1"]) == 0
    report = json.loads((tmp_path / "gpu_results.json").read_text())
    assert set(report["comparison"]) == {"gpt2", "llama"}
    assert [r["rung"] for r in report["ladder"]["rows"]] == list(RUNG_NAMES)
    assert report["ladder"]["ends_from_comparison"]
    assert report["ladder"]["rows"][0]["val_losses"] == report["comparison"]["gpt2"]["best_val_losses"]
    for png in ("loss_curves.png", "ladder.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "| rung | change |" in (tmp_path / "results_snippet.md").read_text()


def test_ladder_budget_fits_the_time_left():
    fit = lambda left_s: bench_steps(left_s)  # noqa: E731
    assert fit(10_000) == 5000, "plenty of time: the full budget, ends reused"
    assert fit(5) == 250, "never below one unit"
    mid = fit(200)
    assert 250 <= mid < 5000 and mid % 250 == 0


def bench_steps(left_s: float) -> int:
    bench = load_module("benchmarks/gpu_train.py")
    # comparison: 6 runs took 120 s; ladder: 15 runs at the full budget, 21 below it
    return bench.ladder_steps_for(left_s, 0.0, 120.0, 6, 15, 21, 5000, 250)
