"""The GPU benchmark's parts in smoke mode, on the CPU: the same code path as on a GPU, tiny."""

import json

import pytest
from repo_files import load_module
from training_setup import never_online  # noqa: F401 (an autouse fixture: keeps these tests offline)

from modern_block.ladder import ABLATION_NAMES, LADDER_NAMES, LLAMA_END


def test_gpu_benchmark_smoke_mode(tmp_path):
    bench = load_module("benchmarks/gpu_train.py")
    assert bench.main(["--smoke", "--out", str(tmp_path), "--part", "all", "--seeds", "0", "1",
                       "--rates", "1e-3", "1e-2"]) == 0
    reports = {part: json.loads((tmp_path / f"{part}.json").read_text()) for part in bench.PARTS}
    assert [r["rung"] for r in reports["compare"]["rows"]] == ["untied", LLAMA_END]
    assert [r["rung"] for r in reports["tied"]["rows"]] == ["gpt2", "tied"]
    assert [r["rung"] for r in reports["ladder"]["rows"]] == list(LADDER_NAMES)
    assert [r["rung"] for r in reports["ablations"]["rows"]] == [LLAMA_END, *ABLATION_NAMES]
    for report in reports.values():
        for row in report["rows"]:
            assert row["lr"] in (1e-3, 1e-2) and len(row["val_losses"]) == 2 and set(row["rates"]) == {"0.001", "0.01"}
    # one budget and one set of seeds: the ladder's top is the same runs as the comparison's Llama arm
    assert reports["ladder"]["rows"][-1]["val_losses"] == reports["compare"]["rows"][1]["val_losses"]
    assert len(reports["ladder"]["gaps"]) == len(LADDER_NAMES) - 1
    for part in bench.PARTS:
        assert (tmp_path / f"{part}.png").read_bytes()[:4] == b"\x89PNG"
        assert "| model | change | params | chosen lr |" in (tmp_path / f"{part}.md").read_text()
    assert "nanoGPT's published GPT-2 result" in (tmp_path / "tied.md").read_text()


def test_gpu_benchmark_refuses_bad_arguments(capsys):
    bench = load_module("benchmarks/gpu_train.py")
    for argv in (["--smoke", "--seeds", "0", "0"], ["--smoke", "--rates", "0"], ["--smoke", "--part", "nope"]):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
    capsys.readouterr()
