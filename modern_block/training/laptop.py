"""The laptop scale: nanoGPT's CPU recipe (``config.LAPTOP``), GPT-2 against Llama and the tied Llama.

    python -m modern_block compare --scale laptop --workers 2 --anchor --out results/laptop

The arms are named after their models: ``gpt2`` is GPT-2 as nanoGPT builds it at this scale (tied head, no
biases: ``GPT2LM(bias=False)``, the ladder's ``gpt2_nobias``), ``llama`` is ``LlamaStyleLM`` (untied, GQA with
2 KV heads, QK-norm) and ``llama_tied`` the same with a tied head, their SwiGLU sized to GPT-2's parameters.

The grid, in two phases (``run_laptop``):
1. selection: every arm at every rate on the selection seeds; each arm's rate is the one with the lowest mean
   final validation loss there (``statistics.select_and_report``);
2. reported: every arm at its chosen rate on other seeds (and, with ``anchor``, GPT-2 at nanoGPT's own 1e-3 on
   them too, the run to hold against nanoGPT's published 1.88).
Every run has its folder under DIR/runs/ (metrics.jsonl, a checkpoint every evaluation, summary.json and
``run.json``, the record used here): a finished run is read back, not trained again, and an interrupted one
resumes from its checkpoint, so the command can be stopped and started again. DIR/results.json holds the
command, every setting, the seeds, torch, the machine, and per run the losses at each evaluation, wall and
CPU time and tokens/s; DIR/report.md the tables with paired 95% intervals.
"""

import json
import math
import os
import platform
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import torch

from .config import RUNTIME_FIELDS, TrainConfig
from .files import write_text_atomic
from .rungs import get_rung
from .statistics import (
    CONFIDENCE,
    choose_rate,
    format_seeds,
    markdown_table,
    mean_interval,
    paired_difference,
    select_and_report,
)

LAPTOP_ARMS = {"gpt2": "gpt2_nobias", "llama": "llama", "llama_tied": "llama_tied"}  # arm -> model (rung)
LAPTOP_LABELS = {"gpt2": "GPT-2 (tied, no biases: nanoGPT's)", "llama": "Llama (untied)", "llama_tied": "Llama, tied"}
LAPTOP_RATES = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # nanoGPT's 1e-3, halved once and doubled three times (a first sweep
# of 1e-3 to 4e-3 chose a rate at its edge for every model)
SELECTION_SEEDS = (0,)
REPORTED_SEEDS = (1, 2, 3)
NANOGPT_RATE, NANOGPT_VAL = 1e-3, 1.88  # nanoGPT's README: "a loss of only 1.88" after this recipe's 2000 steps
RUN_RECORD = "run.json"


@dataclass(frozen=True)
class Run:
    """One training of the grid."""

    arm: str
    lr: float
    seed: int
    role: str  # "selection", "reported" or "anchor"

    @property
    def name(self) -> str:
        return f"{self.arm}-lr{self.lr:g}-seed{self.seed}"

    def config(self, base: TrainConfig, arms: dict) -> TrainConfig:
        return replace(base, arch=f"ladder:{arms[self.arm]}", lr=self.lr, min_lr=self.lr * base.min_lr / base.lr,
                       seed=self.seed)


def _same_settings(saved: dict, cfg: TrainConfig) -> bool:
    return all(saved.get(k) == v for k, v in asdict(cfg).items() if k not in RUNTIME_FIELDS)


def read_record(run_dir: Path, cfg: TrainConfig) -> dict | None:
    """The finished run's record in ``run_dir`` if it was made with these settings, else None."""
    path = Path(run_dir) / RUN_RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and _same_settings(record.get("config", {}), cfg) else None


def train_run(cfg: TrainConfig, run_dir: str | Path, corpus=None) -> dict:
    """Train one run (resuming its checkpoint if there is one) on one thread; write and return its record."""
    from .trainer import NonFiniteLossError, train  # here: the worker process imports it

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = Path(run_dir)
    resume = (folder / "ckpt.pt").exists()
    cpu0 = time.process_time()
    record: dict[str, object]
    try:
        res = train(cfg, folder, resume=resume, corpus=corpus, overwrite=not resume, progress=False, verbose=False)
    except NonFiniteLossError as err:
        record = {"config": asdict(cfg), "diverged": str(err), "final_val": None, "best_val": None, "metrics": []}
    else:
        s = res.summary()
        record = {"config": s["config"], "diverged": None, "final_val": s["final_val_loss"],
                  "best_val": s["best_val_loss"], "final_train": res.metrics[-1]["train_loss"],
                  "n_params": s["n_params"], "tokens_per_s": s["tokens_per_s"], "wall_s": s["wall_s"],
                  "cpu_s_last_session": time.process_time() - cpu0, "resumed": resume, "threads": 1,
                  "torch": torch.__version__, "made_by": "python -m modern_block compare --scale laptop",
                  "metrics": res.metrics, "train_losses": res.losses}  # every step's: what a rerun must repeat
    finally:
        torch.set_num_threads(threads)
    write_text_atomic(folder / RUN_RECORD, json.dumps(record, indent=1))
    return record


def _worker_init() -> None:
    torch.set_num_threads(1)


def machine() -> dict:
    return {"system": platform.system(), "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "threads_per_run": 1}


def _train_all(runs: list[Run], base: TrainConfig, arms: dict, out: Path, workers: int, say,
               corpus=None) -> dict[Run, dict]:
    """Each run's record: read back when finished, else trained (``workers`` at once, one thread each). A run is
    looked for again just before it would start, so a record that appears meanwhile is used, not retrained."""
    records, start = {}, time.perf_counter()

    def finished(run):
        return read_record(out / "runs" / run.name, run.config(base, arms))

    queue = []
    for run in runs:
        rec = finished(run)
        if rec is not None:
            records[run] = rec
        else:
            queue.append(run)
    if records:
        say(f"{len(records)} of {len(runs)} run(s) already finished in {out / 'runs'}: read back")
    if not queue:
        return records
    total, done = len(queue), 0

    def report(run, rec):
        loss = "diverged" if rec["diverged"] else f"final val loss {rec['final_val']:.4f}"
        say(f"[{done}/{total}] {run.role:9} {run.name}: {loss} ({time.perf_counter() - start:,.0f} s since start)")

    if workers == 1:  # here, one run after another
        for run in queue:
            records[run] = train_run(run.config(base, arms), str(out / "runs" / run.name), corpus)
            done += 1
            report(run, records[run])
        return records
    with ProcessPoolExecutor(min(workers, len(queue)), mp_context=get_context("spawn"),
                             initializer=_worker_init) as ex:
        running: dict = {}
        try:
            while queue or running:
                while queue and len(running) < workers:
                    run = queue.pop(0)
                    rec = finished(run)
                    if rec is not None:
                        records[run], total = rec, total - 1
                        continue
                    running[ex.submit(train_run, run.config(base, arms), str(out / "runs" / run.name), corpus)] = run
                if not running:
                    break
                complete, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in complete:
                    run = running.pop(future)
                    records[run] = future.result()
                    done += 1
                    report(run, records[run])
        except BaseException:
            for future in running:
                future.cancel()
            raise
    return records


def run_laptop(base: TrainConfig, out_dir, rates=LAPTOP_RATES, selection_seeds=SELECTION_SEEDS,
               reported_seeds=REPORTED_SEEDS, arms: dict | None = None, anchor: bool = False, workers: int = 1,
               command: str = "", say=print, corpus=None) -> dict:
    """The two-phase grid (module docstring); returns the results (also written to DIR/results.json and
    DIR/report.md)."""
    arms = dict(LAPTOP_ARMS if arms is None else arms)
    for rung in arms.values():
        get_rung(rung)
    out = Path(out_dir)
    start = time.perf_counter()
    selection = [Run(a, lr, s, "selection") for a in arms for lr in rates for s in selection_seeds]
    say(f"laptop scale: {len(arms)} arms x {len(rates)} rates x {len(selection_seeds)} selection seed(s), then "
        f"each arm at its rate on seeds {list(reported_seeds)}; {workers} run(s) at once, one thread each")
    records = _train_all(selection, base, arms, out, workers, say, corpus)
    def loss(run):  # a diverged run counts as inf
        value = records[run]["final_val"]
        return math.inf if value is None else value

    means = {a: {lr: math.fsum(loss(Run(a, lr, s, "selection")) for s in selection_seeds) / len(selection_seeds)
                 for lr in rates} for a in arms}
    chosen = {a: choose_rate(means[a]) for a in arms}
    say("chosen rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))
    reported = [Run(a, chosen[a], s, "reported") for s in reported_seeds for a in arms]  # whole seeds first
    if anchor and "gpt2" in arms and chosen["gpt2"] != NANOGPT_RATE:
        reported += [Run("gpt2", NANOGPT_RATE, s, "anchor") for s in reported_seeds]
    records |= _train_all(reported, base, arms, out, workers, say, corpus)
    results = laptop_results(records, base, arms, rates, selection_seeds, reported_seeds, command,
                             time.perf_counter() - start)
    results["complete"] = True
    write_text_atomic(out / "results.json", json.dumps(results, indent=1))
    write_text_atomic(out / "report.md", laptop_report(results))
    write_figure(results, out / "curves.png")
    return results


def laptop_results(records: dict[Run, dict], base: TrainConfig, arms: dict, rates, selection_seeds, reported_seeds,
                   command: str, wall_s: float) -> dict:
    """The JSON-able results: the command, every setting, seeds, machine, and every run with its evaluations."""
    settings = {k: v for k, v in asdict(base).items() if k not in ("arch", "lr", "min_lr", "seed")}
    settings["min_lr_ratio"] = base.min_lr / base.lr
    runs = [{"arm": r.arm, "model": arms[r.arm], "lr": r.lr, "seed": r.seed, "role": r.role} | rec
            for r, rec in records.items()]
    return {"command": command, "settings": settings, "arms": {a: {"model": m, "label": LAPTOP_LABELS.get(a, a),
                                                                    "change": get_rung(m).change}
                                                                for a, m in arms.items()},
            "rates": list(rates), "selection_seeds": list(selection_seeds), "reported_seeds": list(reported_seeds),
            "loss": "final validation loss (step max_steps) on the fixed evaluation windows",
            "nanogpt": {"lr": NANOGPT_RATE, "val_loss": NANOGPT_VAL}, "machine": machine(),
            "wall_s_this_session": wall_s, "runs": runs}


def chosen_rates(results: dict) -> dict[str, float]:
    """Each arm's rate: the lowest mean final loss over the selection seeds (arms whose selection runs are not all
    finished are left out)."""
    out = {}
    for arm in results["arms"]:
        means = {}
        for lr in results["rates"]:
            losses = [r["final_val"] for r in results["runs"] if r["arm"] == arm and r["lr"] == lr
                      and r["seed"] in results["selection_seeds"]]
            if len(losses) == len(results["selection_seeds"]):
                means[lr] = math.fsum(math.inf if v is None else v for v in losses) / len(losses)
        if len(means) == len(results["rates"]):
            out[arm] = choose_rate(means)
    return out


def complete_seeds(results: dict) -> list[int]:
    """The reported seeds on which every arm has finished at its chosen rate (all of them once the grid is done)."""
    chosen = chosen_rates(results)
    if len(chosen) < len(results["arms"]):
        return []
    done = {(r["arm"], r["lr"], r["seed"]) for r in results["runs"]}
    return [s for s in results["reported_seeds"] if all((a, lr, s) in done for a, lr in chosen.items())]


def selections(results: dict) -> dict:
    """Each arm's ``statistics.Selection`` (rate chosen on the selection seeds, losses on the reported seeds that
    every arm has finished); empty while no reported seed is complete."""
    seeds = complete_seeds(results)
    if not seeds:
        return {}
    rows = [{"model": r["arm"], "lr": r["lr"], "seed": r["seed"], "loss": r["final_val"]} for r in results["runs"]
            if r["seed"] in results["selection_seeds"] or (r["seed"] in seeds and r["role"] != "anchor")]
    rows = list({(x["model"], x["lr"], x["seed"]): x for x in rows}.values())
    return select_and_report(rows, results["selection_seeds"], seeds, list(results["arms"]))


def reported_losses(results: dict, arm: str) -> dict[int, float]:
    """The arm's final losses at its chosen rate on the reported seeds finished so far (seed -> loss)."""
    lr = chosen_rates(results).get(arm)
    return {r["seed"]: math.inf if r["final_val"] is None else r["final_val"] for r in results["runs"]
            if r["arm"] == arm and r["lr"] == lr and r["seed"] in results["reported_seeds"]}


def pair_difference(results: dict, a: str, b: str):
    """b minus a, paired over the reported seeds both have finished (None with fewer than 2 such seeds)."""
    la, lb = reported_losses(results, a), reported_losses(results, b)
    seeds = sorted(set(la) & set(lb))
    if len(seeds) < 2:
        return None
    return paired_difference({s: la[s] for s in seeds}, {s: lb[s] for s in seeds})


def anchor_losses(results: dict) -> dict[int, float]:
    """GPT-2 at nanoGPT's own rate, every seed run at it (nanoGPT's rate is fixed, not chosen on these seeds)."""
    return {r["seed"]: r["final_val"] for r in results["runs"] if r["arm"] == "gpt2" and r["lr"] == NANOGPT_RATE}


PAIRS = (("gpt2", "llama"), ("gpt2", "llama_tied"), ("llama_tied", "llama"))


def laptop_summary(results: dict) -> str:
    """The results as text: each arm's chosen rate and reported loss with its interval, the paired differences with
    their verdicts, GPT-2 at nanoGPT's rate against 1.88, the throughput; what is missing while the grid runs."""

    labels = {a: v["label"] for a, v in results["arms"].items()}
    chosen, seeds = chosen_rates(results), complete_seeds(results)
    lines = []
    if not results.get("complete", True):
        lines += [f"INCOMPLETE: {len(results['runs'])} runs finished; rates chosen so far: "
                  + (", ".join(f"{a} {lr:g}" for a, lr in chosen.items()) or "none")
                  + f"; reported seeds finished by every arm: {seeds or 'none'} of {results['reported_seeds']}.", ""]
    def at(arm, lr, seed):
        for r in results["runs"]:
            if (r["arm"], r["lr"], r["seed"]) == (arm, lr, seed):
                return "diverged" if r["final_val"] is None else f"{r['final_val']:.4f}"
        return "-"

    means = [{"model": labels[a], **{f"lr {lr:g}": " / ".join(at(a, lr, s) for s in results["selection_seeds"])
                                     for lr in results["rates"]}} for a in results["arms"]]
    lines += [f"Final val loss on the selection seed(s) {results['selection_seeds']} at each rate:", "",
              markdown_table(means), ""]
    rows = []
    for arm in results["arms"]:
        if arm not in chosen:
            continue
        got = reported_losses(results, arm)
        values = [got[k] for k in sorted(got)]
        edge = chosen[arm] in (min(results["rates"]), max(results["rates"]))
        rows.append({"model": labels[arm], "chosen lr": f"{chosen[arm]:g}" + (" (edge)" if edge else ""),
                     "reported seeds done": format_seeds(sorted(got)) if got else "none",
                     f"final val loss, mean ± {CONFIDENCE:.0%} interval": mean_interval(values).format()
                     if len(values) > 1 else (f"{values[0]:.4f} (one seed)" if values else "-")})
    if rows:
        lines += [markdown_table(rows), "", "Paired differences on the reported seeds both models have finished "
                  f"(same seed = same batches in the same order), {CONFIDENCE:.0%} t interval:", ""]
        for a, b in PAIRS:
            d = pair_difference(results, a, b) if a in chosen and b in chosen else None
            lines.append(f"- {b} minus {a}: " + (str(d) if d else "fewer than 2 paired seeds finished"))
    anchor = anchor_losses(results)
    if anchor:
        lines += ["", anchor_sentence(anchor)]
    done = [r for r in results["runs"] if not r.get("diverged")]
    tps = sorted(r["tokens_per_s"] for r in done if r.get("tokens_per_s"))
    s = results["settings"]
    per_cpu = sorted(s["max_steps"] * s["batch_size"] * s["block_size"] / r["cpu_s_last_session"] for r in done
                     if not r.get("resumed") and r.get("cpu_s_last_session"))
    if tps:
        lines += ["", f"Throughput of the course's trainer, one thread per run: median {tps[len(tps) // 2]:,.0f} "
                  f"tokens/s of wall time over {len(tps)} runs (range {tps[0]:,.0f}-{tps[-1]:,.0f}: a shared machine "
                  "under load)" + (f"; per CPU-second, which the load does not change, {per_cpu[0]:,.0f}-"
                                   f"{per_cpu[-1]:,.0f} tokens over the {len(per_cpu)} runs trained in one session"
                                   if per_cpu else "") + "."]
    return "\n".join(lines)


def anchor_sentence(anchor: dict[int, float]) -> str:
    """GPT-2 at nanoGPT's rate against nanoGPT's one published run: is 1.88 where one more run of ours would fall?"""
    values = [anchor[s] for s in sorted(anchor)]
    text = f"GPT-2 at nanoGPT's rate {NANOGPT_RATE:g} on seeds {format_seeds(sorted(anchor))}: "
    if len(values) < 2:
        return text + f"{values[0]:.4f} (one seed: no spread to hold nanoGPT's {NANOGPT_VAL} against)."
    interval = mean_interval(values)
    low, high = interval.next_value_range
    inside = low <= NANOGPT_VAL <= high
    return (text + f"{interval.format()} over {len(values)} seeds (range {min(values):.4f}-{max(values):.4f}). "
            f"nanoGPT's README reports {NANOGPT_VAL} from one run (its evaluation: 20 random batches), so it is held "
            f"against where one more run falls, not against the mean: {CONFIDENCE:.0%} prediction interval "
            f"{low:.4f}-{high:.4f}, and {NANOGPT_VAL} is " + ("inside it: within the seed spread." if inside else
                                                                "outside it: beyond the seed spread."))


def laptop_finding(results: dict) -> str | None:
    """One sentence for lesson 08's findings, from the paired interval of Llama minus GPT-2 (None before it)."""
    d = pair_difference(results, "gpt2", "llama")
    if d is None:
        return None
    chosen = chosen_rates(results)
    return (f"Laptop scale (nanoGPT's CPU recipe, committed results; GPT-2 at {chosen['gpt2']:g}, Llama at "
            f"{chosen['llama']:g}, chosen on seed(s) {format_seeds(results['selection_seeds'])}): Llama minus GPT-2 = "
            f"{d}" + ("" if results.get("complete", True) else " (the grid is not finished)") + ".")


def reported_curves(results: dict) -> dict[str, list]:
    """Label -> the evaluation rows of each reported run at the arm's chosen rate (for ``plot_curve_bands``)."""
    chosen = chosen_rates(results)
    out = {}
    for arm, v in results["arms"].items():
        rows = [r["metrics"] for r in results["runs"] if r["arm"] == arm and r["lr"] == chosen.get(arm)
                and r["seed"] in results["reported_seeds"]]
        if rows:
            out[v["label"]] = rows
    return out


def write_figure(results: dict, path) -> None:
    """The figure of the results: the reported runs' validation loss (seed mean with its 95% band) per arm, or the
    selection runs' curves while no reported seed is complete."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import plot_curve_bands

    curves = reported_curves(results)
    title = "laptop scale (nanoGPT's CPU recipe), reported seeds:\nval loss, mean and 95% band"
    if not curves:
        title = "laptop scale: selection runs so far (one seed each)"
        curves = {f"{results['arms'][r['arm']]['label']} lr {r['lr']:g}": [r["metrics"]] for r in results["runs"]
                  if r["seed"] in results["selection_seeds"] and r["metrics"]}
    if not curves:  # nothing finished yet
        return
    fig = plot_curve_bands(curves, path, title=title)
    plt.close(fig)


def laptop_report(results: dict) -> str:
    """DIR/report.md: the settings and ``laptop_summary``."""
    s = results["settings"]
    lines = ["# Laptop scale: nanoGPT's CPU recipe, GPT-2 vs Llama", "",
             f"Command: `{results['command']}`", "",
             f"{s['n_layers']} layers, d = {s['d']}, {s['n_heads']} heads (Llama: {s['n_kv_heads']} KV heads), "
             f"block {s['block_size']}, batch {s['batch_size']}, {s['max_steps']} steps, warmup {s['warmup_steps']}, "
             f"cosine to {s['min_lr_ratio']:g} x the peak, AdamW betas ({s['beta1']}, {s['beta2']}), weight decay "
             f"{s['weight_decay']}, clip {s['grad_clip']}, dropout {s['dropout']}. Loss: {results['loss']} "
             f"({s['eval_batches']} batches of {s['batch_size']} x {s['block_size']} characters of the last 10% of "
             f"the text). torch {results['machine']['torch']}, one thread per run. Rates "
             f"{', '.join(f'{lr:g}' for lr in results['rates'])}; selection seeds {results['selection_seeds']}, "
             f"reported seeds {results['reported_seeds']}.", "",
             "Arms: " + "; ".join(f"`{a}` = {v['label']} ({v['model']})" for a, v in results["arms"].items()), "",
             laptop_summary(results)]
    return "\n".join(lines) + "\n"


def collect(base: TrainConfig, out_dir, rates=LAPTOP_RATES, selection_seeds=SELECTION_SEEDS,
            reported_seeds=REPORTED_SEEDS, arms: dict | None = None, anchor: bool = False, command: str = "") -> dict:
    """The results of the runs finished so far in DIR (nothing is trained): the grid's plan, read back."""
    arms = dict(LAPTOP_ARMS if arms is None else arms)
    out = Path(out_dir)
    plan = [Run(a, lr, s, "selection") for a in arms for lr in rates for s in selection_seeds]
    records = {run: rec for run in plan if (rec := read_record(out / "runs" / run.name, run.config(base, arms)))}
    partial = laptop_results(records, base, arms, rates, selection_seeds, reported_seeds, command, 0.0)
    chosen = chosen_rates(partial)
    more = [Run(a, lr, s, "reported") for s in reported_seeds for a, lr in chosen.items()]
    if anchor and chosen.get("gpt2", NANOGPT_RATE) != NANOGPT_RATE:
        more += [Run("gpt2", NANOGPT_RATE, s, "anchor") for s in reported_seeds]
    records |= {run: rec for run in more if (rec := read_record(out / "runs" / run.name, run.config(base, arms)))}
    results = laptop_results(records, base, arms, rates, selection_seeds, reported_seeds, command, 0.0)
    results["complete"] = len(chosen) == len(arms) and len(records) == len(plan) + len(more)
    return results


def main_laptop(base: TrainConfig, args, command: str) -> int:
    """``compare --scale laptop``'s body: run the grid, print the report."""
    grid = dict(rates=args.rates or LAPTOP_RATES, selection_seeds=tuple(args.selection_seeds or SELECTION_SEEDS),
                reported_seeds=tuple(args.seeds or REPORTED_SEEDS), anchor=args.anchor,
                arms={a: LAPTOP_ARMS[a] for a in (args.arms or LAPTOP_ARMS)},
                command=command.replace(" --collect", ""))  # the grid's command, which --collect only reads
    if args.collect:  # what is finished so far, nothing trained
        results = collect(base, args.out, **grid)
        write_text_atomic(Path(args.out) / "results.json", json.dumps(results, indent=1))
        write_text_atomic(Path(args.out) / "report.md", laptop_report(results))
        write_figure(results, Path(args.out) / "curves.png")
    else:
        results = run_laptop(base, args.out, workers=args.workers, say=lambda text: print(text, flush=True), **grid)
    print(laptop_report(results))
    print(f"results: {Path(args.out) / 'results.json'}", file=sys.stderr)
    return 0
