"""The bubblewrap command line of a sandbox, the interpreter it shows, and reading what its holder reports.

A sandbox sees the system's libraries and the interpreter's folders read-only, its copy of the package, the
notebook, a private read-only ``/proc``, a ``/dev`` of four devices and a size-limited ``/tmp`` (the only place it
can write); nothing else (docs/sandbox.md). The seccomp filter is read from a file descriptor.
"""

from __future__ import annotations

import inspect
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from . import package_copy

COPY_MOUNT = "/opt/modern-block"
NOTEBOOK_MOUNT = "/submission/notebook.ipynb"
TMPFS_BYTES = 256 << 20  # the sandbox's private /tmp
DEVICES = ("null", "zero", "random", "urandom")
ENV = {"HOME": "/tmp", "TMPDIR": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
       "LC_ALL": "C.UTF-8", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib", "IPYTHONDIR": "/tmp/.ipython",
       "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}


class InterpreterError(Exception):
    """The interpreter that is to run the submissions cannot be asked about itself."""


@dataclass(frozen=True)
class Interpreter:
    """A Python installation as the sandbox needs it: the executable, the folders to show, ``sys.path``."""

    executable: str
    folders: tuple[str, ...]
    path: tuple[str, ...]

    @classmethod
    def of(cls, python: str | None) -> Interpreter:
        """The interpreter ``python`` (default: this one), asked about itself."""
        if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
            info = describe_interpreter()
        else:
            code = f"import json\n{inspect.getsource(describe_interpreter)}\nprint(json.dumps(describe_interpreter()))"
            try:
                out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                                     stdin=subprocess.DEVNULL)
                info = json.loads(out.stdout)
            except (OSError, subprocess.SubprocessError, ValueError) as err:
                raise InterpreterError(f"cannot ask {python} about its installation: {err}") from None
        return cls(info["executable"], tuple(info["folders"]), tuple(info["path"]))


def describe_interpreter() -> dict:
    """This interpreter's executable, installation folders (with the virtual environment's) and ``sys.path``
    (without the working folder). Runs in other interpreters too: self-contained."""
    import os
    import sys

    real = os.path.realpath
    folders = {real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    path = [real(p) for p in sys.path if p and os.path.isdir(p) and real(p) != real(os.getcwd())]
    folders |= {p for p in path if os.path.basename(p) in ("site-packages", "dist-packages")}
    return {"executable": real(sys.executable), "folders": sorted(folders), "path": path}


def _inside(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _outermost(paths) -> list[str]:
    """The paths with those inside another removed."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not _inside(p, out):
            out.append(p)
    return out


def installed_packages(paths) -> list[str]:
    """Every ``modern_block`` folder on the interpreter's path, and the checkout around this one."""
    found = [os.path.join(p, "modern_block") for p in paths if os.path.isdir(os.path.join(p, "modern_block"))]
    found.append(str(package_copy.PACKAGE))
    checkout = package_copy.PACKAGE.parent
    if (checkout / "pyproject.toml").is_file():
        found.append(str(checkout))
    return [os.path.realpath(p) for p in found]


def bwrap_features(bwrap: str) -> frozenset[str]:
    """The newer options this bubblewrap has (``--disable-userns`` from 0.8, ``--size`` from 0.5)."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(option for option in ("--disable-userns", "--size") if option in text)


def bwrap_command(bwrap: str, interpreter: Interpreter, copy: str, notebook: str | None, hidden: list[str],
                  argv: list[str], features: frozenset[str] = frozenset({"--disable-userns", "--size"}),
                  seccomp_fd: int | None = None) -> list[str]:
    """The bubblewrap command line for one sandbox (see the module's docstring)."""
    cmd = [bwrap, *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []), "--unshare-all",
           "--unshare-user", *(["--disable-userns"] if "--disable-userns" in features else []),
           "--cap-drop", "ALL", "--uid", "1000", "--gid", "1000", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in ENV.items():
        cmd += ["--setenv", key, value]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    size = ["--size", str(TMPFS_BYTES)] if "--size" in features else []
    # the private /tmp before the interpreter's folders: an interpreter (a virtual environment) under /tmp is
    # bound on top of it, not hidden by it
    cmd += ["--proc", "/proc", "--remount-ro", "/proc", "--tmpfs", "/dev"]
    for device in DEVICES:
        cmd += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        cmd += ["--symlink", target, f"/dev/{name}"]
    cmd += ["--remount-ro", "/dev", *size, "--tmpfs", "/tmp"]
    shown = ["/usr", *_outermost(f for f in interpreter.folders if not _inside(f, ["/usr"]))]
    for folder in shown[1:]:
        cmd += ["--ro-bind", folder, folder]
    for path in _outermost(p for p in hidden if _inside(p, shown) and os.path.isdir(p)):
        cmd += ["--tmpfs", path]  # an empty folder over it
    cmd += ["--ro-bind", copy, COPY_MOUNT]
    if notebook is not None:
        cmd += ["--ro-bind", notebook, NOTEBOOK_MOUNT]
    return cmd + ["--chdir", "/tmp", "--", *argv]


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def read_until(fd: int, deadline: float, done) -> bytes:
    """Bytes from ``fd`` until ``done(data)`` or end of file; raises TimeoutError at ``deadline``."""
    data = b""
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no answer in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def json_complete(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except ValueError:
        return False
