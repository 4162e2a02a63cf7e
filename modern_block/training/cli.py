"""The two training commands and the options they share (argument types that reject bad values in words):

    python -m modern_block train --arch llama --quick --out runs/llama [--resume]   # one run (or under torchrun)
    python -m modern_block compare --laptop --workers 2      # a study (training.study): models at their own rates
    python -m modern_block compare --study attention --workers 2    # MHA, GQA, MQA, MLA, QK-norm (laptop scale)
    python -m modern_block compare --study ladder_laptop --reuse results/laptop/results.json   # reads those runs

Every run has its folder; stopped, the same command continues. Exit status: 0 done; 2 a usage error; 1 a failure,
saying what is kept; 130 interrupted."""

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from . import distributed
from .checkpoint import CheckpointError
from .config import ARCHS, MAX_SEED, QUICK_ENV, SCALES, ConfigError, TrainConfig, quick_forced, scale_config, with_rate
from .device import choose_device
from .distributed import RankFailedError, ranks_from_env
from .files import StorageError, reason
from .ladder import ARCH_NAMES, MODEL_NAMES
from .report import report_text, write_results
from .run_folder import RunFolderError
from .study import STUDIES, Study, run_study
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


def train_parser(quiet: bool = False) -> argparse.ArgumentParser:
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


def train_main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = train_parser()
    try:
        ranks = distributed.ranks_from_env()
    except ConfigError as err:
        parser.error(str(err))
    if not ranks.is_main:  # usage errors: every process finds them, rank 0 says them
        parser = train_parser(quiet=True)
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


SCALE_OF = {"quick": "quick", "ladder": "quick", "ablations": "quick", "laptop": "laptop", "gpu": "gpu",
            "attention": "laptop", "ladder_laptop": "laptop"}


def compare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m modern_block compare",
                                     description="Models at their own rates, compared by paired 95% intervals.")
    parser.add_argument("--study", choices=tuple(STUDIES), default=None,
                        help="the study (default: the one of the scale: quick, laptop or gpu); a scale given with it "
                             "replaces its budget")
    parser.add_argument("--ladder", action="store_true", help="--study ladder")
    parser.add_argument("--out", default=None, help="output folder (default runs/<study>)")
    parser.add_argument("--models", nargs="+", default=None, choices=ARCH_NAMES, metavar="MODEL",
                        help="train these of the study's models only")
    parser.add_argument("--rates", type=positive_float_arg, nargs="+", default=None, metavar="LR",
                        help="peak learning rates each model's rate is chosen from (default: the study's)")
    parser.add_argument("--selection-seeds", type=seed_arg, nargs="+", default=None,
                        help="the seeds each model's rate is chosen on (default: the study's)")
    parser.add_argument("--seeds", type=seed_arg, nargs="+", default=None,
                        help="the reported seeds, other than the selection seeds (default: the study's)")
    parser.add_argument("--collect", action="store_true",
                        help="write the results of the runs finished so far in --out, training nothing")
    parser.add_argument("--reuse", nargs="+", default=(), metavar="RESULTS_JSON",
                        help="committed results (results/<study>/results.json): their finished runs with the same "
                             "settings on the same text are read from there, not trained (and written into --out)")
    parser.add_argument("--workers", type=positive_int_arg, default=1,
                        help="trainings at once, each in its own process with one thread")
    add_run_options(parser)
    return parser


def study_from_args(parser, args) -> Study:
    """The study the options ask for, with their changes; a bad combination ends in ``parser.error``."""
    if args.lr is not None or args.min_lr is not None:
        parser.error("compare chooses each model's rate from --rates; drop --lr and --min-lr")
    if args.study and args.ladder and args.study != "ladder":
        parser.error(f"--ladder is --study ladder; drop one of --ladder and --study {args.study}")
    scale = scale_from_args(args)
    name = args.study or ("ladder" if args.ladder else scale)
    if quick_forced() and SCALE_OF[name] != "quick":
        print(f"note: {QUICK_ENV} is set: the quick study instead of {name}", file=sys.stderr)
        name = "quick"
    for option in ("models", "rates", "selection_seeds", "seeds"):
        values = getattr(args, option)
        if values is not None and len(set(values)) != len(values):
            parser.error(f"--{option.replace('_', '-')} must be distinct, got {values}")
    if args.workers > 1 and ranks_from_env().distributed:
        parser.error("--workers: under torchrun the processes share every run; leave --workers at 1")
    study = STUDIES[name]
    if scale != SCALE_OF[name] and scale_asked(args) is not None:  # the study at another budget
        study = replace(study, base=scale_config(scale, "gpt2"))
    unknown = set(args.models or ()) - set(study.models)
    if unknown:
        parser.error(f"--models: the {name} study trains {list(study.models)}, not {sorted(unknown)}")
    try:
        return study.with_options(args.models, args.rates, args.selection_seeds, args.seeds,
                                  **overrides_from_args(parser, args))
    except ValueError as err:
        parser.error(str(err).replace("reported_seeds", "--seeds").replace("selection_seeds", "--selection-seeds"))
        raise  # parser.error exits


def compare_main(argv=None) -> int:
    parser = compare_parser()
    args = parser.parse_args(argv)
    study = study_from_args(parser, args)
    out = args.out or f"runs/{study.name}"
    if os.path.isfile(out):  # (False, not an error, for a path the file system refuses: the runs say why)
        parser.error(f"--out {out} is a file, not a folder: choose a folder for the study's runs")
    command = "python -m modern_block compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    reuse = []
    for path in args.reuse:
        try:
            reuse.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            parser.error(f"--reuse {path}: not a readable results.json ({err})")
        if not isinstance(reuse[-1], dict) or not isinstance(reuse[-1].get("runs"), list):
            parser.error(f"--reuse {path}: not a study's results.json (no list of runs)")
    kept = f"what the runs wrote is kept in {out}; the same command continues"
    try:
        results = run_study(study, out, workers=args.workers, command=command, train=not args.collect,
                            say=lambda text: print(text, file=sys.stderr, flush=True), reuse=reuse)
        if not ranks_from_env().is_main:  # under torchrun every process trains; rank 0 writes the report
            return 0
        if not any(r.get("final_val_loss") is not None for r in results.runs) and not args.collect:
            print("error: every run diverged (non-finite loss); try lower --rates", file=sys.stderr)
            return 1
        report = write_results(results, out)
    except (RunFolderError, RankFailedError, StorageError, CheckpointError) as err:
        print(f"error: {err}. No report written; {kept}", file=sys.stderr)
        return 1
    except ConfigError as err:
        parser.error(str(err))
    except BrokenProcessPool as err:
        print(f"error: a worker process died ({err}); no report written; {kept}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: {reason(err)}{f': {err.filename}' if err.filename else ''}. No report written; {kept}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: compare stopped every run after its current step and started no other; {kept}",
              file=sys.stderr)
        return 130
    print(report_text(results))
    print(f"report: {report}")
    return 0
