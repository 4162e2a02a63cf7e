"""One study design for every comparison: models on one budget, each at the rate chosen on some seeds and
reported on others, compared by the paired t interval. ``STUDIES`` holds its configurations; ``run_study``
trains one (every run in its own resumable folder) and returns ``Results``."""

import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from .config import TrainConfig, gpu_config, laptop_config, quick_config, with_rate
from .data import Corpus, load_corpus
from .ladder import ABLATION_NAMES, ATTENTION_NAMES, LADDER_NAMES, LLAMA_END, get_rung
from .statistics import PairedDifference, Selection, choose_rate, paired_difference
from .trainer import TrainResult
from .workers import WorkerPool, committed_record, final_loss, read_record, run_dir, train_many

QUICK_RATES = (4e-3, 8e-3, 1.6e-2, 3.2e-2)  # tiny models, short runs: high rates
# lesson 08's live comparison: the quick models trained long enough (300 steps, about 3 CPU-seconds a run) that
# both arms end below the bigram loss; the quick ladder keeps the 90-step preset (a live demo of the design)
QUICK_STUDY = quick_config("gpt2", max_steps=300, warmup_steps=30, eval_interval=50)
LAPTOP_RATES = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # nanoGPT's 1e-3, halved once and doubled three times
GPU_RATES = (5e-4, 1e-3, 2e-3)  # around nanoGPT's 1e-3 for its shakespeare-char budget
ATTENTION_RATES = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3)  # a rate on each side of every model's best
MAIN = ("gpt2_untied", LLAMA_END)  # the two blocks, both heads untied, at GPT-2's parameter count
TRAIN_LOSS_STEPS = 50  # per-step training losses a results.json keeps: the first steps, which a rerun checks
ROLES = ("selection", "reported", "anchor", "stress")  # the first two choose and report rates; the others do not


@dataclass(frozen=True)
class Anchor:
    """One model at a published rate on the reported seeds, to hold against a published loss."""

    model: str
    lr: float
    published: float
    source: str


@dataclass(frozen=True)
class Study:
    """Models on the budget ``base`` at the peak rates chosen on ``selection_seeds``, reported on
    ``reported_seeds``; ``pairs`` (a, b): the differences b - a to report; ``recorded_steps``: the steps of each
    run results.json keeps (None: all); ``stress`` (model, factor): that model also at factor times its chosen
    rate on the reported seeds, where diverging is an outcome to report (a stability test)."""

    name: str
    base: TrainConfig
    models: tuple[str, ...]
    rates: tuple[float, ...]
    selection_seeds: tuple[int, ...]
    reported_seeds: tuple[int, ...]
    pairs: tuple[tuple[str, str], ...] = ()
    anchor: Anchor | None = None
    recorded_steps: int | None = None
    stress: tuple[tuple[str, float], ...] = ()
    stress_base: str | None = None
    widen: int = 0

    def __post_init__(self):
        for model in self.models:
            get_rung(model)
        for name in ("models", "rates", "selection_seeds", "reported_seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{name} must be a non-empty sequence of distinct values, got {list(values)}")
        shared = set(self.selection_seeds) & set(self.reported_seeds)
        if shared:
            raise ValueError(f"selection_seeds and reported_seeds must be different seeds; both hold {sorted(shared)}")
        unknown = {m for pair in self.pairs for m in pair} - set(self.models)
        if unknown:
            raise ValueError(f"pairs name models the study does not train: {sorted(unknown)}")
        for model, factor in self.stress:
            if model not in self.models:
                raise ValueError(f"stress names {model!r}, which the study does not train")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                    math.isfinite(factor) and factor > 0 and factor != 1):
                raise ValueError(f"stress factors must be positive finite numbers other than 1, got {factor!r}")
        if self.stress_base is not None and self.stress_base not in self.models:
            raise ValueError(f"stress_base names {self.stress_base!r}, which the study does not train")
        if isinstance(self.widen, bool) or not isinstance(self.widen, int) or self.widen < 0:
            raise ValueError(f"widen must be a non-negative int, got {self.widen!r}")
        if self.widen and len(self.rates) < 2:
            raise ValueError("widen needs at least 2 rates: the sweep's step is the ratio of neighbouring rates")
        for lr in self.rates:
            self.config(self.models[0], lr, self.selection_seeds[0])  # a rate TrainConfig refuses fails here

    def config(self, model: str, lr: float, seed: int) -> TrainConfig:
        return with_rate(replace(self.base, arch=f"ladder:{model}", seed=seed), lr)

    def with_options(self, models=None, rates=None, selection_seeds=None, reported_seeds=None,
                     **settings) -> "Study":
        models, rates = tuple(models or self.models), tuple(rates or self.rates)
        return replace(self, base=replace(self.base, **settings), models=models, rates=rates,
                       widen=self.widen if len(rates) > 1 else 0,  # one rate given: that rate, not a sweep
                       selection_seeds=tuple(selection_seeds or self.selection_seeds),
                       reported_seeds=tuple(reported_seeds or self.reported_seeds),
                       pairs=tuple(p for p in self.pairs if set(p) <= set(models)),
                       anchor=self.anchor if self.anchor and self.anchor.model in models else None,
                       stress=tuple(x for x in self.stress if x[0] in models)
                       if self.stress_base is None or self.stress_base in models else (),
                       stress_base=self.stress_base if self.stress_base in models else None)


LADDER_STEPS = tuple(zip(LADDER_NAMES, LADDER_NAMES[1:], strict=False))  # each rung minus the one before
LEFT_OUT = tuple((LLAMA_END, m) for m in ABLATION_NAMES)  # each ablation minus Llama
# the ladder at the laptop scale: every rung (gqa is also Llama without QK-norm) and the leave-one-outs of the
# decisive changes; sweeps start at three rates and widen at an edge
LAPTOP_LEFT_OUT = ("no_rmsnorm", "no_swiglu", "no_rope", "llama_tied")
LAPTOP_LADDER_RATES = (1e-3, 2e-3, 4e-3)
STRESS_FACTORS = (2.0, 4.0, 8.0)  # the attention study's stress rates: these times MHA's chosen rate, for both
STUDIES = {
    "quick": Study("quick", QUICK_STUDY, MAIN, QUICK_RATES, (0, 1), (2, 3, 4, 5, 6, 7), (MAIN,), widen=2),
    "laptop": Study("laptop", laptop_config("gpt2"), ("gpt2_nobias", LLAMA_END, "llama_tied"), LAPTOP_RATES, (0,),
                    (1, 2, 3), (("gpt2_nobias", LLAMA_END), ("gpt2_nobias", "llama_tied"), ("llama_tied", LLAMA_END)),
                    Anchor("gpt2_nobias", 1e-3, 1.88, "nanoGPT's README")),
    "gpu": Study("gpu", gpu_config("gpt2"), MAIN, GPU_RATES, (0,), (1, 2, 3), (MAIN,)),
    "ladder": Study("ladder", quick_config("gpt2"), tuple(dict.fromkeys(LADDER_NAMES + ABLATION_NAMES)), QUICK_RATES,
                    (0, 1), (2, 3, 4, 5, 6, 7), LADDER_STEPS + LEFT_OUT, recorded_steps=20, widen=2),
    "ablations": Study("ablations", quick_config("gpt2"), (LLAMA_END, *ABLATION_NAMES), QUICK_RATES, (0, 1),
                       (2, 3, 4, 5, 6, 7), LEFT_OUT, widen=2),
    "attention": Study("attention", laptop_config("gpt2", n_heads=8), ATTENTION_NAMES, ATTENTION_RATES, (0,),
                       (1, 2, 3, 4, 5), tuple(("mha", m) for m in ATTENTION_NAMES[1:]),
                       stress=tuple((m, f) for f in STRESS_FACTORS for m in ("mha", "mha_qk_norm")),
                       stress_base="mha"),
    "ladder_laptop": Study("ladder_laptop", laptop_config("gpt2"), LADDER_NAMES + LAPTOP_LEFT_OUT,
                           LAPTOP_LADDER_RATES, (0,), (1, 2, 3),
                           LADDER_STEPS + tuple((LLAMA_END, m) for m in LAPTOP_LEFT_OUT), widen=3),
}


def middle_out(rates) -> list[float]:
    """The rates from the middle of the sweep outwards (lower first on a tie): the order to try them in, so
    that a stopped sweep has every model at the likeliest rates."""
    ordered = sorted(rates)
    centre = (len(ordered) - 1) / 2
    return [ordered[i] for i in sorted(range(len(ordered)), key=lambda i: (abs(i - centre), i))]


def machine() -> dict:
    return {"system": platform.system(), "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


@dataclass
class Results:
    """A study's runs (``TrainResult.summary``'s records with model, lr, seed and role) and what they show
    (its report, verdicts and figures are ``report``'s functions of it); ``trained``: the ``TrainResult``s of
    the runs trained in this process."""

    study: Study
    runs: list[dict] = field(default_factory=list)
    command: str = ""
    corpus: str = ""
    machine: dict = field(default_factory=machine)
    wall_s: float = 0.0
    trained: dict = field(default_factory=dict, repr=False)  # (model, lr, seed) -> TrainResult

    def add(self, model: str, lr: float, seed: int, role: str, result) -> None:
        record = result if isinstance(result, dict) else result.summary()
        self.runs = [r for r in self.runs if (r["model"], r["lr"], r["seed"]) != (model, lr, seed)]
        self.runs.append({"model": model, "lr": lr, "seed": seed, "role": role} | record)
        if isinstance(result, TrainResult):
            self.trained[(model, lr, seed)] = result

    def record(self, model: str, lr: float, seed: int) -> dict | None:
        return next((r for r in self.runs if (r["model"], r["lr"], r["seed"]) == (model, lr, seed)), None)

    def _losses(self, model: str, lr: float, seeds) -> dict[int, float] | None:
        """Seed -> final loss of the model's runs at ``lr`` (inf: diverged); None until all of them are in."""
        runs = {s: self.record(model, lr, s) for s in seeds}
        return {s: final_loss(r) for s, r in runs.items() if r is not None} if all(runs.values()) else None

    def sweep(self, model: str) -> list[float]:
        """The rates the model is tried at on the selection seeds: the study's, and while the best of those
        finished is an end one, the next rate beyond it (at most ``widen`` on each side)."""
        s, rates = self.study, sorted(self.study.rates)
        added = {"low": 0, "high": 0}
        while s.widen:
            losses = {lr: self._losses(model, lr, s.selection_seeds) for lr in rates}
            if any(v is None for v in losses.values()):
                break
            best = choose_rate({lr: math.fsum(v.values()) / len(v) for lr, v in losses.items() if v is not None})
            side = "low" if best == rates[0] else "high" if best == rates[-1] else None
            if side is None or added[side] >= s.widen:
                break
            added[side] += 1
            nxt = rates[0] ** 2 / rates[1] if side == "low" else rates[-1] ** 2 / rates[-2]
            rates.insert(0 if side == "low" else len(rates), float(f"{nxt:.6g}"))
        return rates

    def _selection(self, model: str, seeds=()) -> Selection | None:
        """The model's rate, the lowest mean final loss on the selection seeds over its sweep (None until all
        its selection runs are in), with its losses at that rate on ``seeds``."""
        s = self.study
        losses = {lr: self._losses(model, lr, s.selection_seeds) for lr in self.sweep(model)}
        if not all(v is not None for v in losses.values()):
            return None
        chosen = choose_rate({lr: math.fsum(v.values()) / len(v) for lr, v in losses.items() if v is not None})
        return Selection(model, chosen, s.selection_seeds, losses, self._losses(model, chosen, seeds) or {})

    def chosen_rates(self) -> dict[str, float]:
        return {m: sel.lr for m in self.study.models if (sel := self._selection(m)) is not None}

    def planned(self, role: str) -> list[tuple[str, float, int]]:
        s = self.study
        if role == "selection":  # every model at one rate, then the next, from the middle of the sweep outwards;
            # then the rates a sweep widens to
            runs = [(m, lr, seed) for lr in middle_out(s.rates) for seed in s.selection_seeds for m in s.models]
            return runs + [(m, lr, seed) for m in s.models for lr in self.sweep(m) if lr not in s.rates
                           for seed in s.selection_seeds]
        if role == "reported":
            return [(m, lr, seed) for seed in s.reported_seeds for m, lr in self.chosen_rates().items()]
        if role == "stress":
            return [(m, lr, seed) for m, factor in s.stress if (lr := self.stress_rate(m, factor)) is not None
                    for seed in s.reported_seeds]
        chosen = self.chosen_rates().get(s.anchor.model) if s.anchor else None
        if s.anchor is None or chosen is None or chosen == s.anchor.lr:
            return []
        return [(s.anchor.model, s.anchor.lr, seed) for seed in s.reported_seeds]

    def stress_rate(self, model: str, factor: float) -> float | None:
        """``factor`` times the chosen rate of the study's ``stress_base`` (else of ``model``); None before it
        is chosen."""
        lr = self.chosen_rates().get(self.study.stress_base or model)
        return None if lr is None else float(f"{lr * factor:.6g}")

    @property
    def complete(self) -> bool:
        chosen = self.chosen_rates()
        return len(chosen) == len(self.study.models) and all(
            self.record(*run) is not None for role in ROLES[1:] for run in self.planned(role))

    @property
    def complete_seeds(self) -> list[int]:
        """The reported seeds every model has finished at its chosen rate."""
        chosen = self.chosen_rates()
        if len(chosen) < len(self.study.models):
            return []
        return [s for s in self.study.reported_seeds if all(self.record(m, lr, s) for m, lr in chosen.items())]

    @property
    def selections(self) -> dict[str, Selection]:
        """Each model's ``Selection`` on the reported seeds every model has finished ({} before the first)."""
        seeds = self.complete_seeds
        return {m: sel for m in self.study.models if seeds and (sel := self._selection(m, seeds)) is not None}

    def difference(self, a: str, b: str) -> PairedDifference:
        """b minus a on the reported seeds, each at its chosen rate, paired by seed."""
        sel = self.selections
        if a not in sel or b not in sel:
            raise ValueError(f"a and b must be models with reported runs {list(sel)}, got {a!r} and {b!r}")
        return paired_difference(sel[a].reported, sel[b].reported)

    def reported(self, model: str) -> list:
        lr = self.chosen_rates()[model]
        return [self.trained.get((model, lr, s)) or self.record(model, lr, s) for s in self.complete_seeds]

    def to_json(self) -> dict:
        s, keep = self.study, self.study.recorded_steps

        def kept(run: dict) -> dict:
            losses = run.get("train_losses", [])[:min(keep or TRAIN_LOSS_STEPS, TRAIN_LOSS_STEPS)]
            if keep is None:
                return run | {"train_losses": losses}
            return run | {"metrics": [m for m in run.get("metrics", []) if m["step"] <= keep], "train_losses": losses}

        return {"study": s.name, "command": self.command, "settings": asdict(s.base), "models": list(s.models),
                "rates": list(s.rates), "selection_seeds": list(s.selection_seeds),
                "reported_seeds": list(s.reported_seeds), "pairs": [list(p) for p in s.pairs],
                "anchor": asdict(s.anchor) if s.anchor else None, "recorded_steps": keep,
                "stress": [list(x) for x in s.stress], "stress_base": s.stress_base, "widen": s.widen,
                "torch": torch.__version__,
                "corpus": self.corpus, "machine": self.machine, "wall_s": self.wall_s, "complete": self.complete,
                "runs": [kept(r) for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict) -> "Results":
        study = Study(data["study"], TrainConfig(**data["settings"]), tuple(data["models"]), tuple(data["rates"]),
                      tuple(data["selection_seeds"]), tuple(data["reported_seeds"]),
                      tuple(tuple(p) for p in data["pairs"]), Anchor(**data["anchor"]) if data["anchor"] else None,
                      data["recorded_steps"], tuple(tuple(x) for x in data.get("stress", ())),
                      data.get("stress_base"), data.get("widen", 0))
        return cls(study, list(data["runs"]), data["command"], data["corpus"], data["machine"], data["wall_s"])


def time_left(elapsed: float, trained: int, left: int) -> float | None:
    """Seconds until ``left`` more runs end, at the pace of the ``trained`` runs so far (None before the first)."""
    return elapsed / trained * left if trained else None


class Progress:
    """One bar over every run of a study: tqdm's on a terminal, else one line per finished run
    ("[3/28] selection llama lr 0.008 seed 1: final val loss 2.4768 (12 s, ~95 s left)")."""

    def __init__(self, total: int, say: Callable[[str], None], bar: bool):
        self.total, self.done, self.trained, self.say = total, 0, 0, say
        self.start = time.perf_counter()
        self.bar = None
        if bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="runs", dynamic_ncols=True, bar_format="{l_bar}{bar}| {n}/{total} "
                            "[{elapsed}{postfix}]")

    def expect(self, total: int) -> None:
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def read_back(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def __call__(self, role: str, cfg: TrainConfig, result) -> None:
        self.done, self.trained = self.done + 1, self.trained + 1
        elapsed = time.perf_counter() - self.start
        left = time_left(elapsed, self.trained, self.total - self.done)
        value = final_loss(result if isinstance(result, dict) else result.summary())
        loss = "diverged" if math.isinf(value) else f"final val loss {value:.4f}"
        if self.bar is not None:
            self.bar.set_postfix_str(f"~{left:,.0f} s left; last: {role} {cfg.arch.removeprefix('ladder:')} {loss}",
                                     refresh=False)
            self.bar.update(1)
            return
        self.say(f"[{self.done}/{self.total}] {role:9} {cfg.arch.removeprefix('ladder:')} lr {cfg.lr:g} seed "
                 f"{cfg.seed}: {loss} ({elapsed:,.0f} s, ~{left:,.0f} s left)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_study(study: Study, out_dir=None, corpus: Corpus | None = None, workers=1, command: str = "", say=print,
              train: bool = True, bar: bool | None = None, reuse=()) -> Results:
    """Train ``study``: every model at every rate on the selection seeds (widening a sweep as ``widen`` allows),
    then each at its chosen rate on the reported seeds (and the anchor and the stress runs). With ``out_dir``
    each run has its folder there: a finished run is read back, an interrupted one resumes; ``train=False``
    only reads back. ``reuse``: committed results (``Results.to_json`` dicts) whose finished runs with the same
    settings on the same text stand in for training them (written into their folders). ``workers``: as
    ``train_many``; ``bar``: one progress bar (default: when stderr is a terminal), else a line per run."""
    corpus = corpus if corpus is not None else load_corpus(verbose=False)
    results = Results(study, command=command, corpus=corpus.name)
    seeds = len(study.reported_seeds)
    progress = Progress(len(results.planned("selection")) + seeds * (len(study.models) + bool(study.anchor)), say,
                        sys.stderr.isatty() if bar is None else bar)
    pool = None  # the worker processes, spawned for the first round that needs them and kept for the others
    try:
        for i, role in enumerate(ROLES):
            seen: set = set()
            while runs := [run for run in results.planned(role) if run not in seen]:  # a sweep may widen
                if seen:  # the runs a sweep widened to
                    progress.expect(progress.total + len(runs))
                elif i > 0:
                    progress.expect(progress.done + sum(len(results.planned(r)) for r in ROLES[i:]))
                seen.update(runs)
                todo = []
                for run in runs:
                    cfg = study.config(*run)
                    folder = run_dir(out_dir, cfg)
                    record = read_record(folder, cfg) if folder is not None else None
                    record = record or committed_record(reuse, cfg, corpus.name, folder)
                    if record is not None:
                        results.add(*run, role, record)
                    else:
                        todo.append(run)
                if len(todo) < len(runs):
                    progress.read_back(len(runs) - len(todo))
                    say(f"{role}: {len(runs) - len(todo)} run(s) already finished in {out_dir or 'the reused results'}"
                        ": read back")
                if not (train and todo):
                    continue
                if pool is None and workers > 1 and len(todo) > 1:
                    pool = WorkerPool(corpus, workers)
                got = train_many([study.config(*run) for run in todo], corpus, workers, out_dir, progress=False,
                                 on_done=lambda cfg, result, role=role: progress(role, cfg, result), pool=pool)
                for run, result in zip(todo, got, strict=True):
                    results.add(*run, role, result)
    finally:
        progress.close()
        if pool is not None:
            pool.close()
    results.wall_s = time.perf_counter() - progress.start
    return results
