"""``python -m modern_block compare``: the GPT-2 block against the Llama-style block, and a report.

Both models have the same kind of output head (untied by default; ``--tied`` ties both), the same
number of parameters (within 2%, ``modern_block.training.ladder``), the same characters in the same order
(same sampler seeds), the same schedule shape, steps and evaluation windows. Each trains at every
peak learning rate of a small sweep, once per seed, and is reported at its own best rate. Writes
DIR/report.md, DIR/loss_curves.png, DIR/sweep.png, DIR/results.json and, per run,
DIR/<model>-lr<LR>-seed<S>/metrics.jsonl and summary.json (no checkpoints: use
``python -m modern_block train`` to keep and resume one run). The experiment itself lives in
``modern_block.training.experiments``, its report in ``modern_block.training.report``; this is its
command line.

Exit status: 0 done; 2 a usage error; 1 a failure, in one line that says what is kept (a full disk or a
read-only folder, a worker that died, every run diverged); 130 Ctrl-C, which stops every run after its
current step and starts no queued one. ``--workers`` processes die with this one however it ends
(``training.workers``).
"""

import argparse
import shlex
import sys
import time
from concurrent.futures.process import BrokenProcessPool

from .checkpoint import CheckpointError
from .config import ConfigError
from .distributed import RankFailedError, is_main_process, ranks_from_env
from .experiments import ARMS, GPU_RATES, QUICK_RATES, compare
from .files import StorageError, reason
from .options import (
    add_run_options,
    config_from_args,
    positive_float_arg,
    positive_int_arg,
    quick_from_args,
    scale_asked,
    scale_from_args,
    seed_arg,
)
from .report import write_report
from .run_folder import RunFolderError


def build_parser() -> argparse.ArgumentParser:
    cmp_parser = argparse.ArgumentParser(prog="python -m modern_block compare", description=__doc__.split("\n\n")[0])
    cmp_parser.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    cmp_parser.add_argument("--seeds", type=seed_arg, nargs="+", default=None,
                            help="seeds, one run per model, rate and seed (default: 0 1; 0 1 2 at GPU scale)")
    cmp_parser.add_argument("--rates", type=positive_float_arg, nargs="+", default=None, metavar="LR",
                            help=f"peak learning rates to sweep (default: {' '.join(map(str, QUICK_RATES))}; "
                                 f"{' '.join(map(str, GPU_RATES))} at GPU scale)")
    for arch in ("gpt2", "llama"):
        cmp_parser.add_argument(f"--lr-{arch}", type=positive_float_arg, default=None,
                                help=f"train the {'GPT-2' if arch == 'gpt2' else 'Llama-style'} model at this "
                                     "peak rate only (no sweep for it)")
    cmp_parser.add_argument("--tied", action="store_true",
                            help="tie both models' output heads to their embeddings (default: both untied)")
    cmp_parser.add_argument("--selection-seeds", type=seed_arg, nargs="+", default=None,
                            help="--scale laptop: the seeds each model's rate is chosen on (default 0); --seeds are "
                                 "then the reported seeds (default 1 2 3), which must be other seeds")
    cmp_parser.add_argument("--anchor", action="store_true",
                            help="--scale laptop: also train GPT-2 at nanoGPT's own rate 1e-3 on the reported seeds "
                                 "(to hold against nanoGPT's published 1.88)")
    cmp_parser.add_argument("--arms", nargs="+", default=None, choices=("gpt2", "llama", "llama_tied"),
                            help="--scale laptop: train these models only (default: all three)")
    cmp_parser.add_argument("--collect", action="store_true",
                            help="--scale laptop: write results.json and report.md from the runs finished so far in "
                                 "--out, training nothing")
    cmp_parser.add_argument("--ladder", action="store_true",
                            help="lesson 08's ladder and leave-one-out study at its quick budget: 13 models, each "
                                 "at its best of --rates chosen on --selection-seeds (default 0 1), reported on "
                                 "--seeds (default 2-7); writes results.json and report.md to --out")
    cmp_parser.add_argument("--workers", type=positive_int_arg, default=1,
                            help="trainings at once, each in its own process (CPU cores, or runs sharing a GPU)")
    add_run_options(cmp_parser)
    return cmp_parser


def _refuse(parser, args, valued: tuple[str, ...], flags: tuple[str, ...], why: str) -> None:
    """Usage error naming every option given that the chosen mode does not take."""
    given = [n for n in valued if getattr(args, n) is not None] + [n for n in flags if getattr(args, n)]
    if given:
        parser.error(f"{why}; drop {', '.join('--' + g.replace('_', '-') for g in given)}")


def _check_two_phase(parser, args, reported_default, selection_default) -> None:
    """Rates chosen on --selection-seeds, reported on --seeds: each list distinct, the two lists apart."""
    for name in ("seeds", "rates", "selection_seeds"):
        values = getattr(args, name)
        if values is not None and len(set(values)) != len(values):
            parser.error(f"--{name.replace('_', '-')} must be distinct, got {values}")
    shared = set(args.seeds or reported_default) & set(args.selection_seeds or selection_default)
    if shared:
        parser.error(f"--seeds (reported) and --selection-seeds must be different seeds; both hold {sorted(shared)}")


def _laptop(parser, args, base, argv) -> int:
    """``--scale laptop``: the resumable two-phase grid of ``training.laptop``."""
    from .laptop import REPORTED_SEEDS, SELECTION_SEEDS, main_laptop

    _refuse(parser, args, ("lr", "lr_gpt2", "lr_llama"), ("tied",),
            "--scale laptop sweeps --rates and trains all three arms")
    _check_two_phase(parser, args, REPORTED_SEEDS, SELECTION_SEEDS)
    if args.out == "runs/compare":
        args.out = "runs/laptop"
    command = "python -m modern_block compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        return main_laptop(base, args, command)
    except KeyboardInterrupt:
        print(f"interrupted: rerun the same command to continue (finished runs are read back from {args.out}/runs, "
              "the others resume from their checkpoints)", file=sys.stderr)
        return 130
    except (RunFolderError, StorageError, CheckpointError, OSError) as err:
        print(f"error: {err}. What the runs wrote is kept in {args.out}/runs; rerun the command to continue",
              file=sys.stderr)
        return 1


def _ladder(parser, args, argv) -> int:
    """``--ladder``: lesson 08's study at its quick budget (``training.ladder_study``)."""
    from .ladder_study import QUICK_STUDY, REPORTED_SEEDS, SELECTION_SEEDS, main_ladder

    _refuse(parser, args, ("lr", "lr_gpt2", "lr_llama", "arms"), ("tied", "anchor", "collect"),
            "--ladder trains every model at every rate of --rates")
    if scale_asked(args) not in (None, "quick"):
        parser.error("--ladder runs at lesson 08's quick budget; change its size with --d, --n-layers, --max-steps")
    _check_two_phase(parser, args, REPORTED_SEEDS, SELECTION_SEEDS)
    if args.out == "runs/compare":
        args.out = "runs/ladder"
    args.scale = "quick"
    base = config_from_args(parser, args, "gpt2", preset=QUICK_STUDY)
    command = "python -m modern_block compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        return main_ladder(base, args, command)
    except KeyboardInterrupt:
        print("interrupted: nothing written (rerun the command; the study takes a few minutes)", file=sys.stderr)
        return 130
    except (StorageError, OSError) as err:
        print(f"error: {reason(err) if isinstance(err, OSError) else err}; nothing written to {args.out}",
              file=sys.stderr)
        return 1
    except BrokenProcessPool as err:
        print(f"error: a worker process died ({err}); nothing written", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.ladder:
        return _ladder(parser, args, argv)
    base = config_from_args(parser, args, "gpt2")
    if scale_from_args(args) == "laptop":
        return _laptop(parser, args, base, argv)
    if args.selection_seeds is not None or args.anchor or args.collect or args.arms is not None:
        parser.error("--selection-seeds, --anchor, --arms and --collect belong to --scale laptop")
    quick = quick_from_args(args)
    mode = "quick (CPU scale)" if quick else "GPU scale"
    seeds = args.seeds if args.seeds is not None else ([0, 1] if quick else [0, 1, 2])
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct, got {seeds}")
    if args.workers > 1 and ranks_from_env().distributed:
        parser.error("--workers: under torchrun the processes share every run; leave --workers at 1")
    if args.rates is not None and args.lr is not None:
        parser.error("--lr trains both models at one rate; --rates sweeps: give one of them")
    shared = args.rates or ([args.lr] if args.lr is not None else list(QUICK_RATES if quick else GPU_RATES))
    if len(set(shared)) != len(shared):
        parser.error(f"--rates must be distinct, got {shared}")
    gpt2_arm, llama_arm = ARMS[args.tied]
    rates = {gpt2_arm: [args.lr_gpt2] if args.lr_gpt2 else shared,
             llama_arm: [args.lr_llama] if args.lr_llama else shared}
    start = time.perf_counter()
    kept = f"what the runs wrote is kept in {args.out} (metrics.jsonl; summary.json for each run that finished)"
    try:
        arms = compare(base, rates, seeds, tie=args.tied, out_dir=args.out, workers=args.workers,
                       progress=False if args.no_progress else None, verbose=args.workers == 1)
        if not is_main_process():  # under torchrun every process trains; rank 0 writes the report
            return 0
        if not any(arm.trained for arm in arms.values()):
            print("error: every run diverged (non-finite loss); try lower --rates", file=sys.stderr)
            return 1
        report = write_report(arms, args.out, mode, time.perf_counter() - start)
    except (RunFolderError, RankFailedError, StorageError, CheckpointError) as err:  # RunFolderError: in use
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
        print(f"interrupted: compare stopped every run after its current step and started no other; no report "
              f"written; {kept}", file=sys.stderr)
        return 130
    print(report.read_text().split("\n## Samples")[0])
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
