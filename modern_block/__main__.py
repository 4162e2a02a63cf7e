"""``python -m modern_block compare``: train both architectures on the same budget and write a report.

Both models see the same characters in the same order (same sampler seed), the same learning-rate
schedule, number of steps and evaluation windows, at parameter counts matched within 2%
(``modern_block.ladder``). Writes DIR/report.md, DIR/loss_curves.png, DIR/results.json and, per run,
DIR/<arch>-seed<S>/metrics.jsonl and summary.json (no checkpoints: use ``modern_block.train`` to keep
and resume one run).
"""

import argparse
import datetime
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .data import load_corpus
from .train import (
    NonFiniteLossError,
    TrainResult,
    add_run_options,
    config_from_args,
    plot_loss_curves,
    positive_float,
    quick_from_args,
    sample,
    train,
)

LABELS = {"gpt2": "GPT-2", "llama": "Llama-style"}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def compare(configs: dict, seeds=(0,), out_dir=None, corpus=None, progress=None, verbose=True) -> dict[str, list]:
    """Train each ``configs[arch]`` once per seed; returns {arch: [TrainResult per seed]}."""
    corpus = corpus if corpus is not None else load_corpus(verbose=verbose)
    results: dict[str, list[TrainResult]] = {arch: [] for arch in configs}
    for seed in seeds:
        for arch, cfg in configs.items():
            run_dir = Path(out_dir) / f"{arch}-seed{seed}" if out_dir is not None else None
            cfg = replace(cfg, seed=seed)
            results[arch].append(train(cfg, run_dir, corpus=corpus, checkpoints=False, progress=progress,
                                       verbose=verbose))
    return results


def _fmt(value, spec: str, none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def summarize(results: dict[str, list]) -> dict:
    """Per architecture: params, FLOPs/token, best val loss (per seed, mean, std), tokens/s, MFU, wall time."""
    table = {}
    for arch, runs in results.items():
        best = [r.best_val_loss for r in runs]
        mean, std = mean_std(best)
        tps = [r.tokens_per_s for r in runs if r.tokens_per_s]
        mfus = [r.mfu for r in runs if r.mfu is not None]
        table[arch] = {"params": runs[0].n_params, "flops_per_token": runs[0].flops_per_token,
                       "best_val_losses": best, "best_val_mean": mean, "best_val_std": std,
                       "tokens_per_s": sum(tps) / len(tps) if tps else None,
                       "mfu": sum(mfus) / len(mfus) if mfus else None,
                       "wall_s": sum(r.wall_s for r in runs) / len(runs),
                       "device": runs[0].device, "precision": runs[0].precision, "peak": runs[0].peak,
                       "compiled": runs[0].compiled, "corpus": runs[0].corpus}
    return table


def write_report(results: dict[str, list], out_dir, mode: str, total_s: float, n_sample: int = 200) -> Path:
    """DIR/report.md, DIR/loss_curves.png and DIR/results.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = summarize(results)
    archs = list(results)
    first = results[archs[0]][0]
    cfg = first.config
    seeds = [r.config.seed for r in results[archs[0]]]
    n_sample = min(n_sample, cfg.block_size)  # generate() stays within the trained context
    samples = {arch: sample(runs[0].model, runs[0].tokenizer, "\n", n_sample, temperature=0.8, seed=0)
               for arch, runs in results.items()}
    plot_loss_curves({LABELS.get(a, a): results[a] for a in archs}, out / "loss_curves.png",
                     title=f"{' vs '.join(LABELS.get(a, a) for a in archs)} ({mode}, {len(seeds)} seed(s))")
    ratio = table["llama"]["params"] / table["gpt2"]["params"] if {"llama", "gpt2"} <= set(table) else None

    def row(name, key, spec):
        return f"| {name} | " + " | ".join(_fmt(table[a][key], spec) for a in archs) + " |"

    lines = [
        "# Llama-style LM vs GPT-2 LM",
        "",
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}, mode **{mode}**, corpus "
        f"**{first.corpus}**, device {first.device} ({first.precision}"
        f"{', torch.compile' if first.compiled else ''}).",
        f"Same budget for both: {cfg.max_steps} steps × {cfg.batch_size} sequences × {cfg.block_size} characters "
        f"= {cfg.max_steps * cfg.tokens_per_step:,} training tokens, warmup {cfg.warmup_steps} steps then a cosine "
        f"to the minimum learning rate, AdamW betas ({cfg.beta1}, {cfg.beta2}), weight decay {cfg.weight_decay}, "
        f"dropout {cfg.dropout}; d = {cfg.d}, {cfg.n_layers} layers, {cfg.n_heads} heads "
        f"(Llama: {cfg.n_kv_heads} KV heads). Seeds: {seeds}. Val loss: mean over {cfg.eval_batches} fixed "
        f"batches of the last 10% of the text.",
        "",
        "| | " + " | ".join(LABELS.get(a, a) for a in archs) + " |",
        "|---|" + "---|" * len(archs),
        row("parameters", "params", ","),
        "| learning rate (peak -> min) | " + " | ".join(
            f"{results[a][0].config.lr:g} -> {results[a][0].config.min_lr:g}" for a in archs) + " |",
        row("FLOPs per token (6N + 12·L·H·Q·T)", "flops_per_token", ","),
        ("| best val loss, mean ± std | " + " | ".join(
            f"{table[a]['best_val_mean']:.4f} ± {table[a]['best_val_std']:.4f}" for a in archs) + " |")
        if len(seeds) > 1 else ("| best val loss (1 seed) | " + " | ".join(
            f"{table[a]['best_val_mean']:.4f}" for a in archs) + " |"),
        "| best val loss per seed | " + " | ".join(
            ", ".join(f"{v:.4f}" for v in table[a]["best_val_losses"]) for a in archs) + " |",
        row("tokens/s (median of intervals)", "tokens_per_s", ",.0f"),
        "| MFU | " + " | ".join(_fmt(table[a]["mfu"], ".1%") for a in archs) + " |",
        row("wall time per run (s)", "wall_s", ".1f"),
        "",
    ]
    if ratio is not None:
        lines += [f"Parameter ratio Llama / GPT-2 = {ratio:.4f} (matched within 2%: the SwiGLU hidden size is chosen "
                  "so the totals agree; see `modern_block.ladder`).", ""]
    if first.peak is None:
        lines += ["MFU is reported only on GPUs with a known peak (see `modern_block.device.PEAK_FLOPS`).", ""]
    else:
        lines += [f"MFU against the {first.peak} peak of 16-bit tensor-core FLOP/s.", ""]
    lines += [f"Total wall time of the comparison: {total_s:.1f} s.", "", "![loss curves](loss_curves.png)", "",
              f"## Samples (KV-cache decoding, temperature 0.8, seed 0, {n_sample} characters, first seed's model)", ""]
    for arch in archs:
        lines += [f"### {LABELS.get(arch, arch)}", "", "```", samples[arch].strip("\n"), "```", ""]
    (out / "report.md").write_text("\n".join(lines))
    payload = {"mode": mode, "total_s": total_s, "torch": torch.__version__, "table": table, "samples": samples,
               "runs": {a: [r.summary() | {"metrics": r.metrics} for r in runs] for a, runs in results.items()}}
    (out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    return out / "report.md"


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
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    report = write_report(results, args.out, mode, time.perf_counter() - start)
    print((Path(args.out) / "report.md").read_text().split("\n## Samples")[0])
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
