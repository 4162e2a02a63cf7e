"""The experiments of lesson 08, as library functions: train models on one budget and compare them.

    sweep(base, rungs, rates, seeds)    every model at every peak learning rate, once per seed: the same
                                        characters in the same order (the sampler's seed), schedule shape,
                                        steps and evaluation windows; each model then stands at its best rate
    compare(base, rates, seeds, tie)    the two blocks, GPT-2 and Llama-style, with the same output-head
                                        choice (both untied, the main comparison, or both tied) at GPT-2's
                                        parameter count
    run_ladder(base, rates, seeds)      GPT-2 -> Llama one change at a time (the models: ``training.ladder``)
    run_ablations(base, rates, seeds)   the Llama end back one change at a time (leave one out)
    select_then_report(base, rungs, rates, selection_seeds, reported_seeds)
                                        each model's rate chosen on some seeds, its loss reported on others
                                        (a ``Study``; ``Study.difference(a, b)``: paired, with a t interval)
    gap(a, b)                           the difference of two models' mean losses, with its standard error
    summarize(arms)                     the table

Every function takes the budget as a ``TrainConfig`` (``base``: sizes, steps, batch, schedule; its arch,
seed and learning rate are set per run, the minimum rate kept in proportion), with the rates and the
seeds as arguments, so the same code runs the quick CPU version and the GPU scale. ``workers`` > 1
trains that many runs at once, each in its own process (CPU cores, or several small runs sharing one
GPU). ``cache`` (a dict) lets one call reuse another's runs: an identical configuration trains once
(``training.workers``). The report and the figures: ``training.report``. ``python -m modern_block compare``
is the command line over ``compare`` and ``report.write_report``.
"""

import math
from dataclasses import dataclass, replace

from .config import TrainConfig
from .data import Corpus
from .rungs import ABLATION_NAMES, LADDER_NAMES, LLAMA_END, get_rung
from .statistics import choose_rate, difference, select_and_report
from .trainer import TrainResult
from .workers import train_many

LABELS = {"gpt2_untied": "GPT-2", "llama": "Llama", "gpt2": "GPT-2, tied head", "llama_tied": "Llama, tied head",
          "gpt2_nobias": "GPT-2 (no biases, tied: nanoGPT's)"}
ARMS = {False: ("gpt2_untied", "llama"), True: ("gpt2", "llama_tied")}  # tie -> (the GPT-2 block, the Llama block)
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


# ---- rates chosen on some seeds, losses reported on others ----------------------------------------------
def final_loss(run) -> float:
    """A run's validation loss at its last evaluation (inf for a run that diverged)."""
    return run.metrics[-1]["val_loss"] if isinstance(run, TrainResult) and run.metrics else math.inf


@dataclass
class Study:
    """Models whose rates were chosen on ``selection`` seeds and reported on others: ``selections`` (model ->
    ``statistics.Selection``, on final validation losses), ``selection`` (model -> ``Arm`` of the sweep on the
    selection seeds) and ``reported`` (model -> ``Arm`` at its chosen rate on the reported seeds: the runs to plot)."""

    selections: dict
    selection: dict[str, Arm]
    reported: dict[str, Arm]

    def difference(self, a: str, b: str):
        """b minus a on the reported seeds, paired by seed, with its t interval and verdict."""
        return difference(self.selections, a, b)


def select_then_report(base: TrainConfig, rungs, rates, selection_seeds, reported_seeds, **kwargs) -> Study:
    """Every model at every rate on ``selection_seeds``; each then at the rate with the lowest mean final
    validation loss there, on ``reported_seeds`` (other seeds). Keyword arguments go to ``sweep``."""
    rungs = [get_rung(r).name for r in rungs]
    shared = set(selection_seeds) & set(reported_seeds)
    if shared:
        raise ValueError(f"selection_seeds and reported_seeds must be different seeds; both hold {sorted(shared)}")
    selection = sweep(base, rungs, rates, selection_seeds, **kwargs)
    rows = [{"model": r, "lr": lr, "seed": s, "loss": final_loss(run)}
            for r, arm in selection.items() for lr, runs in arm.runs.items()
            for s, run in zip(selection_seeds, runs, strict=True)]
    means = {r: {lr: mean_std([final_loss(x) for x in runs])[0] for lr, runs in arm.runs.items()}
             for r, arm in selection.items()}
    chosen = {r: choose_rate(m) for r, m in means.items()}
    reported = sweep(base, rungs, {r: (chosen[r],) for r in rungs}, reported_seeds, **kwargs)
    rows += [{"model": r, "lr": chosen[r], "seed": s, "loss": final_loss(run)}
             for r, arm in reported.items() for s, run in zip(reported_seeds, arm.best, strict=True)]
    return Study(select_and_report(rows, selection_seeds, reported_seeds, rungs), selection, reported)


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
