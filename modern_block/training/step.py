"""One training step and one evaluation as functions of their inputs (losses stay on the device), and
``Forward``: the model as they call it, compiled or not, data-parallel or not."""

import contextlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .distributed import RankFailedError, is_comm_failure


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast=contextlib.nullcontext) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction; x, y: [B, T]. The logits are compared in fp32."""
    with autocast():
        logits = model(x)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def forward_backward(model: nn.Module, batch, scaler, micro: int, autocast=contextlib.nullcontext) -> torch.Tensor:
    """Gradients of the batch's mean loss, ``micro`` sequences at a time; returns that mean loss."""
    x, y = batch  # [B, T] each
    accum = x.shape[0] // micro  # forward/backward passes in this step
    parts = []
    for i, (xs, ys) in enumerate(zip(x.split(micro), y.split(micro), strict=True)):
        last = i == accum - 1  # data parallelism: exchange the gradients once, after the last micro-batch
        with model.no_sync() if isinstance(model, DistributedDataParallel) and not last else contextlib.nullcontext():
            loss = batch_loss(model, xs, ys, autocast)
            share = loss / accum  # the mean over the whole batch, as one pass would give
            (scaler.scale(share) if scaler is not None else share).backward()
        parts.append(loss.detach())
    return torch.stack(parts).mean()


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler, grad_clip: float) -> None:
    """Clip the gradient norm (0: no clipping), step, and clear the gradients."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, scaler, lr: float, micro: int,
               grad_clip: float, autocast=contextlib.nullcontext) -> torch.Tensor:
    """One optimizer step on ``batch`` (x, y: [B, T]) at rate ``lr``, ``micro`` sequences per pass, the gradient
    norm clipped to ``grad_clip`` (0: none); returns the mean loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = forward_backward(model, batch, scaler, micro, autocast)
    optimizer_step(model, optimizer, scaler, grad_clip)
    return loss.detach()


def eval_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int,
              autocast=contextlib.nullcontext) -> torch.Tensor:
    """Mean loss of one evaluation batch, ``micro`` sequences at a time."""
    return torch.stack([batch_loss(model, xs, ys, autocast)
                        for xs, ys in zip(x.split(micro), y.split(micro), strict=True)]).mean()


class Forward:
    """The model as the steps call it: ``train`` (data-parallel after ``distribute``) and ``eval``, compiled when
    ``compiled``. ``call(fn, on_fallback)``: if the compiled model fails, warn, fall back to eager, run fn() again."""

    def __init__(self, model: nn.Module, compiled: bool):
        self.model, self.compiled, self._wrap = model, compiled, None
        self._build()

    def _build(self) -> None:
        self.eval = torch.compile(self.model) if self.compiled else self.model
        self.train = self._wrap(self.eval) if self._wrap is not None else self.eval

    def distribute(self, wrap) -> None:
        """Train through ``wrap(module)`` (DistributedDataParallel) from now on."""
        self._wrap = wrap
        self._build()

    def call(self, fn, on_fallback=None):
        if not self.compiled:
            return fn()
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - any compiler failure
            if isinstance(err, RankFailedError) or is_comm_failure(err):
                raise
            warnings.warn(f"torch.compile failed ({type(err).__name__}: {str(err)[:200]}); training eagerly",
                          stacklevel=2)
            if on_fallback is not None:
                on_fallback()
            self.compiled = False
            self._build()
            return fn()
