"""The GPU-scale comparison and ladder in one command (target: under 8 minutes on an H100/H200).

    python benchmarks/gpu_train.py --data /path/to/folder/with/tinyshakespeare.txt --out runs/gpu
    python benchmarks/gpu_train.py --smoke --out /tmp/smoke   # a tiny CPU run of the same code path

1. Comparison: GPT2LM and LlamaStyleLM at nanoGPT's shakespeare-char budget (6 layers, 6 heads,
   d = 384, block 256, batch 64, 5000 steps, dropout 0.2, lr 1e-3 -> 1e-4), 3 seeds each.
2. Ladder: GPT-2 -> Llama one change at a time (``modern_block.ladder``), the same seeds. The two
   ends of the ladder are exactly GPT2LM and LlamaStyleLM (tested), so when the ladder runs the same
   number of steps as the comparison, the comparison's runs are its ends. The ladder's step count is
   chosen from the comparison's measured wall time so that the whole command fits ``--budget-min``
   (at most the comparison's 5000; the number used is recorded).

Runs are small (10.7M parameters), so one of them leaves an H100 mostly idle between kernel
launches: ``--jobs`` runs that many trainings at once, each in its own process on the same GPU.

The device machine has no internet: copy tinyshakespeare.txt into a folder of the checkout that git
ignores (and carry it), and pass that folder as --data.

Writes DIR/gpu_results.json, DIR/loss_curves.png, DIR/ladder.png and DIR/results_snippet.md (a table
to paste into benchmarks/RESULTS.md), and each run's metrics.jsonl under DIR/runs/.
"""

import argparse
import datetime
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from modern_block.data import DATA_ENV, load_corpus  # noqa: E402
from modern_block.experiments import plot_ladder, plot_loss_curves  # noqa: E402
from modern_block.ladder import RUNGS, size_table  # noqa: E402
from modern_block.train import TrainConfig, gpu_config, train  # noqa: E402

SMOKE = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=4,
             eval_interval=2, eval_batches=1, warmup_steps=1, dropout=0.0, log_interval=1, compile=False)


def _run(job: dict) -> dict:
    """Train one configuration (in a worker process or in-process); returns its summary and metrics."""
    cfg = TrainConfig(**job["config"])
    corpus = load_corpus(fallback=job["allow_fallback"], verbose=False)
    result = train(cfg, job["out"], corpus=corpus, checkpoints=False, progress=False, verbose=False)
    return result.summary() | {"metrics": result.metrics, "label": job["label"]}


def run_all(jobs: list[dict], n_workers: int) -> list[dict]:
    """Run the jobs, ``n_workers`` at a time (in-process when 1); results in the jobs' order."""
    if n_workers <= 1:
        return [_run(job) for job in jobs]
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
        return list(pool.map(_run, jobs))


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def _jobs(base: TrainConfig, archs, seeds, out: Path, stage: str, allow_fallback: bool) -> list[dict]:
    return [{"config": asdict(replace(base, arch=arch, seed=seed)), "label": (arch, seed),
             "out": str(out / "runs" / f"{stage}-{arch.replace(':', '_')}-seed{seed}"),
             "allow_fallback": allow_fallback} for arch in archs for seed in seeds]


def _by_arch(results: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for r in results:
        grouped.setdefault(r["label"][0], []).append(r)
    return grouped


def _arch_row(runs: list[dict]) -> dict:
    best = [r["best_val_loss"] for r in runs]
    mean, std = mean_std(best)
    tps = [r["tokens_per_s"] for r in runs if r["tokens_per_s"]]
    mfus = [r["mfu"] for r in runs if r["mfu"] is not None]
    return {"params": runs[0]["n_params"], "flops_per_token": runs[0]["flops_per_token"], "best_val_losses": best,
            "best_val_mean": mean, "best_val_std": std, "tokens_per_s": sum(tps) / len(tps) if tps else None,
            "mfu": sum(mfus) / len(mfus) if mfus else None, "wall_s": [r["wall_s"] for r in runs]}


def ladder_steps_for(budget_s: float, elapsed_s: float, comparison_s: float, comparison_runs: int,
                     ladder_runs_full: int, ladder_runs_all: int, full_steps: int, unit: int) -> int:
    """Largest ladder step count (a multiple of ``unit``, at most ``full_steps``) whose estimated
    time fits what is left of the budget. At ``full_steps`` the ends come from the comparison
    (``ladder_runs_full`` runs); below it every rung is trained (``ladder_runs_all``)."""
    left = budget_s - elapsed_s
    per_run_full = comparison_s / comparison_runs  # wall seconds per run at full_steps, at this concurrency
    if ladder_runs_full * per_run_full <= left:
        return full_steps
    steps = int(full_steps * left / (ladder_runs_all * per_run_full)) // unit * unit
    return max(unit, min(steps, full_steps))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu", help="output folder")
    parser.add_argument("--data", default=None, help=f"folder holding tinyshakespeare.txt (sets {DATA_ENV})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=None, help="trainings at once (default 6 on a GPU, 1 in --smoke)")
    parser.add_argument("--budget-min", type=float, default=7.5, help="wall-time budget for everything")
    parser.add_argument("--ladder-steps", type=int, default=None, help="fix the ladder's steps (default: fit)")
    parser.add_argument("--skip-ladder", action="store_true")
    parser.add_argument("--lr-gpt2", type=float, default=1e-3)
    parser.add_argument("--lr-llama", type=float, default=1e-3)
    parser.add_argument("--sweep", type=float, nargs="+", default=None, metavar="LR",
                        help="first train both archs at these peak lrs (seed 0, full budget) and use each one's "
                             "best; adds one round of runs to the time")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 4 steps, on the CPU: checks the code path")
    args = parser.parse_args(argv)
    if (args.jobs is not None and args.jobs < 1) or len(set(args.seeds)) != len(args.seeds):
        parser.error("--jobs must be >= 1 and --seeds distinct")
    if args.data:
        os.environ[DATA_ENV] = args.data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    if args.smoke:
        base = TrainConfig(**SMOKE, device="cpu")
        jobs, allow_fallback = args.jobs or 1, True
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: this benchmark is for a GPU (use --smoke to check it on a CPU)")
        base, jobs, allow_fallback = gpu_config(), args.jobs or 6, False
        try:  # fail now, clearly, if the real text cannot be found
            load_corpus(fallback=False, verbose=False)
        except (OSError, ValueError) as err:
            parser.error(f"tinyshakespeare is not available ({err}); pass --data FOLDER holding it")
    lrs = {"gpt2": args.lr_gpt2, "llama": args.lr_llama}
    report: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                    else None, "smoke": args.smoke, "jobs": jobs, "config": asdict(base), "seeds": args.seeds}

    if args.sweep:
        sweep_jobs = [job for arch in ("gpt2", "llama") for lr in args.sweep
                      for job in _jobs(replace(base, lr=lr, min_lr=lr / 10), [arch], [0], out, f"sweep{lr:g}",
                                       allow_fallback)]
        swept = run_all(sweep_jobs, jobs)
        report["sweep"] = [{"arch": r["arch"], "lr": r["config"]["lr"], "best_val_loss": r["best_val_loss"]}
                           for r in swept]
        for arch in lrs:
            lrs[arch] = min((r for r in swept if r["arch"] == arch), key=lambda r: r["best_val_loss"])["config"]["lr"]
        print("sweep:", report["sweep"], "-> chosen", lrs, flush=True)
    report["lr"] = lrs

    # 1. the comparison
    t0 = time.perf_counter()
    cmp_jobs = [job for arch in ("gpt2", "llama")
                for job in _jobs(replace(base, lr=lrs[arch], min_lr=lrs[arch] / 10), [arch], args.seeds, out,
                                 "compare", allow_fallback)]
    comparison = _by_arch(run_all(cmp_jobs, jobs))
    comparison_s = time.perf_counter() - t0
    report["comparison"] = {arch: _arch_row(runs) for arch, runs in comparison.items()}
    report["comparison_wall_s"] = comparison_s
    report["device"], report["precision"], report["peak"] = (comparison["gpt2"][0][k] for k in
                                                             ("device", "precision", "peak"))
    for arch, row in report["comparison"].items():
        print(f"{arch}: best val {row['best_val_mean']:.4f} ± {row['best_val_std']:.4f} {row['best_val_losses']}, "
              f"{row['tokens_per_s'] or 0:,.0f} tok/s, MFU {row['mfu']}", flush=True)
    plot_loss_curves({"GPT-2": [r["metrics"] for r in comparison["gpt2"]],
                      "Llama-style": [r["metrics"] for r in comparison["llama"]]}, out / "loss_curves.png",
                     title=f"GPT-2 vs Llama-style, {len(args.seeds)} seeds ({report['device']})")

    # 2. the ladder
    if not args.skip_ladder:
        middle = [r.name for r in RUNGS[1:-1]]
        steps = args.ladder_steps or ladder_steps_for(
            args.budget_min * 60, time.perf_counter() - start, comparison_s, len(cmp_jobs),
            len(middle) * len(args.seeds), len(RUNGS) * len(args.seeds), base.max_steps,
            unit=1 if args.smoke else 250)
        ladder_cfg = replace(base, max_steps=steps, eval_interval=min(base.eval_interval, steps))
        reuse_ends = steps == base.max_steps and lrs["gpt2"] == lrs["llama"] == base.lr
        rung_names = middle if reuse_ends else [r.name for r in RUNGS]
        print(f"ladder: {steps} steps per run, rungs {rung_names}"
              f"{' (ends from the comparison)' if reuse_ends else ''}", flush=True)
        t1 = time.perf_counter()
        ladder_runs = _by_arch(run_all(_jobs(ladder_cfg, [f"ladder:{n}" for n in rung_names], args.seeds, out,
                                             "ladder", allow_fallback), jobs))
        if reuse_ends:
            ladder_runs["ladder:gpt2"], ladder_runs["ladder:untied"] = comparison["gpt2"], comparison["llama"]
        vocab = len(set(load_corpus(fallback=allow_fallback, verbose=False).text))
        sizes = {row["rung"]: row for row in size_table(ladder_cfg.shape, vocab)}
        rows = []
        for rung in RUNGS:
            runs = ladder_runs[f"ladder:{rung.name}"]
            row = _arch_row(runs)
            rows.append({"rung": rung.name, "change": rung.change, "d_ff": sizes[rung.name]["d_ff"],
                         "params": row["params"], "val_losses": row["best_val_losses"],
                         "mean": row["best_val_mean"], "std": row["best_val_std"]})
        report["ladder"] = {"steps": steps, "ends_from_comparison": reuse_ends, "rows": rows,
                            "wall_s": time.perf_counter() - t1}
        plot_ladder(rows, out / "ladder.png", title=f"GPT-2 -> Llama, {steps} steps, {len(args.seeds)} seeds")
        for row in rows:
            print(f"  {row['rung']:>8} {row['change']:<40} {row['mean']:.4f} ± {row['std']:.4f}", flush=True)

    report["total_wall_s"] = time.perf_counter() - start
    (out / "gpu_results.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "results_snippet.md").write_text(snippet(report))
    print(f"total {report['total_wall_s']:.0f} s; wrote {out / 'gpu_results.json'}", flush=True)
    return 0


def snippet(report: dict) -> str:
    """Markdown tables of the results, for benchmarks/RESULTS.md."""
    lines = [f"### {report['device']}, torch {report['torch']}, CUDA {report['cuda']}, {report['date'][:10]}", "",
             f"{report['precision']}; {report['jobs']} runs at a time; total {report['total_wall_s']:.0f} s.", "",
             "| arch | params | best val loss (mean ± std) | per seed | tokens/s | MFU |", "|---|---|---|---|---|---|"]
    for arch, row in report["comparison"].items():
        mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"
        tps = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] else "n/a"
        lines.append(f"| {arch} (lr {report['lr'][arch]:g}) | {row['params']:,} | {row['best_val_mean']:.4f} ± "
                     f"{row['best_val_std']:.4f} | {', '.join(f'{v:.4f}' for v in row['best_val_losses'])} | "
                     f"{tps} | {mfu} |")
    if "ladder" in report:
        lines += ["", f"Ladder, {report['ladder']['steps']} steps per run:", "",
                  "| rung | change | d_ff | params | best val loss (mean ± std) |", "|---|---|---|---|---|"]
        for row in report["ladder"]["rows"]:
            lines.append(f"| {row['rung']} | {row['change']} | {row['d_ff']} | {row['params']:,} | "
                         f"{row['mean']:.4f} ± {row['std']:.4f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
