"""The committed study results (results/<study>/) are the code's: the runs follow the study's design (one recipe,
only the model, rate and seed changing), the committed report is what the code writes from results.json, partial
results say so with the command that resumes them, and the first steps of a committed run, rerun from its
recorded settings, give its recorded losses to 1e-6."""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from training_setup import rerun_committed

from modern_block.training.ladder import get_rung
from modern_block.training.report import report_text
from modern_block.training.study import STUDIES, TRAIN_LOSS_STEPS, Results

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ("ladder", "laptop", "attention", "quick", "ladder_laptop")
# the model whose first steps are rerun
RERUN = {"ladder": "llama", "laptop": "gpt2_nobias", "attention": "mla24", "quick": "llama", "ladder_laptop": "rope"}
STEPS = 20  # about 3 s of one CPU core


def _results(name: str) -> dict:
    path = ROOT / "results" / name / "results.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `python -m modern_block compare --study {name} --workers 2 --out "
                    f"runs/{name}` and commit its results.json and report.md")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", COMMITTED)
def test_the_committed_runs_are_the_studys_design_and_the_report_is_the_codes(name):
    results, study = _results(name), STUDIES[name]
    assert results["settings"] == asdict(study.base) and results["models"] == list(study.models)
    assert (results["rates"], results["selection_seeds"], results["reported_seeds"]) == (
        list(study.rates), list(study.selection_seeds), list(study.reported_seeds))
    assert results.get("stress", []) == [list(x) for x in study.stress]
    assert (results.get("stress_base"), results.get("widen", 0)) == (study.stress_base, study.widen)
    assert results["runs"], "no finished run committed"
    for run in results["runs"]:  # one recipe: only the model, the rate and the seed change
        changed = {k for k, v in run["config"].items() if v != results["settings"][k]}
        assert changed <= {"arch", "lr", "min_lr", "seed"}, (run["model"], changed)
        arch = run["config"]["arch"].removeprefix("ladder:")
        assert get_rung(arch).switches == get_rung(run["model"]).switches, "only a twin model shares its runs"
        assert run["config"]["seed"] == run["seed"] and (run["final_val_loss"] is None) == bool(run["diverged"])
        assert run["final_val_loss"] is None or math.isfinite(run["final_val_loss"])  # None: diverged
        if run["final_val_loss"] is not None and results["recorded_steps"] is None:  # every evaluation kept
            assert run["final_val_loss"] == run["metrics"][-1]["val_loss"]
            assert run["metrics"][-1]["step"] == study.base.max_steps
    report = (ROOT / "results" / name / "report.md").read_text()
    assert report == report_text(Results.from_json(results))
    if (name == "attention" or study.widen) and results["complete"]:  # every chosen rate inside its sweep
        assert not [m for m, sel in Results.from_json(results).selections.items() if sel.at_edge]
    if not results["complete"]:  # partial results say so, and how to go on
        readme = (ROOT / "results" / name / "README.md").read_text()
        assert "partial" in readme and f"python -m modern_block compare --study {name}" in readme
        assert "INCOMPLETE" in report


@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_study_keeps_only_the_first_step_losses_a_rerun_checks(name):
    results = _results(name)
    assert all(len(r.get("train_losses", [])) <= TRAIN_LOSS_STEPS for r in results["runs"])
    again = Results.from_json(results).to_json()
    assert [r.get("train_losses", []) for r in again["runs"]] == [r.get("train_losses", []) for r in results["runs"]]


@pytest.mark.parametrize("name", COMMITTED)
def test_the_first_steps_of_a_committed_run_repeat(name):
    results = _results(name)
    runs = [r for r in results["runs"] if r.get("train_losses") and r["final_val_loss"] is not None]
    assert runs, "no committed run records its per-step losses"
    run = next((r for r in runs if r["model"] == RERUN[name]), runs[0])
    steps = min(STEPS, results["recorded_steps"] or STEPS)
    res = rerun_committed(run["config"], run.get("torch", results["torch"]), results["corpus"], steps,
                          threads=run.get("threads", 1))
    first = run["metrics"][0]
    assert res.metrics[0]["step"] == first["step"] == 0
    assert res.metrics[0]["val_loss"] == pytest.approx(first["val_loss"], abs=1e-6)
    assert res.metrics[0]["train_loss"] == pytest.approx(first["train_loss"], abs=1e-6)
    diffs = [abs(a - b) for a, b in zip(res.losses, run["train_losses"][:steps], strict=True)]
    assert max(diffs) <= 1e-6, f"{run['model']} lr {run['lr']} seed {run['seed']}: step losses differ by {max(diffs)}"
