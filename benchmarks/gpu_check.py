"""The GPU check: everything on the GPU path, run in parts of under 8 minutes (GPU time comes in short slots).

    bash benchmarks/gpu_check.sh part1             # then part2 and part3; each runs on its own, in any order
    bash benchmarks/gpu_check.sh --dry-run all     # the same code on the CPU at tiny sizes (the test suite runs this)

Part 1: the test suite's GPU-marked tests (autocast dtypes, torch.compile, fp16 with a GradScaler, device
        and memory); ``benchmarks/cpu_vs_hf.py --device cuda --quick``; the comparison of the two arms at
        nanoGPT's shakespeare-char budget: a short learning-rate sweep per arm (seed 0, 1/5 of the steps),
        one run of each arm alone for its throughput and MFU, then 3 seeds at each arm's best rate.
        Several runs share the GPU at once (``--jobs`` processes).
Part 2: the one-change-at-a-time ladder from GPT-2 to Llama and the leave-one-out ablations from the Llama
        end, 3 seeds, with as many steps as fit the time left (recorded).
Part 3: lessons 08, 09 and 09b executed through nbval at GPU scale, the executed notebooks saved (to commit);
        the two-GPU data-parallel test when there are two GPUs.

A part run again into the same folder (a part that stopped at the end of a GPU slot) reads back every run it
finished there (its record, and its weights for the samples) and trains only the rest, at the step counts
planned the first time (``plan.json``): it completes with the same results.

Everything goes to OUT/<gpu>_torch-<version>_<date>/partN/: ``summary.json`` (each step: ok, failed,
skipped or out of time, with its seconds), logs of every command, ``results.json``, plots, and for
parts 1 and 2 ``results_snippet.md`` (tables for ``benchmarks/RESULTS.md``, against nanoGPT's
published best val loss of 1.4697 for its GPT-2 at this budget on an A100). The exit status is 0
only if every step of every part asked for was ok.

What the machine needs: a Python with a CUDA build of torch and this project's dev extra
(``pip install -e .[dev]``), and tinyshakespeare: ``--data DIR``, ``$MODERN_BLOCK_DATA``, or
``data/tinyshakespeare.txt`` in this checkout (``data/`` is ignored by git; copy it there and carry it
to a machine without internet). Each part keeps its own clock (``--budget-min``, default 7.5) and
fits the training steps to it; ``--steps`` fixes them instead.

``modern_block.training.experiments`` changes as the lessons do: this script reaches it only through
``ExperimentAPI`` below, the one place to adapt.
"""

import argparse
import datetime
import json
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import torch  # noqa: E402

from modern_block.training import report, workers  # noqa: E402
from modern_block.training.checkpoint import load_checkpoint  # noqa: E402
from modern_block.training.config import TrainConfig, gpu_config  # noqa: E402
from modern_block.training.data import DATA_ENV, TINYSHAKESPEARE_FILE, CharTokenizer, load_corpus  # noqa: E402
from modern_block.training.ladder import ABLATION_NAMES, LADDER_NAMES, build_model, get_rung  # noqa: E402
from modern_block.training.run_folder import CHECKPOINT  # noqa: E402
from modern_block.training.study import MAIN  # noqa: E402
from modern_block.training.trainer import sample  # noqa: E402

NANOGPT_BEST_VAL = 1.4697  # nanoGPT's GPT-2 on shakespeare-char at this budget (A100), its README
PARTS = ("part1", "part2", "part3")
TINY = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=4, eval_interval=2,
            eval_batches=1, warmup_steps=1, dropout=0.0, log_interval=1, compile=False, device="cpu")
LESSONS = ("notebooks/08_train_llama_vs_gpt2.ipynb", "notebooks/09_real_model.ipynb",
           "notebooks/09b_rope_scaling.ipynb")


# ---- the adapter: the one place that knows modern_block.training's experiments -----------------------------
class ExperimentAPI:
    """How this check calls the lesson-08 experiments. Each method is one training run's worth of
    work (the check runs many at once, in separate processes), returning plain data."""

    arms = MAIN  # the comparison's arms: GPT-2 and Llama-style, both heads untied
    labels = {"gpt2_untied": "GPT-2", "llama": "Llama"}
    rungs = LADDER_NAMES  # the ladder, GPT-2 -> Llama

    @staticmethod
    def _train(cfg: TrainConfig, rung: str, seed: int, out_dir, corpus):
        """(model and tokenizer or None, the run's record); a run finished in its folder under ``out_dir`` is
        read back (its record, its model from the checkpoint), so that a part run again continues."""
        run_cfg = replace(cfg, arch=f"ladder:{rung}", seed=seed)
        [result] = workers.train_many([run_cfg], corpus, out_dir=out_dir)
        if isinstance(result, dict):  # finished before: summary.json, and the weights of its last checkpoint
            if result.get("diverged"):
                return None, ExperimentAPI._diverged(run_cfg, result["diverged"])
            return ExperimentAPI._saved_model(workers.run_dir(out_dir, run_cfg), run_cfg), result
        if isinstance(result, workers.Diverged):  # a sweep's highest rate may diverge: it counts as loss inf
            return None, ExperimentAPI._diverged(run_cfg, result.message)
        return (result.model, result.tokenizer), result.summary()

    @staticmethod
    def _diverged(cfg: TrainConfig, message: str) -> dict:
        return {"best_val_loss": math.inf, "diverged": message, "tokens_per_s": None, "mfu": None, "n_params": None,
                "precision": None, "compiled": None, "peak": None, "metrics": [], "config": asdict(cfg)}

    @staticmethod
    def _saved_model(folder: Path, cfg: TrainConfig):
        """The model and tokenizer of the finished run in ``folder``, from its checkpoint."""
        ckpt = load_checkpoint(folder / CHECKPOINT)
        tokenizer = CharTokenizer(ckpt["chars"])
        model = build_model(cfg.arch, cfg.shape, tokenizer.vocab_size)
        model.load_state_dict(ckpt["model"])
        return model, tokenizer

    @staticmethod
    def run_arm(cfg: TrainConfig, arch: str, seed: int, out_dir, corpus) -> dict:
        trained, summary = ExperimentAPI._train(cfg, arch, seed, out_dir, corpus)
        text = (sample(*trained, "\n", min(200, cfg.block_size), temperature=0.8, seed=0)
                if trained is not None else "")
        return summary | {"arch": arch, "metrics": summary["metrics"], "sample": text}

    @staticmethod
    def run_rung(cfg: TrainConfig, rung: str, seed: int, out_dir, corpus) -> dict:
        _, summary = ExperimentAPI._train(cfg, rung, seed, out_dir, corpus)
        rates = [m["tokens_per_s"] for m in summary["metrics"] if m["tokens_per_s"]]
        return {"name": rung, "change": get_rung(rung).change, "params": summary["n_params"],
                "best_val_loss": summary["best_val_loss"], "tokens_per_s": statistics.median(rates[1:] or rates or [0])}

    @staticmethod
    def leave_one_out_names() -> tuple[str, ...]:
        """The ablations from the Llama end (each undoes one change of ``LlamaStyleLM``)."""
        return ABLATION_NAMES

    run_leave_one_out = run_rung
    plot_loss_curves = staticmethod(report.plot_curve_bands)

    @staticmethod
    def plot_ladder(rows: list[dict], path, title: str) -> None:
        """Bar chart of the best val loss per model (error bars: the standard deviation over seeds)."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.8))
        means = [r["mean"] if math.isfinite(r["mean"]) else math.nan for r in rows]
        ax.bar([r["rung"] for r in rows], means, yerr=[r["std"] for r in rows], capsize=4)
        ax.set(title=title, ylabel="best val loss")
        ax.tick_params(axis="x", labelrotation=30)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


# ---- running many trainings at once ------------------------------------------------------------------
_CORPUS = None


def _work(task: dict) -> dict:
    """One task in a worker process (or in this one): a run of an arm, a rung or an ablation."""
    global _CORPUS
    if task.get("threads"):
        torch.set_num_threads(task["threads"])
    if task.get("data"):
        os.environ[DATA_ENV] = task["data"]
    if _CORPUS is None:
        _CORPUS = load_corpus(fallback=task["allow_fallback"], verbose=False)
    cfg = TrainConfig(**task["config"])
    start = time.perf_counter()
    if task["kind"] == "arm":
        out = ExperimentAPI.run_arm(cfg, task["arch"], task["seed"], task["out"], _CORPUS)
    elif task["kind"] == "rung":
        out = ExperimentAPI.run_rung(cfg, task["name"], task["seed"], task["out"], _CORPUS)
    else:
        out = ExperimentAPI.run_leave_one_out(cfg, task["name"], task["seed"], task["out"], _CORPUS)
    return out | {"task": {k: v for k, v in task.items() if k != "config"}, "run_s": time.perf_counter() - start}


_POOL: ProcessPoolExecutor | None = None  # kept across steps and parts: a new worker imports torch again


def run_tasks(tasks: list[dict], jobs: int, timeout_s: float) -> list[dict]:
    """Run the tasks ``jobs`` at a time, each worker its own process (they share the GPU); results
    in the tasks' order. After ``timeout_s`` the workers are stopped and a ``TimeoutError`` raised."""
    global _POOL
    if not tasks:
        return []
    if _POOL is None:
        _POOL = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))  # CUDA: no fork
    futures = [_POOL.submit(_work, t) for t in tasks]
    deadline = time.monotonic() + timeout_s
    try:
        return [f.result(timeout=max(1.0, deadline - time.monotonic())) for f in futures]
    except BaseException:
        stop_workers(now=True)
        raise


def stop_workers(now: bool = False) -> None:
    """Shut the workers down; ``now``: without waiting for the tasks they are running."""
    global _POOL
    if _POOL is not None:
        for proc in list(getattr(_POOL, "_processes", {}).values()) if now else ():
            if proc.is_alive():
                proc.terminate()
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None


OVERHEAD_S = 60  # per round of runs: starting, compiling (the inductor cache helps later rounds), evaluating


def seconds_per_step(runs: list[dict]) -> float | None:
    """Seconds per training step while runs share the device as these did: from their measured
    tokens/s (steady intervals, so compilation is left out); the slowest run counts."""
    times = [r["config"]["batch_size"] * r["config"]["block_size"] / r["tokens_per_s"]
             for r in runs if r.get("tokens_per_s") and r.get("config")]
    return max(times) if times else None


def fit_steps(left_s: float, s_per_step: float, rounds: int, full: int, unit: int) -> int:
    """Largest step count (a multiple of ``unit``, at most ``full``, at least ``unit``) for which
    ``rounds`` rounds of concurrent runs take less than ``left_s`` at ``s_per_step`` seconds per step."""
    steps = int(left_s / max(rounds * s_per_step, 1e-9)) // unit * unit
    return max(unit, min(full, steps))


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; inf for a diverged run's inf)."""
    mean = sum(values) / len(values)
    return mean, statistics.stdev(values) if len(values) > 1 and math.isfinite(mean) else 0.0


# ---- the check's bookkeeping -------------------------------------------------------------------------
class Part:
    """One part: its folder, its clock, and a record of each step."""

    def __init__(self, name: str, folder: Path, budget_s: float, args, machine: dict):
        self.name, self.folder, self.args, self.machine = name, folder / name, args, machine
        self.folder.mkdir(parents=True, exist_ok=True)
        self.start, self.budget_s = time.monotonic(), budget_s
        self.steps: list[dict] = []
        self.results: dict = {}

    def planned(self, name: str, choose) -> int:
        """The step count ``name`` of this part: as planned by an earlier run of the part in the same folder
        (so that a rerun reads its finished runs back), else ``choose()``, kept in ``plan.json``."""
        path = self.folder / "plan.json"
        plan = json.loads(path.read_text()) if path.exists() else {}
        if name not in plan:
            plan[name] = choose()
            path.write_text(json.dumps(plan, indent=1) + "\n")
        return plan[name]

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def step(self, name: str, fn, *args):
        """Run ``fn``; record ok / failed (with the traceback) / skipped (``Skip``) / out of time."""
        t0 = time.monotonic()
        print(f"[{self.name}] {name} ... ({self.left():.0f} s left)", flush=True)
        try:
            value = fn(*args)
            status, detail = "ok", None
        except Skip as why:
            value, status, detail = None, "skipped", str(why)
        except (TimeoutError, subprocess.TimeoutExpired):
            value, status, detail = None, "out of time", f"{self.left():.0f} s left in the part"
        except Exception:  # noqa: BLE001 - recorded, and the part goes on
            value, status, detail = None, "failed", traceback.format_exc()[-4000:]
        record = {"step": name, "status": status, "seconds": round(time.monotonic() - t0, 1)}
        if detail:
            record["detail"] = detail
        self.steps.append(record)
        print(f"[{self.name}] {name}: {status} in {record['seconds']} s" + (f"\n{detail}" if detail else ""),
              flush=True)
        return value

    def run(self, name: str, cmd: list[str], timeout_s: float, env: dict | None = None, ok=(0,)) -> str:
        """A command, its output in ``<name>.log``; a failure if it exits with another status."""
        log = self.folder / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True,
                                  timeout=max(1.0, timeout_s), env={**os.environ, **(env or {})})
        text = log.read_text()
        if proc.returncode not in ok:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; the end of {log}:\n{text[-2000:]}")
        return text

    def finish(self, machine: dict) -> bool:
        ok = all(s["status"] in ("ok", "skipped") for s in self.steps)
        summary = {"part": self.name, "ok": ok, "seconds": round(time.monotonic() - self.start, 1),
                   "budget_s": self.budget_s, **machine, "steps": self.steps}
        (self.folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        if self.results:
            (self.folder / "results.json").write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        print(f"[{self.name}] {'all ok' if ok else 'NOT ALL OK'} in {summary['seconds']} s; {self.folder}",
              flush=True)
        return ok


class Skip(Exception):
    """A step that does not apply here (one GPU for a two-GPU test)."""


def machine_info(dry_run: bool) -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "gpus": torch.cuda.device_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "dry_run": dry_run}


def out_folder(root: Path, info: dict) -> Path:
    """OUT/<gpu>_torch-<version>_<date>: parts run on the same machine and day share it."""
    name = info["gpu"] if info["gpu"] and not info["dry_run"] else "cpu-dry-run"
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "-", name).strip("-")
    return root / f"{slug}_torch-{info['torch']}_{info['date'][:10]}"


def base_config(args) -> TrainConfig:
    """nanoGPT's shakespeare-char budget on the GPU; tiny on the CPU in a dry run."""
    if args.dry_run:
        return TrainConfig(**TINY)
    return gpu_config()


def _task(kind: str, cfg: TrainConfig, args, **kw) -> dict:
    return {"kind": kind, "config": asdict(cfg), "data": args.data, "allow_fallback": args.dry_run,
            "threads": 1 if args.dry_run else None, **kw}  # tiny CPU models: more threads only wait on each other


# ---- part 1 ------------------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """The test files that hold GPU-marked tests."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text())


def gpu_tests(part: Part, files: list[str] | None = None) -> str:
    files = files if files is not None else gpu_test_files()
    # nbval's and hypothesis's plugins cost seconds to import (nbformat's schema checks) and serve no test here
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-q", "-p", "no:cacheprovider", "-p", "no:nbval",
           "-p", "no:hypothesispytest", *files]
    out = part.run("gpu_tests", cmd, min(part.left(), 180))
    passed = re.findall(r"(\d+) (passed|skipped|failed)", out)
    part.results.setdefault("gpu_tests", {}).update({kind: int(n) for n, kind in passed} | {"files": files})
    if not part.args.dry_run and "passed" not in dict((k, n) for n, k in passed):
        raise RuntimeError("no GPU-marked test ran: is this torch build CUDA-enabled?")
    return out


def cpu_vs_hf(part: Part) -> None:
    flags = ["--device", "cuda", "--quick", "--out", str(part.folder / "cpu_vs_hf_cuda.json")]
    script = [sys.executable, "benchmarks/cpu_vs_hf.py"]
    if part.args.dry_run:  # minutes even in quick mode: check that the options it is given still exist
        source = (ROOT / script[1]).read_text()
        missing = [f for f in flags if f.startswith("--") and f'add_argument("{f}"' not in source]
        if missing:
            raise RuntimeError(f"benchmarks/cpu_vs_hf.py no longer takes {missing}")
        return
    part.run("cpu_vs_hf", [*script, *flags], min(part.left(), 150))  # the rest of the part trains
    part.results["cpu_vs_hf"] = json.loads((part.folder / "cpu_vs_hf_cuda.json").read_text())


def lr_sweep(part: Part, base: TrainConfig) -> dict[str, float]:
    args = part.args
    steps = args.sweep_steps or max(base.max_steps // 5, 2)
    cfg = replace(base, max_steps=steps, eval_interval=min(base.eval_interval, steps))
    tasks = [_task("arm", replace(cfg, lr=lr, min_lr=lr / 10), args, arch=arch, seed=0,
                   out=str(part.folder / "runs" / f"sweep-lr{lr:g}")) for arch in ExperimentAPI.arms for lr in args.lrs]
    t0 = time.monotonic()
    results = run_tasks(tasks, args.jobs, part.left() * 0.4)
    wall = time.monotonic() - t0
    rounds = math.ceil(len(tasks) / args.jobs)
    part.results["sweep"] = {"steps": steps, "wall_s": wall, "rounds": rounds, "s_per_step": seconds_per_step(results),
                             "runs": [{"arch": r["arch"], "lr": r["config"]["lr"], "best_val_loss": r["best_val_loss"],
                                       "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"]} for r in results]}
    best = {arch: min((r for r in results if r["arch"] == arch), key=lambda r: r["best_val_loss"])["config"]["lr"]
            for arch in ExperimentAPI.arms}
    part.results["chosen_lr"] = best
    print(f"[part1] sweep over {args.lrs} ({steps} steps): chosen {best}", flush=True)
    return best


def comparison(part: Part, base: TrainConfig, lrs: dict[str, float]) -> None:
    args = part.args
    n_tasks = len(ExperimentAPI.arms) * len(args.seeds)
    rounds = math.ceil(n_tasks / args.jobs)
    s_per_step = part.results.get("sweep", {}).get("s_per_step")
    steps = args.steps or part.planned("comparison_steps", lambda: fit_steps(
        part.left() * 0.85 - OVERHEAD_S * rounds, s_per_step, rounds, base.max_steps, 250)
        if s_per_step and not args.dry_run else base.max_steps)
    cfg = replace(base, max_steps=steps, eval_interval=min(base.eval_interval, steps))
    tasks = [_task("arm", replace(cfg, lr=lrs[arch], min_lr=lrs[arch] / 10), args, arch=arch, seed=seed,
                   out=str(part.folder / "runs" / f"compare-{steps}-steps")) for arch in ExperimentAPI.arms
             for seed in args.seeds]
    t0 = time.monotonic()
    results = run_tasks(tasks, args.jobs, part.left())
    by_arch = {arch: [r for r in results if r["arch"] == arch] for arch in ExperimentAPI.arms}
    table = {}
    for arch, runs in by_arch.items():
        best = [r["best_val_loss"] for r in runs]
        mean, std = mean_std(best)
        tps = [r["tokens_per_s"] for r in runs if r["tokens_per_s"]]
        mfus = [r["mfu"] for r in runs if r["mfu"] is not None]
        table[arch] = {"lr": lrs[arch], "params": runs[0]["n_params"], "best_val_losses": best, "mean": mean,
                       "std": std, "vs_nanogpt": mean - NANOGPT_BEST_VAL,
                       "tokens_per_s": sum(tps) / len(tps) if tps else None,
                       "mfu": sum(mfus) / len(mfus) if mfus else None, "precision": runs[0]["precision"],
                       "compiled": runs[0]["compiled"], "sample": runs[0]["sample"]}
    part.results["comparison"] = {"steps": steps, "full_budget": steps == base.max_steps, "seeds": args.seeds,
                                  "concurrent_runs": min(args.jobs, n_tasks), "wall_s": time.monotonic() - t0,
                                  "s_per_step": seconds_per_step(results),
                                  "table": table, "runs": results}
    ExperimentAPI.plot_loss_curves({ExperimentAPI.labels.get(a, a): [r["metrics"] for r in runs]
                                    for a, runs in by_arch.items()}, part.folder / "loss_curves.png",
                                   title=f"{' vs '.join(ExperimentAPI.labels.get(a, a) for a in by_arch)}, "
                                         f"{len(args.seeds)} seeds, {steps} steps")


def alone(part: Part, base: TrainConfig, lrs: dict[str, float]) -> None:
    """Throughput and MFU of one run with the GPU to itself (the comparison's runs share it)."""
    steps = 4 if part.args.dry_run else 300
    cfg = replace(base, max_steps=steps, eval_interval=steps // 3 if steps >= 3 else 1)
    part.results["alone"] = {}
    for arch in ExperimentAPI.arms:
        task = _task("arm", replace(cfg, lr=lrs[arch], min_lr=lrs[arch] / 10), part.args, arch=arch, seed=0,
                     out=str(part.folder / "runs" / "alone"))
        r = run_tasks([task], part.args.jobs, min(part.left(), 240))[0]
        part.results["alone"][arch] = {"steps": steps, "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"],
                                       "precision": r["precision"], "compiled": r["compiled"], "peak": r["peak"]}


def part1(part: Part) -> None:
    args, base = part.args, base_config(part.args)
    if not args.skip_tests:
        part.step("GPU-marked tests", gpu_tests, part)
    if not args.skip_bench:
        part.step("benchmarks/cpu_vs_hf.py --device cuda", cpu_vs_hf, part)
    lrs = part.step("learning-rate sweep", lr_sweep, part, base)
    if lrs is None:
        lrs = {arch: base.lr for arch in ExperimentAPI.arms}
    part.step("throughput of one run alone", alone, part, base, lrs)
    part.step("comparison over seeds", comparison, part, base, lrs)
    (part.folder / "results_snippet.md").write_text(snippet(part.results, part.machine))


# ---- part 2 ------------------------------------------------------------------------------------------
def _per_step_estimate(part: Part) -> float | None:
    """Seconds per step of concurrent runs, from part 1's comparison or sweep if it ran here."""
    previous = part.folder.parent / "part1" / "results.json"
    if previous.exists():
        res = json.loads(previous.read_text())
        for key in ("comparison", "sweep"):
            if res.get(key, {}).get("s_per_step"):
                return res[key]["s_per_step"]
    return None


def calibrate(part: Part, base: TrainConfig) -> float:
    """Seconds per step of ``jobs`` runs sharing the device, measured on a short run of each."""
    args = part.args
    steps = 2 if args.dry_run else 300
    cfg = replace(base, max_steps=steps, eval_interval=max(1, steps // 3))
    tasks = [_task("rung", cfg, args, name=ExperimentAPI.rungs[i % len(ExperimentAPI.rungs)], seed=i,
                   out=str(part.folder / "runs" / "calibration")) for i in range(args.jobs)]
    runs = run_tasks(tasks, args.jobs, part.left() * 0.3)
    return seconds_per_step([r | {"config": asdict(cfg)} for r in runs]) or 1.0


def ladder_and_ablations(part: Part) -> None:
    args, base = part.args, base_config(part.args)
    lr = args.lr or base.lr
    base = replace(base, lr=lr, min_lr=lr / 10)
    names = ExperimentAPI.leave_one_out_names()
    n_tasks = len(ExperimentAPI.rungs) * len(args.seeds) + len(names) * len(args.seeds)
    rounds = math.ceil(n_tasks / args.jobs)
    if args.steps or args.dry_run:
        steps = args.steps or base.max_steps
    else:
        def choose() -> int:
            s_per_step = _per_step_estimate(part) or part.step("calibration", calibrate, part, base) or 1.0
            return fit_steps(part.left() * 0.85 - OVERHEAD_S * rounds, s_per_step, rounds, base.max_steps, 250)

        steps = part.planned("ladder_steps", choose)
    cfg = replace(base, max_steps=steps, eval_interval=min(base.eval_interval, steps))
    print(f"[part2] {n_tasks} runs of {steps} steps, {args.jobs} at a time", flush=True)
    runs = str(part.folder / "runs" / f"ladder-{steps}-steps")  # a finished run is read back from here
    tasks = [_task("rung", cfg, args, name=r, seed=s, out=runs) for r in ExperimentAPI.rungs for s in args.seeds]
    tasks += [_task("loo", cfg, args, name=n, seed=s, out=runs) for n in names for s in args.seeds]
    t0 = time.monotonic()
    results = run_tasks(tasks, args.jobs, part.left())

    def rows(kind):
        out = []
        for name in dict.fromkeys(r["task"]["name"] for r in results if r["task"]["kind"] == kind):
            runs = [r for r in results if r["task"]["kind"] == kind and r["task"]["name"] == name]
            mean, std = mean_std([r["best_val_loss"] for r in runs])
            out.append({"rung": name, "change": runs[0]["change"], "params": runs[0]["params"],
                        "val_losses": [r["best_val_loss"] for r in runs], "mean": mean, "std": std})
        return out

    ladder = rows("rung")
    part.results["ladder"] = {"steps": steps, "lr": lr, "seeds": args.seeds, "rows": ladder,
                              "wall_s": time.monotonic() - t0}
    ExperimentAPI.plot_ladder(ladder, part.folder / "ladder.png",
                              title=f"GPT-2 -> Llama, {steps} steps, {len(args.seeds)} seeds")
    ablations = rows("loo")
    part.results["leave_one_out"] = {"rows": ablations}
    ExperimentAPI.plot_ladder(ablations, part.folder / "leave_one_out.png",
                              title=f"Llama minus one change, {steps} steps, {len(args.seeds)} seeds")


def part2(part: Part) -> None:
    part.step("ladder and leave-one-out ablations", ladder_and_ablations, part)
    (part.folder / "results_snippet.md").write_text(snippet(part.results, part.machine))


# ---- part 3 ------------------------------------------------------------------------------------------
def lessons(part: Part) -> None:
    """Lessons 08, 09 and 09b through nbval, at GPU scale, each notebook saved with its new outputs."""
    args = part.args
    saved = part.folder / "notebooks"
    if args.dry_run:  # the lessons take minutes even on a CPU: run the same machinery on a two-cell notebook
        cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
                 for src in ("x = 6 * 7\nprint(x)", "x")]
        nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                          "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
        paths = [part.folder / "dry_run_lesson.ipynb"]
        paths[0].write_text(json.dumps(nb))
    else:
        paths = [ROOT / p for p in LESSONS]
    env = {"NBVAL_SAVE_DIR": str(saved), "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
           "MPLBACKEND": "Agg"}
    env.update({DATA_ENV: args.data} if args.data else {})
    if not args.dry_run:
        os.environ.pop("MODERN_BLOCK_QUICK", None)  # GPU scale
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "nbval_save", "-q",
           "-p", "no:cacheprovider", "--nbval-cell-timeout", "900", *map(str, paths)]
    part.run("nbval", cmd, part.left() - 60, env)
    written = sorted(p.name for p in saved.glob("*.ipynb"))
    part.results["lessons"] = {"saved": written, "folder": str(saved)}
    if written != sorted(p.name for p in paths):
        raise RuntimeError(f"expected {[p.name for p in paths]} in {saved}, found {written}")


def two_gpus(part: Part) -> None:
    if part.args.dry_run:
        raise Skip("dry run: the same pytest call as part 1's GPU tests; the CPU data-parallel tests are in the suite")
    if torch.cuda.device_count() < 2:
        raise Skip(f"{torch.cuda.device_count()} GPU(s): the two-GPU test needs two")
    gpu_tests(part, ["tests/training/test_distributed.py"])


def part3(part: Part) -> None:
    part.step("lessons 08, 09 and 09b through nbval, outputs saved", lessons, part)
    part.step("two GPUs: torchrun with NCCL against one GPU", two_gpus, part)


# ---- the report --------------------------------------------------------------------------------------
def snippet(results: dict, machine: dict) -> str:
    """Markdown tables for benchmarks/RESULTS.md."""
    lines = [f"### {machine['gpu'] or 'CPU (dry run)'}, torch {machine['torch']}, CUDA {machine['cuda']}, "
             f"{machine['date'][:10]}", ""]
    cmp = results.get("comparison")
    if cmp:
        full = "" if cmp["full_budget"] else (" (FEWER STEPS THAN nanoGPT's 5,000: not comparable with 1.4697; "
                                              "`gpu_check.sh part1 --skip-tests --skip-bench` gives training the "
                                              "whole part)")
        swept = sorted({r["lr"] for r in results["sweep"]["runs"]}) if "sweep" in results else None
        how = (f"; each arm at its best learning rate of {swept} ({results['sweep']['steps']}-step sweep, seed 0)"
               if swept else "")
        lines += [f"Comparison: {cmp['steps']} steps{full}, seeds {cmp['seeds']}, {cmp['concurrent_runs']} runs at a "
                  f"time on one device{how}", "",
                  "| arm | lr | params | best val loss (mean ± std) | per seed | vs nanoGPT's 1.4697 | tokens/s alone "
                  "| MFU alone |", "|---|---|---|---|---|---|---|---|"]
        for arch, row in cmp["table"].items():
            solo = results.get("alone", {}).get(arch, {})
            mfu = f"{100 * solo['mfu']:.1f}%" if solo.get("mfu") is not None else "n/a"
            tps = f"{solo['tokens_per_s']:,.0f}" if solo.get("tokens_per_s") else "n/a"
            lines.append(f"| {ExperimentAPI.labels.get(arch, arch)} | {row['lr']:g} | {row['params']:,} | "
                         f"{row['mean']:.4f} ± {row['std']:.4f} | "
                         f"{', '.join(f'{v:.4f}' for v in row['best_val_losses'])} | {row['vs_nanogpt']:+.4f} | "
                         f"{tps} | {mfu} |")
        lines += ["", "tokens/s and MFU: one run with the device to itself (`alone` in results.json); the comparison's "
                  "runs shared it, each slower.", ""]
    for key, title in (("ladder", "Ladder, GPT-2 -> Llama"), ("leave_one_out", "Leave-one-out from Llama")):
        block = results.get(key, {})
        if block.get("rows"):
            steps = results["ladder"]["steps"]
            lines += [f"{title}, {steps} steps per run:", "", "| rung | change | params | best val loss (mean ± std) |",
                      "|---|---|---|---|"]
            lines += [f"| {r['rung']} | {r['change']} | {r['params']:,} | {r['mean']:.4f} ± {r['std']:.4f} |"
                      for r in block["rows"]] + [""]
    return "\n".join(lines) + "\n"


# ---- command line ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_check.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=(*PARTS, "all"), help="which parts to run, in order")
    parser.add_argument("--dry-run", action="store_true", help="the CPU at tiny sizes: checks the script itself")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check", help="output root")
    parser.add_argument("--data", default=None, help=f"folder holding {TINYSHAKESPEARE_FILE} (sets {DATA_ENV})")
    parser.add_argument("--jobs", type=int, default=None, help="trainings at once (default 6; 2 in a dry run)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lrs", type=float, nargs="+", default=None, help="the sweep (default 5e-4 1e-3 2e-3)")
    parser.add_argument("--lr", type=float, default=None, help="the ladder's learning rate (default 1e-3)")
    parser.add_argument("--sweep-steps", type=int, default=None, help="steps of a sweep run (default 1/5)")
    parser.add_argument("--steps", type=int, default=None, help="steps of the comparison, ladder and ablations "
                        "(default: the full 5,000 if they fit the part's time, else fewer, recorded)")
    parser.add_argument("--budget-min", type=float, default=7.5, help="minutes per part")
    parser.add_argument("--skip-tests", action="store_true", help="part 1 without the GPU-marked tests")
    parser.add_argument("--skip-bench", action="store_true", help="part 1 without benchmarks/cpu_vs_hf.py")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1 or len(set(args.seeds)) != len(args.seeds):
        parser.error("--jobs must be >= 1 and --seeds distinct")
    args.jobs = args.jobs or (2 if args.dry_run else 6)
    args.lrs = args.lrs or ([1e-3, 3e-3] if args.dry_run else [5e-4, 1e-3, 2e-3])
    if args.dry_run:
        args.seeds = args.seeds[:2]
    if args.data is None and (ROOT / "data" / TINYSHAKESPEARE_FILE).is_file():
        args.data = str(ROOT / "data")
    if args.data:
        os.environ[DATA_ENV] = args.data
    if not args.dry_run:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: this check is for a GPU (--dry-run runs it on the CPU at tiny sizes)")
        try:
            load_corpus(fallback=False, verbose=False)
        except (OSError, ValueError) as err:
            parser.error(f"tinyshakespeare is not available ({err}); pass --data FOLDER holding "
                         f"{TINYSHAKESPEARE_FILE}, or copy it to data/ in this checkout")
    if args.dry_run:
        torch.set_num_threads(1)
    machine = machine_info(args.dry_run)
    folder = out_folder(args.out, machine)
    print(f"GPU check: {machine['gpu'] or 'CPU dry run'}, torch {machine['torch']}, output {folder}", flush=True)
    ok = True
    try:
        for name in PARTS if "all" in args.parts else dict.fromkeys(args.parts):
            part = Part(name, folder, args.budget_min * 60, args, machine)
            {"part1": part1, "part2": part2, "part3": part3}[name](part)
            ok = part.finish(machine) and ok
    finally:
        stop_workers()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
