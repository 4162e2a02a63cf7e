"""The GPU scripts on the CPU at tiny sizes, so they cannot rot before a GPU runs them: the GPU check's
dry run (every part) and its step budgeting."""

import json
import os
import subprocess
import sys

import nbformat
from repo_files import ROOT, load_module
from training_setup import never_online  # noqa: F401 (an autouse fixture: keeps these tests offline)

from modern_block.training.ladder import ABLATION_NAMES, LADDER_NAMES, LLAMA_END


def _substance(results: dict) -> dict:
    """What a part found, without its timings: the chosen rates, every run's losses, samples and sizes."""
    keep = ("chosen_lr", "best_val_loss", "best_val_losses", "val_losses", "mean", "sample", "params", "n_params",
            "final_val_loss", "lr", "arch", "rung", "steps", "seeds")
    if isinstance(results, dict):
        return {k: _substance(v) for k, v in results.items() if k in keep or isinstance(v, (dict, list))}
    if isinstance(results, list):
        return [_substance(v) for v in results]
    return results


def test_gpu_check_dry_run_runs_every_part_and_a_rerun_reads_its_runs_back(tmp_path):
    """Every part twice into the same folder (a GPU slot ended; the part is run again): the second run reads the
    finished runs back, trains none of them again, and completes with the same results."""
    env = {**os.environ, "PYTHON": sys.executable, "MPLBACKEND": "Agg", "https_proxy": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9"}  # a closed port: no download, the text comes as in the other tests
    command = ["bash", "benchmarks/gpu_check.sh", "--dry-run", "all", "--out", str(tmp_path / "check")]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    [folder] = (tmp_path / "check").iterdir()
    first = {p: json.loads((folder / p / "results.json").read_text()) for p in ("part1", "part2")}
    checkpoints = {p: p.stat().st_mtime_ns for p in folder.rglob("ckpt.pt")}
    assert len(checkpoints) >= 8, "every training run keeps its folder"
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert [p.name for p in (tmp_path / "check").iterdir()] == [folder.name]
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("ckpt.pt")} == checkpoints, "nothing trained again"
    for p in ("part1", "part2"):
        assert _substance(json.loads((folder / p / "results.json").read_text())) == _substance(first[p]), p
    assert folder.name.startswith("cpu-dry-run_torch-")
    summaries = {p: json.loads((folder / p / "summary.json").read_text()) for p in ("part1", "part2", "part3")}
    assert all(s["ok"] and s["dry_run"] and s["torch"] for s in summaries.values())
    status = {p: {step["step"]: step["status"] for step in s["steps"]} for p, s in summaries.items()}
    assert set(status["part1"].values()) == {"ok"}, status["part1"]

    part1 = json.loads((folder / "part1" / "results.json").read_text())
    assert part1["gpu_tests"]["skipped"] >= 4 and "tests/training/test_distributed.py" in part1["gpu_tests"]["files"]
    arms = {"gpt2_untied", LLAMA_END}  # GPT-2 and Llama-style, both heads untied
    assert {r["arch"] for r in part1["sweep"]["runs"]} == arms and set(part1["chosen_lr"]) == arms
    table = part1["comparison"]["table"]
    assert set(table) == arms and all(len(row["best_val_losses"]) == 2 for row in table.values())
    assert table["gpt2_untied"]["params"] != table[LLAMA_END]["params"]
    assert set(part1["alone"]) == arms and all(r["tokens_per_s"] > 0 for r in part1["alone"].values())
    assert (folder / "part1" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "vs nanoGPT's 1.4697" in (folder / "part1" / "results_snippet.md").read_text()

    part2 = json.loads((folder / "part2" / "results.json").read_text())
    assert [r["rung"] for r in part2["ladder"]["rows"]] == list(LADDER_NAMES)
    assert [r["rung"] for r in part2["leave_one_out"]["rows"]] == list(ABLATION_NAMES)
    assert (folder / "part2" / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    assert set(status["part2"].values()) == {"ok"}, status["part2"]

    saved = nbformat.read(folder / "part3" / "notebooks" / "dry_run_lesson.ipynb", as_version=4)
    nbformat.validate(saved)
    assert [c.execution_count for c in saved.cells] == [1, 2]
    assert saved.cells[0].outputs[0]["text"] == "42\n" and saved.cells[1].outputs[0]["data"]["text/plain"] == "42"
    assert status["part3"]["two GPUs: torchrun with NCCL against one GPU"] == "skipped"


def test_the_check_fits_its_steps_to_the_time_left():
    check = load_module("benchmarks/gpu_check.py")
    assert check.fit_steps(10_000, 0.01, 2, 5000, 250) == 5000, "plenty of time: the full budget"
    assert check.fit_steps(5, 0.01, 2, 5000, 250) == 250, "never below one unit"
    steps = check.fit_steps(60, 0.01, 2, 5000, 250)  # 2 rounds of 0.01 s per step in 60 s: 3000 steps
    assert steps == 3000 and steps % 250 == 0


