"""The committed laptop-scale results (results/laptop/) are the code's: the first steps of a committed run, rerun from
its recorded settings, give its recorded losses to 1e-6, and the committed report is what the code writes from them."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from training_setup import rerun_committed

from modern_block.training.report import report_text
from modern_block.training.study import STUDIES, Results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "laptop" / "results.json"
STEPS = 20  # about 3 s of one CPU core


def _results() -> dict:
    return json.loads(RESULTS.read_text())


def test_the_first_steps_of_a_committed_laptop_run_repeat():
    results = _results()
    runs = [r for r in results["runs"] if r.get("train_losses")]
    assert runs, "no committed run records its per-step losses"
    run = runs[0]
    res = rerun_committed(run["config"], run["torch"], results["corpus"], STEPS, threads=run["threads"])
    first = run["metrics"][0]
    assert res.metrics[0]["step"] == first["step"] == 0
    assert res.metrics[0]["val_loss"] == pytest.approx(first["val_loss"], abs=1e-6)
    assert res.metrics[0]["train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)
    diffs = [abs(a - b) for a, b in zip(res.losses, run["train_losses"][:STEPS], strict=True)]
    assert max(diffs) <= 1e-6, f"{run['model']} lr {run['lr']} seed {run['seed']}: step losses differ by {max(diffs)}"


def test_the_committed_results_are_the_laptop_study_and_the_report_is_the_codes():
    results = _results()
    study = STUDIES["laptop"]
    assert results["settings"] == asdict(study.base) and results["models"] == list(study.models)
    assert (results["selection_seeds"], results["reported_seeds"]) == (list(study.selection_seeds),
                                                                       list(study.reported_seeds))
    for run in results["runs"]:  # one recipe: only the model, the rate and the seed change
        changed = {k for k, v in run["config"].items() if v != results["settings"][k]}
        assert changed <= {"arch", "lr", "min_lr", "seed"}, (run["model"], changed)
        assert run["config"]["arch"] == f"ladder:{run['model']}"
        assert run["final_val_loss"] == run["metrics"][-1]["val_loss"] and run["metrics"][-1]["step"] == 2000
    assert results["complete"]
    report = (ROOT / "results" / "laptop" / "report.md").read_text()
    assert report == report_text(Results.from_json(results))
