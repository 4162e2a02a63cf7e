"""A run's folder: metrics.jsonl, ckpt.pt, summary.json and .lock (one training per folder). A run there is
never started over unless asked, files are replaced atomically, a resume keeps exactly the checkpoint's
evaluations, and a refused run removes what it created."""

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ConfigError
from .files import StorageError, reason, refused_writes, remove_temporaries, shown, write_text_atomic

CHECKPOINT = "ckpt.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
LOCK = ".lock"


class RunFolderError(ConfigError):
    """``--out`` cannot be used as asked: not a folder, not writable, in use, or already holding a run."""


class RunFolder:
    """The files of one run in ``path`` (None: none); only the ``writer`` (rank 0) writes; ``checkpoints=False``:
    metrics and summary only."""

    def __init__(self, path=None, writer: bool = True, checkpoints: bool = True):
        self.path = Path(path) if path is not None else None
        self.writer = writer and self.path is not None
        self.keeps_checkpoints = checkpoints and self.path is not None
        self._lock: RunLock | None = None
        self._created: list[Path] = []  # folders this run made: removed again if it is refused

    def _file(self, name: str) -> Path:
        if self.path is None:
            raise RunFolderError(f"this run keeps no files, so it has no {name}")
        return self.path / name

    @property
    def checkpoint(self) -> Path:
        return self._file(CHECKPOINT)

    @property
    def metrics(self) -> Path:
        return self._file(METRICS)

    def claim(self, resume: bool, overwrite: bool, say) -> dict | None:
        """Check and lock the folder and remove stale temporary files; return the checkpoint to resume from, or
        None for a new run. An earlier run is refused unless ``resume`` or ``overwrite``; ``say(text)`` notes."""
        if self.path is None:
            return None
        if resume and overwrite:
            raise RunFolderError("resume and overwrite exclude each other")
        if self.writer:
            self._created = missing_folders(self.path)
            prepare(self.path)
            self._lock = RunLock(self.path)
            with refused_writes(f"remove the temporary files in {shown(self.path)}"):
                n, size = remove_temporaries(self.path, (CHECKPOINT, METRICS, SUMMARY))
            if n:
                say(f"note: removed {n} temporary file(s) ({size / 2**20:,.1f} MiB) that interrupted writes left "
                    f"in {self.path}")
        if resume and self.checkpoint.exists():
            return load_checkpoint(self.checkpoint)
        if self.writer:
            with refused_writes(f"read {shown(self.path)}"):
                found = existing_run(self.path)
            if resume:
                say(f"no checkpoint in {self.path}; starting a new run"
                    + (f" (replacing what is there: {found})" if found else ""))
            elif found and not overwrite:
                raise RunFolderError(f"{self.path} already holds a run ({found}). Pass --resume to continue it, "
                                     "--overwrite to start it over, or choose another --out")
        return None

    def start(self) -> None:
        """A new run, every check passed: an earlier run's files go, an empty metrics file."""
        if self.writer and self.path is not None:
            with refused_writes(f"start the run in {shown(self.path)}"):
                clear(self.path)
                self.metrics.write_text("")

    def resumed_metrics(self, step: int, saved: list[dict], run_id: str, say) -> list[dict]:
        """On resume (the writer): ``metrics.jsonl`` rewritten to hold exactly the ``saved`` evaluations of the
        checkpoint at ``step`` (later lines will be written again); a ``summary.json`` of another run goes."""
        if not self.writer:
            return []
        with refused_writes(f"read {shown(self.metrics)}"):
            on_disk = [m for m in read_metrics(self.metrics, say=say) if m["step"] <= step]
        if on_disk != saved:
            say(f"note: {self.metrics} did not hold the checkpoint's evaluations ({_differences(on_disk, saved)}); "
                f"it now holds the {len(saved)} the checkpoint carries")
        with refused_writes(f"rewrite {shown(self.metrics)}"):
            write_text_atomic(self.metrics, "".join(json.dumps(m) + "\n" for m in saved))
            self._drop_other_summary(run_id, say)
        return saved

    def _drop_other_summary(self, run_id: str, say) -> None:
        path = self._file(SUMMARY)
        if not path.exists():
            return
        try:
            theirs = json.loads(path.read_text()).get("run_id")
        except (ValueError, AttributeError):
            theirs = "unreadable"
        if theirs != run_id:
            path.unlink()
            say(f"note: removed {path}: it summarised another run ({theirs}), not the checkpoint's ({run_id})")

    def append_metrics(self, row: dict) -> None:
        if self.writer:
            with refused_writes(f"append an evaluation to {shown(self.metrics)}"):
                with open(self.metrics, "a") as f:
                    f.write(json.dumps(row) + "\n")

    def write_summary(self, summary: dict) -> None:
        if self.writer:
            with refused_writes(f"write {shown(self._file(SUMMARY))}"):
                write_text_atomic(self._file(SUMMARY), json.dumps(summary, indent=1) + "\n")

    def save_checkpoint(self, state: dict) -> None:
        if self.writer and self.keeps_checkpoints:
            save_checkpoint(state, self.checkpoint)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def abandon(self) -> None:
        """A run refused before it started: remove the lock file and the empty folders it created (best effort)."""
        if self._lock is not None and self._lock.created:
            with contextlib.suppress(OSError):
                self._lock.path.unlink()  # while holding the lock: see RunLock
        self.release()
        for folder in reversed(self._created):  # the innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []


def _differences(on_disk: list[dict], saved: list[dict]) -> str:
    """How the file's evaluations differ from the checkpoint's, in words."""
    mine = {m["step"]: m for m in on_disk}
    missing = [m["step"] for m in saved if m["step"] not in mine]
    other = [m["step"] for m in saved if m["step"] in mine and mine[m["step"]] != m]
    extra = sorted(set(mine) - {m["step"] for m in saved})
    parts = ([f"missing or torn at step(s) {missing}"] if missing else []) + (
        [f"other values at step(s) {other}: another run's"] if other else []) + (
        [f"steps the checkpoint never saw: {extra}"] if extra else [])
    return "; ".join(parts)


def missing_folders(folder: Path) -> list[Path]:
    """The folders that creating ``folder`` would make, outermost first."""
    try:
        return [p for p in reversed([folder, *folder.parents]) if not p.exists()]
    except OSError:  # a name too long for the file system: prepare() says so
        return []


def prepare(folder: Path) -> None:
    """Create ``folder`` and check that files can be written in it: a ``RunFolderError`` when the path names a
    file, a ``StorageError`` when the file system refuses."""
    try:
        if folder.exists() and not folder.is_dir():
            raise RunFolderError(f"--out {shown(folder)} is a file, not a folder: choose a folder for the run")
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.")
        os.close(fd)
        os.remove(probe)
    except (NotADirectoryError, FileExistsError) as err:
        raise RunFolderError(f"cannot write in --out {shown(folder)} ({err.strerror}): a part of that path is a "
                             "file; choose a folder") from None
    except OSError as err:
        raise StorageError(f"cannot write in --out {shown(folder)} ({reason(err)}): choose a folder you can "
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
    """An exclusive lock on ``folder/.lock``. ``created``: this lock made the file, which a refused run removes
    while holding it (a process that opened the removed file sees the path name another file, and tries again)."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        for _ in range(10):
            self.created = not self.path.exists()
            with refused_writes(f"create the lock file {shown(self.path)}"):
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
            if self._still_named():
                break
            self.release()  # its holder removed it after we opened it: lock the file that is there now
        try:  # unbuffered: a full disk fails here, not again when the file is closed
            os.ftruncate(self._file.fileno(), 0)
            os.write(self._file.fileno(), f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        except OSError as err:
            if self.created:
                self.path.unlink(missing_ok=True)
            self.release()
            raise StorageError(f"could not write the lock file {shown(self.path)} ({reason(err)})") from None

    def _still_named(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self._file.fileno()).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if not self._file.closed:
            with contextlib.suppress(OSError):
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


def read_metrics(path: Path, say=print) -> list[dict]:
    """The rows of ``metrics.jsonl``; a line that is not a JSON object with a "step" (torn) is dropped, said."""
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
