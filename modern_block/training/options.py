"""The command-line options ``train`` and ``compare`` share: argument types that reject bad values with a
clear message, and the settings the options ask for."""

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import torch

from .config import MAX_SEED, QUICK_ENV, SCALES, TrainConfig, quick_forced, scale_config, with_rate
from .device import choose_device


def _argument_type(convert, ok, rule: str) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)`` that must satisfy ``ok``, else "expected RULE, got TEXT"."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {rule}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {rule}, got {text}")
        return value
    return parse


positive_int_arg = _argument_type(int, lambda v: v > 0, "a positive integer")
positive_float_arg = _argument_type(float, lambda v: math.isfinite(v) and v > 0, "a positive finite number")
nonneg_float_arg = _argument_type(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
seed_arg = _argument_type(int, lambda v: 0 <= v <= MAX_SEED, "a seed in [0, 2**63 - 1]")


# option -> (TrainConfig field, argparse type, help)
CONFIG_OPTIONS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--d": ("d", positive_int_arg, "model width (the scale's preset otherwise)"),
    "--n-layers": ("n_layers", positive_int_arg, "number of blocks"),
    "--n-heads": ("n_heads", positive_int_arg, "attention heads (must divide --d)"),
    "--n-kv-heads": ("n_kv_heads", positive_int_arg, "key/value heads of GQA (must divide --n-heads)"),
    "--max-steps": ("max_steps", positive_int_arg, "training steps"),
    "--lr": ("lr", positive_float_arg, "peak learning rate"),
    "--min-lr": ("min_lr", nonneg_float_arg,
                 "learning rate at the end of the cosine (default: the preset's fraction of --lr, a tenth)"),
    "--warmup-steps": ("warmup_steps", int, "linear warmup steps"),
    "--batch-size": ("batch_size", positive_int_arg, "sequences per optimizer step, over all processes"),
    "--micro-batch-size": ("micro_batch_size", positive_int_arg, "sequences per forward/backward pass in one process "
                           "(gradient accumulation; default: batch size / processes)"),
    "--block-size": ("block_size", positive_int_arg, "context length (characters)"),
    "--dropout": ("dropout", nonneg_float_arg, "dropout probability"),
    "--weight-decay": ("weight_decay", nonneg_float_arg, "AdamW weight decay on matrices"),
    "--grad-clip": ("grad_clip", nonneg_float_arg, "gradient-norm clip (0: off)"),
    "--eval-interval": ("eval_interval", positive_int_arg, "steps between evaluations and checkpoints"),
    "--eval-batches": ("eval_batches", positive_int_arg, "fixed batches per evaluation"),
}


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``python -m modern_block train`` and ``python -m modern_block compare``."""
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--scale", choices=SCALES, default=None,
                       help="preset sizes and schedule: quick (the lesson's CPU scale, default without a GPU), laptop "
                            "(nanoGPT's CPU recipe: 4 layers, 128 wide, block 64, 2000 steps; minutes per run), gpu "
                            "(nanoGPT's shakespeare-char; default with a GPU). The options below override the preset")
    scale.add_argument("--quick", action="store_true", help=f"--scale quick ({QUICK_ENV}=1 forces it)")
    scale.add_argument("--laptop", action="store_true", help="--scale laptop")
    scale.add_argument("--full", action="store_true", help="--scale gpu, even without a GPU (slow on a CPU)")
    for option, (_, kind, text) in CONFIG_OPTIONS.items():
        parser.add_argument(option, type=kind, default=None, help=text)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--no-compile", action="store_true", help="do not use torch.compile")
    parser.add_argument("--compile", action="store_true", help="use torch.compile on the CPU too")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def overrides_from_args(parser: argparse.ArgumentParser, args) -> dict[str, Any]:
    """The settings the options give (nothing for an option not given); bad ones end in ``parser.error``."""
    overrides = {name: getattr(args, option[2:].replace("-", "_")) for option, (name, _, _) in CONFIG_OPTIONS.items()}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.no_compile and args.compile:
        parser.error("--compile and --no-compile exclude each other")
    if args.no_compile or args.compile:
        overrides["compile"] = args.compile
    if args.device is not None:
        try:
            choose_device(args.device)
        except (ValueError, RuntimeError) as err:
            parser.error(f"--device: {err}")
        overrides["device"] = args.device
    asked = scale_asked(args)
    if asked not in (None, "quick") and quick_forced():
        print(f"note: {QUICK_ENV} is set, so --scale {asked} is ignored: quick mode", file=sys.stderr)
    return overrides


def config_from_args(parser: argparse.ArgumentParser, args, arch: str, seed: int | None = None) -> TrainConfig:
    """The TrainConfig the options ask for; invalid combinations end in ``parser.error`` (exit 2)."""
    overrides = overrides_from_args(parser, args)
    if seed is not None:
        overrides["seed"] = seed
    lr = overrides.pop("lr") if "lr" in overrides and "min_lr" not in overrides else None
    try:
        cfg = scale_config(scale_from_args(args), arch, **overrides)
        return with_rate(cfg, lr) if lr is not None else cfg
    except ValueError as err:
        parser.error(str(err))


def scale_asked(args) -> str | None:
    """The scale the options name, if any."""
    return args.scale or ("quick" if args.quick else "laptop" if args.laptop else "gpu" if args.full else None)


def scale_from_args(args) -> str:
    """The scale: quick when MODERN_BLOCK_QUICK=1, else the one asked for, else gpu with a GPU and quick without."""
    if quick_forced():
        return "quick"
    return scale_asked(args) or ("gpu" if torch.cuda.is_available() else "quick")



