"""The checkpoint: everything a run needs to continue exactly, with a sha256 of all of it (a flipped bit is
refused, not trained on) and the run's identity and evaluations. Tensors and plain containers only (loading runs
no code); a bad file is a ``CheckpointError`` naming it; a failed write keeps the old one."""

import hashlib
import shutil
from pathlib import Path

import torch

from ..interop.verify import CheckpointError
from .config import TrainConfig
from .files import reason, write_atomic

CHECKPOINT_FORMAT = 3
REQUIRED_KEYS = ("format", "config", "chars", "corpus", "step", "elapsed_s", "losses", "model", "optimizer",
                 "scaler", "rng_cpu", "rng_cuda", "sampler", "run_id", "metrics")
ADVICE = "restore a good copy, or start the run again with --overwrite"


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
        why = reason(err) if isinstance(err, OSError) else str(err).splitlines()[0][:200]
        try:
            why += f"; {shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free on that disk"
        except OSError:
            pass
        raise CheckpointError(f"could not write the checkpoint {path} ({why}). The file there before this write "
                              "is unchanged") from err


def load_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path``, verified: a ``CheckpointError`` naming the file when it is empty,
    truncated, not a checkpoint, lacks keys, fails its checksum, or holds values of the wrong kind."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise CheckpointError(f"the checkpoint {path} cannot be read ({reason(err)})") from None
    if size == 0:
        raise CheckpointError(f"the checkpoint {path} is empty (0 bytes): the write that made it never finished; "
                              f"{ADVICE}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain containers only
    except Exception as err:  # noqa: BLE001 - torch raises many types for damaged files
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"the checkpoint {path} ({size:,} bytes) cannot be read: it is truncated, damaged or "
                              f"not a checkpoint of this trainer ({type(err).__name__}: {first}); {ADVICE}") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint of this trainer; {ADVICE}")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"the checkpoint {path} lacks {missing}: it was not written by this trainer, or "
                              f"was edited; {ADVICE}")
    stored = ckpt.pop("checksum", None)
    computed = digest(ckpt)
    if stored is None:
        raise CheckpointError(f"the checkpoint {path} lacks its checksum; {ADVICE}")
    if computed != stored:
        raise CheckpointError(f"the checkpoint {path} fails its checksum: its contents changed after it was "
                              f"written (a flipped bit on the disk or in a copy); {ADVICE}")
    wrong = malformed(ckpt)
    if wrong:
        raise CheckpointError(f"the checkpoint {path} is malformed ({wrong}): it was not written by this trainer, "
                              f"or was edited; {ADVICE}")
    ckpt["checksum"] = computed  # what was verified: processes compare it to be sure they read the same file
    return ckpt


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_state(x) -> bool:
    """A random generator's state: a 1-D uint8 tensor."""
    return isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.dim() == 1


def malformed(ckpt: dict) -> str | None:
    """What in a loaded checkpoint is not of the kind this trainer writes, or None."""
    fmt, step = ckpt["format"], ckpt["step"]
    if not _is_int(fmt) or fmt != CHECKPOINT_FORMAT:
        return f"format {fmt!r}: this trainer reads format {CHECKPOINT_FORMAT}"
    if not _is_int(step) or step < 0:
        return f"step {step!r}"
    losses = ckpt["losses"]
    checks = {
        "losses": isinstance(losses, list) and all(isinstance(v, float) for v in losses) and len(losses) == step,
        "elapsed_s": isinstance(ckpt["elapsed_s"], (int, float)) and not isinstance(ckpt["elapsed_s"], bool),
        "config": isinstance(ckpt["config"], dict),
        "chars": isinstance(ckpt["chars"], str) and len(ckpt["chars"]) > 0,
        "corpus": isinstance(ckpt["corpus"], str),
        "model": isinstance(ckpt["model"], dict) and all(isinstance(v, torch.Tensor) for v in ckpt["model"].values()),
        "optimizer": isinstance(ckpt["optimizer"], dict),
        "scaler": ckpt["scaler"] is None or isinstance(ckpt["scaler"], dict),
        "rng_cpu": _is_state(ckpt["rng_cpu"]),
        "rng_cuda": ckpt["rng_cuda"] is None or _is_state(ckpt["rng_cuda"]),
        "rng_ranks": ckpt.get("rng_ranks") is None or (
            isinstance(ckpt["rng_ranks"], list) and len(ckpt["rng_ranks"]) == ckpt.get("world_size")
            and all(isinstance(r, dict) and _is_state(r.get("cpu")) for r in ckpt["rng_ranks"])),
        "world_size": _is_int(ckpt.get("world_size", 1)) and ckpt.get("world_size", 1) >= 1,
        "sampler": _is_state(ckpt["sampler"]),
        "run_id": isinstance(ckpt["run_id"], str) and len(ckpt["run_id"]) > 0,
        "metrics": isinstance(ckpt["metrics"], list) and all(
            isinstance(m, dict) and _is_int(m.get("step")) and 0 <= m["step"] <= step for m in ckpt["metrics"]),
    }
    wrong = [name for name, ok in checks.items() if not ok]
    return f"{', '.join(wrong)} of the wrong kind" if wrong else None


def saved_config(ckpt: dict, path: Path) -> TrainConfig:
    """The settings of the run the checkpoint continues; a ``CheckpointError`` when they are not valid settings."""
    try:
        return TrainConfig(**ckpt["config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"the checkpoint {path} holds settings this trainer cannot use ({err}); "
                              f"{ADVICE}") from None
