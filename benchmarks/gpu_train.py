"""Lesson 08's experiments at GPU scale, in parts that each fit a short GPU slot.

    python benchmarks/gpu_train.py --data DIR --out runs/gpu --part compare    # the two blocks, untied heads
    python benchmarks/gpu_train.py --data DIR --out runs/gpu --part tied       # the two blocks, tied heads
    python benchmarks/gpu_train.py --data DIR --out runs/gpu --part ladder     # GPT-2 -> Llama, one change at a time
    python benchmarks/gpu_train.py --data DIR --out runs/gpu --part ablations  # Llama, one change left out
    python benchmarks/gpu_train.py --smoke --out /tmp/smoke --part all          # every part, tiny, on the CPU

The budget is nanoGPT's shakespeare-char one (6 layers, 6 heads, d = 384, block 256, batch 64,
5000 steps, dropout 0.2, warmup 100, cosine to a tenth of the peak). Every model trains at each
peak rate of ``--rates`` (default 5e-4 1e-3 2e-3) with each seed of ``--seeds`` (default 0 1 2)
and is reported at its own best rate, as in lesson 08 (``modern_block.training.experiments``). ``compare``
and ``tied`` run the full 5000 steps (``tied``'s GPT-2 arm is nanoGPT's model: its published best
val loss there is 1.4697 on an A100); ``ladder`` and ``ablations`` run ``--ladder-steps`` (default
1000) per run, so their ends are trained again at that budget. ``--max-steps`` shortens every part
(to fit a slot; recorded in the output).

Runs are small (10.7M parameters), so one of them leaves a large GPU mostly idle between kernel
launches: ``--workers`` trainings run at once, each in its own process on the same GPU.

The device machine has no internet: copy tinyshakespeare.txt into a folder of the checkout that git
ignores (and carry it), and pass that folder as --data.

Each part writes DIR/<part>.json (every run's best val loss and evaluation rows), DIR/<part>.png and
DIR/<part>.md (a table for benchmarks/RESULTS.md), with the GPU's name, the torch version and the date.
"""

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from modern_block.training.config import TrainConfig, gpu_config  # noqa: E402
from modern_block.training.data import DATA_ENV, load_corpus  # noqa: E402
from modern_block.training.experiments import ARMS, GPU_RATES, gap, run_ablations, run_ladder, sweep  # noqa: E402
from modern_block.training.report import plot_ladder, plot_loss_curves, plot_sweep  # noqa: E402
from modern_block.training.workers import WorkerPool  # noqa: E402

PARTS = ("compare", "tied", "ladder", "ablations")
NANOGPT_GPT2_BEST_VAL = 1.4697  # nanoGPT's README, shakespeare-char, GPT-2 block, this budget, A100
SMOKE = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=4,
             eval_interval=2, eval_batches=1, warmup_steps=1, dropout=0.0, log_interval=1, compile=False,
             device="cpu")


def run_part(part: str, base: TrainConfig, ladder_base: TrainConfig, rates, seeds, corpus, workers, out: Path) -> dict:
    """Train one part; returns its JSON-able report (also written to DIR/<part>.json)."""
    t0 = time.perf_counter()
    if part in ("compare", "tied"):
        arms = sweep(base, ARMS[part == "tied"], rates, seeds, corpus=corpus, workers=workers)
        rows = [arm.row() for arm in arms.values()]
        a, b = arms.values()
        report = {"budget": asdict(base), "rows": rows, "gap": asdict(gap(a, b)) | {"verdict": gap(a, b).verdict()}}
        plot_loss_curves({arm.label: arm.best for arm in arms.values()}, out / f"{part}.png",
                         title=f"{part}: {len(seeds)} seeds, each at its best rate ({base.max_steps} steps)")
        plot_sweep(arms, out / f"{part}_sweep.png")
    else:
        run = run_ladder if part == "ladder" else run_ablations
        rows = run(ladder_base, rates, seeds, corpus=corpus, workers=workers)
        report = {"budget": asdict(ladder_base), "rows": rows,
                  "gaps": [asdict(g) | {"verdict": g.verdict()} for g in _gaps(part, rows)]}
        plot_ladder(rows, out / f"{part}.png", title=f"{part}: {ladder_base.max_steps} steps, {len(seeds)} seeds")
    report |= {"part": part, "wall_s": time.perf_counter() - t0}
    return report


def _gaps(part: str, rows: list[dict]):
    """Ladder: each rung against the one before it; ablations: each model against the reference."""
    if part == "ladder":
        return [gap(prev, row) for prev, row in zip(rows, rows[1:], strict=False)]
    return [gap(rows[0], row) for row in rows[1:]]


def snippet(report: dict, meta: dict) -> str:
    """A markdown table of one part, for benchmarks/RESULTS.md."""
    budget = report["budget"]
    lines = [f"### {report['part']}: {meta['gpu']}, torch {meta['torch']}, {meta['date'][:10]}", "",
             f"{budget['max_steps']} steps × {budget['batch_size']} × {budget['block_size']} tokens; rates "
             f"{', '.join(f'{r:g}' for r in meta['rates'])}; seeds {meta['seeds']}; {meta['workers']} runs at a time; "
             f"{report['wall_s']:.0f} s.", "",
             "| model | change | params | chosen lr | best val loss (mean ± std) | per seed | mean per rate |",
             "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        mean = f"{row['mean']:.4f} ± {row['std']:.4f}" if row["mean"] is not None else "diverged"
        seeds = ", ".join("diverged" if v is None else f"{v:.4f}" for v in row["val_losses"])
        per_rate = ", ".join(f"{lr}: {'diverged' if v is None else f'{v:.4f}'}" for lr, v in row["rates"].items())
        lines.append(f"| {row['label']} | {row['change']} | {row['params']:,} | {row['lr']:g}"
                     f"{' (edge)' if row['at_edge'] else ''} | {mean} | {seeds} | {per_rate} |")
    if "gap" in report:
        g = report["gap"]
        lines += ["", f"Llama-style minus GPT-2: {g['delta']:+.4f} ± {g['se'] or 0:.4f} (standard error): "
                      f"{g['verdict']}."]
        if report["part"] == "tied":
            lines += [f"nanoGPT's published GPT-2 result at this budget: best val loss {NANOGPT_GPT2_BEST_VAL}."]
    else:
        what = "the rung before" if report["part"] == "ladder" else "the Llama end"
        lines += ["", f"Each model against {what}:", ""]
        others = report["rows"][1:]
        for row, g in zip(others, report["gaps"], strict=True):
            lines.append(f"- {row['change']}: {g['delta']:+.4f} ± {g['se'] or 0:.4f}, {g['verdict']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu", help="output folder")
    parser.add_argument("--data", default=None, help=f"folder holding tinyshakespeare.txt (sets {DATA_ENV})")
    parser.add_argument("--part", nargs="+", choices=(*PARTS, "all"), default=["compare"], help="what to run")
    parser.add_argument("--rates", type=float, nargs="+", default=list(GPU_RATES), help="peak learning rates")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=None,
                        help="trainings at once (default 6 on a GPU, 1 in --smoke)")
    parser.add_argument("--ladder-steps", type=int, default=1000, help="steps per ladder/ablation run")
    parser.add_argument("--max-steps", type=int, default=None, help="cap every run's steps (to fit a time slot)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 4 steps, on the CPU: checks the code path")
    args = parser.parse_args(argv)
    if (args.workers is not None and args.workers < 1) or len(set(args.seeds)) != len(args.seeds):
        parser.error("--workers must be >= 1 and --seeds distinct")
    if not all(r > 0 for r in args.rates) or len(set(args.rates)) != len(args.rates):
        parser.error("--rates must be distinct positive numbers")
    if args.data:
        os.environ[DATA_ENV] = args.data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = PARTS if "all" in args.part else tuple(dict.fromkeys(args.part))

    if args.smoke:
        base, workers, corpus = TrainConfig(arch="gpt2", **SMOKE), args.workers or 1, load_corpus(verbose=False)
        ladder_base = base
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: this benchmark is for a GPU (use --smoke to check it on a CPU)")
        try:  # fail now, clearly, if the real text cannot be found
            corpus = load_corpus(fallback=False, verbose=False)
        except (OSError, ValueError) as err:
            parser.error(f"tinyshakespeare is not available ({err}); pass --data FOLDER holding it")
        base, workers = gpu_config("gpt2"), args.workers or 6
        ladder_base = replace(base, max_steps=args.ladder_steps,
                              eval_interval=min(base.eval_interval, args.ladder_steps))
    if args.max_steps:
        base, ladder_base = (replace(b, max_steps=min(b.max_steps, args.max_steps),
                                     eval_interval=min(b.eval_interval, args.max_steps)) for b in (base, ladder_base))
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU",
            "smoke": args.smoke, "workers": workers, "rates": args.rates, "seeds": args.seeds, "corpus": corpus.name}
    pool = WorkerPool(corpus, workers) if workers > 1 else 1
    try:
        for part in parts:
            print(f"{part}: training ...", flush=True)
            report = run_part(part, base, ladder_base, args.rates, args.seeds, corpus, pool, out) | {"meta": meta}
            (out / f"{part}.json").write_text(json.dumps(report, indent=1) + "\n")
            text = snippet(report, meta)
            (out / f"{part}.md").write_text(text)
            print(text, flush=True)
    finally:
        if isinstance(pool, WorkerPool):
            pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
