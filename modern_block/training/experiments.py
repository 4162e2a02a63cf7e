"""The experiments of lesson 08, as library functions: train models on one budget and compare them.

    sweep(base, rungs, rates, seeds)    every model at every peak learning rate, once per seed: the same
                                        characters in the same order (the sampler's seed), schedule shape,
                                        steps and evaluation windows; each model then stands at its best rate
    compare(base, rates, seeds, tie)    the two blocks, GPT-2 and Llama-style, with the same output-head
                                        choice (both untied, the main comparison, or both tied) at GPT-2's
                                        parameter count
    run_ladder(base, rates, seeds)      GPT-2 -> Llama one change at a time (the models: ``training.ladder``)
    run_ablations(base, rates, seeds)   the Llama end back one change at a time (leave one out)
    gap(a, b)                           the difference of two models' mean losses, with its standard error
    summarize, write_report             the table; DIR/report.md, DIR/loss_curves.png, DIR/sweep.png, DIR/results.json
    plot_loss_curves, plot_sweep, plot_ladder

Every function takes the budget as a ``TrainConfig`` (``base``: sizes, steps, batch, schedule; its arch,
seed and learning rate are set per run, the minimum rate kept in proportion), with the rates and the
seeds as arguments, so the same code runs the quick CPU version and the GPU scale. ``workers`` > 1
trains that many runs at once, each in its own process (CPU cores, or several small runs sharing one
GPU). ``cache`` (a dict) lets one call reuse another's runs: an identical configuration trains once.
``python -m modern_block compare`` is the command line over ``compare`` and ``write_report``.
"""

import datetime
import json
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .config import TrainConfig
from .data import Corpus, load_corpus
from .ladder import ABLATION_NAMES, LADDER_NAMES, LLAMA_END, get_rung
from .trainer import NonFiniteLossError, TrainResult, sample, train

LABELS = {"untied": "GPT-2", "qk_norm": "Llama-style", "gpt2": "GPT-2, tied head", "tied": "Llama-style, tied head"}
ARMS = {False: ("untied", "qk_norm"), True: ("gpt2", "tied")}  # tie -> (the GPT-2 block, the Llama block)
QUICK_RATES = (4e-3, 8e-3, 1.6e-2, 3.2e-2)  # the quick lesson's sweep (tiny models, short runs: high rates)
GPU_RATES = (5e-4, 1e-3, 2e-3)  # around nanoGPT's 1e-3 for its shakespeare-char budget


def label(rung: str) -> str:
    return LABELS.get(rung, rung)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# ---- running many trainings ---------------------------------------------------------------------------
@dataclass
class Diverged:
    """A run stopped by a non-finite loss (a sweep's highest rates may do this): it counts as loss inf."""

    config: TrainConfig
    message: str
    metrics: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    best_val_loss: float = math.inf


def _key(cfg: TrainConfig, corpus: Corpus) -> tuple:
    """What determines a run: the text and the configuration, with a ladder model named by its switches
    (two names for one model share their runs)."""
    settings = asdict(cfg)
    if cfg.arch.startswith("ladder:"):
        settings["arch"] = get_rung(cfg.arch.removeprefix("ladder:")).switches
    return (corpus.name, len(corpus.text)) + tuple(sorted(settings.items(), key=lambda kv: kv[0]))


def _run_dir(out_dir, cfg: TrainConfig):
    if out_dir is None:
        return None
    return Path(out_dir) / f"{cfg.arch.removeprefix('ladder:')}-lr{cfg.lr:g}-seed{cfg.seed}"


def _train_or_diverge(cfg, run_dir, corpus, progress, verbose):
    try:
        return train(cfg, run_dir, corpus=corpus, checkpoints=False, progress=progress, verbose=verbose,
                     overwrite=True)  # a re-run replaces its own runs
    except NonFiniteLossError as err:
        return Diverged(cfg, str(err))


_WORKER_CORPUS: Corpus | None = None


def _worker_init(text: str, name: str, source: str) -> None:
    global _WORKER_CORPUS
    torch.set_num_threads(1)  # one core per run; the same arithmetic as a one-thread run in the parent
    _WORKER_CORPUS = Corpus(text, name, source)


def _worker_train(cfg: TrainConfig, run_dir):
    result = _train_or_diverge(cfg, run_dir, _WORKER_CORPUS, False, False)
    if isinstance(result, TrainResult):
        result.model.cpu()  # back to the parent as CPU tensors
    return result


class WorkerPool:
    """``n`` worker processes (spawned, one thread each) that hold ``corpus`` and train runs for
    ``train_many``; one pool can serve many calls, so the workers start once. Close it (or use
    ``with``) when done."""

    def __init__(self, corpus: Corpus, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        self.corpus, self.n = corpus, n
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked; spawn is safe everywhere
        self._pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                                         initargs=(corpus.text, corpus.name, corpus.source))

    def submit(self, cfg: TrainConfig, run_dir):
        return self._pool.submit(_worker_train, cfg, run_dir)

    def close(self) -> None:
        """Stop the workers (runs not yet started are dropped)."""
        self._pool.shutdown(cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def train_many(configs: list[TrainConfig], corpus: Corpus | None = None, workers=1, out_dir=None,
               cache: dict | None = None, progress=None, verbose: bool = False) -> list:
    """Train each configuration on ``corpus``; returns a ``TrainResult`` (or a ``Diverged``) per
    configuration, in order. ``workers``: 1 trains here, one run after another; n > 1 starts a
    ``WorkerPool`` of n processes for this call; a ``WorkerPool`` is used as it is. Runs found in
    ``cache`` are not trained again. Each run is seeded, so the results do not depend on ``workers``."""
    if isinstance(workers, WorkerPool):
        corpus = corpus if corpus is not None else workers.corpus
        if (corpus.name, corpus.text) != (workers.corpus.name, workers.corpus.text):
            raise ValueError("workers: this WorkerPool holds a different corpus than the one given")
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int or a WorkerPool, got {workers!r}")
    corpus = corpus if corpus is not None else load_corpus(verbose=verbose)
    cache = {} if cache is None else cache
    todo = {}
    for cfg in configs:
        todo.setdefault(_key(cfg, corpus), cfg)
    todo = {k: cfg for k, cfg in todo.items() if k not in cache}
    if workers == 1 or (not isinstance(workers, WorkerPool) and len(todo) <= 1):
        for k, cfg in todo.items():
            cache[k] = _train_or_diverge(cfg, _run_dir(out_dir, cfg), corpus, progress, verbose)
    elif todo:
        pool = workers if isinstance(workers, WorkerPool) else WorkerPool(corpus, min(workers, len(todo)))
        futures = {}
        try:
            futures = {k: pool.submit(cfg, _run_dir(out_dir, cfg)) for k, cfg in todo.items()}
            for k, future in futures.items():
                cache[k] = future.result()
        except BaseException:  # an error or Ctrl-C: drop the runs not started yet
            for future in futures.values():
                future.cancel()
            raise
        finally:
            if pool is not workers:
                pool.close()
    return [cache[_key(cfg, corpus)] for cfg in configs]


# ---- one model at several learning rates -----------------------------------------------------------
@dataclass
class Arm:
    """One model trained at several peak learning rates, once per seed at each; it stands at the rate
    with the lowest mean best-validation loss (``lr``)."""

    rung: str
    runs: dict[float, list]  # peak lr -> [TrainResult or Diverged, one per seed]

    @property
    def label(self) -> str:
        return label(self.rung)

    @property
    def change(self) -> str:
        return get_rung(self.rung).change

    @property
    def rates(self) -> list[float]:
        return sorted(self.runs)

    def losses(self, lr: float) -> list[float]:
        """Best validation loss of each seed at this rate (inf for a run that diverged)."""
        return [r.best_val_loss for r in self.runs[lr]]

    def mean_at(self, lr: float) -> float:
        return mean_std(self.losses(lr))[0]

    @property
    def lr(self) -> float:
        return min(self.rates, key=lambda lr: (self.mean_at(lr), lr))

    @property
    def at_edge(self) -> bool:
        """The best rate is the lowest or the highest one tried: a wider sweep might find a better one."""
        return len(self.rates) > 1 and self.lr in (self.rates[0], self.rates[-1])

    @property
    def best(self) -> list:
        return self.runs[self.lr]

    @property
    def val_losses(self) -> list[float]:
        return self.losses(self.lr)

    @property
    def mean(self) -> float:
        return mean_std(self.val_losses)[0]

    @property
    def std(self) -> float:
        return mean_std(self.val_losses)[1]

    @property
    def trained(self) -> list[TrainResult]:
        return [r for r in self.best if isinstance(r, TrainResult)]

    @property
    def params(self) -> int | None:
        runs = [r for rs in self.runs.values() for r in rs if isinstance(r, TrainResult)]
        return runs[0].n_params if runs else None

    def row(self) -> dict:
        """The JSON-able summary: rung, change, params, chosen lr, mean loss per rate, per-seed losses
        at the chosen rate, mean and std, and those runs' evaluation rows (``metrics``, for curves)."""
        finite = lambda v: v if math.isfinite(v) else None  # noqa: E731 (JSON has no inf)
        return {"rung": self.rung, "label": self.label, "change": self.change, "params": self.params,
                "lr": self.lr, "at_edge": self.at_edge,
                "rates": {f"{lr:g}": finite(self.mean_at(lr)) for lr in self.rates},
                "val_losses": [finite(v) for v in self.val_losses], "mean": finite(self.mean), "std": self.std,
                "metrics": [r.metrics for r in self.best]}


def _check_grid(rates, seeds) -> tuple[tuple[float, ...], tuple[int, ...]]:
    rates, seeds = tuple(rates), tuple(seeds)
    if not rates or not all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"rates must be positive finite numbers, got {list(rates)}")
    if len(set(rates)) != len(rates):
        raise ValueError(f"rates must be distinct, got {list(rates)}")
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be ints, got {list(seeds)}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    return rates, seeds


def sweep(base: TrainConfig, rungs, rates, seeds=(0, 1), corpus: Corpus | None = None, workers=1,
          out_dir=None, cache: dict | None = None, progress=None, verbose: bool = False) -> dict[str, Arm]:
    """Train every model in ``rungs`` at every rate in ``rates`` (or ``rates[rung]`` when a dict), once
    per seed, on the budget of ``base``. The minimum learning rate keeps ``base``'s ratio to the peak."""
    rungs = [get_rung(r).name for r in rungs]
    grid = {r: _check_grid(rates[r] if isinstance(rates, dict) else rates, seeds) for r in rungs}
    ratio = base.min_lr / base.lr
    configs = [replace(base, arch=f"ladder:{r}", lr=lr, min_lr=lr * ratio, seed=s)
               for r in rungs for lr in grid[r][0] for s in grid[r][1]]
    results = iter(train_many(configs, corpus, workers, out_dir, cache, progress, verbose))
    arms = {}
    for r in rungs:
        arms[r] = Arm(r, {lr: [next(results) for _ in grid[r][1]] for lr in grid[r][0]})
    return arms


def compare(base: TrainConfig, rates, seeds=(0, 1), tie: bool = False, **kwargs) -> dict[str, Arm]:
    """The GPT-2 block against the Llama-style block, both with an untied output head (the main
    comparison) or both tied (``tie=True``), at GPT-2's parameter count, each at its best rate.
    Keyword arguments go to ``sweep``."""
    return sweep(base, ARMS[bool(tie)], rates, seeds, **kwargs)


def run_ladder(base: TrainConfig, rates, seeds=(0, 1), rungs=LADDER_NAMES, **kwargs) -> list[dict]:
    """The cumulative ladder, each model at its best rate: one ``Arm.row()`` per rung."""
    return [arm.row() for arm in sweep(base, rungs, rates, seeds, **kwargs).values()]


def run_ablations(base: TrainConfig, rates, seeds=(0, 1), rungs=ABLATION_NAMES, **kwargs) -> list[dict]:
    """Leave one out from the Llama end (``LlamaStyleLM``): the reference row first, then one row per
    model that undoes one change, each at its best rate."""
    return [arm.row() for arm in sweep(base, (LLAMA_END, *rungs), rates, seeds, **kwargs).values()]


# ---- reading the results ------------------------------------------------------------------------------
@dataclass
class Gap:
    """b's mean loss minus a's, with the standard error of that difference, sqrt(s_a²/n_a + s_b²/n_b)."""

    delta: float
    se: float | None  # None with a single seed on either side: no spread to compare with

    @property
    def resolved(self) -> bool:
        """|delta| is more than twice its standard error (with 2-3 seeds, a coarse screen, not a test)."""
        return self.se is not None and math.isfinite(self.delta) and abs(self.delta) > 2 * self.se

    def verdict(self) -> str:
        if not math.isfinite(self.delta):
            return "a run diverged"
        if self.se is None:
            return "one seed: no spread to judge by"
        if not self.resolved:
            return "no difference at this scale (within 2 standard errors)"
        return "lower loss" if self.delta < 0 else "higher loss"

    def __str__(self) -> str:
        se = f" ± {self.se:.4f}" if self.se is not None else ""
        return f"{self.delta:+.4f}{se}: {self.verdict()}"


def gap(a, b) -> Gap:
    """``b`` minus ``a``; each an ``Arm``, a row (``val_losses``) or a list of per-seed losses."""
    def losses(x):
        values = x.val_losses if isinstance(x, Arm) else x["val_losses"] if isinstance(x, dict) else x
        return [math.inf if v is None else v for v in values]

    la, lb = losses(a), losses(b)
    (ma, sa), (mb, sb) = mean_std(la), mean_std(lb)
    se = math.sqrt(sa ** 2 / len(la) + sb ** 2 / len(lb)) if min(len(la), len(lb)) > 1 else None
    return Gap(mb - ma, se)


def _fmt(value, spec: str, none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def summarize(arms: dict[str, Arm]) -> dict:
    """Per model: params, FLOPs/token, the chosen rate, mean loss per rate, best val loss at the chosen
    rate (per seed, mean, std), tokens/s, MFU, wall time per run."""
    table = {}
    for rung, arm in arms.items():
        runs = arm.trained
        tps = [r.tokens_per_s for r in runs if r.tokens_per_s]
        mfus = [r.mfu for r in runs if r.mfu is not None]
        first = runs[0] if runs else None
        table[rung] = arm.row() | {
            "flops_per_token": first.flops_per_token if first else None,
            "best_val_losses": arm.val_losses, "best_val_mean": arm.mean, "best_val_std": arm.std,
            "tokens_per_s": sum(tps) / len(tps) if tps else None, "mfu": sum(mfus) / len(mfus) if mfus else None,
            "wall_s": sum(r.wall_s for r in runs) / len(runs) if runs else None,
            "device": first.device if first else None, "precision": first.precision if first else None,
            "peak": first.peak if first else None, "compiled": first.compiled if first else None,
            "corpus": first.corpus if first else None}
        del table[rung]["metrics"]
    return table


def write_report(arms: dict[str, Arm], out_dir, mode: str, total_s: float, n_sample: int = 200) -> Path:
    """DIR/report.md, DIR/loss_curves.png, DIR/sweep.png and DIR/results.json for ``compare``'s arms."""
    out = Path(out_dir)
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
        lines += [f"{b.label} minus {a.label}: {g}. Parameter ratio {b.params / a.params:.4f} (matched within 2%: "
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
    (out / "report.md").write_text("\n".join(lines))
    payload = {"mode": mode, "total_s": total_s, "torch": torch.__version__, "table": table, "samples": samples,
               "runs": {r: {f"{lr:g}": [x.summary() | {"metrics": x.metrics} if isinstance(x, TrainResult)
                                        else {"diverged": x.message, "config": asdict(x.config)} for x in runs]
                            for lr, runs in arm.runs.items()} for r, arm in arms.items()}}
    (out / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
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
        fig.savefig(path, dpi=120)
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
