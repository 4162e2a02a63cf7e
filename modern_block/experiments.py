"""The experiments of lesson 08, as library functions: train architectures on one budget and compare.

    compare(configs, seeds)     each architecture once per seed: same characters in the same order
                                (same sampler seed), same schedule, steps and evaluation windows
    summarize(results)          per architecture: params, FLOPs/token, best val loss (mean ± std), tokens/s, MFU
    write_report(results, dir)  DIR/report.md, DIR/loss_curves.png, DIR/results.json
    run_ladder(base, seeds)     GPT-2 -> Llama one change at a time (the models: ``modern_block.ladder``)
    plot_loss_curves, plot_ladder

``python -m modern_block compare`` is the command line over ``compare`` and ``write_report``.
"""

import datetime
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from .data import load_corpus
from .ladder import RUNG_NAMES, get_rung
from .train import TrainResult, sample, train

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
                                       verbose=verbose, overwrite=True))  # a re-run replaces its own runs
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


def plot_loss_curves(results: dict[str, list], path=None, title: str = "validation loss"):
    """Val (solid) and train (dashed) loss against step; ``results`` maps a label to the
    ``TrainResult``s (or metric lists) of its seeds."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray")
    for k, (label, runs) in enumerate(results.items()):
        color = colors[k % len(colors)]
        for i, run in enumerate(runs):
            rows = run.metrics if hasattr(run, "metrics") else run
            steps = [m["step"] for m in rows]
            ax.plot(steps, [m["val_loss"] for m in rows], color=color, alpha=0.9,
                    label=f"{label} val" if i == 0 else None)
            ax.plot(steps, [m["train_loss"] for m in rows], color=color, alpha=0.5, linestyle="--",
                    label=f"{label} train" if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
def run_ladder(base, seeds=(0,), rungs=RUNG_NAMES, corpus=None, progress=None, verbose: bool = True) -> list[dict]:
    """Train every rung for every seed on the budget of ``base`` (a ``TrainConfig``); returns one
    row per rung: name, change, params, best val loss per seed, their mean and sample standard
    deviation, and each seed's evaluation rows (``metrics``, for loss curves)."""
    rows = []
    for name in rungs:
        rung = get_rung(name)
        results = [train(replace(base, arch=f"ladder:{name}", seed=seed), corpus=corpus, progress=progress,
                         verbose=verbose) for seed in seeds]
        losses = [r.best_val_loss for r in results]
        mean = sum(losses) / len(losses)
        std = math.sqrt(sum((x - mean) ** 2 for x in losses) / (len(losses) - 1)) if len(losses) > 1 else 0.0
        rows.append({"rung": name, "change": rung.change, "params": results[0].n_params, "val_losses": losses,
                     "mean": mean, "std": std, "metrics": [r.metrics for r in results]})
    return rows


def plot_ladder(rows: list[dict], path=None, title: str = "GPT-2 -> Llama, one change at a time"):
    """Bar chart of best val loss per rung, error bars = standard deviation across seeds."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [r["rung"] for r in rows]
    bars = ax.bar(names, [r["mean"] for r in rows], yerr=[r["std"] for r in rows], capsize=4, color="tab:blue")
    ax.bar_label(bars, labels=[f"{r['mean']:.3f}" for r in rows], label_type="center", color="white", fontsize=8)
    lo = min(r["mean"] - r["std"] for r in rows)
    hi = max(r["mean"] + r["std"] for r in rows)
    pad = max(hi - lo, 1e-3) * 0.5
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_ylabel("best val loss")
    ax.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
