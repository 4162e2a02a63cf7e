"""The ladder study (``compare --study ladder``) and its committed results (results/ladder/): the design is the
configuration's, the report is rebuilt from results.json alone, and the first steps of a committed run, rerun from
its recorded settings, give its recorded losses to 1e-6."""

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from training_setup import rerun_committed

from modern_block.training import compare_cli
from modern_block.training.report import report_text
from modern_block.training.rungs import get_rung
from modern_block.training.study import STUDIES, Results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "ladder" / "results.json"


@pytest.mark.parametrize("flags, message", [
    (["--lr", "1e-3"], "drop --lr"),
    (["--selection-seeds", "0", "--seeds", "0", "2"], "different seeds; both hold [0]"),
    (["--rates", "1e-3", "1e-3"], "--rates must be distinct"),
])
def test_ladder_usage_errors_name_the_option(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        compare_cli.main(["--ladder", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_ladder_budget_is_the_quick_one_and_the_options_override_it(monkeypatch):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    parser = compare_cli.build_parser()
    study = compare_cli.study_from_args(parser, parser.parse_args(["--ladder", "--max-steps", "7"]))
    assert study.name == "ladder" and study.base == STUDIES["quick"].base.__class__(
        **(asdict(STUDIES["quick"].base) | {"max_steps": 7}))
    assert (study.base.d, study.base.n_layers, study.base.block_size, study.base.batch_size) == (32, 2, 32, 16)
    at_laptop = compare_cli.study_from_args(parser, parser.parse_args(["--ladder", "--scale", "laptop"]))
    assert at_laptop.models == study.models and at_laptop.base.d == 128, "a scale replaces the study's budget"


def _committed() -> dict:
    if not RESULTS.exists():
        pytest.fail(f"{RESULTS} is missing: run `python -m modern_block compare --study ladder --workers 2 --out "
                    "results/ladder` and commit it")
    return json.loads(RESULTS.read_text())


def test_the_committed_study_is_the_ladder_configuration_and_the_report_is_the_codes():
    results = _committed()
    study = STUDIES["ladder"]
    assert results["models"] == list(study.models) and results["settings"] == asdict(study.base)
    assert (results["selection_seeds"], results["reported_seeds"]) == (list(study.selection_seeds),
                                                                       list(study.reported_seeds))
    for run in results["runs"]:  # one budget: only the model, the rate and the seed change
        changed = {k for k, v in run["config"].items() if v != results["settings"][k]}
        assert changed <= {"arch", "lr", "min_lr", "seed"}, (run["model"], changed)
        arch = run["config"]["arch"].removeprefix("ladder:")
        assert get_rung(arch).switches == get_rung(run["model"]).switches, "a twin model shares its runs"
        assert run["config"]["seed"] == run["seed"] and (run["final_val_loss"] is None) == bool(run["diverged"])
        assert run["final_val_loss"] is None or math.isfinite(run["final_val_loss"])
    assert results["complete"]
    report = (RESULTS.parent / "report.md").read_text()
    assert report == report_text(Results.from_json(results))


def test_the_first_steps_of_a_committed_ladder_run_repeat():
    results = _committed()
    run = next(r for r in results["runs"] if r["final_val_loss"] is not None and r["model"] == "llama")
    res = rerun_committed(run["config"], results["torch"], results["corpus"], results["recorded_steps"])
    assert res.metrics[0]["val_loss"] == pytest.approx(run["metrics"][0]["val_loss"], abs=1e-6)
    diffs = [abs(a - b) for a, b in zip(res.losses, run["train_losses"], strict=True)]
    assert max(diffs) <= 1e-6, f"llama lr {run['lr']} seed {run['seed']}: step losses differ by {max(diffs)}"
