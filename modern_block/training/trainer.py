"""Train the Llama-style LM or the GPT-2 LM on characters, and resume exactly where a run stopped.

    python -m modern_block train --arch llama --quick --out runs/llama
    python -m modern_block train --arch llama --quick --out runs/llama --resume   # continue it
    torchrun --nproc_per_node 2 -m modern_block train --arch llama --out runs/llama   # two GPUs (or processes)

What one step does: sample a batch (seeded sampler), forward under autocast (bf16, or fp16 with a
GradScaler, or plain fp32 on the CPU: see ``modern_block.training.device``), cross-entropy, backward, clip the
gradient norm, AdamW step with the learning rate of the schedule (linear warmup, cosine decay to
``min_lr``). Weight decay applies to matrices (dim >= 2) only, not to biases and norm scales.

Every ``eval_interval`` steps the model is evaluated on fixed batches (the same windows every time),
one line is appended to ``DIR/metrics.jsonl``, and a checkpoint is written to ``DIR/ckpt.pt``. The
checkpoint holds the model, optimizer and scaler states, the step, and the random states of torch
and of the sampler, so a resumed run repeats the uninterrupted one's losses exactly (on the CPU; on a
GPU up to kernel nondeterminism). It is loaded with ``torch.load(weights_only=True)``: it holds only
tensors and plain Python containers, and loading one runs no code.

A non-finite loss stops the run with a ``NonFiniteLossError``; the checkpoint on disk is then the last
good one (parameters are checked before every save). Ctrl-C finishes the step in progress, saves a
checkpoint and re-raises ``KeyboardInterrupt``. How the files are kept safe (a lock per folder, no
silent restart of an existing run, atomic writes, a checksum in the checkpoint): ``modern_block.training.run_folder``.

The run's settings, schedule and optimizer groups: ``modern_block.training.config``; the options both
command lines share: ``modern_block.training.options``.

Data parallelism (``modern_block.training.distributed``). Launched by torchrun, every process trains a copy of
the model inside ``DistributedDataParallel``. ``batch_size`` stays the global batch: every process draws
the same seeded offsets and keeps its own slice of them, so N processes see exactly the sequences one
process would, and ``micro_batch_size`` (gradient accumulation) only decides how many of them go
through the model at once. Evaluation batches are shared out and the losses summed over processes.
Rank 0 alone prints and writes metrics, checkpoints and the summary; the checkpoint holds every
process's random state, so a resume with the same number of processes repeats the run exactly.
"""

import argparse
import contextlib
import inspect
import json
import math
import shlex
import signal
import statistics
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..generate import generate
from ..params import count_parameters
from . import distributed, run_folder
from .config import (  # noqa: F401 (the settings are re-exported: `from modern_block.training.trainer import TrainConfig`)
    ARCHS,
    EVAL_SEED,
    MAX_LR,
    QUICK_ENV,
    RUNTIME_FIELDS,
    TrainConfig,
    default_config,
    gpu_config,
    lr_at,
    make_optimizer,
    quick_config,
    quick_forced,
    resumed_config,
)
from .data import BatchSampler, CharTokenizer, Corpus, fixed_batches, load_corpus, train_val_split
from .device import choose_device, flops_per_token, matmul_parameters, memory_bytes, mfu
from .distributed import RankFailedError
from .ladder import build_model
from .options import add_run_options, config_from_args, seed_int
from .run_folder import CHECKPOINT, METRICS, SUMMARY, CheckpointError, RunFolderError


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
    extra: dict = field(default_factory=dict)
    world_size: int = 1  # processes (devices) that trained it

    @property
    def best_val_loss(self) -> float:
        return min(m["val_loss"] for m in self.metrics)

    def summary(self) -> dict:
        return {"arch": self.config.arch, "config": asdict(self.config), "corpus": self.corpus,
                "n_params": self.n_params, "flops_per_token": self.flops_per_token,
                "best_val_loss": self.best_val_loss, "final_val_loss": self.metrics[-1]["val_loss"],
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "wall_s": self.wall_s, "device": self.device,
                "precision": self.precision, "peak": self.peak, "compiled": self.compiled,
                "finished": self.finished, "steps": self.metrics[-1]["step"], "world_size": self.world_size,
                "torch": torch.__version__}


class _SigintToFlag:
    """While active (main thread only), the first Ctrl-C sets ``requested``; a second one raises.

    Under torchrun every process gets Ctrl-C twice (from the terminal, then forwarded by torchrun),
    and the processes must stop at the same step: there (``abort_on_second=False``) the flag is only
    read, and agreed on, where the processes exchange their losses."""

    def __init__(self, abort_on_second: bool = True):
        self.requested = False
        self.abort_on_second = abort_on_second
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested and self.abort_on_second:
            raise KeyboardInterrupt
        if not self.requested and distributed.is_main_process():
            print("\nCtrl-C: stopping after this step and saving a checkpoint"
                  f"{' (press again to abort at once)' if self.abort_on_second else ''}", file=sys.stderr, flush=True)
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class _SigtermToError:
    """Under torchrun: SIGTERM (torchrun sends it to every process when one of them fails, or when
    it is itself stopped) raises a ``RankFailedError`` at once, instead of dying without a word."""

    def __init__(self, active: bool):
        self.active = active and threading.current_thread() is threading.main_thread()
        self._previous = None

    def _handle(self, signum, frame):
        raise RankFailedError("stopped by SIGTERM (torchrun sends it to every process when one of them fails or "
                              "when torchrun itself is stopped)")

    def __enter__(self):
        if self.active:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


class Trainer:
    """One training run; see the module docstring. ``run()`` trains to ``max_steps`` (or ``until``).

    ``out_dir`` holding an earlier run is refused unless ``resume`` (continue it) or ``overwrite``
    (start it over); while the trainer exists it holds the folder's lock (``close()`` releases it)."""

    def __init__(self, cfg: TrainConfig, out_dir=None, resume: bool = False, corpus: Corpus | None = None,
                 checkpoints: bool = True, progress: bool | None = None, verbose: bool = True,
                 overwrite: bool = False):
        self.ranks = distributed.setup(distributed.device_type_for(cfg.device))
        self.out = Path(out_dir) if out_dir is not None else None
        self.checkpoints = checkpoints and self.out is not None
        self.verbose = verbose and self.ranks.is_main
        self.progress = (sys.stderr.isatty() if progress is None else progress) and self.ranks.is_main
        self._lock: run_folder.RunLock | None = None
        self.ddp = None
        try:
            error, ckpt = None, None
            try:  # what may fail on one process only: every process learns of it before any waits on another
                ckpt = self._claim_folder(resume, overwrite)
                self._build(cfg, ckpt, corpus, verbose)
            except Exception as err:  # noqa: BLE001 - handed to every process, then raised
                error = err
            seen = distributed.agree_or_raise(error, (ckpt["step"], ckpt["checksum"]) if ckpt else None)
            if len(set(seen)) > 1:
                raise RunFolderError(f"the processes of this run found different checkpoints in {self.out} "
                                     f"(step, checksum per rank: {seen}): --out must be on a file system that "
                                     "every machine sees")
            self._join(ckpt)
        except BaseException:
            self.close()
            raise

    # ---- setting up --------------------------------------------------------------------------
    def _claim_folder(self, resume: bool, overwrite: bool) -> dict | None:
        """Check and lock ``out`` (rank 0); load the checkpoint to resume from (every process)."""
        if self.out is None:
            return None
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other")
        if self.ranks.is_main:
            run_folder.prepare(self.out)
            self._lock = run_folder.RunLock(self.out)
        path = self.out / CHECKPOINT
        if resume and path.exists():
            return run_folder.load_checkpoint(path)
        if self.ranks.is_main:
            found = run_folder.existing_run(self.out)
            if resume:
                self._say(f"no checkpoint in {self.out}; starting a new run"
                          + (f" (replacing what is there: {found})" if found else ""))
            elif found and not overwrite:
                raise RunFolderError(f"{self.out} already holds a run ({found}). Pass --resume to continue it, "
                                     "--overwrite to start it over, or choose another --out")
        return None

    def _device(self, device: str | None) -> str | None:
        """Under torchrun on GPUs, process LOCAL_RANK uses cuda:LOCAL_RANK."""
        if not (self.ranks.distributed and distributed.device_type_for(device) == "cuda"):
            return device
        if device not in (None, "cuda"):
            raise ValueError(f"under torchrun each process uses the GPU cuda:LOCAL_RANK; pass --device cuda "
                             f"(or nothing), not {device!r}")
        return f"cuda:{self.ranks.local_rank}"

    def _build(self, cfg: TrainConfig, ckpt: dict | None, corpus: Corpus | None, verbose: bool) -> None:
        """Everything local to this process: data, model, optimizer, the state to resume from."""
        if ckpt is not None:
            cfg = resumed_config(cfg, ckpt["config"])
        self.cfg = cfg
        world, rank = self.ranks.world_size, self.ranks.rank
        if cfg.batch_size % world:
            raise ValueError(f"batch_size ({cfg.batch_size}) is the global batch and must be divisible by the "
                             f"number of processes ({world})")
        per_rank = cfg.batch_size // world
        self.micro = cfg.micro_batch_size or per_rank
        if per_rank % self.micro:
            raise ValueError(f"each of the {world} process(es) takes {per_rank} sequences per step, which "
                             f"micro_batch_size ({self.micro}) must divide")
        self.accum = per_rank // self.micro  # forward/backward passes per optimizer step and process
        self.setup = choose_device(self._device(cfg.device))
        dev = self.setup.device

        corpus = corpus if corpus is not None else load_corpus(verbose=verbose and self.ranks.is_main)
        self.corpus_name = corpus.name
        self.tokenizer = CharTokenizer.from_text(corpus.text)
        if ckpt is not None and ckpt["chars"] != self.tokenizer.chars:
            raise ValueError(f"the checkpoint in {self.out} was trained on a different text (corpus "
                             f"{ckpt['corpus']!r}, vocabulary of {len(ckpt['chars'])}); "
                             f"cannot resume on {corpus.name!r}")
        self._check_memory(self.tokenizer.vocab_size)
        train_ids, val_ids = train_val_split(self.tokenizer.encode(corpus.text))
        self.sampler = BatchSampler(train_ids, cfg.block_size, cfg.batch_size, cfg.seed, dev, rank, world)
        self.eval_sets = {}  # split -> (number of batches in all, [(index, x, y)] of this process)
        for i, (split, ids) in enumerate((("train", train_ids), ("val", val_ids))):
            batches = fixed_batches(ids, cfg.block_size, cfg.batch_size, cfg.eval_batches, EVAL_SEED + i)
            self.eval_sets[split] = (len(batches), [(j, x.to(dev), y.to(dev)) for j, (x, y) in enumerate(batches)
                                                    if j % world == rank])

        torch.manual_seed(cfg.seed)  # model initialisation and dropout
        self.model = build_model(cfg.arch, cfg.shape, self.tokenizer.vocab_size).to(dev)
        if rank > 0:
            torch.manual_seed(cfg.seed + rank)  # the same initial model everywhere, a dropout stream per process
        self.optimizer = make_optimizer(self.model, cfg, fused=dev.type == "cuda")
        self.scaler = torch.amp.GradScaler("cuda") if self.setup.needs_scaler else None
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast
            torch.backends.cudnn.allow_tf32 = True
        self.compiled = cfg.compile if cfg.compile is not None else dev.type == "cuda"
        self.forward = torch.compile(self.model) if self.compiled else self.model

        self.n_params = count_parameters(self.model)
        head_dim = cfg.d // cfg.n_heads
        self.flops_per_token = flops_per_token(matmul_parameters(self.model), cfg.n_layers, cfg.n_heads, head_dim,
                                               cfg.block_size)
        # MFU is per device: the run's tokens/s against the peak of all its devices together
        self.peak_flops = self.setup.peak[1] * world if self.setup.peak else None
        self.step, self.elapsed, self.metrics, self.losses = 0, 0.0, [], []
        self.rates: list[tuple[float, bool]] = []  # tokens/s of each evaluation interval, (rate, first of a session)
        self._pending: list[torch.Tensor] = []  # losses not yet read back from the device
        self._last_saved: int | None = None
        self._mid_step = False
        self._first_step = self.step
        if ckpt is not None:
            self._restore(ckpt)

    def _check_memory(self, vocab_size: int) -> None:
        """Refuse, before allocating anything, sizes that cannot fit: the fixed evaluation batches
        (held on the device) and one micro-batch's fp32 logits with their softmax and gradient
        (a lower bound on what a step needs)."""
        total = memory_bytes(self.setup)
        if total is None:
            return
        cfg = self.cfg
        own_eval = -(-cfg.eval_batches // self.ranks.world_size)  # batches of one process, per split
        eval_bytes = 2 * own_eval * 2 * cfg.batch_size * (cfg.block_size + 1) * 8  # 2 splits, x and y, int64
        step_bytes = 3 * self.micro * cfg.block_size * vocab_size * 4
        if eval_bytes + step_bytes > total:
            raise ValueError(
                f"these sizes need at least {(eval_bytes + step_bytes) / 2**30:,.1f} GiB on {self.setup.name} "
                f"({eval_bytes / 2**30:,.1f} GiB for {cfg.eval_batches:,} evaluation batches per split, "
                f"{step_bytes / 2**30:,.1f} GiB for the logits of {self.micro:,} sequences at once), which has "
                f"{total / 2**30:,.1f} GiB: lower --eval-batches, --batch-size or --micro-batch-size")

    def _restore(self, ckpt: dict) -> None:
        """This process's state from the checkpoint (each process reads the same file)."""
        path = self.out / CHECKPOINT
        try:
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            if self.scaler is not None and ckpt["scaler"] is not None:
                self.scaler.load_state_dict(ckpt["scaler"])
            self.sampler.set_state(ckpt["sampler"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"the checkpoint {path} does not fit this model ({str(err).splitlines()[0][:200]})"
                                  "; restore a good copy, or start the run again with --overwrite") from None
        self.step, self.elapsed = ckpt["step"], ckpt["elapsed_s"]
        self.losses = list(ckpt["losses"])
        self.rates = [(rate, bool(first)) for rate, first in ckpt.get("rates", [])]
        self._last_saved = self.step
        saved_world = ckpt.get("world_size", 1)
        states = ckpt.get("rng_ranks") or [{"cpu": ckpt["rng_cpu"], "cuda": ckpt["rng_cuda"]}]
        if saved_world == self.ranks.world_size or self.ranks.rank == 0:
            mine = states[self.ranks.rank]
            torch.set_rng_state(mine["cpu"])
            if self.setup.device.type == "cuda" and mine["cuda"] is not None:
                torch.cuda.set_rng_state(mine["cuda"], self.setup.device)
        if saved_world != self.ranks.world_size:
            self._say(f"note: {path} was written by {saved_world} process(es), this run has "
                      f"{self.ranks.world_size}: the same batches follow, but dropout draws other masks than "
                      "the original run would have")

    def _join(self, ckpt: dict | None) -> None:
        """What the processes do together once each is set up: wrap the model for data parallelism
        (which copies rank 0's weights to all) and share rank 0's metrics log."""
        if self.ranks.distributed:
            self.ddp = self._wrap(self.forward)
        if ckpt is None and self.out is not None and self.ranks.is_main:  # every check passed: now replace
            run_folder.clear(self.out)
            (self.out / METRICS).write_text("")  # a new run: a new metrics file
        if ckpt is not None:
            if self.ranks.is_main:
                rows = run_folder.read_metrics(self.out / METRICS, say=self._say)
                # keep the evaluations up to the checkpoint; later lines (written after it) will be written again
                self.metrics = [m for m in rows if m["step"] <= self.step]
                run_folder.write_text_atomic(self.out / METRICS, "".join(json.dumps(m) + "\n" for m in self.metrics))
            self.metrics = distributed.broadcast_object(self.metrics)
            self._say(f"resumed from {self.out / CHECKPOINT} at step {self.step}")

    def _wrap(self, module: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.setup.device.index] if self.setup.device.type == "cuda" else None
        # the RoPE tables are buffers computed alike everywhere: no need to send them on every step
        no_resend = ({"forward_sync_buffers": False}
                     if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                     else {"broadcast_buffers": False})  # the older name (torch < 2.13)
        return DistributedDataParallel(module, device_ids=ids, **no_resend)

    def close(self) -> None:
        """Release the folder's lock (``train()`` does this when the run ends, however it ends)."""
        if getattr(self, "_lock", None) is not None:
            self._lock.release()
            self._lock = None

    def __del__(self):
        self.close()

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Write ``DIR/ckpt.pt`` (rank 0; see ``run_folder.save_checkpoint``), after checking that
        every parameter is finite: a bad state never replaces the last good checkpoint. Every
        process takes part: the checkpoint holds each one's random state."""
        if not self.checkpoints:
            return None
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteLossError(f"the parameters became non-finite by step {self.step}; training stopped. "
                                     + self._kept_message())
        dev = self.setup.device
        rng = distributed.gather_objects(
            {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None})
        path, error = self.out / CHECKPOINT, None
        if self.ranks.is_main:
            state = {
                "format": run_folder.CHECKPOINT_FORMAT, "config": asdict(self.cfg), "chars": self.tokenizer.chars,
                "corpus": self.corpus_name, "step": self.step, "elapsed_s": self.elapsed, "losses": list(self.losses),
                "rates": [list(r) for r in self.rates],
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng_cpu": rng[0]["cpu"], "rng_cuda": rng[0]["cuda"],
                "world_size": self.ranks.world_size, "rng_ranks": rng if self.ranks.distributed else None,
                "sampler": self.sampler.state(),
            }
            try:
                run_folder.save_checkpoint(state, path)
            except CheckpointError as err:
                error = CheckpointError(f"{err}. Training stopped. {self._kept_message()}")
        distributed.agree_or_raise(error)
        self._last_saved = self.step
        return path

    def _kept_message(self) -> str:
        if not self.checkpoints:
            return "No checkpoints were being written."
        if self._last_saved is None:
            return "No checkpoint had been written yet."
        return f"The last good checkpoint (step {self._last_saved}) is kept in {self.out / CHECKPOINT}."

    # ---- one step, evaluation ----------------------------------------------------------------
    def _loss(self, x: torch.Tensor, y: torch.Tensor, net: nn.Module | None = None) -> torch.Tensor:
        with self.setup.autocast():
            logits = (net or self.forward)(x)  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def _with_compile_fallback(self, fn):
        """Run fn(); if the compiled model fails (no compiler, unsupported platform), warn, switch to
        eager and run it again. Errors that eager mode also raises are raised from there."""
        if not self.compiled:
            return fn()
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - any compiler failure
            if isinstance(err, RankFailedError) or distributed.is_comm_failure(err):
                raise
            warnings.warn(f"torch.compile failed ({type(err).__name__}: {str(err)[:200]}); training eagerly",
                          stacklevel=2)
            self.optimizer.zero_grad(set_to_none=True)
            self.forward, self.compiled = self.model, False
            if self.ddp is not None:
                self.ddp = self._wrap(self.model)
            return fn()

    def _train_step(self) -> None:
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = next(self.sampler)  # [B / processes, T] each: this process's share of the global batch

        def backward(loss):
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

        def forward_backward():
            net = self.ddp or self.forward
            if self.accum == 1:
                loss = self._loss(x, y, net)
                backward(loss)
                return loss
            parts = []  # gradient accumulation: the gradients of all micro-batches add up before the step
            for i, (xs, ys) in enumerate(zip(x.split(self.micro), y.split(self.micro), strict=True)):
                last = i == self.accum - 1
                with self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext():
                    loss = self._loss(xs, ys, net)
                    backward(loss / self.accum)  # the mean over the whole batch, as one pass would give
                parts.append(loss.detach())
            return torch.stack(parts).mean()

        loss = self._with_compile_fallback(forward_backward) if self.step == self._first_step else forward_backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending.append(loss.detach())

    def _read_losses(self, stop_requested: bool = False) -> bool:
        """Bring pending losses to the host (one synchronisation) and stop on a non-finite one.
        With several processes, the losses are averaged over them and the processes agree whether
        any of them was asked to stop (Ctrl-C); returns that agreement."""
        if not self._pending:
            return stop_requested
        values = torch.stack(self._pending)
        if self.ranks.distributed:  # one exchange: the losses of every process and their stop flags
            packed = torch.cat([values.float(), values.new_tensor([float(stop_requested)], dtype=torch.float32)])
            packed = distributed.all_sum(packed)
            values, stop_requested = packed[:-1] / self.ranks.world_size, bool(packed[-1] > 0)
        values = values.tolist()
        first = self.step - len(values)  # 0-based step of values[0]
        self._pending.clear()
        for i, v in enumerate(values):
            if not math.isfinite(v):
                raise NonFiniteLossError(
                    f"the training loss became {v} at step {first + i + 1} (lr {lr_at(first + i, self.cfg):.3g}); "
                    f"training stopped. {self._kept_message()} Try a lower --lr or a longer warmup.")
        self.losses.extend(values)
        return stop_requested

    def _eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.micro >= x.shape[0]:
            return self._loss(x, y)
        return torch.stack([self._loss(xs, ys) for xs, ys in zip(x.split(self.micro), y.split(self.micro),
                                                                 strict=True)]).mean()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the fixed train and val batches, in eval mode (no dropout). With several
        processes each evaluates its share of the batches, and the losses are gathered in order."""
        self.model.eval()
        try:
            out = {}
            for split, (n, batches) in self.eval_sets.items():
                def total(n=n, batches=batches):
                    losses = torch.zeros(n, device=self.setup.device)  # [n]: one entry per batch
                    for j, x, y in batches:
                        losses[j] = self._eval_loss(x, y)
                    return distributed.all_sum(losses).sum()
                out[split] = self._with_compile_fallback(total).item() / n
            return out
        finally:
            self.model.train()

    # ---- the loop ----------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        if self.verbose:
            from tqdm.auto import tqdm
            tqdm.write(text) if self.progress else print(text, flush=True)

    def _log_eval(self, tokens_per_s: float | None) -> dict:
        losses = self.evaluate()
        util = mfu(self.flops_per_token, tokens_per_s, self.peak_flops) if tokens_per_s is not None else None
        row = {"step": self.step, "train_loss": round(losses["train"], 6), "val_loss": round(losses["val"], 6),
               "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s is not None else None,
               "mfu": round(util, 5) if util is not None else None, "lr": lr_at(max(self.step - 1, 0), self.cfg),
               "elapsed_s": round(self.elapsed, 2)}
        self.metrics.append(row)
        if self.out is not None and self.ranks.is_main:
            with open(self.out / METRICS, "a") as f:
                f.write(json.dumps(row) + "\n")
        rate = f", {tokens_per_s:,.0f} tok/s" if tokens_per_s is not None else ""
        util_text = f", MFU {100 * util:.1f}%" if util is not None else ""
        self._say(f"step {self.step:>5}: train {row['train_loss']:.4f}, val {row['val_loss']:.4f}{rate}{util_text}")
        return row

    def describe(self) -> str:
        cfg, world = self.cfg, self.ranks.world_size
        split = ""
        if world > 1 or self.accum > 1:
            split = (f" ({world} process(es) × {self.accum} micro-batch(es) of {self.micro} sequences"
                     f" = a global batch of {cfg.batch_size})")
        return (f"{cfg.arch}: {self.n_params:,} parameters, {self.flops_per_token:,} FLOPs/token "
                f"(6N + 12·L·H·Q·T), corpus {self.corpus_name}, {cfg.max_steps} steps × "
                f"{cfg.tokens_per_step:,} tokens{split}; device {self.setup.describe()}"
                f"{', torch.compile' if self.compiled else ''}")

    def run(self, until: int | None = None, on_step=None) -> TrainResult:
        """Train up to ``until`` (default ``max_steps``) steps in all. ``on_step(trainer)`` is called
        after every step (tests use it to interrupt or corrupt a run)."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        many = self.ranks.distributed
        stop = cfg.max_steps if until is None else min(until, cfg.max_steps)
        self._first_step = self.step
        if self.step >= cfg.max_steps:
            self._say(f"the run in {self.out} is already finished (step {self.step} of {cfg.max_steps}); "
                      "nothing to train")
        self._say(self.describe())
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not self.progress, desc=cfg.arch,
                   dynamic_ncols=True, leave=False)
        t_start = time.perf_counter()
        elapsed_before = self.elapsed
        first_interval = True
        with _SigintToFlag(abort_on_second=not many) as sigint, _SigtermToError(many):
            try:
                try:
                    if not self.metrics:
                        self._log_eval(None)  # the loss before training, ln(V) or so
                    interval_t, interval_steps = time.perf_counter(), 0
                    while self.step < stop:
                        self._mid_step = True
                        self._train_step()
                        self.step += 1
                        self._mid_step = False
                        interval_steps += 1
                        bar.update(1)
                        eval_due = self.step % cfg.eval_interval == 0 or self.step == cfg.max_steps
                        agreed = False  # several processes stop together, where they exchange losses
                        if eval_due or self.step % cfg.log_interval == 0 or self.step == stop:
                            agreed = self._read_losses(sigint.requested)
                            bar.set_postfix(loss=f"{self.losses[-1]:.3f}", refresh=False)
                        if eval_due:
                            if self.setup.device.type == "cuda":
                                torch.cuda.synchronize()
                            now = time.perf_counter()
                            self.rates.append((interval_steps * cfg.tokens_per_step / (now - interval_t),
                                               first_interval))
                            first_interval = False
                            self.elapsed = elapsed_before + now - t_start
                            self._log_eval(self.rates[-1][0])
                            self.save_checkpoint()
                            interval_t, interval_steps = time.perf_counter(), 0
                        if on_step is not None:
                            on_step(self)
                        if agreed if many else sigint.requested:
                            raise KeyboardInterrupt
                    self.elapsed = elapsed_before + time.perf_counter() - t_start
                    if self._last_saved != self.step:
                        self.save_checkpoint()  # paused at ``until``
                except Exception as err:
                    if many and distributed.is_comm_failure(err):
                        raise RankFailedError(f"rank {self.ranks.rank}: {distributed.as_rank_failure(err)}. "
                                              f"{self._kept_message()}") from err
                    raise
            except KeyboardInterrupt:
                bar.close()
                self.elapsed = elapsed_before + time.perf_counter() - t_start
                if self._mid_step:  # the state is half-updated: keep the last checkpoint
                    self._say(f"interrupted inside step {self.step + 1}; nothing saved. {self._kept_message()}")
                    raise
                self._read_losses()
                path = self.save_checkpoint()
                where = f"checkpoint saved to {path}; continue with --resume" if path else "no checkpoint written"
                self._say(f"interrupted after step {self.step}: {where}")
                raise
            finally:
                bar.close()
        return self.result()

    def result(self) -> TrainResult:
        """The run's ``TrainResult``; rank 0 writes it to ``DIR/summary.json``. Throughput: the
        median over evaluation intervals, of every session of the run, leaving out the first of
        each session (compilation, warm-up) when there are others."""
        steady = [r for r, first in self.rates if not first] or [r for r, _ in self.rates]
        tps = statistics.median(steady) if steady else None
        util = mfu(self.flops_per_token, tps, self.peak_flops) if tps else None
        res = TrainResult(self.cfg, self.model, self.tokenizer, self.corpus_name, list(self.metrics),
                          list(self.losses), self.n_params, self.flops_per_token, tps, util, self.elapsed,
                          self.setup.name, self.setup.precision, self.setup.peak[0] if self.setup.peak else None,
                          self.compiled, self.step >= self.cfg.max_steps, world_size=self.ranks.world_size)
        if self.out is not None and self.ranks.is_main:
            run_folder.write_text_atomic(self.out / SUMMARY, json.dumps(res.summary(), indent=1) + "\n")
        return res



def train(cfg: TrainConfig, out_dir=None, resume: bool = False, corpus: Corpus | None = None,
          checkpoints: bool = True, progress: bool | None = None, verbose: bool = True, until: int | None = None,
          on_step=None, overwrite: bool = False) -> TrainResult:
    """Build a ``Trainer`` and run it; see the module docstring. The folder's lock is released
    however the run ends."""
    trainer = Trainer(cfg, out_dir, resume, corpus, checkpoints, progress, verbose, overwrite)
    try:
        return trainer.run(until, on_step)
    finally:
        trainer.close()


def sample(model: nn.Module, tokenizer: CharTokenizer, prompt: str = "\n", max_new_tokens: int = 200,
           temperature: float = 0.8, top_k: int | None = None, seed: int = 0) -> str:
    """Text generated with the KV cache (``modern_block.generate``), seeded; the prompt is included."""
    device = next(model.parameters()).device
    idx = tokenizer.encode(prompt)[None].to(device)  # [1, T0]
    max_new_tokens = min(max_new_tokens, model.max_len - idx.shape[1] + 1)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = generate(model, idx, max_new_tokens, use_cache=True, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0])



# ---- command line --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m modern_block train",
                                     description="Train the Llama-style LM or the GPT-2 LM on tinyshakespeare "
                                     "(one process, or one per GPU under torchrun).")
    parser.add_argument("--arch", required=True, choices=ARCHS, help="which model")
    parser.add_argument("--out", default=None, help="folder for metrics.jsonl, ckpt.pt, summary.json "
                        "(default runs/<arch>)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    start.add_argument("--overwrite", action="store_true", help="start over in an --out that holds a run")
    parser.add_argument("--seed", type=seed_int, default=None, help="seed of initialisation, dropout and batches")
    add_run_options(parser)
    return parser


def resume_command(argv: list[str], out: Path, ranks: distributed.Ranks | None = None) -> str:
    """The command that continues this run: the same options, plus --resume (and --out)."""
    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    ranks = ranks or distributed.Ranks()
    if not ranks.distributed:
        launcher = "python"
    elif ranks.local_world_size == ranks.world_size:
        launcher = f"torchrun --nproc_per_node {ranks.local_world_size}"
    else:
        launcher = (f"torchrun --nnodes {ranks.world_size // ranks.local_world_size} --nproc_per_node "
                    f"{ranks.local_world_size} <the same rendezvous options as before>")
    return f"{launcher} -m modern_block train {shlex.join(args)}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        ranks = distributed.ranks_from_env()
    except ValueError as err:
        parser.error(str(err))
    if not ranks.is_main:  # usage errors: every process finds them, rank 0 says them
        parser.error = lambda message: sys.exit(2)
    args = parser.parse_args(argv)
    cfg = config_from_args(parser, args, args.arch, args.seed)
    out = Path(args.out) if args.out else Path("runs") / args.arch
    say = print if ranks.is_main else (lambda *a, **k: None)
    try:
        result = train(cfg, out, resume=args.resume, progress=False if args.no_progress else None,
                       overwrite=args.overwrite)
    except ValueError as err:  # e.g. --resume with different settings, an --out that holds a run
        parser.error(str(err))
    except NonFiniteLossError as err:
        say(f"error: {err}", file=sys.stderr)
        return 1
    except CheckpointError as err:
        say(f"error: {err}", file=sys.stderr)
        return 1
    except RankFailedError as err:  # every surviving process says why it stopped
        print(f"error: {err}\nOnce the cause is fixed, resume with: {resume_command(argv, out, ranks)}",
              file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        say(f"interrupted; resume with: {resume_command(argv, out, ranks)}", file=sys.stderr)
        return 130
    s = result.summary()
    mfu_text = f"{100 * s['mfu']:.1f}%" if s["mfu"] is not None else "n/a"
    tps = f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "n/a"
    say(f"done: best val loss {s['best_val_loss']:.4f}, {tps} tokens/s, MFU {mfu_text}"
        f"{' per device' if ranks.distributed else ''}, {s['wall_s']:.1f} s; files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
