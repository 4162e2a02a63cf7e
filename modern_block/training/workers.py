"""Many trainings, here or in worker processes of one thread each: ``train_many(configs, corpus, workers)``. A run
with a folder resumes there, or is read back when finished; workers die with their parent and stop on its word."""

import atexit
import contextlib
import ctypes
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .config import RUNTIME_FIELDS, TrainConfig
from .data import Corpus, load_corpus
from .files import write_text_atomic
from .ladder import get_rung
from .run_folder import CHECKPOINT, SUMMARY
from .trainer import NonFiniteLossError, TrainResult, train


def final_loss(record: dict) -> float:
    """A run's final validation loss; inf for a run that diverged."""
    value = record.get("final_val_loss")
    return math.inf if value is None else value


@dataclass
class Diverged:
    """A run stopped by a non-finite loss (a sweep's highest rates may do this): it counts as loss inf."""

    config: TrainConfig
    message: str
    best_val_loss: float = math.inf
    final_val_loss: float = math.inf

    def summary(self) -> dict:
        return {"arch": self.config.arch, "config": asdict(self.config), "diverged": self.message, "finished": True,
                "final_val_loss": None, "best_val_loss": None, "metrics": [], "train_losses": [],
                "torch": torch.__version__}


def run_key(cfg: TrainConfig, corpus: Corpus) -> tuple:
    """What determines a run: the text and the settings, a model named by its switches (one model, one run)."""
    settings = asdict(cfg)
    if cfg.arch.startswith("ladder:"):
        settings["arch"] = get_rung(cfg.arch.removeprefix("ladder:")).switches
    return (corpus.name, len(corpus.text)) + tuple(sorted(settings.items(), key=lambda kv: kv[0]))


def run_dir(out_dir, cfg: TrainConfig) -> Path | None:
    """``out_dir/<model>-lr<LR>-seed<S>``, the run's folder (None without ``out_dir``)."""
    if out_dir is None:
        return None
    return Path(out_dir) / f"{cfg.arch.removeprefix('ladder:')}-lr{cfg.lr:g}-seed{cfg.seed}"


def read_record(folder, cfg: TrainConfig) -> dict | None:
    """The record (``summary.json``) of a finished run in ``folder`` made with these settings, else None."""
    try:
        record = json.loads((Path(folder) / SUMMARY).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return record if finished_with(record, cfg) else None


def finished_with(record, cfg: TrainConfig) -> bool:
    """``record`` is a finished run's, made with ``cfg``'s settings (runtime options aside)."""
    return isinstance(record, dict) and bool(record.get("finished")) and isinstance(record.get("config"), dict) and all(
        record["config"].get(k) == v for k, v in asdict(cfg).items() if k not in RUNTIME_FIELDS)


RUN_KEYS = ("model", "lr", "seed", "role")  # what a study adds to a run's record


def committed_record(committed, cfg: TrainConfig, corpus: str, folder=None) -> dict | None:
    """The record of a finished run made with these settings on the text ``corpus`` in any of ``committed``
    (``Results.to_json`` dicts that keep every step, such as a committed results.json), else None; written as
    ``summary.json`` into ``folder`` (when given), so that the folder holds the finished run from then on."""
    for data in committed:
        if data.get("corpus") != corpus or data.get("recorded_steps") is not None:
            continue
        for run in data.get("runs", ()):
            record = {k: v for k, v in run.items() if k not in RUN_KEYS}
            metrics = record.get("metrics") or [{}]
            if isinstance(record.get("config"), dict) and "finished" not in record:  # written before the key was
                record["finished"] = bool(record.get("diverged")) or metrics[-1].get("step") == cfg.max_steps
            if finished_with(record, cfg):
                if folder is not None:
                    Path(folder).mkdir(parents=True, exist_ok=True)
                    write_text_atomic(Path(folder) / SUMMARY, json.dumps(record, indent=1))
                return record
    return None


def _train_or_diverge(cfg, folder, corpus, progress, verbose, on_step=None):
    """A ``TrainResult``, a ``Diverged``, or the record of a run already finished in ``folder``; one thread."""
    if folder is not None and (record := read_record(folder, cfg)) is not None:
        return record
    try:
        resume = folder is not None and (Path(folder) / CHECKPOINT).exists()
    except OSError:  # a path the file system refuses: the run folder's checks say why
        resume = False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(cfg, folder, resume=resume, corpus=corpus, progress=progress, verbose=verbose,
                     overwrite=not resume, on_step=on_step)
    except NonFiniteLossError as err:
        diverged = Diverged(cfg, str(err))
        if folder is not None:
            write_text_atomic(Path(folder) / SUMMARY, json.dumps(diverged.summary(), indent=1))
        return diverged
    finally:
        torch.set_num_threads(threads)


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` ends: the kernel's SIGKILL (Linux), and a thread that checks every 0.2 s
    that ``parent`` is still the parent (everywhere, and for a parent that died before this line)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG (linux/prctl.h)

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


_WORKER_CORPUS: Corpus | None = None
_WORKER_STOP: Any = None  # the pool's multiprocessing.Event: set, every worker stops after its current step


def _worker_init(text: str, name: str, source: str, parent: int, stop) -> None:
    global _WORKER_CORPUS, _WORKER_STOP
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    if hasattr(signal, "pthread_sigmask"):  # blocked since the spawn (see WorkerPool.submit); from now on ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)
    atexit.register(os._exit, 0)  # results are sent by then: skip tearing torch down (seconds per worker)
    torch.set_num_threads(1)  # one core per run; the same arithmetic as a one-thread run in the parent
    _WORKER_CORPUS, _WORKER_STOP = Corpus(text, name, source), stop


def _stop_if_asked(trainer) -> None:
    if _WORKER_STOP.is_set():
        raise KeyboardInterrupt  # the trainer stops after this step, as on Ctrl-C


def _worker_train(cfg: TrainConfig, folder):
    if _WORKER_STOP.is_set():
        return None  # queued when the pool was stopped: not started
    try:
        result = _train_or_diverge(cfg, folder, _WORKER_CORPUS, False, False, on_step=_stop_if_asked)
    except KeyboardInterrupt:
        return None  # stopped after a step, as asked
    if isinstance(result, TrainResult):
        result.model.cpu()  # back to the parent as CPU tensors
    return result


class WorkerPool:
    """``n`` spawned worker processes holding ``corpus``, for ``train_many`` calls on that text; close it when
    done."""

    def __init__(self, corpus: Corpus, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        self.corpus_key = (corpus.name, corpus.text)
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked; spawn is safe everywhere
        self._stop = ctx.Event()
        self._pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                                         initargs=(corpus.text, corpus.name, corpus.source, os.getpid(), self._stop))

    def submit(self, cfg: TrainConfig, folder):
        """Queue one run; a worker started here has Ctrl-C blocked until it ignores it."""
        if not hasattr(signal, "pthread_sigmask"):
            return self._pool.submit(_worker_train, cfg, folder)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return self._pool.submit(_worker_train, cfg, folder)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def stop(self, futures) -> None:
        """Every worker stops after its current step, every queued run returns unstarted; then take runs again."""
        self._stop.set()
        wait(futures)  # a second Ctrl-C ends the wait, and the pool stays stopped
        self._stop.clear()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def train_many(configs: list[TrainConfig], corpus: Corpus | None = None, workers=1, out_dir=None, progress=None,
               verbose: bool = False, on_done=None, pool: WorkerPool | None = None) -> list:
    """A ``TrainResult``, ``Diverged`` or finished run's record per configuration, in order (identical ones trained
    once), each run in its folder under ``out_dir`` (or none). ``workers``: 1 trains here, n > 1 in a pool of
    that many processes, or in ``pool`` (a ``WorkerPool`` holding ``corpus``, left open for the next call: a study
    spawns its workers once, not once a round); ``on_done(cfg, result)`` as each run ends."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    corpus = corpus if corpus is not None else load_corpus(verbose=verbose)
    if pool is not None and pool.corpus_key != (corpus.name, corpus.text):
        raise ValueError(f"pool holds another text than corpus {corpus.name!r}: a pool trains on the text it was "
                         "made with")
    todo: dict[tuple, TrainConfig] = {}
    for cfg in configs:
        todo.setdefault(run_key(cfg, corpus), cfg)
    done: dict[tuple, Any] = {}
    if workers == 1 or len(todo) <= 1:
        for k, cfg in todo.items():
            done[k] = _train_or_diverge(cfg, run_dir(out_dir, cfg), corpus, progress, verbose)
            if on_done is not None:
                on_done(cfg, done[k])
    elif todo:
        own_pool = pool is None
        pool = WorkerPool(corpus, min(workers, len(todo))) if pool is None else pool
        futures = {}
        try:
            futures = {k: pool.submit(cfg, run_dir(out_dir, cfg)) for k, cfg in todo.items()}
            for k, future in futures.items():
                done[k] = future.result()
                if on_done is not None:
                    on_done(todo[k], done[k])
        except BaseException:  # an error or Ctrl-C: no run starts any more, the running ones stop after a step
            for future in futures.values():
                future.cancel()
            pool.stop(list(futures.values()))
            raise
        finally:
            if own_pool:
                pool.close()
    return [done[run_key(cfg, corpus)] for cfg in configs]
