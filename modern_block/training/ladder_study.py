"""Lesson 08's ladder and leave-one-out study at the quick budget, run from the command line, with committed results.

    python -m modern_block compare --ladder --workers 2 --out results/ladder

Every model of the ladder (GPT-2 to Llama, one change per rung) and of the leave-one-out ablations trains at every
rate of the quick sweep on the selection seeds; each then trains at its own chosen rate on other seeds, the ones
reported (``experiments.select_then_report``). That is the design of the lesson's main comparison, for 13 models:
more runs than the lesson's live run can fit in its time budget, so the lesson reads this command's results.

DIR/results.json holds the command, every setting, the seeds, torch, the machine, the wall time and per run its
final validation loss and its first ``RECORDED_STEPS`` training losses (what a rerun must repeat, see
tests/test_ladder_study.py); DIR/report.md the tables with paired 95% intervals, written from results.json alone
(``ladder_report``). The runs are quick (about a second each), so the command keeps no per-run folders: stopped,
it starts again from the beginning.
"""

import datetime
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .config import TrainConfig, quick_config
from .experiments import QUICK_RATES, Study, final_loss, select_then_report
from .files import write_text_atomic
from .laptop import machine
from .rungs import ABLATION_NAMES, LADDER_NAMES, LLAMA_END, get_rung
from .statistics import difference, format_seeds, markdown_table, select_and_report, selection_row

# Lesson 08's quick budget: every experiment of the lesson trains at it on a CPU (tiny models, 90 steps)
QUICK_STUDY = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=32, batch_size=16, max_steps=90,
                   warmup_steps=9, eval_interval=30, eval_batches=4)
SELECTION_SEEDS = (0, 1)
REPORTED_SEEDS = (2, 3, 4, 5, 6, 7)
MODELS = tuple(dict.fromkeys((*LADDER_NAMES, *ABLATION_NAMES)))  # the ladder's models, then the ablations'
RECORDED_STEPS = 20


def quick_study_config(arch: str = "gpt2", **overrides) -> TrainConfig:
    """Lesson 08's quick budget (``QUICK_STUDY``) with ``overrides``."""
    return quick_config(arch, **(QUICK_STUDY | overrides))


def _run_record(model: str, role: str, lr: float, seed: int, run) -> dict:
    loss = final_loss(run)
    trained = math.isfinite(loss)
    return {"model": model, "role": role, "lr": lr, "seed": seed, "loss": loss if trained else None,
            "config": asdict(run.config) if trained else None,
            "train_losses": run.losses[:RECORDED_STEPS] if trained else None,
            "first_eval": run.metrics[0] if trained else None}


def run_ladder_study(base: TrainConfig, command: str, rates=QUICK_RATES, selection_seeds=SELECTION_SEEDS,
                     reported_seeds=REPORTED_SEEDS, models=MODELS, workers=1, corpus=None, progress=None) -> dict:
    """Train the study and return its results (what results.json holds)."""
    start, cpu0 = time.perf_counter(), time.process_time()
    study = select_then_report(base, models, rates, selection_seeds, reported_seeds, corpus=corpus, workers=workers,
                               cache={}, progress=progress)
    runs = [_run_record(m, "selection", lr, s, run) for m, arm in study.selection.items()
            for lr, seeded in arm.runs.items() for s, run in zip(selection_seeds, seeded, strict=True)]
    runs += [_run_record(m, "reported", arm.lr, s, run) for m, arm in study.reported.items()
             for s, run in zip(reported_seeds, arm.best, strict=True)]
    return {"command": command, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "machine": machine(), "corpus": _corpus_name(study),
            "wall_s": time.perf_counter() - start, "cpu_s_main_process": time.process_time() - cpu0,
            "base": asdict(base), "models": list(models), "rates": list(rates),
            "selection_seeds": list(selection_seeds), "reported_seeds": list(reported_seeds), "runs": runs}


def _corpus_name(study: Study) -> str:
    arm = next(iter(study.selection.values()))
    return next(r.corpus for seeded in arm.runs.values() for r in seeded if math.isfinite(final_loss(r)))


def study_from_results(results: dict) -> Study:
    """The ``Study`` of committed results: its ``selections`` (and so ``difference``) rebuilt from the recorded
    final losses by the same rule that chose the rates; the trained runs themselves are not kept (``selection``
    and ``reported`` are empty)."""
    selections = select_and_report(results["runs"], results["selection_seeds"], results["reported_seeds"],
                                   results["models"])
    return Study(selections, {}, {})


def ladder_report(results: dict) -> str:
    """report.md, from results.json alone."""
    sel = study_from_results(results).selections
    steps = [(a, b) for a, b in zip(LADDER_NAMES, LADDER_NAMES[1:], strict=False) if a in sel and b in sel]
    left_out = [r for r in ABLATION_NAMES if r in sel and LLAMA_END in sel]
    base, mach = results["base"], results["machine"]
    lines = ["# Ladder and leave-one-out study (lesson 08's quick budget)\n",
             f"`{results['command']}`: {len(results['runs'])} runs on {results['corpus']}, {results['date']}, torch "
             f"{results['torch']}, {mach['cpus']} CPUs ({mach['processor'] or mach['machine']}), one thread per run, "
             f"{results['wall_s']:.0f} s of wall time.\n",
             f"Budget: d = {base['d']}, {base['n_layers']} layers, {base['n_heads']} heads ({base['n_kv_heads']} K/V "
             f"heads where a model shares them), context {base['block_size']}, batch {base['batch_size']}, "
             f"{base['max_steps']} steps. Each model's peak rate is chosen from "
             f"{', '.join(f'{r:g}' for r in results['rates'])} on selection seeds "
             f"{format_seeds(results['selection_seeds'])} and reported on seeds "
             f"{format_seeds(results['reported_seeds'])}; differences are paired by seed, with a t-based 95% "
             "interval, and a verdict only from that interval.\n",
             markdown_table([selection_row(sel[m], f"{m}: {get_rung(m).change}") for m in results["models"]]), ""]
    if steps:
        lines += ["## The ladder: each rung minus the one before\n",
                  markdown_table([_difference_row(sel, a, b) for a, b in steps]), ""]
    if left_out:
        lines += [f"## Leave one out: each model minus {LLAMA_END}\n",
                  markdown_table([_difference_row(sel, LLAMA_END, r) for r in left_out]), ""]
    return "\n".join(lines)


def _difference_row(selections, a: str, b: str) -> dict[str, str]:
    d = difference(selections, a, b)
    return {"model": b, "change": get_rung(b).change, "minus": a, "difference, 95% interval": d.format(),
            "verdict": d.verdict}


def write_ladder_results(results: dict, out_dir) -> Path:
    """DIR/results.json and DIR/report.md; returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "results.json", json.dumps(results, indent=1) + "\n")
    report = out / "report.md"
    write_text_atomic(report, ladder_report(results))
    return report


def main_ladder(base: TrainConfig, args, command: str) -> int:
    """``compare --ladder``: train the study, write its results, print the report."""
    selection = tuple(args.selection_seeds or SELECTION_SEEDS)
    reported = tuple(args.seeds or REPORTED_SEEDS)
    rates = tuple(args.rates or QUICK_RATES)
    n_runs = len(MODELS) * (len(rates) * len(selection) + len(reported))
    print(f"ladder study: {len(MODELS)} models, rates {', '.join(f'{r:g}' for r in rates)} on selection seeds "
          f"{format_seeds(selection)}, then reported seeds {format_seeds(reported)}: up to {n_runs} runs "
          f"(identical models are trained once), {args.workers} at a time", file=sys.stderr)
    results = run_ladder_study(base, command, rates, selection, reported, workers=args.workers,
                               progress=False if args.no_progress else None)
    report = write_ladder_results(results, args.out)
    print(report.read_text())
    print(f"results: {Path(args.out) / 'results.json'}; report: {report}")
    return 0
