"""What a training run keeps on disk, written so that a run is never lost.

    DIR/metrics.jsonl   one JSON line per evaluation, appended as the run goes
    DIR/ckpt.pt         everything needed to continue exactly, and a sha256 of its contents (``training.checkpoint``)
    DIR/summary.json    the run's summary, rewritten at the end of each session
    DIR/.lock           held (an operating-system file lock) by the one training writing DIR

The rules, and why:
- A folder that already holds a run is not started over unless asked (``RunFolderError``): a
  typo in ``--out`` must not wipe a day of training.
- One training per folder at a time. The lock is the operating system's (``flock``; ``msvcrt`` on
  Windows), so it is released when its process ends, even when it is killed: no stale lock files.
- Every file is replaced atomically (``training.files``): a reader sees the old file or the new one.
- A torn last line of ``metrics.jsonl`` (the process died while appending it) is dropped, and said so.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ConfigError
from .files import write_text_atomic

CHECKPOINT = "ckpt.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOCK = ".lock"


class RunFolderError(ConfigError):
    """``--out`` cannot be used as asked: not a folder, not writable, in use, or already holding a run."""


def _silent(*args, **kwargs) -> None:
    pass


class RunFolder:
    """The files of one run in ``path``; ``path=None``: a run that keeps no files. Only the ``writer``
    (the one process of a run that writes, rank 0) writes; every process may read the checkpoint.
    ``checkpoints=False``: metrics and summary only (``compare``'s runs)."""

    def __init__(self, path=None, writer: bool = True, checkpoints: bool = True):
        self.path = Path(path) if path is not None else None
        self.writer = writer and self.path is not None
        self.keeps_checkpoints = checkpoints and self.path is not None
        self._lock: RunLock | None = None

    def _file(self, name: str) -> Path | None:
        return self.path / name if self.path is not None else None

    @property
    def checkpoint(self) -> Path | None:
        return self._file(CHECKPOINT)

    @property
    def metrics(self) -> Path | None:
        return self._file(METRICS)

    def claim(self, resume: bool, overwrite: bool, say=_silent) -> dict | None:
        """Check and lock the folder (the writer); return the checkpoint to resume from (every
        process), or None for a new run. An earlier run is refused unless ``resume`` or ``overwrite``."""
        if self.path is None:
            return None
        if resume and overwrite:
            raise RunFolderError("resume and overwrite exclude each other")
        if self.writer:
            prepare(self.path)
            self._lock = RunLock(self.path)
        if resume and self.checkpoint.exists():
            return load_checkpoint(self.checkpoint)
        if self.writer:
            found = existing_run(self.path)
            if resume:
                say(f"no checkpoint in {self.path}; starting a new run"
                    + (f" (replacing what is there: {found})" if found else ""))
            elif found and not overwrite:
                raise RunFolderError(f"{self.path} already holds a run ({found}). Pass --resume to continue it, "
                                     "--overwrite to start it over, or choose another --out")
        return None

    def start(self) -> None:
        """A new run: an earlier run's files go (every check has passed by now), an empty metrics file."""
        if self.writer:
            clear(self.path)
            self.metrics.write_text("")

    def metrics_up_to(self, step: int, say=_silent) -> list[dict]:
        """On resume (the writer): the evaluations up to the checkpoint's ``step``; later lines, written
        after it, are dropped from the file (they will be written again)."""
        if not self.writer:
            return []
        rows = [m for m in read_metrics(self.metrics, say=say) if m["step"] <= step]
        write_text_atomic(self.metrics, "".join(json.dumps(m) + "\n" for m in rows))
        return rows

    def append_metrics(self, row: dict) -> None:
        if self.writer:
            with open(self.metrics, "a") as f:
                f.write(json.dumps(row) + "\n")

    def write_summary(self, summary: dict) -> None:
        if self.writer:
            write_text_atomic(self.path / SUMMARY, json.dumps(summary, indent=1) + "\n")

    def save_checkpoint(self, state: dict) -> None:
        if self.writer and self.keeps_checkpoints:
            save_checkpoint(state, self.checkpoint)

    def release(self) -> None:
        """Release the folder's lock."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


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
