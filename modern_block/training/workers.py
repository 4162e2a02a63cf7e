"""Many trainings: one after another in this process, or at once in worker processes.

    train_many(configs, corpus, workers)   a ``TrainResult`` (or a ``Diverged``) per configuration, in order
    WorkerPool(corpus, n)                  n worker processes (spawned, one thread each) that hold the text

Each run is seeded, so the results do not depend on ``workers``; ``cache`` (a dict) lets one call
reuse another's runs: an identical configuration trains once. A run whose loss becomes non-finite (a
sweep's highest rates may do this) comes back as a ``Diverged``, which counts as loss inf.
"""

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
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
        except BaseException:  # an error or Ctrl-C: drop the runs not started yet
            for future in futures.values():
                future.cancel()
            raise
        finally:
            if pool is not workers:
                pool.close()
    return [cache[run_key(cfg, corpus)] for cfg in configs]
