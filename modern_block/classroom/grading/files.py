"""The grader's files: the class folder read without following links or blocking, the outputs written so that
nothing planted at their paths can redirect them.

Collection walks the folders the instructor names (those names are followed, as given); inside them a
symbolic link, a pipe, a device, a folder too deep or a file over ``MAX_NOTEBOOK_BYTES`` is never opened or
followed: it gets an error row of its own. Every file is read once, into memory, before any student code runs.

Outputs (``--csv``, ``--json-file``) are written to a temporary file in the target's folder and renamed over
the target, so a reader never sees half a gradebook and a symbolic link at the path is replaced, never
followed; a link or a folder already at the path is refused before grading starts.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .notebook import MAX_NOTEBOOK_BYTES

MAX_DEPTH = 16  # folder levels below a given folder
MAX_FILES = 20_000  # notebooks in one run


class OutputError(Exception):
    """An output file cannot be written (its path is refused, or the disk says no)."""


@dataclass
class Submission:
    path: str
    notebook: str  # as shown in the report
    student: str
    data: bytes | None = None
    read_error: str | None = None


def read_regular(path: str) -> tuple[bytes | None, str | None]:
    """A regular file's bytes (at most ``MAX_NOTEBOOK_BYTES``), or why it is not read. Links are not followed,
    and nothing is opened that could block (a pipe) or act (a device)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return None, "a symbolic link: the grader reads only regular files"
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > MAX_NOTEBOOK_BYTES:
            return None, f"the file is larger than {MAX_NOTEBOOK_BYTES >> 20} MB"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno == errno.ELOOP:
            return None, "a symbolic link: the grader reads only regular files"
        return None, f"cannot read the file ({err.strerror or err})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        chunks, left = [], MAX_NOTEBOOK_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            return None, f"the file is larger than {MAX_NOTEBOOK_BYTES >> 20} MB"
        return b"".join(chunks), None
    except OSError as err:
        return None, f"cannot read the file ({err.strerror or err})"
    finally:
        os.close(fd)


def _walk(folder: str, depth: int, found: list, refused: list) -> None:
    """The ``*.ipynb`` files below ``folder`` (hidden names skipped), in name order; links, special files and
    folders too deep go to ``refused`` as (path, reason)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        refused.append((folder, f"cannot read the folder ({err.strerror or err})"))
        return
    for entry in entries:
        if entry.name.startswith(".") or len(found) + len(refused) >= MAX_FILES:
            continue
        if entry.is_symlink():
            if entry.name.endswith(".ipynb") or os.path.isdir(entry.path):
                refused.append((entry.path, "a symbolic link: the grader does not follow links in a class folder"))
        elif entry.is_dir(follow_symlinks=False):
            if entry.name.endswith(".ipynb"):
                refused.append((entry.path, "not a regular file (a folder)"))
            elif depth >= MAX_DEPTH:
                refused.append((entry.path, f"a folder more than {MAX_DEPTH} levels deep"))
            else:
                _walk(entry.path, depth + 1, found, refused)
        elif entry.name.endswith(".ipynb"):
            found.append(entry.path)


def collect(paths, exclude=()) -> list[Submission]:
    """The submissions named by ``paths`` (notebooks, or folders searched for ``*.ipynb``, ``exclude`` left
    out of the search), read into memory. A notebook named here is read through a link; inside a folder
    nothing is. Raises FileNotFoundError for a path that does not exist."""
    excluded = {os.path.realpath(p) for p in exclude}
    rows: list[tuple[str, str, str | None]] = []  # (path, student, refusal); student "" for a named file
    for given in map(os.fspath, paths):
        if os.path.isdir(given):
            found: list[str] = []
            refused: list[tuple[str, str]] = []
            _walk(given, 0, found, refused)
            for path, reason in [(p, None) for p in found if os.path.realpath(p) not in excluded] + refused:
                parts = Path(os.path.relpath(path, given)).parts
                student = parts[0] if len(parts) > 1 else Path(parts[0]).stem
                rows.append((path, student, reason))
        elif os.path.lexists(given):
            rows.append((given, "", None))
        else:
            raise FileNotFoundError(given)
    stems = [Path(path).stem for path, student, _ in rows if not student]
    subs = []
    data: bytes | None
    error: str | None
    for path, student, reason in rows:
        if reason:
            data, error = None, reason
        elif student:
            data, error = read_regular(path)
        else:  # a file given by name: its stem, or folder/stem when two share a stem
            p = Path(path)
            student = f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem
            data, error = read_regular(os.path.realpath(path))
        subs.append(Submission(path, path, student, data, error))
    return subs


def refuse_target(path: str, option: str) -> None:
    """Raise OutputError when ``path`` cannot be an output: a link or a folder there, or no folder for it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise OutputError(f"{option} {path}: {err.strerror or err}") from None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise OutputError(f"{option} {path}: a symbolic link is there; the grader does not write through links")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{option} {path}: something that is not a regular file is there (a folder?)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{option}: the folder of {path} does not exist")


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (another thread may create files)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def write_atomic(path: str, text: str, option: str) -> None:
    """Write ``text`` (UTF-8) to a temporary file beside ``path``, then rename it over ``path``, with the mode
    an ordinary new file gets (0644 under the usual umask 022). Raises OutputError (the target unchanged, the
    temporary file removed)."""
    refuse_target(path, option)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".grade-", suffix=".tmp", dir=folder)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise OutputError(f"{option} {path}: {err.strerror or err}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
