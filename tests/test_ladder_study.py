"""The ladder study's command (``compare --ladder``, modern_block/training/ladder_study.py) and its committed results
(results/ladder/): the design is lesson 08's, the report is rebuilt from results.json alone, and the first steps of
a committed run, rerun from its recorded settings, give its recorded losses to 1e-6."""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from training_setup import rerun_committed

from modern_block.training import compare_cli, ladder_study
from modern_block.training.experiments import select_then_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "ladder" / "results.json"
TEXT = "".join(f"{i} little pigs, {i * 7 % 13} wolves; the house of straw fell down.\n" for i in range(400))


@pytest.mark.parametrize("flags, message", [
    (["--tied"], "drop --tied"),
    (["--lr", "1e-3"], "drop --lr"),
    (["--scale", "laptop"], "quick budget"),
    (["--seeds", "0", "2"], "different seeds; both hold [0]"),
    (["--rates", "1e-3", "1e-3"], "--rates must be distinct"),
])
def test_ladder_usage_errors_name_the_option(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        compare_cli.main(["--ladder", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_ladder_config_is_the_lessons_budget_and_the_options_override_it():
    parser = compare_cli.build_parser()
    args = parser.parse_args(["--ladder", "--max-steps", "7"])
    args.scale = "quick"
    from modern_block.training.options import config_from_args

    cfg = config_from_args(parser, args, "gpt2", preset=ladder_study.QUICK_STUDY)
    assert cfg == ladder_study.quick_study_config("gpt2", max_steps=7)
    assert (cfg.d, cfg.n_layers, cfg.block_size, cfg.batch_size) == (32, 2, 32, 16)


def test_results_rebuild_the_study_that_made_them(tmp_path):
    from modern_block.training.data import Corpus

    corpus = Corpus(TEXT, "pigs", "inline")
    base = ladder_study.quick_study_config("gpt2", max_steps=4, eval_interval=2, eval_batches=1, warmup_steps=1)
    models, rates, sel, rep = ("gpt2", "gpt2_untied"), (4e-3, 1e-2), (0,), (1, 2)
    results = ladder_study.run_ladder_study(base, "test", rates, sel, rep, models=models, corpus=corpus)
    study = select_then_report(base, models, rates, sel, rep, corpus=corpus)  # trained again, directly
    rebuilt = ladder_study.study_from_results(json.loads(json.dumps(results)))  # through JSON, as committed
    for m in models:
        assert rebuilt.selections[m] == study.selections[m]
    assert len(results["runs"]) == len(models) * (len(rates) * len(sel) + len(rep))
    first = results["runs"][0]
    assert len(first["train_losses"]) == 4 and first["loss"] == study.selection["gpt2"].runs[4e-3][0].metrics[-1][
        "val_loss"]
    report = ladder_study.write_ladder_results(results, tmp_path / "out")
    assert report.read_text() == ladder_study.ladder_report(results)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"] == json.loads(json.dumps(results))[
        "runs"]
    text = report.read_text()
    assert "| gpt2: GPT-2 baseline (tied head) |" in text and "## Leave one out" not in text
    step = study.difference("gpt2", "gpt2_untied")
    assert f"| gpt2_untied | tied -> untied output head | gpt2 | {step.format()} | {step.verdict} |" in text


def _committed() -> dict:
    if not RESULTS.exists():
        pytest.fail(f"{RESULTS} is missing: run `python -m modern_block compare --ladder --workers 2 --out "
                    "results/ladder` and commit it")
    return json.loads(RESULTS.read_text())


def test_the_committed_study_is_the_lessons_design_and_the_report_is_the_codes():
    results = _committed()
    assert results["models"] == list(ladder_study.MODELS)
    assert results["selection_seeds"] == list(ladder_study.SELECTION_SEEDS)
    assert results["reported_seeds"] == list(ladder_study.REPORTED_SEEDS)
    assert results["base"] == asdict(ladder_study.quick_study_config("gpt2"))
    for run in results["runs"]:  # one budget: only the model, the rate and the seed change
        if run["config"] is None:
            assert run["loss"] is None  # diverged
            continue
        changed = {k for k, v in run["config"].items() if v != results["base"][k]}
        assert changed <= {"arch", "lr", "min_lr", "seed"}, (run["model"], changed)
        assert math.isfinite(run["loss"]) and run["config"]["seed"] == run["seed"]
    report = (RESULTS.parent / "report.md").read_text()
    assert report == ladder_study.ladder_report(results)


def test_the_first_steps_of_a_committed_ladder_run_repeat():
    results = _committed()
    run = next(r for r in results["runs"] if r["config"] and r["model"] == "llama")
    res = rerun_committed(run["config"], results["torch"], results["corpus"], ladder_study.RECORDED_STEPS)
    assert res.metrics[0]["val_loss"] == pytest.approx(run["first_eval"]["val_loss"], abs=1e-6)
    diffs = [abs(a - b) for a, b in zip(res.losses, run["train_losses"], strict=True)]
    assert max(diffs) <= 1e-6, f"llama lr {run['lr']} seed {run['seed']}: step losses differ by {max(diffs)}"
