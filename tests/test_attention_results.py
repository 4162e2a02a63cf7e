"""The committed attention-study results (results/attention/) are the code's: the first steps of a committed run,
rerun from its recorded settings, give its recorded losses to 1e-6; the runs are the study's design, one recipe with
only the model, rate and seed changing; the committed report is what the code writes from results.json; and results
that are not complete say so, with the command that resumes them."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from training_setup import rerun_committed

from modern_block.training.report import report_text
from modern_block.training.study import STUDIES, Results

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "results" / "attention"
STEPS = 20  # about 3 s of one CPU core
RESUME = "python -m modern_block compare --study attention"


def _results() -> dict:
    return json.loads((FOLDER / "results.json").read_text())


def test_the_first_steps_of_a_committed_attention_run_repeat():
    results = _results()
    runs = [r for r in results["runs"] if r.get("train_losses")]
    assert runs, "no committed run records its per-step losses"
    run = next((r for r in runs if r["model"].startswith("mla")), runs[0])  # MLA's if one is there
    res = rerun_committed(run["config"], run["torch"], results["corpus"], STEPS, threads=run["threads"])
    first = run["metrics"][0]
    assert res.metrics[0]["step"] == first["step"] == 0
    assert res.metrics[0]["val_loss"] == pytest.approx(first["val_loss"], abs=1e-6)
    assert res.metrics[0]["train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)
    diffs = [abs(a - b) for a, b in zip(res.losses, run["train_losses"][:STEPS], strict=True)]
    assert max(diffs) <= 1e-6, f"{run['model']} lr {run['lr']} seed {run['seed']}: step losses differ by {max(diffs)}"


def test_the_committed_results_are_the_attention_study_and_the_report_is_the_codes():
    results = _results()
    study = STUDIES["attention"]
    assert results["settings"] == asdict(study.base) and results["models"] == list(study.models)
    assert (results["rates"], results["selection_seeds"], results["reported_seeds"]) == (
        list(study.rates), list(study.selection_seeds), list(study.reported_seeds))
    assert results["stress"] == [list(x) for x in study.stress]
    assert results["runs"], "no finished run committed"
    for run in results["runs"]:  # one recipe: only the model, the rate and the seed change
        changed = {k for k, v in run["config"].items() if v != results["settings"][k]}
        assert changed <= {"arch", "lr", "min_lr", "seed"}, (run["model"], changed)
        assert run["config"]["arch"] == f"ladder:{run['model']}"
        if run["final_val_loss"] is not None:  # None: diverged, an outcome of its own
            assert run["final_val_loss"] == run["metrics"][-1]["val_loss"] and run["metrics"][-1]["step"] == 2000
    report = (FOLDER / "report.md").read_text()
    assert report == report_text(Results.from_json(results))
    if not results["complete"]:  # partial results say so, and how to go on
        readme = (FOLDER / "README.md").read_text()
        assert "partial" in readme and RESUME in readme and "INCOMPLETE" in report
