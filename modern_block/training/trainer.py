"""The training loop: ``train(cfg, out_dir)`` trains one model on characters and resumes exactly where it stopped.
A non-finite loss, Ctrl-C, a refused write or a failed peer stops the run saying what is kept."""

import contextlib
import math
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..decoder import DecoderLM
from ..generate import generate
from ..params import count_parameters
from . import distributed
from .checkpoint import CHECKPOINT_FORMAT, CheckpointError, saved_config
from .config import TrainConfig, lr_at, resumed_config
from .data import CharTokenizer, Corpus
from .device import mfu
from .distributed import RankFailedError
from .files import StorageError
from .parts import build_parts
from .run_folder import RunFolder, RunFolderError
from .step import eval_loss, train_step


class StopSignals:
    """While active the first Ctrl-C sets ``requested`` (the run stops after the step in progress) and a second
    aborts; ``many`` (torchrun): SIGTERM raises ``RankFailedError``, a second Ctrl-C waits."""

    def __init__(self, many: bool = False, what_happens: str = "", say: bool = True):
        self.requested = False
        self.many, self.what_happens, self.say = many, what_happens, say
        self._previous: dict[int, object] = {}

    def _ctrl_c(self, signum, frame):
        if self.requested and not self.many:
            raise KeyboardInterrupt
        if not self.requested and self.say:
            print(f"\nCtrl-C: stopping after this step{self.what_happens}"
                  f"{' (press again to abort at once)' if not self.many else ''}", file=sys.stderr, flush=True)
        self.requested = True

    def _sigterm(self, signum, frame):
        raise RankFailedError("stopped by SIGTERM (torchrun sends it to every process when one of them fails or "
                              "when torchrun itself is stopped)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._ctrl_c)
            if self.many:
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._sigterm)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False


class NonFiniteLossError(RuntimeError):
    """The loss (or the parameters) became inf or NaN; the run was stopped."""


@dataclass
class TrainResult:
    """What a run produced. ``summary()`` is the JSON-able part."""

    config: TrainConfig
    model: nn.Module
    tokenizer: CharTokenizer
    corpus: str
    metrics: list[dict]
    losses: list[float]  # training loss of every step, in order
    n_params: int
    flops_per_token: int
    tokens_per_s: float | None  # of the whole run (all processes)
    mfu: float | None  # per device: tokens/s × FLOPs per token / (processes × one device's peak)
    wall_s: float
    device: str
    precision: str
    peak: str | None
    compiled: bool
    finished: bool
    world_size: int = 1  # processes (devices) that trained it
    cpu_s: float | None = None  # this process's CPU seconds in the run's last session
    resumed: bool = False  # the last session continued a checkpoint
    threads: int = 1  # torch's intra-op threads in that session

    @property
    def best_val_loss(self) -> float:
        return min(m["val_loss"] for m in self.metrics)

    @property
    def final_val_loss(self) -> float:
        return self.metrics[-1]["val_loss"]

    def summary(self) -> dict:
        """The run's record, ``DIR/summary.json`` (``diverged``: the message of a run stopped by a non-finite loss)."""
        return {"arch": self.config.arch, "config": asdict(self.config), "corpus": self.corpus, "diverged": None,
                "n_params": self.n_params, "flops_per_token": self.flops_per_token,
                "best_val_loss": self.best_val_loss, "final_val_loss": self.final_val_loss,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "resumed": self.resumed, "threads": self.threads, "device": self.device,
                "precision": self.precision, "peak": self.peak, "compiled": self.compiled,
                "finished": self.finished, "steps": self.metrics[-1]["step"], "world_size": self.world_size,
                "torch": torch.__version__, "metrics": list(self.metrics), "train_losses": list(self.losses)}


class Clock:
    """The wall time of a run over its sessions, and the tokens/s of each evaluation interval (a lap)."""

    def __init__(self, elapsed_before: float, device: torch.device, step: int):
        self.before, self.device, self.first = elapsed_before, device, True
        self.start = time.perf_counter()
        self.restart_lap(step)

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.start

    def restart_lap(self, step: int) -> None:
        self.lap_start, self.lap_step = time.perf_counter(), step

    def lap(self, step: int, tokens_per_step: int) -> tuple[float, bool, float]:
        """(tokens/s since the lap began, whether it is the session's first lap, the run's elapsed seconds)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now, first, self.first = time.perf_counter(), self.first, False
        return (step - self.lap_step) * tokens_per_step / (now - self.lap_start), first, self.before + now - self.start


class Trainer:
    """One run in ``out_dir``, whose lock it holds until ``close()``; an earlier run there is refused unless
    ``resume`` (continue it) or ``overwrite`` (start it over)."""

    def __init__(self, cfg: TrainConfig, out_dir=None, resume: bool = False, corpus: Corpus | None = None,
                 checkpoints: bool = True, progress: bool | None = None, verbose: bool = True,
                 overwrite: bool = False):
        self.ranks = distributed.join(cfg.device)
        self.folder = RunFolder(out_dir, writer=self.ranks.is_main, checkpoints=checkpoints)
        self.verbose = verbose and self.ranks.is_main
        self.progress = (sys.stderr.isatty() if progress is None else progress) and self.ranks.is_main
        try:
            error, ckpt = None, None
            try:  # what may fail on one process only: every process learns of it before any waits on another
                ckpt = self.folder.claim(resume, overwrite, say=self._say)
                self._build(cfg, ckpt, corpus, verbose)
            except Exception as err:  # noqa: BLE001 - handed to every process, then raised
                error = err
            seen = distributed.agree_or_raise(error, (ckpt["step"], ckpt["checksum"]) if ckpt else None)
            if len(set(seen)) > 1:
                raise RunFolderError(f"the processes of this run found different checkpoints in {self.folder.path} "
                                     f"(step, checksum per rank: {seen}): --out must be on a file system that "
                                     "every machine sees")
            self._join(ckpt)
        except StorageError as err:
            self.folder.abandon()
            raise StorageError(f"{err}. The run did not start" + (
                f"; the checkpoint {self.folder.checkpoint} is as it was" if ckpt else "")) from None
        except BaseException:
            self.folder.abandon()  # refused: the folders and the lock file this run made go again
            raise

    def _build(self, cfg: TrainConfig, ckpt: dict | None, corpus: Corpus | None, verbose: bool) -> None:
        cfg = resumed_config(cfg, saved_config(ckpt, self.folder.checkpoint)) if ckpt is not None else cfg
        self.parts = build_parts(cfg, self.ranks, corpus, verbose and self.ranks.is_main, ckpt)
        self.run_id = uuid.uuid4().hex  # which run the files belong to (a resumed run keeps its own)
        self.cfg, self.model, self.setup, self.forward = cfg, self.parts.model, self.parts.setup, self.parts.forward
        self.n_params, self.flops_per_token = count_parameters(self.model), self.parts.flops_per_token
        self.peak_flops = self.setup.peak[1] * self.ranks.world_size if self.setup.peak else None
        self.step, self.elapsed = 0, 0.0
        self.metrics: list[dict] = []
        self.losses: list[float] = []  # of every step
        self.rates: list[tuple[float, bool]] = []  # (tokens/s, first of a session) of each evaluation interval
        self._pending: list[torch.Tensor] = []  # losses not yet read back from the device
        self._last_saved: int | None = None
        self._mid_step = False
        self._cpu0, self.resumed = time.process_time(), ckpt is not None
        if ckpt is not None:
            self._restore(ckpt)

    def _state(self, rng: list[dict]) -> dict:
        """What the checkpoint holds (rank 0 writes it): ``rng`` is every process's random state."""
        return {"format": CHECKPOINT_FORMAT, **self.parts.state(), "step": self.step, "elapsed_s": self.elapsed,
                "losses": list(self.losses), "rates": [list(r) for r in self.rates],
                "rng_cpu": rng[0]["cpu"], "rng_cuda": rng[0]["cuda"], "world_size": self.ranks.world_size,
                "rng_ranks": rng if self.ranks.distributed else None, "run_id": self.run_id,
                "metrics": list(self.metrics)}

    def _restore(self, ckpt: dict) -> None:
        self.parts.restore(ckpt, self.folder.checkpoint)
        self.step, self.elapsed = ckpt["step"], ckpt["elapsed_s"]
        self.losses = list(ckpt["losses"])
        self.rates = [(rate, bool(first)) for rate, first in ckpt.get("rates", [])]
        self.run_id = ckpt["run_id"]
        self._last_saved = self.step
        saved_world, ranks = ckpt.get("world_size", 1), self.ranks
        states = ckpt.get("rng_ranks") or [{"cpu": ckpt["rng_cpu"], "cuda": ckpt["rng_cuda"]}]
        try:
            if saved_world == ranks.world_size or ranks.is_main:
                mine = states[ranks.rank]
                torch.set_rng_state(mine["cpu"])
                if self.setup.device.type == "cuda" and mine["cuda"] is not None:
                    torch.cuda.set_rng_state(mine["cuda"], self.setup.device)
        except (RuntimeError, TypeError, IndexError) as err:
            raise CheckpointError(f"the checkpoint {self.folder.checkpoint} holds a random state this process cannot "
                                  f"take ({str(err).splitlines()[0][:120]}); restore a good copy, or start the run "
                                  "again with --overwrite") from None
        if saved_world != ranks.world_size:
            self._say(f"note: {self.folder.checkpoint} was written by {saved_world} process(es), this run has "
                      f"{ranks.world_size}: the same batches follow, but dropout draws other masks than "
                      "the original run would have")

    def _join(self, ckpt: dict | None) -> None:
        """Wrap the model for data parallelism (rank 0's weights to all) and share rank 0's metrics log."""
        if self.ranks.distributed:
            self.forward.distribute(lambda module: self.ranks.wrap(module, self.setup.device))
        if ckpt is None:
            self.folder.start()  # every check passed: now an earlier run's files may go
            return
        rows = self.folder.resumed_metrics(self.step, ckpt["metrics"], ckpt["run_id"], say=self._say)
        self.metrics = distributed.gather_objects(rows)[0]  # rank 0's rows (the others read none)
        self._say(f"resumed from {self.folder.checkpoint} at step {self.step}")

    def close(self) -> None:
        if getattr(self, "folder", None) is not None:
            self.folder.release()

    def __del__(self):
        self.close()

    def save_checkpoint(self) -> Path | None:
        """Write ``DIR/ckpt.pt`` (rank 0, with every process's random state) if every parameter is finite:
        a bad state never replaces the last good checkpoint."""
        if not self.folder.keeps_checkpoints:
            return None
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteLossError(f"the parameters became non-finite by step {self.step}; training stopped. "
                                     + self._kept_message())
        dev = self.setup.device
        rng = distributed.gather_objects(
            {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None})
        error = None
        if self.ranks.is_main:
            try:
                self.folder.save_checkpoint(self._state(rng))
                self._last_saved = self.step  # on disk now, even if another process fails below
            except CheckpointError as err:
                error = CheckpointError(f"{err}. Training stopped. {self._kept_message()}")
        distributed.agree_or_raise(error)
        self._last_saved = self.step
        return self.folder.checkpoint

    def _kept_message(self) -> str:
        if not self.folder.keeps_checkpoints:
            return "No checkpoints were being written."
        if self._last_saved is None:
            return "No checkpoint had been written yet."
        return f"The last good checkpoint (step {self._last_saved}) is kept in {self.folder.checkpoint}."

    def _train_step(self, first: bool) -> None:
        self._mid_step = True  # from here until the step is counted, the state is half-updated
        batch = next(self.parts.sampler)  # x, y: [B / processes, T] each

        def step():
            return train_step(self.forward.train, batch, self.parts.optimizer, self.parts.scaler,
                              lr_at(self.step, self.cfg), self.parts.micro, self.cfg.grad_clip, self.setup.autocast)

        self._pending.append(self.forward.call(step, self.parts.optimizer.zero_grad) if first else step())
        self.step += 1
        self._mid_step = False

    def _read_losses(self, stop_requested: bool = False) -> bool:
        """Bring pending losses to the host (averaged over the processes) and stop on a non-finite one; returns
        whether any process was asked to stop (Ctrl-C)."""
        if not self._pending:
            return stop_requested
        means, stop_requested = self.ranks.mean_and_any(torch.stack(self._pending), stop_requested)
        values = means.tolist()
        first = self.step - len(values)  # 0-based step of values[0]
        self._pending.clear()
        for i, v in enumerate(values):
            if not math.isfinite(v):
                raise NonFiniteLossError(
                    f"the training loss became {v} at step {first + i + 1} (lr {lr_at(first + i, self.cfg):.3g}); "
                    f"training stopped. {self._kept_message()} Try a lower --lr or a longer warmup.")
        self.losses.extend(values)
        return stop_requested

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the fixed train and val batches in eval mode, each process evaluating its share."""
        self.model.eval()
        try:
            out = {}
            for split, (n, batches) in self.parts.eval_sets.items():
                def total(n=n, batches=batches):
                    losses = torch.zeros(n, device=self.setup.device)  # [n]: one entry per batch
                    for j, x, y in batches:
                        losses[j] = eval_loss(self.forward.eval, x, y, self.parts.micro, self.setup.autocast)
                    return distributed.all_sum(losses).sum()
                out[split] = self.forward.call(total, self.parts.optimizer.zero_grad).item() / n
            return out
        finally:
            self.model.train()

    def _log_eval(self, tokens_per_s: float | None) -> dict:
        losses = self.evaluate()
        util = mfu(self.flops_per_token, tokens_per_s, self.peak_flops)
        row = {"step": self.step, "train_loss": round(losses["train"], 6), "val_loss": round(losses["val"], 6),
               "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s is not None else None,
               "mfu": round(util, 5) if util is not None else None, "lr": lr_at(max(self.step - 1, 0), self.cfg),
               "elapsed_s": round(self.elapsed, 2)}
        self.metrics.append(row)
        self.folder.append_metrics(row)
        rate = f", {tokens_per_s:,.0f} tok/s" if tokens_per_s is not None else ""
        util_text = f", MFU {100 * util:.1f}%" if util is not None else ""
        self._say(f"step {self.step:>5}: train {row['train_loss']:.4f}, val {row['val_loss']:.4f}{rate}{util_text}")
        return row

    def _say(self, text: str) -> None:
        if self.verbose:
            from tqdm.auto import tqdm
            tqdm.write(text) if self.progress else print(text, flush=True)

    def describe(self) -> str:
        cfg, world = self.cfg, self.ranks.world_size
        split, accum = "", cfg.batch_size // world // self.parts.micro
        if world > 1 or accum > 1:
            split = (f" ({world} process(es) × {accum} micro-batch(es) of {self.parts.micro} sequences"
                     f" = a global batch of {cfg.batch_size})")
        return (f"{cfg.arch}: {self.n_params:,} parameters, {self.flops_per_token:,} FLOPs/token "
                f"(6N + 12·L·H·Q·T), corpus {self.parts.corpus_name}, {cfg.max_steps} steps × "
                f"{cfg.tokens_per_step:,} tokens{split}; device {self.setup.describe()}"
                f"{', torch.compile' if self.forward.compiled else ''}")

    def _eval_due(self) -> bool:
        return self.step % self.cfg.eval_interval == 0 or self.step == self.cfg.max_steps

    def _sync(self, requested: bool, stop: int, bar) -> bool:
        """At a reading point (``log_interval``, an evaluation, the last step) read the losses back; returns
        whether the processes agreed there to stop."""
        if not (self._eval_due() or self.step % self.cfg.log_interval == 0 or self.step == stop):
            return False
        agreed = self._read_losses(requested)
        bar.set_postfix(loss=f"{self.losses[-1]:.3f}", refresh=False)
        return agreed

    def run(self, until: int | None = None, on_step=None) -> TrainResult:
        """Train up to ``until`` (default ``max_steps``) steps in all; ``on_step(trainer)`` after every step."""
        stop = self.cfg.max_steps if until is None else min(until, self.cfg.max_steps)
        if self.step >= self.cfg.max_steps:
            self._say(f"the run in {self.folder.path} is already finished (step {self.step} of {self.cfg.max_steps}); "
                      "nothing to train")
        self._say(self.describe())
        clock, first_step = Clock(self.elapsed, self.setup.device, self.step), self.step
        what_happens = " and saving a checkpoint" if self.folder.keeps_checkpoints else ""
        signals = StopSignals(self.ranks.distributed, what_happens, say=self.ranks.is_main)
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.max_steps, initial=self.step, disable=not self.progress, desc=self.cfg.arch,
                   dynamic_ncols=True, leave=False)
        with signals, self._interruptions(clock), bar:
            if not self.metrics:
                self._log_eval(None)  # the loss before training, ln(V) or so
            clock.restart_lap(self.step)
            while self.step < stop:
                self._train_step(first=self.step == first_step)
                bar.update(1)
                agreed = self._sync(signals.requested, stop, bar)  # several processes stop together, there
                if self._eval_due():
                    rate, first, self.elapsed = clock.lap(self.step, self.cfg.tokens_per_step)
                    self.rates.append((rate, first))
                    self._log_eval(rate)
                    self.save_checkpoint()
                    clock.restart_lap(self.step)
                if on_step is not None:
                    on_step(self)
                if agreed or (signals.requested and not self.ranks.distributed):
                    raise KeyboardInterrupt
            self.elapsed = clock.elapsed()
            if self._last_saved != self.step:
                self.save_checkpoint()  # paused at ``until``
        return self.result()

    @contextlib.contextmanager
    def _interruptions(self, clock: Clock):
        """Ctrl-C after a whole step saves a checkpoint, inside one keeps the last; a failed peer: RankFailedError."""
        try:
            yield
        except KeyboardInterrupt:
            self.elapsed = clock.elapsed()
            if self._mid_step:
                self._say(f"interrupted inside step {self.step + 1}; nothing saved. {self._kept_message()}")
                raise
            self._read_losses()
            path = self.save_checkpoint()
            where = f"checkpoint saved to {path}; continue with --resume" if path else "no checkpoint written"
            self._say(f"interrupted after step {self.step}: {where}")
            raise
        except StorageError as err:
            raise StorageError(f"{err}. Training stopped. {self._kept_message()}") from None
        except Exception as err:
            if self.ranks.distributed and distributed.is_comm_failure(err):
                raise RankFailedError(f"rank {self.ranks.rank}: {distributed.as_rank_failure(err)}. "
                                      f"{self._kept_message()}") from err
            raise

    def result(self) -> TrainResult:
        """The run's ``TrainResult`` (rank 0 writes ``DIR/summary.json``). Throughput: the median over evaluation
        intervals of every session, without each session's first (compilation, warm-up) when there are others."""
        steady = [r for r, first in self.rates if not first] or [r for r, _ in self.rates]
        tps = statistics.median(steady) if steady else None
        util = mfu(self.flops_per_token, tps, self.peak_flops)
        res = TrainResult(self.cfg, self.model, self.parts.tokenizer, self.parts.corpus_name, list(self.metrics),
                          list(self.losses), self.n_params, self.flops_per_token, tps, util, self.elapsed,
                          self.setup.name, self.setup.precision, self.setup.peak[0] if self.setup.peak else None,
                          self.forward.compiled, self.step >= self.cfg.max_steps,
                          world_size=self.ranks.world_size, cpu_s=time.process_time() - self._cpu0,
                          resumed=self.resumed, threads=torch.get_num_threads())
        try:
            self.folder.write_summary(res.summary() | {"run_id": self.run_id})
        except StorageError as err:
            raise StorageError(f"{err}. {self._kept_message()} The evaluations are in {self.folder.metrics}") from None
        return res


def train(cfg: TrainConfig, out_dir=None, resume: bool = False, corpus: Corpus | None = None,
          checkpoints: bool = True, progress: bool | None = None, verbose: bool = True, until: int | None = None,
          on_step=None, overwrite: bool = False) -> TrainResult:
    """Build a ``Trainer`` and run it; the folder's lock is released however the run ends."""
    trainer = Trainer(cfg, out_dir, resume, corpus, checkpoints, progress, verbose, overwrite)
    try:
        return trainer.run(until, on_step)
    finally:
        trainer.close()


def sample(model: nn.Module, tokenizer: CharTokenizer, prompt: str = "\n", max_new_tokens: int = 200,
           temperature: float = 0.8, top_k: int | None = None, seed: int = 0) -> str:
    """Text generated with the KV cache (``modern_block.generate``), seeded; the prompt is included."""
    if not isinstance(model, DecoderLM):
        raise TypeError(f"model must be a course language model (a DecoderLM), got {type(model).__name__}")
    device = next(model.parameters()).device
    idx = tokenizer.encode(prompt)[None].to(device)  # [1, T0]
    max_new_tokens = min(max_new_tokens, model.max_len - idx.shape[1] + 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, idx, max_new_tokens, use_cache=True, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0])
