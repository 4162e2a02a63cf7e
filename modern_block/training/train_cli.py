"""``python -m modern_block train --arch llama --quick --out runs/llama [--resume]`` (or under torchrun): one run,
and the options ``train`` and ``compare`` share (argument types that reject bad values in words). Exit status: 0
done; 2 a usage error; 1 the run failed, saying what is kept; 130 interrupted."""

import argparse
import math
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..files import StorageError, reason
from . import distributed
from .checkpoint import CheckpointError
from .config import ARCHS, MAX_SEED, QUICK_ENV, SCALES, ConfigError, TrainConfig, quick_forced, scale_config, with_rate
from .device import choose_device
from .distributed import RankFailedError
from .rungs import MODEL_NAMES
from .trainer import NonFiniteLossError, train


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


# TrainConfig field -> (argparse type, help); the option is --FIELD with dashes
CONFIG_OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "d": (positive_int_arg, "model width (the scale's preset otherwise)"),
    "n_layers": (positive_int_arg, "number of blocks"),
    "n_heads": (positive_int_arg, "attention heads (must divide --d)"),
    "n_kv_heads": (positive_int_arg, "key/value heads of GQA (must divide --n-heads)"),
    "max_steps": (positive_int_arg, "training steps"),
    "lr": (positive_float_arg, "peak learning rate"),
    "min_lr": (nonneg_float_arg, "learning rate at the end of the cosine (default: the preset's fraction of --lr, a "
               "tenth)"),
    "warmup_steps": (int, "linear warmup steps"),
    "batch_size": (positive_int_arg, "sequences per optimizer step, over all processes"),
    "micro_batch_size": (positive_int_arg, "sequences per forward/backward pass in one process (gradient "
                         "accumulation; default: batch size / processes)"),
    "block_size": (positive_int_arg, "context length (characters)"),
    "dropout": (nonneg_float_arg, "dropout probability"),
    "weight_decay": (nonneg_float_arg, "AdamW weight decay on matrices"),
    "grad_clip": (nonneg_float_arg, "gradient-norm clip (0: off)"),
    "eval_interval": (positive_int_arg, "steps between evaluations and checkpoints"),
    "eval_batches": (positive_int_arg, "fixed batches per evaluation"),
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
    for name, (kind, text) in CONFIG_OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--no-compile", action="store_true", help="do not use torch.compile")
    parser.add_argument("--compile", action="store_true", help="use torch.compile on the CPU too")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def overrides_from_args(parser: argparse.ArgumentParser, args) -> dict[str, Any]:
    """The settings the options give (nothing for an option not given); bad ones end in ``parser.error``."""
    overrides = {name: getattr(args, name) for name in CONFIG_OPTIONS if getattr(args, name) is not None}
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


class QuietParser(argparse.ArgumentParser):
    """The parser of every process but rank 0: a usage error exits with status 2 without a word (rank 0 says it)."""

    def error(self, message: str):
        sys.exit(2)


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    parser = (QuietParser if quiet else argparse.ArgumentParser)(prog="python -m modern_block train",
                                     description="Train the Llama-style LM or the GPT-2 LM on tinyshakespeare "
                                     "(one process, or one per GPU under torchrun).")
    parser.add_argument("--arch", required=True, choices=ARCHS + tuple(r for r in MODEL_NAMES if r not in ARCHS),
                        metavar="ARCH", help="which model: gpt2 (GPT2LM), llama (LlamaStyleLM), or any model of "
                        f"lesson 08's ladder: {', '.join(r for r in MODEL_NAMES if r not in ARCHS)} "
                        "(gpt2_nobias: nanoGPT's GPT-2, no biases, tied)")
    parser.add_argument("--out", default=None, help="folder for metrics.jsonl, ckpt.pt, summary.json "
                        "(default runs/<arch>)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    start.add_argument("--overwrite", action="store_true", help="start over in an --out that holds a run")
    parser.add_argument("--seed", type=seed_arg, default=None, help="seed of initialisation, dropout and batches")
    add_run_options(parser)
    return parser


def resume_command(argv: list[str], out: Path, ranks: distributed.Ranks | None = None) -> str:
    """The command that continues this run: the same options, plus --resume (and --out)."""
    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    ranks = ranks or distributed.Ranks()
    if not ranks.distributed:
        launcher = "python"
    elif ranks.local_world_size == ranks.world_size:
        launcher = f"torchrun --nproc_per_node {ranks.local_world_size}"
    else:
        launcher = (f"torchrun --nnodes {ranks.world_size // ranks.local_world_size} --nproc_per_node "
                    f"{ranks.local_world_size} <the same rendezvous options as before>")
    return f"{launcher} -m modern_block train {shlex.join(args)}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        ranks = distributed.ranks_from_env()
    except ConfigError as err:
        parser.error(str(err))
    if not ranks.is_main:  # usage errors: every process finds them, rank 0 says them
        parser = build_parser(quiet=True)
    args = parser.parse_args(argv)
    arch = args.arch if args.arch in ARCHS else f"ladder:{args.arch}"
    cfg = config_from_args(parser, args, arch, args.seed)
    out = Path(args.out) if args.out else Path("runs") / args.arch
    say = print if ranks.is_main else (lambda *a, **k: None)
    try:
        result = train(cfg, out, resume=args.resume, progress=False if args.no_progress else None,
                       overwrite=args.overwrite)
    except ConfigError as err:  # e.g. --resume with different settings, an --out that holds a run
        parser.error(str(err))
    except (NonFiniteLossError, CheckpointError, StorageError) as err:
        say(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the environment refused something no message above foresaw: one line all the same
        say(f"error: {reason(err)}{f': {err.filename}' if err.filename else ''}. Files written so far in {out} are "
            "kept", file=sys.stderr)
        return 1
    except RankFailedError as err:  # every surviving process says why it stopped
        print(f"error: {err}\nOnce the cause is fixed, resume with: {resume_command(argv, out, ranks)}",
              file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        say(f"interrupted; resume with: {resume_command(argv, out, ranks)}", file=sys.stderr)
        return 130
    s = result.summary()
    mfu_text = f"{100 * s['mfu']:.1f}%" if s["mfu"] is not None else "n/a"
    tps = f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "n/a"
    say(f"done: best val loss {s['best_val_loss']:.4f}, {tps} tokens/s, MFU {mfu_text}"
        f"{' per device' if ranks.distributed else ''}, {s['wall_s']:.1f} s; files in {out}")
    return 0
