"""Files a reader never sees half of (written beside their name, then renamed), and the file system's refusals
as one-line ``StorageError``s naming the file and the reason."""

import contextlib
import errno
import os
import tempfile
from pathlib import Path

TEMPORARY = ".tmp"  # the suffix of every temporary file write_atomic makes


class StorageError(RuntimeError):
    """The file system refused a read or a write (full, read-only, a name too long, gone); the message says
    which file, why, and what is kept."""


def reason(err: OSError) -> str:
    """An OSError in a few words: "No space left on device", "Read-only file system", ..."""
    if err.errno == errno.ENAMETOOLONG:
        return "File name too long: the path is longer than this file system allows"
    return err.strerror or str(err)


def shown(path: Path) -> str:
    """A path for a one-line message: an over-long one is shortened in the middle."""
    text = str(path)
    return text if len(text) <= 160 else f"{text[:90]}...{text[-60:]}"


@contextlib.contextmanager
def refused_writes(what: str):
    """An OSError inside becomes a ``StorageError``: "could not WHAT (the reason)"."""
    try:
        yield
    except OSError as err:
        raise StorageError(f"could not {what} ({reason(err)})") from None


def remove_temporaries(folder: Path, names) -> tuple[int, int]:
    """Remove the temporary files that interrupted writes of ``names`` left in ``folder``: (files, bytes)."""
    found = [p for name in names for p in folder.glob(f"{name}.*{TEMPORARY}") if p.is_file()]
    size = sum(p.stat().st_size for p in found)
    for p in found:
        p.unlink(missing_ok=True)
    return len(found), size


class _WriteErrors:
    """A file that keeps the first OSError its writes raised (``torch.save`` reports a full disk otherwise)."""

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


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (another thread may create files)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def _open_for_writing(fd: int):
    os.fchmod(fd, 0o666 & ~_umask())  # an ordinary new file's mode: mkstemp makes 0600
    return os.fdopen(fd, "wb")


def write_atomic(path: Path, write) -> None:
    """``write(file)`` into a temporary file beside ``path``, then rename it onto ``path``; on any failure the
    temporary file goes, ``path`` is as it was and the ``OSError`` that caused it is raised."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=TEMPORARY)
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
