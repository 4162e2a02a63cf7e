"""Files written so that a reader never sees half of one.

Every file is written to a temporary file with a unique name in the same folder and renamed onto
its final name (``os.replace`` is atomic), so a reader sees the old file or the new one, never
half of one. A failed write (a full disk) removes its temporary file; the old file stays.
"""

import os
import tempfile
from pathlib import Path


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
