"""Many trainings: one after another in this process, or at once in worker processes.

    train_many(configs, corpus, workers)   a ``TrainResult`` (or a ``Diverged``) per configuration, in order
    WorkerPool(corpus, n)                  n worker processes (spawned, one thread each) that hold the text

Each run is seeded, so the results do not depend on ``workers``; ``cache`` (a dict) lets one call
reuse another's runs: an identical configuration trains once. A run whose loss becomes non-finite (a
sweep's highest rates may do this) comes back as a ``Diverged``, which counts as loss inf.

The workers are accounted for, however the parent ends:
- they die with it, SIGKILL included (Linux's ``PR_SET_PDEATHSIG``, and everywhere a thread that
  watches whether the parent is still there), so none is left holding the caller's terminal or pipe;
- they ignore Ctrl-C (the terminal sends it to the whole process group): the parent decides. On
  Ctrl-C (or Jupyter's interrupt) ``train_many`` asks every worker to stop after its current step and
  waits for them; a queued run does not start. The runs keep what they wrote (no checkpoints: the
  trainer keeps those, for one run at a time).
"""

import atexit
import contextlib
import ctypes
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .config import TrainConfig
from .data import Corpus, load_corpus
from .rungs import get_rung
from .trainer import NonFiniteLossError, TrainResult, train


@dataclass
class Diverged:
    """A run stopped by a non-finite loss (a sweep's highest rates may do this): it counts as loss inf."""

    config: TrainConfig
    message: str
    metrics: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    best_val_loss: float = math.inf


def run_key(cfg: TrainConfig, corpus: Corpus) -> tuple:
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


def _train_or_diverge(cfg, run_dir, corpus, progress, verbose, on_step=None):
    try:
        return train(cfg, run_dir, corpus=corpus, checkpoints=False, progress=progress, verbose=verbose,
                     overwrite=True, on_step=on_step)  # a re-run replaces its own runs
    except NonFiniteLossError as err:
        return Diverged(cfg, str(err))


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """End this process when ``parent`` ends, however it ends: the kernel sends SIGKILL (Linux), and a
    thread checks every 0.2 s that ``parent`` is still this process's parent (everywhere; and for a
    parent that died before the first line of this function)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


_WORKER_CORPUS: Corpus | None = None
_WORKER_STOP = None  # the pool's multiprocessing.Event: set, every worker stops after its current step


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


def _worker_train(cfg: TrainConfig, run_dir):
    if _WORKER_STOP.is_set():
        return None  # queued when the pool was stopped: not started
    try:
        result = _train_or_diverge(cfg, run_dir, _WORKER_CORPUS, False, False, on_step=_stop_if_asked)
    except KeyboardInterrupt:
        return None  # stopped after a step, as asked
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
        self._stop = ctx.Event()
        self._pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init,
                                         initargs=(corpus.text, corpus.name, corpus.source, os.getpid(), self._stop))

    def submit(self, cfg: TrainConfig, run_dir):
        """Queue one run. A worker starts here when one is missing, with Ctrl-C blocked until it has set
        itself to ignore it (a blocked signal stays blocked through the new interpreter's start)."""
        if not hasattr(signal, "pthread_sigmask"):
            return self._pool.submit(_worker_train, cfg, run_dir)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return self._pool.submit(_worker_train, cfg, run_dir)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def stop(self, futures) -> None:
        """Have every worker stop after its current step and every queued run return unstarted; wait for
        ``futures`` to settle, then take runs again."""
        self._stop.set()
        wait(futures)  # a second Ctrl-C ends the wait, and the pool stays stopped
        self._stop.clear()

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
        todo.setdefault(run_key(cfg, corpus), cfg)
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
        except BaseException:  # an error or Ctrl-C: no run starts any more, the running ones stop after a step
            for future in futures.values():
                future.cancel()
            pool.stop(list(futures.values()))
            raise
        finally:
            if pool is not workers:
                pool.close()
    return [cache[run_key(cfg, corpus)] for cfg in configs]
