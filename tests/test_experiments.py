"""The experiments of lesson 08 and their command line (python -m modern_block compare)."""

import json

import pytest
from training_setup import CORPUS, SMALL, never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import __main__ as cli
from modern_block import train as T
from modern_block.experiments import run_ladder


def test_run_ladder_gives_mean_and_spread():
    rows = run_ladder(tiny(max_steps=2, eval_interval=2), seeds=(0, 1), rungs=("gpt2", "rope"), corpus=CORPUS,
                      progress=False, verbose=False)
    assert [r["rung"] for r in rows] == ["gpt2", "rope"]
    for r in rows:
        assert len(r["val_losses"]) == 2 and r["val_losses"][0] != r["val_losses"][1]
        assert r["mean"] == pytest.approx(sum(r["val_losses"]) / 2) and r["std"] > 0
        assert [m["step"] for m in r["metrics"][0]] == [0, 2]


def test_compare_cli_rejects_bad_arguments(capsys):
    for argv, message in ((["compare", "--seeds", "1", "1"], "--seeds must be distinct"),
                          (["compare", "--lr", "0"], "expected a positive finite number"),
                          (["fit"], "invalid choice: 'fit'")):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_compare_cli_writes_report_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--quick", "--out", str(out), "--lr-llama", "0.02", *SMALL]) == 0
    report = (out / "report.md").read_text()
    assert "| learning rate (peak -> min) | 0.003 -> 0.0003 | 0.02 -> 0.002 |" in report
    for needle in ("| parameters |", "FLOPs per token", "best val loss (1 seed)", "tokens/s", "| MFU |",
                   "wall time", "Parameter ratio Llama / GPT-2", "### GPT-2", "### Llama-style", "KV-cache"):
        assert needle in report, needle
    assert (out / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((out / "results.json").read_text())
    assert set(results["table"]) == {"gpt2", "llama"}
    for arch in ("gpt2", "llama"):
        assert (out / f"{arch}-seed0" / T.METRICS).exists()
        assert not (out / f"{arch}-seed0" / T.CHECKPOINT).exists(), "compare keeps no checkpoints"
    ratio = results["table"]["llama"]["params"] / results["table"]["gpt2"]["params"]
    assert 0.98 <= ratio <= 1.02
