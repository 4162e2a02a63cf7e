"""The checkpoint: everything a run needs to continue exactly, in a file that proves it is whole.

It holds only tensors and plain Python containers and is loaded with ``torch.load(weights_only=True)``:
loading one runs no code. It carries a sha256 of everything in it, checked when it is loaded: a
flipped bit is reported, not trained on. Any unreadable checkpoint gives a ``CheckpointError``
naming the file; a failed write (a full disk) leaves the previous checkpoint as it was.
"""

import hashlib
import shutil
import sys
from pathlib import Path

import torch

from .files import write_atomic

CHECKPOINT_FORMAT = 2  # 1: no checksum, no throughput history (read, with a warning)
REQUIRED_KEYS = ("format", "config", "chars", "corpus", "step", "elapsed_s", "losses", "model", "optimizer",
                 "scaler", "rng_cpu", "rng_cuda", "sampler")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read (empty, truncated, damaged, incomplete) or written (disk full)."""


def digest(obj) -> str:
    """sha256 of a checkpoint's contents: every tensor's dtype, shape and bytes, and every other
    value's repr, in order (dicts keep their insertion order through ``torch.save``/``load``)."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(x, dict):
            h.update(b"{")
            for k, v in x.items():
                h.update(repr(k).encode())
                walk(v)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[" if isinstance(x, list) else b"(")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def to_cpu(obj):
    """A copy of a nested state with every tensor on the CPU (what is hashed is what is saved)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def save_checkpoint(state: dict, path: Path) -> None:
    """Write ``state`` with its checksum to ``path`` atomically (see ``write_atomic``); a failed
    write (full disk, lost mount) is a ``CheckpointError`` that says the old checkpoint is kept."""
    state = to_cpu(state)
    state["checksum"] = digest(state)
    try:
        write_atomic(path, lambda f: torch.save(state, f))
    except (OSError, RuntimeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0][:200]
        free = shutil.disk_usage(path.parent).free
        raise CheckpointError(f"could not write the checkpoint {path} ({reason}; {free / 2**20:,.0f} MiB free "
                              f"on that disk). The file there before this write is unchanged") from err


def load_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path``, verified: a ``CheckpointError`` naming the file when it is empty,
    truncated, not a checkpoint, lacks keys, or fails its checksum."""
    advice = "restore a good copy, or start the run again with --overwrite"
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"the checkpoint {path} is empty (0 bytes): the write that made it never finished; "
                              f"{advice}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain containers only
    except Exception as err:  # noqa: BLE001 - torch raises many types for damaged files
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"the checkpoint {path} ({size:,} bytes) cannot be read: it is truncated, damaged or "
                              f"not a checkpoint of this trainer ({type(err).__name__}: {first}); {advice}") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint of this trainer; {advice}")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"the checkpoint {path} lacks {missing}: it was not written by this trainer, or "
                              f"was edited; {advice}")
    stored = ckpt.pop("checksum", None)
    computed = digest(ckpt)
    if stored is None:
        if ckpt["format"] >= 2:
            raise CheckpointError(f"the checkpoint {path} lacks its checksum; {advice}")
        print(f"note: {path} was written before checkpoints carried a checksum; it is not verified",
              file=sys.stderr)
    elif computed != stored:
        raise CheckpointError(f"the checkpoint {path} fails its checksum: its contents changed after it was "
                              f"written (a flipped bit on the disk or in a copy); {advice}")
    ckpt["checksum"] = computed  # what was verified: processes compare it to be sure they read the same file
    return ckpt
