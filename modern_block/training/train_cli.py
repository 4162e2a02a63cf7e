"""``python -m modern_block train --arch llama --quick --out runs/llama [--resume]`` (or under torchrun): one run.
Exit status: 0 done; 2 a usage error; 1 the run failed, saying what is kept; 130 interrupted."""

import argparse
import shlex
import sys
from pathlib import Path

from ..files import StorageError, reason
from . import distributed
from .checkpoint import CheckpointError
from .config import ARCHS, ConfigError
from .distributed import RankFailedError
from .options import add_run_options, config_from_args, seed_arg
from .rungs import MODEL_NAMES
from .trainer import NonFiniteLossError, train


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


if __name__ == "__main__":
    sys.exit(main())
