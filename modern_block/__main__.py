"""``python -m modern_block compare``: train both architectures on the same budget and write a report.

Both models see the same characters in the same order (same sampler seed), the same learning-rate
schedule, number of steps and evaluation windows, at parameter counts matched within 2%
(``modern_block.ladder``). Writes DIR/report.md, DIR/loss_curves.png, DIR/results.json and, per run,
DIR/<arch>-seed<S>/metrics.jsonl and summary.json (no checkpoints: use ``modern_block.train`` to keep
and resume one run). The experiment itself lives in ``modern_block.experiments``; this is its command line.
"""

import argparse
import sys
import time
from pathlib import Path

from .distributed import RankFailedError, is_main_process
from .experiments import LABELS, compare, write_report
from .run_folder import RunFolderError
from .train import NonFiniteLossError, add_run_options, config_from_args, positive_float, quick_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m modern_block", description="The Modern Transformer Block.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    cmp_parser = commands.add_parser("compare", help="train the Llama-style and GPT-2 LMs on the same budget",
                                     description=__doc__.split("\n\n")[0])
    cmp_parser.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    cmp_parser.add_argument("--seeds", type=int, nargs="+", default=None,
                            help="seeds, one run per architecture each (default: 0; 0 1 2 at GPU scale)")
    for arch in ("gpt2", "llama"):
        cmp_parser.add_argument(f"--lr-{arch}", type=positive_float, default=None,
                                help=f"peak learning rate of the {LABELS[arch]} arm only (overrides --lr)")
    add_run_options(cmp_parser)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configs = {arch: config_from_args(parser, args, arch, lr=getattr(args, f"lr_{arch}"))
               for arch in ("gpt2", "llama")}
    quick = quick_from_args(args)
    mode = "quick (CPU scale)" if quick else "GPU scale"
    seeds = args.seeds if args.seeds is not None else ([0] if quick else [0, 1, 2])
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct, got {seeds}")
    start = time.perf_counter()
    try:
        results = compare(configs, seeds, args.out, progress=False if args.no_progress else None)
    except (NonFiniteLossError, RunFolderError, RankFailedError) as err:  # RunFolderError: --out in use
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if not is_main_process():  # under torchrun every process trains; rank 0 writes the report
        return 0
    report = write_report(results, args.out, mode, time.perf_counter() - start)
    print((Path(args.out) / "report.md").read_text().split("\n## Samples")[0])
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
