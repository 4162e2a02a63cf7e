"""Data parallelism under torchrun: which process this is (``Ranks``) and the few exchanges the trainer makes;
without torchrun every exchange returns its input."""

import atexit
import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .config import ConfigError

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class RankFailedError(RuntimeError):
    """Another process of a data-parallel run failed or was stopped; this one cannot go on alone."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run."""

    rank: int = 0  # over all machines
    world_size: int = 1
    local_rank: int = 0  # on this machine: the GPU it uses
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that prints and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def device(self, device: str | None) -> str | None:
        """Under torchrun on GPUs, process LOCAL_RANK uses cuda:LOCAL_RANK."""
        if not (self.distributed and device_type_for(device) == "cuda"):
            return device
        if device not in (None, "cuda"):
            raise ConfigError(f"under torchrun each process uses the GPU cuda:LOCAL_RANK; pass --device cuda "
                              f"(or nothing), not {device!r}")
        return f"cuda:{self.local_rank}"

    def wrap(self, module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """``module`` inside ``DistributedDataParallel``, which averages the gradients of every process; the RoPE
        tables are buffers computed alike everywhere, so they are not sent on every step."""
        from torch.nn.parallel import DistributedDataParallel

        option = "forward_sync_buffers"  # "broadcast_buffers" before torch 2.13
        if option not in inspect.signature(DistributedDataParallel).parameters:
            option = "broadcast_buffers"
        no_resend: dict[str, Any] = {option: False}
        return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                       **no_resend)

    def mean_and_any(self, values: torch.Tensor, flag: bool) -> tuple[torch.Tensor, bool]:
        """``values`` averaged over the processes, and whether ``flag`` is set in any of them: one exchange."""
        if not self.distributed:
            return values, flag
        packed = all_sum(torch.cat([values.float(), values.new_tensor([float(flag)], dtype=torch.float32)]))
        return packed[:-1] / self.world_size, bool(packed[-1] > 0)


def ranks_from_env(environ=None) -> Ranks:
    """The ``Ranks`` torchrun put in the environment; one process when they are absent."""
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:
        return Ranks()
    values = {}
    for name in ENV_VARS:
        text = environ.get(name, "0" if name.startswith("LOCAL") or name == "RANK" else "1")
        try:
            values[name] = int(text)
        except ValueError:
            raise ConfigError(f"the environment variable {name} must be an integer (torchrun sets it), "
                              f"got {text!r}") from None
    ranks = Ranks(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"],
                  max(values["LOCAL_WORLD_SIZE"], 1))
    if not (ranks.world_size >= 1 and 0 <= ranks.rank < ranks.world_size and 0 <= ranks.local_rank):
        raise ConfigError(f"inconsistent torchrun environment: RANK={ranks.rank}, WORLD_SIZE={ranks.world_size}, "
                          f"LOCAL_RANK={ranks.local_rank}")
    return ranks


def device_type_for(device: str | None) -> str:
    """"cuda" or "cpu": the kind of device a ``--device`` value (None: CUDA if available) names."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if str(device).startswith("cuda") else "cpu"


def join(device: str | None) -> Ranks:
    """Join torchrun's process group (once per process) and, on GPUs, use ``cuda:LOCAL_RANK``; this ``Ranks``."""
    ranks, device_type = ranks_from_env(), device_type_for(device)
    if not ranks.distributed:
        return ranks
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
        if ranks.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"torchrun started process LOCAL_RANK={ranks.local_rank} but this machine has "
                             f"{torch.cuda.device_count()} GPU(s): pass --nproc_per_node "
                             f"{torch.cuda.device_count()} or fewer")
        torch.cuda.set_device(ranks.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
        atexit.register(_leave)
    return ranks


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_comm_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failed exchange with a peer: torch's ``DistError``s, or gloo's and NCCL's RuntimeErrors."""
    if isinstance(err, RankFailedError) or (hasattr(dist, "DistError") and isinstance(err, dist.DistError)):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("gloo" in text or "nccl" in text or "connection reset" in text)


def as_rank_failure(err: BaseException) -> RankFailedError:
    """A peer's failure in plain words: gloo's "[.../pair.cc:537] Read error [127.0.0.1]:50406:
    Connection reset by peer. This is typically caused by ..." keeps only its middle."""
    if isinstance(err, RankFailedError):
        return err
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(" This is typically caused")[0].rstrip(".")
    return RankFailedError(f"another process of this run stopped or cannot be reached ({text[:200]})")


def _exchange(fn):
    """Run a collective; a peer's failure becomes a ``RankFailedError`` with a plain message."""
    try:
        return fn()
    except RuntimeError as err:
        if is_comm_failure(err):
            raise as_rank_failure(err) from err
        raise


def all_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over all processes (``tensor`` itself in one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        _exchange(lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM))
    return tensor


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every process, for small picklable objects."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out = [None] * dist.get_world_size()
    _exchange(lambda: dist.all_gather_object(out, obj))
    return out


def agree_or_raise(error: BaseException | None, info=None) -> list:
    """After a step that may fail on some processes only: every process raises the first failure (none waits
    forever), else returns every process's ``info``."""
    gathered = gather_objects((error, info))
    me = dist.get_rank() if len(gathered) > 1 else 0
    for rank, (err, _) in enumerate(gathered):
        if err is not None:
            if rank == me and error is not None:
                raise error
            raise err if isinstance(err, BaseException) else RankFailedError(f"rank {rank} failed: {err}")
    return [info for _, info in gathered]
