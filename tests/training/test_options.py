"""The command-line options train and compare share (modern_block/training/cli.py): each argument type
rejects a bad value in words, and the options become the TrainConfig they ask for."""

import argparse

import pytest

from modern_block.training.cli import (
    add_run_options,
    config_from_args,
    nonneg_float_arg,
    positive_float_arg,
    positive_int_arg,
    seed_arg,
)
from modern_block.training.config import MAX_SEED


@pytest.mark.parametrize("kind,good,bad", [
    (positive_int_arg, {"1": 1, "64": 64}, {"0": "positive integer, got 0", "-2": "got -2", "1.5": "got '1.5'"}),
    (positive_float_arg, {"3e-4": 3e-4, "2": 2.0},
     {"0": "positive finite number, got 0", "inf": "got inf", "nan": "got nan",
      "x": "positive finite number, got 'x'"}),
    (nonneg_float_arg, {"0": 0.0, "0.1": 0.1}, {"-0.1": "finite number >= 0, got -0.1", "inf": "got inf",
                                                 "a": "number >= 0, got 'a'"}),
    (seed_arg, {"0": 0, str(MAX_SEED): MAX_SEED},
     {"-1": r"seed in \[0, 2\*\*63 - 1\], got -1", str(MAX_SEED + 1): "got",
      "1.0": r"seed in \[0, 2\*\*63 - 1\], got '1.0'"}),
])
def test_argument_types_accept_the_rule_and_name_what_they_reject(kind, good, bad):
    for text, value in good.items():
        assert kind(text) == value and type(kind(text)) is type(value)
    for text, message in bad.items():
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            kind(text)


def parse(*argv):
    parser = argparse.ArgumentParser(prog="train")
    add_run_options(parser)
    return parser, parser.parse_args(list(argv))


def test_options_become_the_config_they_ask_for():
    parser, args = parse("--quick", "--lr", "2e-3", "--max-steps", "7", "--no-compile", "--device", "cpu")
    cfg = config_from_args(parser, args, "gpt2", seed=3)
    assert (cfg.lr, cfg.max_steps, cfg.seed, cfg.compile, cfg.device) == (2e-3, 7, 3, False, "cpu")
    assert cfg.min_lr == pytest.approx(2e-4, rel=1e-12), "the preset's fraction of the peak, a tenth"
    parser, args = parse("--quick", "--lr", "2e-3", "--min-lr", "0")  # an explicit min-lr is kept
    assert config_from_args(parser, args, "gpt2").min_lr == 0.0


@pytest.mark.parametrize("argv,message", [
    (["--compile", "--no-compile"], "--compile and --no-compile exclude each other"),
    (["--device", "tpu"], "--device: "),
    (["--quick", "--full"], "not allowed with argument"),
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got 0"),
])
def test_bad_combinations_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parser, args = parse(*argv)
        config_from_args(parser, args, "gpt2")
    assert exit_.value.code == 2 and message in capsys.readouterr().err
