"""A run's settings (``TrainConfig``, checked when built; a bad one is a ``ConfigError``), the three scales,
the learning-rate schedule and the optimizer's groups."""

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn as nn

from .ladder import ARCH_NAMES, ModelShape

QUICK_ENV = "MODERN_BLOCK_QUICK"
EVAL_SEED = 1234  # the fixed evaluation windows do not depend on the run's seed
ARCHS = ("llama", "gpt2")
# may differ between a run and its resumption (where it runs, how often it looks, how the batch is cut up)
RUNTIME_FIELDS = ("device", "compile", "log_interval", "micro_batch_size")
MAX_INT = 2**31 - 1  # sizes and counts beyond this are typos (and overflow some kernels)
MAX_SEED = 2**63 - 1  # torch's generators take 64-bit seeds
MAX_LR = 1e3  # far above any rate that trains (lesson 08 shows 10 and 100 diverge), far below float32 overflow


class ConfigError(ValueError):
    """A run's settings break a rule or contradict each other (or the run they would resume)."""


@dataclass
class TrainConfig:
    """Model shape, optimisation and evaluation settings; the defaults are the GPU scale."""

    arch: str = "llama"  # "llama", "gpt2" or "ladder:<rung>"
    d: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2  # Llama arm only (GPT-2 is MHA); must divide n_heads
    block_size: int = 256
    dropout: float = 0.2
    batch_size: int = 64  # the global batch: sequences per optimizer step, over all processes
    micro_batch_size: int | None = None  # sequences per forward/backward (None: batch_size / processes)
    max_steps: int = 5000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_batches: int = 20
    seed: int = 1337
    log_interval: int = 10  # steps between reading losses back from the device (and checking them)
    compile: bool | None = None  # None: on for CUDA, off on the CPU
    device: str | None = None  # None: CUDA if available, else the CPU

    def __post_init__(self):
        ints = ("d", "n_layers", "n_heads", "n_kv_heads", "block_size", "batch_size", "max_steps",
                "eval_interval", "eval_batches", "log_interval")
        for name in ints + (("micro_batch_size",) if self.micro_batch_size is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_INT:
                raise ConfigError(f"{name} must be a positive int of at most {MAX_INT:,}, got {value!r}")
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ConfigError(f"micro_batch_size ({self.micro_batch_size}) must divide batch_size ({self.batch_size})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be an int in [0, 2**63 - 1], got {self.seed!r}")
        if self.arch not in ARCHS and self.arch.removeprefix("ladder:") not in ARCH_NAMES:
            raise ConfigError(f"arch must be one of {list(ARCHS)} or 'ladder:<rung>' with a rung in "
                             f"{list(ARCH_NAMES)}, got {self.arch!r}")
        if not (math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            raise ConfigError(f"lr must be a positive finite number of at most {MAX_LR:g} (AdamW moves every weight "
                             f"by about lr per step; nanoGPT uses 1e-3; beyond this AdamW's float32 arithmetic "
                             f"overflows), got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be a non-negative int, got {self.warmup_steps!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if not (self.weight_decay >= 0 and self.grad_clip >= 0):
            raise ConfigError(f"weight_decay and grad_clip must be >= 0, got {self.weight_decay}, {self.grad_clip}")
        try:
            self.shape  # noqa: B018 - builds the ModelShape, which checks divisibility
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.d, self.n_layers, self.n_heads, self.n_kv_heads, self.block_size, self.dropout)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size


def gpu_config(arch: str = "llama", **overrides) -> TrainConfig:
    """nanoGPT's shakespeare-char budget (``TrainConfig``'s defaults; GPT-2 there: val loss 1.4697)."""
    return TrainConfig(arch=arch, **overrides)


def quick_config(arch: str = "llama", **overrides) -> TrainConfig:
    """The CPU scale of lesson 08 and ``compare --quick``: about a second per run on one core."""
    base: dict[str, Any] = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=32, dropout=0.0, batch_size=16,
                max_steps=90, lr=3e-3, min_lr=3e-4, warmup_steps=9, eval_interval=30, eval_batches=4,
                log_interval=1, compile=False)
    return TrainConfig(arch=arch, **(base | overrides))


# nanoGPT's README CPU recipe (the rest from its shakespeare-char config): val loss 1.88 in about 3 minutes there.
LAPTOP: dict[str, Any] = dict(
    d=128, n_layers=4, n_heads=4, n_kv_heads=2, block_size=64, dropout=0.0, batch_size=12, max_steps=2000,
    lr=1e-3, min_lr=1e-4, warmup_steps=100, weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
    eval_interval=250, eval_batches=20, log_interval=50, compile=False, device="cpu")
SCALES = ("quick", "laptop", "gpu")


def laptop_config(arch: str = "llama", **overrides) -> TrainConfig:
    """nanoGPT's CPU recipe (``LAPTOP``): 5-6 minutes of one CPU core per run."""
    return TrainConfig(arch=arch, **(LAPTOP | overrides))


def scale_config(scale: str, arch: str = "llama", **overrides) -> TrainConfig:
    makers = {"quick": quick_config, "laptop": laptop_config, "gpu": gpu_config}
    if scale not in makers:
        raise ConfigError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    return makers[scale](arch, **overrides)


def quick_forced() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def with_rate(cfg: TrainConfig, lr: float) -> TrainConfig:
    """``cfg`` at peak rate ``lr``, its cosine ending at the same fraction of it (a tenth in every preset)."""
    return replace(cfg, lr=lr, min_lr=lr * (cfg.min_lr / cfg.lr))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Rate of 0-based ``step``: linear warmup to ``lr``, then a cosine down to ``min_lr`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step >= cfg.max_steps:
        return cfg.min_lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)  # in [0, 1)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (embeddings, linear weights), none on biases and norm scales."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def resumed_config(given: TrainConfig, saved_cfg: TrainConfig) -> TrainConfig:
    """The saved config, with the runtime options of ``given``; any other difference is an error."""
    diffs = [f"{f.name} (saved {getattr(saved_cfg, f.name)!r}, given {getattr(given, f.name)!r})"
             for f in fields(TrainConfig)
             if f.name not in RUNTIME_FIELDS and getattr(saved_cfg, f.name) != getattr(given, f.name)]
    if diffs:
        raise ConfigError("--resume continues the saved run with its own settings; these differ: " + "; ".join(diffs))
    return replace(saved_cfg, **{name: getattr(given, name) for name in RUNTIME_FIELDS})

