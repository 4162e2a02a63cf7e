"""The grader's files (docs/sandbox.md): the class folder read lazily, one student at a time bounded, no link below
the class root followed (``read_inside``); outputs that nothing planted at their paths can redirect.

The class root is the folder given, or the one common to the paths given; the student is the name directly under
it. Links, special files, over-deep folders, over-large files and over-full student folders get error rows of
their own; no other row changes.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from ...training.files import write_text_atomic
from .grade_report import one_line
from .notebook import MAX_NOTEBOOK_BYTES, TOO_LARGE

MAX_DEPTH = 16  # folder levels below a student's folder
MAX_FILES = 20_000  # rows in one run: a class root with more is refused as a whole, never cut
MAX_STUDENT_ENTRIES = 2_000  # files and folders looked at in one student's folder
MAX_STUDENT_FILES = 64  # notebooks of one student
MAX_STUDENT_BYTES = 64 << 20  # bytes of one student's notebooks together
_EAST_ASIAN = {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "IDEOGRAPHIC"}  # scripts one name mixes legitimately


class OutputError(Exception):
    """An output file cannot be written (its path is refused, or the disk says no)."""


class UsageError(ValueError):
    """The grader cannot run with these arguments or paths (exit status 2)."""


@dataclass
class Submission:
    path: str
    notebook: str  # as shown in the report
    student: str  # as shown in the report (escaped)
    read_error: str | None = None  # set at collection: the row is an error, nothing is read
    root: str = ""  # the class root: no link below it is followed
    name: str = ""  # the student's folder name as it is (rows are keyed by it; ``student`` shows it)

    def read(self) -> tuple[bytes | None, str | None]:
        """The notebook's bytes now, or why there are none."""
        if self.read_error:
            return None, self.read_error
        return read_inside(self.path, self.root) if self.root else read_regular(self.path)


def read_regular(path: str, dir_fd: int | None = None) -> tuple[bytes | None, str | None]:
    """A regular file's bytes (at most ``MAX_NOTEBOOK_BYTES``), or why it is not read. Links are not followed,
    and nothing is opened that could block (a pipe) or act (a device). ``dir_fd``: ``path`` is relative to it."""
    try:
        info = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            return None, "a symbolic link: the grader reads only regular files"
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > MAX_NOTEBOOK_BYTES:
            return None, TOO_LARGE
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
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
            return None, TOO_LARGE
        return b"".join(chunks), None
    except OSError as err:
        return None, f"cannot read the file ({err.strerror or err})"
    finally:
        os.close(fd)


LINK = "a symbolic link: the grader does not follow links in a class folder"


def read_inside(path: str, folder: str) -> tuple[bytes | None, str | None]:
    """The regular file ``path`` below ``folder`` (taken as given: the instructor named it), or why it is not read.
    Every folder on the way down and the file are opened with ``O_NOFOLLOW`` relative to the one above, so a link
    anywhere below ``folder`` is refused and nothing can be swapped in between the check and the read."""
    parts = os.path.relpath(os.path.abspath(path), os.path.abspath(folder)).split(os.sep)
    if parts[0] in (os.curdir, os.pardir):
        return None, "not inside the class folder"
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return None, f"cannot read the folder {one_line(folder)} ({err.strerror or err})"
    try:
        for part in parts[:-1]:
            below = os.open(part, nofollow | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        return read_regular(parts[-1], fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            return None, LINK
        return None, f"cannot read the file ({err.strerror or err})"
    finally:
        os.close(fd)


def name_problem(name: str) -> str | None:
    """Why a student's name cannot be trusted in a gradebook, or None: control, format or separator
    characters (a newline forges CSV lines, U+202E reverses text), characters that stand for others
    (NFKC: fullwidth or mathematical letters), or letters of more than one script (``hоnest01`` with a
    Cyrillic ``о`` looks like ``honest01``)."""
    if one_line(name) != name:
        return "control or invisible characters"
    if unicodedata.normalize("NFKC", name) != unicodedata.normalize("NFC", name):
        return "characters that stand for others (fullwidth, mathematical or compatibility forms)"
    scripts = set()
    for ch in name:
        if unicodedata.category(ch).startswith("L"):
            script = unicodedata.name(ch, "UNKNOWN").split(" ")[0]
            scripts.add("CJK" if script in _EAST_ASIAN else script)
    if len(scripts) > 1:
        return f"letters of more than one script ({', '.join(sorted(scripts)).lower()}): a look-alike of another name?"
    return None


@dataclass
class _Student:
    """One student's folder, walked with its caps."""

    entries: int = 0
    files: int = 0
    bytes: int = 0
    found: list[tuple[str, str | None]] = field(default_factory=list)  # (path, refusal)
    over: str | None = None

    def look(self, size: int = 0, notebook: bool = False) -> bool:
        """Count one entry; False once a cap is passed (the walk stops)."""
        self.entries += 1
        self.files += notebook
        self.bytes += size if notebook else 0
        for count, cap, what in ((self.entries, MAX_STUDENT_ENTRIES, f"{MAX_STUDENT_ENTRIES:,} files and folders"),
                                 (self.files, MAX_STUDENT_FILES, f"{MAX_STUDENT_FILES} notebooks"),
                                 (self.bytes, MAX_STUDENT_BYTES, f"{MAX_STUDENT_BYTES >> 20} MB of notebooks")):
            if count > cap:
                self.over = f"the folder holds more than {what} (the limit per student): not graded"
                return False
        return True


def _walk(folder: str, depth: int, student: _Student) -> bool:
    """Add the ``*.ipynb`` files below ``folder`` (hidden names skipped) to ``student``, in name order. False once
    a cap is passed."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for entry in it:  # lazily: a folder of a million entries is not listed whole
                if entry.name.startswith("."):
                    continue
                if not student.look():
                    return False
                entries.append(entry.path)
    except OSError as err:
        student.found.append((folder, f"cannot read the folder ({err.strerror or err})"))
        return True
    for path in sorted(entries):
        if not _add(student, path, depth + 1):
            return False
    return True


def _add(student: _Student, path: str, depth: int, named: bool = False) -> bool:
    """``path`` (never followed) into ``student``'s list: a notebook, a folder walked, or a refusal for a link,
    a special file, a folder too deep or too large a file. ``named``: a file given by name, whatever its name
    ends with. False once a cap is passed."""
    if os.path.islink(path):
        if named or path.endswith(".ipynb") or os.path.isdir(path):
            student.found.append((path, LINK))
    elif os.path.isdir(path):
        if path.endswith(".ipynb"):
            student.found.append((path, "not a regular file (a folder)"))
        elif depth > MAX_DEPTH:
            student.found.append((path, f"a folder more than {MAX_DEPTH} levels deep"))
        else:
            return _walk(path, depth, student)
    elif named or path.endswith(".ipynb"):
        try:
            info = os.lstat(path)
        except OSError as err:
            student.found.append((path, f"cannot read the file ({err.strerror or err})"))
            return True
        regular = stat.S_ISREG(info.st_mode)
        if not student.look(info.st_size if regular else 0, notebook=True):
            return False
        student.found.append((path, "not a regular file" if not regular else
                              TOO_LARGE if info.st_size > MAX_NOTEBOOK_BYTES else None))
    return True


def _root(paths: list[str]) -> str:
    """The class root: the one folder given, the folder above a single notebook's folder (so that notebook's
    student is its folder), else the folder common to all the paths given."""
    if len(paths) == 1:
        path = os.path.abspath(paths[0])
        return path if os.path.isdir(path) else os.path.dirname(os.path.dirname(path))
    try:
        return os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
    except ValueError:  # nothing in common (different drives)
        return os.path.abspath(os.sep)


def _student_of(path: str, root: str) -> str:
    parts = os.path.relpath(os.path.abspath(path), root).split(os.sep)
    return parts[0] if len(parts) > 1 else os.path.splitext(parts[0])[0]


def collect(paths, exclude=()) -> list[Submission]:
    """The submissions named by ``paths`` (notebooks, or folders searched for ``*.ipynb``, ``exclude`` left
    out), looked at, not read, each read when it is graded. Raises UsageError for a path that does not exist or a
    class root of more than ``MAX_FILES`` entries."""
    given = [os.fspath(p) for p in paths]
    for path in given:
        if not os.path.lexists(path):
            raise UsageError(f"no such notebook or folder: {path}")
    excluded = [os.path.realpath(p) for p in exclude]

    def left_out(path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == e or real.startswith(e.rstrip(os.sep) + os.sep) for e in excluded)

    root = _root(given)
    students: dict[str, _Student] = {}
    for path in given:
        if os.path.isdir(path) and os.path.abspath(path) == root:  # the class root: one student per entry
            try:
                with os.scandir(path) as it:
                    tops = []
                    for entry in it:
                        if entry.name != ".ipynb_checkpoints":  # a hidden one gets a row (below), never none
                            tops.append(entry.path)
                        if len(tops) > MAX_FILES:
                            raise UsageError(f"{path} holds more than {MAX_FILES:,} entries: grade it in parts")
            except OSError as err:
                raise UsageError(f"cannot read the folder {path} ({err.strerror or err})") from None
        else:
            tops = [path]
        for top in sorted(tops):
            if left_out(top):
                continue
            student = students.setdefault(_student_of(top, root), _Student())
            if student.over:
                continue
            beside = os.path.dirname(os.path.abspath(top)) == root and not os.path.isdir(top) and \
                os.path.isdir(os.path.splitext(top)[0])
            if os.path.basename(top).startswith(".") or beside:
                student.found.append((top, "a notebook at the class root beside the folder of the same name: not "
                                           "graded (move it into that folder)" if beside else "a hidden name (it "
                                           "starts with a dot): not graded (rename it to grade it)"))
            else:
                _add(student, top, 0, named=top == path and not os.path.isdir(path))
    subs: list[Submission] = []
    seen: set[str] = set()
    for name in sorted(students):
        student = students[name]
        if student.over:
            subs.append(_submission(os.path.join(root, name), name, student.over))
            continue
        for path, refusal in student.found:
            if not left_out(path) and os.path.abspath(path) not in seen:
                seen.add(os.path.abspath(path))
                subs.append(_submission(path, name, refusal, root))
    return subs


def _submission(path: str, name: str, refusal: str | None, root: str = "") -> Submission:
    problem = name_problem(name)
    if problem and not refusal:
        refusal = f"the name {one_line(name)!r} has {problem}: not graded (rename the folder)"
    return Submission(path, one_line(path), one_line(name), refusal, root, name)


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


def write_atomic(path: str, text: str, option: str) -> None:
    """``text`` written whole to ``path`` (the package's one atomic writer), never through a link; an OutputError
    names ``option`` and leaves it as it was."""
    refuse_target(path, option)
    try:
        write_text_atomic(Path(path), text)
    except OSError as err:
        raise OutputError(f"{option} {path}: {err.strerror or err}") from None
