"""One study design for every comparison: models trained on one budget, each at the rate chosen on some seeds
and reported on others, compared by the paired t interval (``training.statistics``).

``Study`` is a configuration (``STUDIES``: quick, laptop, gpu, ladder, ablations, attention); ``run_study`` trains it,
every run in its own folder (resumable; a finished run is read back) through one worker pool, and returns
``Results``; ``training.report`` writes them.
"""

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from .config import TrainConfig, gpu_config, laptop_config, quick_config, with_rate
from .data import Corpus, load_corpus
from .rungs import ABLATION_NAMES, ATTENTION_NAMES, LADDER_NAMES, LLAMA_END, get_rung
from .statistics import PairedDifference, Selection, choose_rate, difference, select_and_report
from .trainer import TrainResult
from .workers import read_record, run_dir, train_many

QUICK_RATES = (4e-3, 8e-3, 1.6e-2, 3.2e-2)  # tiny models, short runs: high rates
LAPTOP_RATES = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # nanoGPT's 1e-3, halved once and doubled three times
GPU_RATES = (5e-4, 1e-3, 2e-3)  # around nanoGPT's 1e-3 for its shakespeare-char budget
ATTENTION_RATES = (2.5e-4, 5e-4, 1e-3, 2e-3)  # the laptop Llama's best was 5e-4-1e-3: a rate on each side
MAIN = ("gpt2_untied", LLAMA_END)  # the two blocks, both heads untied, at GPT-2's parameter count
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
    """Which models, on which budget (``base``: its arch, rate and seed are set per run), at which peak rates,
    chosen on ``selection_seeds`` and reported on ``reported_seeds``; ``pairs`` (a, b): the differences b - a to
    report; ``recorded_steps``: how many first steps of each run results.json keeps (None: all); ``stress``
    (model, factor): that model also at factor times its chosen rate on the reported seeds, where diverging is an
    outcome to report (a stability test)."""

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
        for lr in self.rates:
            self.config(self.models[0], lr, self.selection_seeds[0])  # a rate TrainConfig refuses fails here

    def config(self, model: str, lr: float, seed: int) -> TrainConfig:
        """One run's settings: the budget with this model, peak rate and seed."""
        return with_rate(replace(self.base, arch=f"ladder:{model}", seed=seed), lr)

    def with_options(self, models=None, rates=None, selection_seeds=None, reported_seeds=None,
                     **settings) -> "Study":
        """The study with some of its models, other rates or seeds, or budget settings changed."""
        models = tuple(models or self.models)
        return replace(self, base=replace(self.base, **settings), models=models,
                       rates=tuple(rates or self.rates), selection_seeds=tuple(selection_seeds or self.selection_seeds),
                       reported_seeds=tuple(reported_seeds or self.reported_seeds),
                       pairs=tuple(p for p in self.pairs if set(p) <= set(models)),
                       anchor=self.anchor if self.anchor and self.anchor.model in models else None,
                       stress=tuple(x for x in self.stress if x[0] in models))


LADDER_STEPS = tuple(zip(LADDER_NAMES, LADDER_NAMES[1:], strict=False))  # each rung minus the one before
LEFT_OUT = tuple((LLAMA_END, m) for m in ABLATION_NAMES)  # each ablation minus Llama
STUDIES = {
    "quick": Study("quick", quick_config("gpt2"), MAIN, QUICK_RATES, (0, 1), (2, 3, 4, 5, 6, 7), (MAIN,)),
    "laptop": Study("laptop", laptop_config("gpt2"), ("gpt2_nobias", LLAMA_END, "llama_tied"), LAPTOP_RATES, (0,),
                    (1, 2, 3), (("gpt2_nobias", LLAMA_END), ("gpt2_nobias", "llama_tied"), ("llama_tied", LLAMA_END)),
                    Anchor("gpt2_nobias", 1e-3, 1.88, "nanoGPT's README")),
    "gpu": Study("gpu", gpu_config("gpt2"), MAIN, GPU_RATES, (0,), (1, 2, 3), (MAIN,)),
    "ladder": Study("ladder", quick_config("gpt2"), tuple(dict.fromkeys(LADDER_NAMES + ABLATION_NAMES)), QUICK_RATES,
                    (0, 1), (2, 3, 4, 5, 6, 7), LADDER_STEPS + LEFT_OUT, recorded_steps=20),
    "ablations": Study("ablations", quick_config("gpt2"), (LLAMA_END, *ABLATION_NAMES), QUICK_RATES, (0, 1),
                       (2, 3, 4, 5, 6, 7), LEFT_OUT),
    "attention": Study("attention", laptop_config("gpt2", n_heads=8), ATTENTION_NAMES, ATTENTION_RATES, (0,), (1, 2, 3),
                       tuple(("mha", m) for m in ATTENTION_NAMES[1:]), stress=(("mha_qk_norm", 4.0), ("mha", 4.0))),
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


def final_loss(record: dict) -> float:
    """A run's final validation loss; inf for a run that diverged."""
    value = record.get("final_val_loss")
    return math.inf if value is None else value


@dataclass
class Results:
    """A study's runs (``runs``: one record each, ``TrainResult.summary``'s names plus model, lr, seed and role)
    and what they show. ``trained`` holds the runs trained in this process, models included."""

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

    def chosen_rates(self) -> dict[str, float]:
        """Each model's rate, the lowest mean final loss on the selection seeds (models whose selection runs
        are not all there are left out)."""
        out = {}
        for m in self.study.models:
            runs = [[self.record(m, lr, s) or {} for s in self.study.selection_seeds] for lr in self.study.rates]
            if all(rs for r in runs for rs in r):
                means = [math.fsum(final_loss(r) for r in rs) / len(rs) for rs in runs]
                out[m] = choose_rate(dict(zip(self.study.rates, means, strict=True)))
        return out

    def planned(self, role: str) -> list[tuple[str, float, int]]:
        """(model, lr, seed) of every run of a role that can be planned so far."""
        s = self.study
        if role == "selection":  # every model at one rate, then the next, from the middle of the sweep outwards
            return [(m, lr, seed) for lr in middle_out(s.rates) for seed in s.selection_seeds for m in s.models]
        if role == "reported":
            return [(m, lr, seed) for seed in s.reported_seeds for m, lr in self.chosen_rates().items()]
        if role == "stress":
            rates = self.chosen_rates()
            return [(m, rates[m] * factor, seed) for m, factor in s.stress if m in rates for seed in s.reported_seeds]
        chosen = self.chosen_rates().get(s.anchor.model) if s.anchor else None
        if s.anchor is None or chosen is None or chosen == s.anchor.lr:
            return []
        return [(s.anchor.model, s.anchor.lr, seed) for seed in s.reported_seeds]

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
        if not seeds:
            return {}
        rows = [{"model": r["model"], "lr": r["lr"], "seed": r["seed"], "loss": final_loss(r)} for r in self.runs
                if r["role"] in ROLES[:2] and (r["seed"] in self.study.selection_seeds or r["seed"] in seeds)]
        return select_and_report(rows, self.study.selection_seeds, seeds, self.study.models)

    def difference(self, a: str, b: str) -> PairedDifference:
        """b minus a on the reported seeds, each at its chosen rate, paired by seed."""
        return difference(self.selections, a, b)

    def reported(self, model: str) -> list:
        """The model's runs at its chosen rate on the reported seeds: ``TrainResult``s when trained here."""
        lr = self.chosen_rates()[model]
        return [self.trained.get((model, lr, s)) or self.record(model, lr, s) for s in self.complete_seeds]

    def to_json(self) -> dict:
        s, keep = self.study, self.study.recorded_steps

        def kept(run: dict) -> dict:
            if keep is None:
                return run
            return run | {"metrics": [m for m in run.get("metrics", []) if m["step"] <= keep],
                          "train_losses": run.get("train_losses", [])[:keep]}

        return {"study": s.name, "command": self.command, "settings": asdict(s.base), "models": list(s.models),
                "rates": list(s.rates), "selection_seeds": list(s.selection_seeds),
                "reported_seeds": list(s.reported_seeds), "pairs": [list(p) for p in s.pairs],
                "anchor": asdict(s.anchor) if s.anchor else None, "recorded_steps": keep,
                "stress": [list(x) for x in s.stress], "torch": torch.__version__,
                "corpus": self.corpus, "machine": self.machine, "wall_s": self.wall_s, "complete": self.complete,
                "runs": [kept(r) for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict) -> "Results":
        study = Study(data["study"], TrainConfig(**data["settings"]), tuple(data["models"]), tuple(data["rates"]),
                      tuple(data["selection_seeds"]), tuple(data["reported_seeds"]),
                      tuple(tuple(p) for p in data["pairs"]), Anchor(**data["anchor"]) if data["anchor"] else None,
                      data["recorded_steps"], tuple(tuple(x) for x in data.get("stress", ())))
        return cls(study, list(data["runs"]), data["command"], data["corpus"], data["machine"], data["wall_s"])


@dataclass
class _Progress:
    """One line per finished run of a phase: "[3/8] selection llama lr 0.008 seed 1: final val loss 2.4768"."""

    say: Callable[[str], None]
    role: str
    total: int
    start: float
    done: int = 0

    def __call__(self, cfg: TrainConfig, result) -> None:
        self.done += 1
        value = final_loss(result if isinstance(result, dict) else result.summary())
        loss = "diverged" if math.isinf(value) else f"final val loss {value:.4f}"
        self.say(f"[{self.done}/{self.total}] {self.role:9} {cfg.arch.removeprefix('ladder:')} lr {cfg.lr:g} "
                 f"seed {cfg.seed}: {loss} ({time.perf_counter() - self.start:,.0f} s since start)")


def run_study(study: Study, out_dir=None, corpus: Corpus | None = None, workers=1, cache: dict | None = None,
              command: str = "", say=print, train: bool = True) -> Results:
    """Train ``study``: every model at every rate on the selection seeds, then each at its chosen rate on the
    reported seeds (and the anchor). With ``out_dir`` each run has its folder there: a finished run is read
    back and an interrupted one resumes, so a stopped study continues where it stopped; ``train=False`` only
    reads back what is finished. ``workers``: as ``train_many``; ``cache``: runs shared between studies."""
    start = time.perf_counter()
    corpus = corpus if corpus is not None else load_corpus(verbose=False)
    results = Results(study, command=command, corpus=corpus.name)
    for role in ROLES:
        todo = []
        for run in results.planned(role):
            folder = run_dir(out_dir, study.config(*run))
            record = read_record(folder, study.config(*run)) if folder is not None else None
            if record is not None:
                results.add(*run, role, record)
            else:
                todo.append(run)
        if len(todo) < len(results.planned(role)):
            say(f"{role}: {len(results.planned(role)) - len(todo)} run(s) already finished in {out_dir}: read back")
        if not (train and todo):
            continue
        on_done = _Progress(say, role, len(todo), start)
        got = train_many([study.config(*run) for run in todo], corpus, workers, out_dir, cache, on_done=on_done)
        for run, result in zip(todo, got, strict=True):
            results.add(*run, role, result)
    results.wall_s = time.perf_counter() - start
    return results
