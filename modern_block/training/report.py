"""``compare``'s report and lesson 08's figures: DIR/report.md, DIR/results.json, the loss curves, the
learning-rate sweep and the ladder's bars.

    write_report(arms, out_dir, mode, total_s)   DIR/report.md, DIR/loss_curves.png, DIR/sweep.png, DIR/results.json
    plot_loss_curves, plot_sweep, plot_ladder    the figures, each returned (and saved when given a path)

Every file is written atomically (``training.files``); a file system that refuses a write is a
``StorageError`` naming the file.
"""

import datetime
import io
import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from .experiments import Arm, gap, mean_std, summarize
from .files import refused_writes, shown, write_atomic, write_text_atomic
from .rungs import get_rung
from .statistics import PairedDifference
from .trainer import TrainResult, sample


def _fmt(value, spec: str, none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def write_report(arms: dict[str, Arm], out_dir, mode: str, total_s: float, n_sample: int = 200) -> Path:
    """DIR/report.md, DIR/loss_curves.png, DIR/sweep.png and DIR/results.json for ``compare``'s arms."""
    out = Path(out_dir)
    with refused_writes(f"create the report's folder {shown(out)}"):
        out.mkdir(parents=True, exist_ok=True)
    table = summarize(arms)
    rungs = list(arms)
    first = next(r for arm in arms.values() for r in arm.trained)
    cfg, seeds = first.config, [r.config.seed for r in next(iter(arms.values())).best]
    tied = [get_rung(r).tie for r in rungs]
    n_sample = min(n_sample, cfg.block_size)  # generate() stays within the trained context
    prompt = "\n" if "\n" in first.tokenizer.chars else first.tokenizer.chars[0]  # a character the text has
    samples = {r: sample(arm.trained[0].model, arm.trained[0].tokenizer, prompt, n_sample, temperature=0.8, seed=0)
               for r, arm in arms.items() if arm.trained}
    plot_loss_curves({arm.label: arm.best for arm in arms.values()}, out / "loss_curves.png",
                     title=f"{' vs '.join(a.label for a in arms.values())} ({mode}, {len(seeds)} seed(s))")
    plot_sweep(arms, out / "sweep.png", title=f"best val loss against the peak learning rate ({mode})")

    def row(name, cell):
        return f"| {name} | " + " | ".join(cell(r) for r in rungs) + " |"

    loss_row = "best val loss, mean ± std" if len(seeds) > 1 else "best val loss (1 seed)"
    lines = [
        "# " + " vs ".join(a.label for a in arms.values()),
        "",
        f"{datetime.date.today().isoformat()}, torch {torch.__version__}, mode **{mode}**, corpus "
        f"**{first.corpus}**, device {first.device} ({first.precision}"
        f"{', torch.compile' if first.compiled else ''}).",
        f"Output head: {'tied' if all(tied) else 'untied' if not any(tied) else 'MIXED'} in every arm. "
        f"Same budget for all: {cfg.max_steps} steps × {cfg.batch_size} sequences × {cfg.block_size} characters "
        f"= {cfg.max_steps * cfg.tokens_per_step:,} training tokens, warmup {cfg.warmup_steps} steps then a cosine "
        f"to a tenth of the peak, AdamW betas ({cfg.beta1}, {cfg.beta2}), weight decay {cfg.weight_decay}, "
        f"dropout {cfg.dropout}; d = {cfg.d}, {cfg.n_layers} layers, {cfg.n_heads} heads "
        f"(Llama: {cfg.n_kv_heads} KV heads). Each arm trained at the peak rates "
        f"{', '.join(f'{lr:g}' for lr in arms[rungs[0]].rates)} with seeds {seeds} and reported at the rate "
        f"with the lowest mean; val loss: mean over {cfg.eval_batches} fixed batches of the last 10% of the text.",
        "",
        "| | " + " | ".join(arms[r].label for r in rungs) + " |",
        "|---|" + "---|" * len(rungs),
        row("parameters", lambda r: _fmt(table[r]["params"], ",")),
        row("chosen peak learning rate", lambda r: f"{arms[r].lr:g}" + (" (edge of the sweep)" if arms[r].at_edge
                                                                         else "")),
        row("mean best val loss per rate", lambda r: ", ".join(
            f"{lr}: {_fmt(v, '.4f', 'diverged')}" for lr, v in table[r]["rates"].items())),
        row("FLOPs per token (6N + 12·L·H·Q·T)", lambda r: _fmt(table[r]["flops_per_token"], ",")),
        row(loss_row, lambda r: f"{arms[r].mean:.4f} ± {arms[r].std:.4f}" if len(seeds) > 1 else f"{arms[r].mean:.4f}"),
        row("best val loss per seed", lambda r: ", ".join(f"{v:.4f}" for v in arms[r].val_losses)),
        row("tokens/s (median of intervals)", lambda r: _fmt(table[r]["tokens_per_s"], ",.0f")),
        row("MFU", lambda r: _fmt(table[r]["mfu"], ".1%")),
        row("wall time per run (s)", lambda r: _fmt(table[r]["wall_s"], ".1f")),
        "",
    ]
    if len(rungs) == 2:
        a, b = (arms[r] for r in rungs)
        g = gap(a, b)
        ratio = f"{b.params / a.params:.4f}" if a.params and b.params else "unknown (every run diverged)"
        lines += [f"{b.label} minus {a.label}: {g}. Parameter ratio {ratio} (matched within 2%: "
                  "every FFN is sized so the totals agree; see `modern_block.training.ladder`).", ""]
    if first.peak is None:
        lines += ["MFU is reported only on GPUs with a known peak (see `modern_block.training.device.PEAK_FLOPS`).", ""]
    else:
        lines += [f"MFU against the {first.peak} peak of 16-bit tensor-core FLOP/s.", ""]
    lines += [f"Total wall time of the comparison: {total_s:.1f} s.", "", "![loss curves](loss_curves.png)", "",
              "![learning-rate sweep](sweep.png)", "",
              f"## Samples (KV-cache decoding, temperature 0.8, seed 0, {n_sample} characters, first seed's model)", ""]
    for r, text in samples.items():
        lines += [f"### {arms[r].label}", "", "```", text.strip("\n"), "```", ""]
    with refused_writes(f"write the report {shown(out / 'report.md')}"):
        write_text_atomic(out / "report.md", "\n".join(lines))
    payload = {"mode": mode, "total_s": total_s, "torch": torch.__version__, "table": table, "samples": samples,
               "runs": {r: {f"{lr:g}": [x.summary() | {"metrics": x.metrics} if isinstance(x, TrainResult)
                                        else {"diverged": x.message, "config": asdict(x.config)} for x in runs]
                            for lr, runs in arm.runs.items()} for r, arm in arms.items()}}
    with refused_writes(f"write {shown(out / 'results.json')}"):
        write_text_atomic(out / "results.json", json.dumps(payload, indent=1) + "\n")
    return out / "report.md"


# ---- plots --------------------------------------------------------------------------------------------
COLORS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray")


def _label(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)


def _finish(fig, path):
    """Lay the figure out, save it when ``path`` is given, return it."""
    fig.tight_layout()
    if path is not None:
        image = io.BytesIO()
        fig.savefig(image, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
        with refused_writes(f"write the figure {shown(Path(path))}"):
            write_atomic(Path(path), lambda f: f.write(image.getvalue()))
    return fig


def plot_loss_curves(results: dict[str, list], path=None, title: str = "validation loss"):
    """Val (solid) and train (dashed) loss against step; ``results`` maps a label to the
    ``TrainResult``s (or metric lists) of its seeds."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (name, runs) in enumerate(results.items()):
        color = COLORS[k % len(COLORS)]
        for i, run in enumerate(runs):
            rows = run.metrics if hasattr(run, "metrics") else run
            steps = [m["step"] for m in rows]
            ax.plot(steps, [m["val_loss"] for m in rows], color=color, alpha=0.9,
                    label=f"{name} val" if i == 0 else None)
            ax.plot(steps, [m["train_loss"] for m in rows], color=color, alpha=0.5, linestyle="--",
                    label=f"{name} train" if i == 0 else None)
    _label(ax, "step", "cross-entropy (nats/char)", title)
    return _finish(fig, path)


def plot_sweep(arms: dict[str, Arm], path=None, title: str = "best val loss against the peak learning rate"):
    """Mean best val loss (error bars: std over seeds) at each rate, per model; the chosen rate circled.
    Diverged rates are left out."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k, arm in enumerate(arms.values()):
        color = COLORS[k % len(COLORS)]
        rates = [lr for lr in arm.rates if math.isfinite(arm.mean_at(lr))]
        stats = [mean_std(arm.losses(lr)) for lr in rates]
        ax.errorbar(rates, [m for m, _ in stats], yerr=[s for _, s in stats], color=color, marker="o", capsize=3,
                    label=f"{arm.label} (best {arm.lr:g})")
        ax.plot([arm.lr], [arm.mean], marker="o", markersize=12, markerfacecolor="none", color=color)
    ax.set_xscale("log")
    _label(ax, "peak learning rate", "best val loss (nats/char)", title)
    return _finish(fig, path)


def _bars(ax, rows: list[dict], color: str, title: str) -> None:
    names = [r["rung"] for r in rows]
    means = [r["mean"] if r["mean"] is not None else math.nan for r in rows]
    bars = ax.bar(names, means, yerr=[r["std"] for r in rows], capsize=4, color=color)
    ax.bar_label(bars, labels=[f"{m:.3f}" for m in means], label_type="center", color="white", fontsize=8)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=30)


def plot_ladder(rows: list[dict], path=None, title: str = "GPT-2 -> Llama, one change at a time",
                ablations: list[dict] | None = None, ablation_title: str = "Llama, one change left out"):
    """Bar chart of best val loss per rung (error bars: standard deviation across seeds); with
    ``ablations`` (``run_ablations``' rows), a second panel beside it on the same scale."""
    import matplotlib.pyplot as plt

    panels = [(rows, "tab:blue", title)] + ([(ablations, "tab:green", ablation_title)] if ablations else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(8 if len(panels) == 1 else 12, 3.8), sharey=True, squeeze=False)
    for ax, (panel, color, text) in zip(axes[0], panels, strict=True):
        _bars(ax, panel, color, text)
    every = [r for panel, _, _ in panels for r in panel if r["mean"] is not None]
    lo = min(r["mean"] - r["std"] for r in every)
    hi = max(r["mean"] + r["std"] for r in every)
    pad = max(hi - lo, 1e-3) * 0.5
    axes[0][0].set_ylim(lo - pad, hi + pad)
    axes[0][0].set_ylabel("best val loss")
    return _finish(fig, path)


def plot_curve_bands(groups: dict[str, list], path=None, title: str = "validation loss, seed mean and 95% band",
                     skip: int = 1):
    """Validation loss against step for each model: the mean over its seeds and a t-based 95% band
    (``statistics.band``), from the ``skip``-th evaluation on (after the first drop from ln V, which would
    flatten everything after it). ``groups`` maps a label to the runs (or metric lists) of its seeds."""
    import matplotlib.pyplot as plt

    from .statistics import band

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (name, runs) in enumerate(groups.items()):
        rows = [run.metrics if hasattr(run, "metrics") else run for run in runs]
        rows = [r for r in rows if r]  # a diverged run has none
        steps = [m["step"] for m in rows[0]][skip:]
        curves = [[m["val_loss"] for m in r][skip:] for r in rows]
        color = COLORS[k % len(COLORS)]
        if len(curves) > 1:
            mean, low, high = band(curves)
            ax.fill_between(steps, low, high, color=color, alpha=0.25, linewidth=0)
        else:
            mean = curves[0]
        ax.plot(steps, mean, color=color, marker="o", markersize=3, label=f"{name} ({len(curves)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("val loss (nats/char)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _finish(fig, path)


def plot_differences(rows: list[tuple[str, PairedDifference]], path=None, title: str = "differences, 95% intervals",
                     xlabel: str = "difference in val loss (nats/char); < 0: lower loss"):
    """Paired differences (``statistics.PairedDifference``) as points with their 95% intervals, one row each,
    against a line at zero: an interval that crosses it is "no difference at this scale"."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for i, (_, d) in enumerate(rows):
        if d.diverged:
            ax.text(0, i, "a run diverged", va="center")
            continue
        color = "tab:gray" if d.low <= 0 <= d.high else "tab:blue" if d.mean < 0 else "tab:red"
        ax.errorbar([d.mean], [i], xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path)
