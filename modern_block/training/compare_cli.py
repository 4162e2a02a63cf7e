"""``python -m modern_block compare``: one study (``training.study``) trained and reported.

    python -m modern_block compare --quick                          # GPT-2 against Llama, lesson 08's budget
    python -m modern_block compare --laptop --workers 2             # nanoGPT's CPU recipe, three models
    python -m modern_block compare --study ladder --workers 2       # the ladder and the leave-one-out models
    python -m modern_block compare --study attention --workers 2    # MHA, GQA, MQA, MLA, QK-norm (laptop scale)

Every run has its folder in DIR; stopped, the same command continues. Writes DIR/results.json, report.md and
curves.png. Exit status: 0 done; 2 a usage error; 1 a failure, saying what is kept; 130 Ctrl-C.
"""

import argparse
import shlex
import sys
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

from ..files import StorageError, reason
from . import train_cli
from .checkpoint import CheckpointError
from .config import QUICK_ENV, ConfigError, quick_forced, scale_config
from .distributed import RankFailedError, ranks_from_env
from .report import report_text, write_results
from .run_folder import RunFolderError
from .rungs import ARCH_NAMES
from .study import STUDIES, Study, run_study

SCALE_OF = {"quick": "quick", "ladder": "quick", "ablations": "quick", "laptop": "laptop", "gpu": "gpu",
            "attention": "laptop"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m modern_block compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=tuple(STUDIES), default=None,
                        help="the study (default: the one of the scale: quick, laptop or gpu); a scale given with it "
                             "replaces its budget")
    parser.add_argument("--ladder", action="store_true", help="--study ladder")
    parser.add_argument("--out", default=None, help="output folder (default runs/<study>)")
    parser.add_argument("--models", nargs="+", default=None, choices=ARCH_NAMES, metavar="MODEL",
                        help="train these of the study's models only")
    parser.add_argument("--rates", type=train_cli.positive_float_arg, nargs="+", default=None, metavar="LR",
                        help="peak learning rates each model's rate is chosen from (default: the study's)")
    parser.add_argument("--selection-seeds", type=train_cli.seed_arg, nargs="+", default=None,
                        help="the seeds each model's rate is chosen on (default: the study's)")
    parser.add_argument("--seeds", type=train_cli.seed_arg, nargs="+", default=None,
                        help="the reported seeds, other than the selection seeds (default: the study's)")
    parser.add_argument("--collect", action="store_true",
                        help="write the results of the runs finished so far in --out, training nothing")
    parser.add_argument("--workers", type=train_cli.positive_int_arg, default=1,
                        help="trainings at once, each in its own process with one thread")
    train_cli.add_run_options(parser)
    return parser


def study_from_args(parser, args) -> Study:
    """The study the options ask for, with their changes; a bad combination ends in ``parser.error``."""
    if args.lr is not None or args.min_lr is not None:
        parser.error("compare chooses each model's rate from --rates; drop --lr and --min-lr")
    if args.study and args.ladder and args.study != "ladder":
        parser.error(f"--ladder is --study ladder; drop one of --ladder and --study {args.study}")
    scale = train_cli.scale_from_args(args)
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
    if scale != SCALE_OF[name] and train_cli.scale_asked(args) is not None:  # the study at another budget
        study = replace(study, base=scale_config(scale, "gpt2"))
    unknown = set(args.models or ()) - set(study.models)
    if unknown:
        parser.error(f"--models: the {name} study trains {list(study.models)}, not {sorted(unknown)}")
    try:
        return study.with_options(args.models, args.rates, args.selection_seeds, args.seeds,
                                  **train_cli.overrides_from_args(parser, args))
    except ValueError as err:
        parser.error(str(err).replace("reported_seeds", "--seeds").replace("selection_seeds", "--selection-seeds"))
        raise  # parser.error exits


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    study = study_from_args(parser, args)
    out = args.out or f"runs/{study.name}"
    command = "python -m modern_block compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    kept = f"what the runs wrote is kept in {out}; the same command continues"
    try:
        results = run_study(study, out, workers=args.workers, command=command, train=not args.collect,
                            say=lambda text: print(text, file=sys.stderr, flush=True))
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
