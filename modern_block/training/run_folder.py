"""What a training run keeps on disk, written so that a run is never lost.

    DIR/metrics.jsonl   one JSON line per evaluation, appended as the run goes
    DIR/ckpt.pt         everything needed to continue exactly, and a sha256 of its contents
    DIR/summary.json    the run's summary, rewritten at the end of each session
    DIR/.lock           held (an operating-system file lock) by the one training writing DIR

The rules, and why:
- A folder that already holds a run is not started over unless asked (``RunFolderError``): a
  typo in ``--out`` must not wipe a day of training.
- One training per folder at a time. The lock is the operating system's (``flock``; ``msvcrt`` on
  Windows), so it is released when its process ends, even when it is killed: no stale lock files.
- Every file is written to a temporary file with a unique name in the same folder and renamed onto
  its final name (``os.replace`` is atomic), so a reader sees the old file or the new one, never
  half of one. A failed write (a full disk) removes its temporary file; the old file stays.
- The checkpoint carries a sha256 of everything in it, checked when it is loaded: a flipped bit
  is reported, not trained on. Any unreadable checkpoint gives a ``CheckpointError`` naming the file.
- A torn last line of ``metrics.jsonl`` (the process died while appending it) is dropped, and said so.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

CHECKPOINT = "ckpt.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOCK = ".lock"
CHECKPOINT_FORMAT = 2  # 1: no checksum, no throughput history (read, with a warning)
REQUIRED_KEYS = ("format", "config", "chars", "corpus", "step", "elapsed_s", "losses", "model", "optimizer",
                 "scaler", "rng_cpu", "rng_cuda", "sampler")


class RunFolderError(ValueError):
    """``--out`` cannot be used as asked: not a folder, not writable, in use, or already holding a run."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read (empty, truncated, damaged, incomplete) or written (disk full)."""


# ---- the folder --------------------------------------------------------------------------------------
def prepare(folder: Path) -> None:
    """Create ``folder`` if needed and check that files can be written in it, with errors that say which."""
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"--out {folder} is a file, not a folder: choose a folder for the run")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise RunFolderError(f"cannot write in --out {folder} ({err.strerror or err}): choose a folder you can "
                             "write to") from None


def existing_run(folder: Path) -> str | None:
    """What in ``folder`` belongs to an earlier run ("a checkpoint, 3 evaluations"), or None."""
    found = []
    if (folder / CHECKPOINT).exists():
        found.append(f"a checkpoint ({CHECKPOINT})")
    metrics = folder / METRICS
    if metrics.is_file() and metrics.stat().st_size > 0:
        n = sum(1 for line in metrics.read_text(errors="replace").splitlines() if line.strip())
        found.append(f"{n} evaluation(s) in {METRICS}")
    if (folder / SUMMARY).exists():
        found.append(f"a {SUMMARY}")
    return ", ".join(found) or None


def clear(folder: Path) -> None:
    """Remove an earlier run's files (``--overwrite``): its checkpoint must not outlive it."""
    for name in (CHECKPOINT, METRICS, SUMMARY):
        (folder / name).unlink(missing_ok=True)


class RunLock:
    """An exclusive lock on ``folder/.lock`` for as long as this object holds it."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self._file = open(self.path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            _lock(self._file)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise RunFolderError(f"{folder} is in use by another training ({holder}); two trainings in one "
                                 "folder would mix their files. Wait for it to finish or choose another --out"
                                 ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            _unlock(self._file)
            self._file.close()


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock(f):
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(f):
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---- writing files atomically ------------------------------------------------------------------------
class _WriteErrors:
    """A file that remembers the first OSError its writes raised. ``torch.save`` turns a failed
    write (a full disk) into "unexpected pos ..." or "basic_ios::clear: iostream error"; this keeps
    the real cause to report."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data):
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name):
        return getattr(self.file, name)


def _open_for_writing(fd: int):
    return os.fdopen(fd, "wb")


def write_atomic(path: Path, write) -> None:
    """``write(file)`` into a uniquely named temporary file beside ``path``, then rename it onto
    ``path``. On any failure the temporary file is removed and ``path`` is left as it was; a
    failed write raises the ``OSError`` that caused it (ENOSPC: disk full)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with _open_for_writing(fd) as raw:
            f = _WriteErrors(raw)
            try:
                write(f)
            except Exception as err:
                if f.error is not None and f.error is not err:
                    raise f.error from err
                raise
            f.flush()
            os.fsync(f.fileno())  # on disk before it takes the final name
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode()))


# ---- the checkpoint ----------------------------------------------------------------------------------
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


# ---- the metrics log ---------------------------------------------------------------------------------
def read_metrics(path: Path, say=print) -> list[dict]:
    """The rows of ``metrics.jsonl``. A line that is not a JSON object with a "step" (a torn last
    line, when a process died while appending it) is dropped, and ``say`` tells which."""
    if not path.exists():
        return []
    rows, dropped = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("no step")
            rows.append(row)
        except ValueError:
            dropped.append(number)
    if dropped:
        say(f"note: {path}: dropped line(s) {dropped} that are not complete JSON rows (a line cut off when the "
            "process stopped mid-write); the checkpoint is unaffected")
    return rows
