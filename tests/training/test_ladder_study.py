"""The ladder study's command line (``compare --ladder``): its usage errors and its budget (its committed results are
tested with the others' in test_committed_studies.py)."""

from dataclasses import asdict
from pathlib import Path

import pytest

from modern_block.training import cli
from modern_block.training.study import STUDIES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "ladder" / "results.json"


@pytest.mark.parametrize("flags, message", [
    (["--lr", "1e-3"], "drop --lr"),
    (["--selection-seeds", "0", "--seeds", "0", "2"], "different seeds; both hold [0]"),
    (["--rates", "1e-3", "1e-3"], "--rates must be distinct"),
])
def test_ladder_usage_errors_name_the_option(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.compare_main(["--ladder", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_ladder_budget_is_the_quick_one_and_the_options_override_it(monkeypatch):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    parser = cli.compare_parser()
    study = cli.study_from_args(parser, parser.parse_args(["--ladder", "--max-steps", "7"]))
    assert study.name == "ladder" and study.base == STUDIES["ladder"].base.__class__(
        **(asdict(STUDIES["ladder"].base) | {"max_steps": 7}))
    assert (study.base.d, study.base.n_layers, study.base.block_size, study.base.batch_size) == (32, 2, 32, 16)
    at_laptop = cli.study_from_args(parser, parser.parse_args(["--ladder", "--scale", "laptop"]))
    assert at_laptop.models == study.models and at_laptop.base.d == 128, "a scale replaces the study's budget"

