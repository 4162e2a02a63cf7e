"""Each submission runs in a bubblewrap sandbox of its own (docs/sandbox.md says what it stops).

Never as root: a grader started as root runs bubblewrap and the zygote as a user of their own (``sandbox_user``).
New user, mount, pid, network, IPC and UTS namespaces; a cgroup per sandbox (``cgroups``), refused without one
unless ``NO_CGROUP_FLAG`` accepts per-process limits; without bubblewrap refused unless ``UNSAFE_FLAG``. The
student's process is forked by the pre-loaded zygote (importing torch anew would cost most of a class's time),
enters the namespaces, loads the seccomp filter and talks to the grader over a socket pair (``wire``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import package_copy, seccomp_filter, wire
from .bwrap import (
    COPY_MOUNT,
    ENV,
    TMPFS_BYTES,
    Interpreter,
    InterpreterError,
    bwrap_command,
    bwrap_features,
    installed_packages,
    json_complete,
    kill_group,
    read_until,
)
from .cgroups import Cgroups, Group, scope_command, v2_group
from .sandbox_user import sandbox_user, user_processes

STARTUP_TIMEOUT = 180.0  # seconds for the zygote to import torch, or a sandbox to start, on a busy machine
INTERPRETER_BYTES = 1 << 30  # memory of the loaded interpreter (torch, IPython), on top of --memory-mb
PROCESSES = 128  # processes and threads of one sandbox (with a cgroup)
EXTRA_PROCESSES = 64  # without a cgroup: processes a submission may add to its user's count
OPEN_FILES = 256  # open files of each of its processes (no process can hold more pipes or sockets' buffers)
UNSAFE_FLAG = "--no-sandbox-i-trust-these-notebooks"
NO_CGROUP_FLAG = "--no-cgroup-i-accept-per-process-limits"  # Limits(without_cgroup=True)
STATUS_LINE = 4096  # bytes of one report of the process that enters a sandbox
_PROBE = "import sys; sys.exit(0 if sys.path else 1)"


class SandboxLost(BaseException):
    """The student's process timed out, died or sent garbage. A BaseException, so that no ``except
    Exception`` inside a check can mistake it for the student's error."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class SandboxError(Exception):
    """The grader cannot start sandboxes at all (exit status 2)."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 2048  # memory a submission may use on top of the loaded interpreter
    cpu_seconds: int = 630  # CPU time of each of its processes (a backstop: the grader's clocks act first)
    sandbox: bool = True  # False: plain processes, no isolation (--no-sandbox-i-trust-these-notebooks)
    without_cgroup: bool = False  # True: grade where no cgroup can be made (--no-cgroup-i-accept-per-process-limits)


class Sandbox:
    """One submission's process, reached through a socket; ``close`` ends it and all it started."""

    def __init__(self, sock: socket.socket, status: socket.socket, holder: subprocess.Popen | None,
                 group: Group | None, files: list[Path]):  # files: the sandbox's private folders
        self.sock, self.status, self.holder, self.group, self.files = sock, status, holder, group, files
        self.pid: int | None = None  # the student's process, as the joiner reports it
        self.joining: int | None = None  # the joiner, waiting to be moved into the cgroup
        self.ended: int | None = None  # its wait status, once reported
        self.closed = False
        self.error: str | None = None  # the joiner's, when it could not start the student's process
        self._lines = b""

    def request(self, message: dict, deadline: float) -> dict:
        """Send one request and return the checked reply. Raises SandboxLost."""
        if self.closed:
            raise SandboxLost("died", "the process had already ended")
        try:
            wire.send(self.sock, message, timeout=max(0.01, deadline - time.monotonic()))
            reply = wire.receive(self.sock, deadline)
        except TimeoutError:
            lost = SandboxLost("timed out")
        except (EOFError, OSError):
            lost = SandboxLost("died", self.how_it_ended())
        except wire.ProtocolError as err:
            lost = SandboxLost("garbled", str(err))
        else:
            if isinstance(reply, dict):
                return reply
            lost = SandboxLost("garbled", "a reply that is not a dict")
        self.close()
        raise lost

    def read_status(self, timeout: float, joining: bool = False) -> None:
        """Read the joiner's reports (its own pid when it waits for its cgroup, the student's pid, then its wait
        status) that arrive within ``timeout`` (``joining``: until the joiner's own pid)."""
        deadline = time.monotonic() + timeout
        while self.ended is None and not self.closed and not (joining and self.joining is not None):
            if not select.select([self.status], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return
            try:
                chunk = self.status.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                return
            self._lines = (self._lines + chunk)[-STATUS_LINE:]
            while b"\n" in self._lines:
                line, self._lines = self._lines.split(b"\n", 1)
                try:
                    report = json.loads(line)
                except ValueError:
                    continue
                if isinstance(report.get("joining"), int):
                    self.joining = report["joining"]
                if isinstance(report.get("pid"), int):
                    self.pid = report["pid"]
                if isinstance(report.get("status"), int):
                    self.ended = report["status"]
                if isinstance(report.get("error"), str):
                    self.ended, self.error = -1, report["error"]

    def how_it_ended(self) -> str:
        """How the student's process ended, if that is known within a second."""
        self.read_status(1.0)
        if self.group is not None and self.group.out_of_memory():
            return "the process was killed: it ran out of memory (the sandbox's limit)"
        status = self.ended
        if status is None or status < 0:
            return "the process closed its connection to the grader"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            why = {"SIGKILL": " (killed: out of memory, or by the submission)", "SIGXCPU": " (its CPU-time limit)",
                   "SIGSEGV": " (a crash)"}.get(name, "")
            return f"the process was ended by signal {name}{why}"
        return f"the process exited with status {os.WEXITSTATUS(status)} (exit() or os._exit in the code?)"

    def close(self) -> None:
        """End the student's process and everything it started: with a sandbox, bubblewrap's pid namespace
        (its init dies with the bwrap process, and the kernel kills every process in it)."""
        if self.closed:
            return
        if self.holder is None:
            self.read_status(0.5)
        self.closed = True
        for s in (self.sock, self.status):
            with contextlib.suppress(OSError):
                s.close()
        if self.holder is not None:
            kill_group(self.holder.pid)
            self.holder.wait()
        elif self.pid is not None:
            kill_group(self.pid)  # no sandbox: its session (a process that left it survives)
        if self.group is not None:
            self.group.remove()
        for folder in self.files:
            shutil.rmtree(folder, ignore_errors=True)


class Launcher:
    """Starts sandboxes: bubblewrap builds each one, the zygote's pre-loaded interpreter enters it."""

    def __init__(self, python: str | None = None, limits: Limits = Limits()):
        if not sys.platform.startswith("linux"):
            raise SandboxError("the grader runs each submission in a Linux sandbox (bubblewrap): run it on Linux "
                               "or in the container of docs/instructors.md; in a notebook the checks work everywhere")
        self.limits = limits
        try:
            self.interpreter = Interpreter.of(python)
        except InterpreterError as err:
            raise SandboxError(str(err)) from None
        self.lock = threading.Lock()
        self.count = 0
        self.started = False  # a sandbox has started: later failures are the submission's, not the setup's
        self.run_dir = Path(tempfile.mkdtemp(prefix="modern-block-grade-"))
        try:
            self.user = sandbox_user() if limits.sandbox else None
        except LookupError as err:
            raise SandboxError(str(err)) from None
        self.uid = self.user[0] if self.user else os.getuid()
        self.as_user: dict = {}  # Popen's arguments that start a process as that user
        if self.user is not None:
            self.run_dir.chmod(0o711)  # the sandbox user reaches the files it is given by name, lists nothing
            self.as_user = {"user": self.user[0], "group": self.user[1], "extra_groups": []}
        self.hidden = [*installed_packages(self.interpreter.path), str(self.run_dir)]
        self.cgroups: Cgroups | None = None
        self.scope_problem = ""  # why the systemd scope could not be used, where it was tried
        self.bwrap: str | None = None
        self.features: frozenset[str] = frozenset()
        self.zygote: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.seccomp = b""
        try:
            if limits.sandbox:
                self.bwrap = shutil.which("bwrap")
                if self.bwrap is None:
                    raise SandboxError(self._refusal("bubblewrap is not installed"))
                try:
                    self.seccomp = seccomp_filter.program()
                except seccomp_filter.SeccompUnavailable as err:
                    raise SandboxError(self._refusal(str(err))) from None
                (self.run_dir / "seccomp.bpf").write_bytes(self.seccomp)
                self.features = bwrap_features(self.bwrap)
                self._probe()
                self.cgroups = Cgroups.open()
            self._start_zygote()
            if limits.sandbox and self.cgroups is None and not limits.without_cgroup:
                raise SandboxError(self._no_cgroup())
        except BaseException:
            self.close()
            raise

    def hide(self, paths) -> None:
        """Also hide these folders (the class's, the reference's) from every sandbox started from now on,
        should they lie inside a folder the sandbox shows."""
        with self.lock:
            self.hidden.extend(os.path.realpath(p) for p in paths if os.path.realpath(p) not in self.hidden)

    @property
    def whole_sandbox_limits(self) -> str:
        """How memory, processes and CPU are bounded, in words."""
        if not self.limits.sandbox:
            return "no sandbox: limits on each process only"
        if self.cgroups is not None:
            return f"a cgroup per sandbox (cgroup v{self.cgroups.version}: memory, processes, CPU)"
        return f"limits on every process plus the sandbox's pid namespace (no cgroup: {NO_CGROUP_FLAG})"

    def _no_cgroup(self) -> str:
        tried = f"; systemd-run: {self.scope_problem}" if self.scope_problem else ""
        return ("the grader bounds each sandbox's memory, processes and CPU with a cgroup and cannot make one here "
                f"(cgroup v1 controllers not writable, no delegated cgroup v2 subtree{tried}). Run it as root, "
                "or in a delegated scope (systemd-run --user --scope -p Delegate=yes python -m modern_block grade "
                f"...), or pass {NO_CGROUP_FLAG} to bound each process of a submission only (address space, CPU "
                "time, processes, open files; memfd, shared memory and new sockets are refused), so that its "
                "processes together may hold more memory than --memory-mb")

    def _refusal(self, why: str) -> str:
        who = f" for uid {self.uid}" if self.user else ""
        for knob in ("kernel/unprivileged_userns_clone", "user/max_user_namespaces"):
            with contextlib.suppress(OSError):
                if Path("/proc/sys", knob).read_text().strip() == "0":
                    why += f" (the kernel refuses user namespaces{who}: sysctl {knob.replace('/', '.')} is 0)"
        if self.user is not None and "Permission denied" in why:
            why += (f" (the sandboxes run as uid {self.uid}, which must be able to read the interpreter "
                    f"{self.interpreter.executable} and its folders: chmod o+rx them, or o+x a private folder above)")
        return (f"the grader runs every submission in a bubblewrap sandbox and cannot start one here: {why}. "
                "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) on a kernel that allows user "
                "namespaces, or grade in the container of docs/instructors.md. To grade without a sandbox, "
                f"giving every notebook your user's files, processes and network, pass {UNSAFE_FLAG}.")

    def _seccomp_fd(self) -> int:
        """A fresh descriptor of the filter's program, for bubblewrap's ``--seccomp`` (it reads it to the end)."""
        return os.open(self.run_dir / "seccomp.bpf", os.O_RDONLY)

    @property
    def _bwrap(self) -> str:
        """bubblewrap's path, where sandboxes are in use."""
        if self.bwrap is None:
            raise SandboxError("no sandbox: bubblewrap is not in use")
        return self.bwrap

    def _probe(self) -> None:
        copy = package_copy.build(self.run_dir, frozenset())
        fd = self._seccomp_fd()
        cmd = bwrap_command(self._bwrap, self.interpreter, str(copy), None, self.hidden,
                            [self.interpreter.executable, "-I", "-S", "-c", _PROBE], self.features, fd)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                                  pass_fds=[fd], cwd="/", **self.as_user)
        except (OSError, subprocess.SubprocessError) as err:
            raise SandboxError(self._refusal(str(err))) from None
        finally:
            os.close(fd)
        if done.returncode != 0:
            raise SandboxError(self._refusal((done.stderr.strip() or f"exit status {done.returncode}")[-500:]))

    def _private_folder(self, prefix: str) -> Path:
        """A folder of the run with a random name, only the sandbox user's (mode 0700)."""
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self.run_dir))
        if self.user is not None:
            os.chown(folder, *self.user)
        return folder

    def _start_zygote(self) -> None:
        """Start the zygote: in a systemd scope of its own, which then holds the sandboxes' cgroups, where no
        other cgroup could be made and systemd is there; else as a plain process."""
        home = self._private_folder("zygote-")
        argv = [self.interpreter.executable, "-I", "-S", "-c",
                (Path(__file__).parent / "zygote.py").read_text(encoding="utf-8"), "FD",
                json.dumps(list(self.interpreter.path)), self.seccomp.hex()]
        scope = scope_command(argv, self.user) if self.limits.sandbox and self.cgroups is None else None
        if scope is not None:
            try:
                manager = {k: v for k, v in os.environ.items() if k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")}
                self._start(scope, home, {}, manager)  # (the user's manager is found through these)
                base = v2_group(self.zygote.pid) if self.zygote else None
                self.cgroups = Cgroups.open(base) if base is not None else None
                if self.cgroups is not None:
                    return
                self.scope_problem = f"its scope {base} cannot be managed"
            except SandboxError as err:
                self.scope_problem = " ".join(str(err).split())[-300:]
            self._stop_zygote()
        self._start(argv, home, self.as_user)

    def _start(self, argv: list[str], home: Path, as_user: dict, manager: dict | None = None) -> None:
        mine, theirs = socket.socketpair()
        argv = [str(theirs.fileno()) if arg == "FD" else arg for arg in argv]
        env = {**ENV, "MPLCONFIGDIR": str(home / "matplotlib"), "IPYTHONDIR": str(home / "ipython"), "HOME": str(home)}
        env.update(manager or {})
        log = home.with_suffix(".log")
        try:
            with open(log, "wb") as out:
                self.zygote = subprocess.Popen(argv, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=out,
                                               stderr=out, pass_fds=[theirs.fileno()], start_new_session=True,
                                               **as_user)
        except OSError as err:
            raise SandboxError(f"cannot start {argv[0]}: {err}") from None
        finally:
            theirs.close()
        self.control = mine
        try:
            answer = read_until(mine.fileno(), time.monotonic() + STARTUP_TIMEOUT, lambda d: d.endswith(b"\n"))
            if answer == b"ready\n":
                return
        except TimeoutError:
            pass
        tail = log.read_text(errors="replace")[-2000:]
        raise SandboxError(f"the grader's interpreter ({self.interpreter.executable}) did not start:\n{tail}")

    def _stop_zygote(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.zygote is not None:
            kill_group(self.zygote.pid)
            self.zygote.wait()
            self.zygote = None

    def _notebook_file(self, number: int, notebook: bytes | None, files: list) -> Path | None:
        """The submission's copy that bubblewrap binds, alone in a folder with a random name that only the
        sandbox user may open; the folder is listed in ``files``."""
        if notebook is None:
            return None
        folder = self._private_folder(f"n{number}-")
        files.append(folder)
        nb = folder / "notebook.ipynb"
        nb.write_bytes(notebook)
        if self.user is not None:
            os.chown(nb, *self.user)
        nb.chmod(0o400)
        return nb

    def _holder(self, number: int, copy: Path, notebook: bytes | None, files: list) -> tuple[subprocess.Popen, int]:
        """Start bubblewrap for one sandbox with a first process that holds its namespaces open (a shell that says
        so on a pipe, then sleeps); bubblewrap's process and that first process's pid."""
        nb = self._notebook_file(number, notebook, files)
        seccomp = self._seccomp_fd()
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        if self.user is not None:
            os.fchown(ready_w, *self.user)  # the shell inside reopens it through /proc/self/fd
        argv = ["/bin/sh", "-c", f"printf x > /proc/self/fd/{ready_w} && exec sleep 2147483647"]
        try:
            cmd = bwrap_command(self._bwrap, self.interpreter, str(copy), str(nb) if nb else None, self.hidden, argv,
                                self.features, seccomp)
            cmd[-len(argv) - 1:-len(argv) - 1] = ["--info-fd", str(info_w)]
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    pass_fds=[info_w, ready_w, seccomp], start_new_session=True,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd="/", **self.as_user)
        finally:
            for fd in (info_w, ready_w, seccomp):
                os.close(fd)
        try:
            deadline = time.monotonic() + 60
            ready = read_until(ready_r, deadline, lambda d: len(d) >= 1)
            info = json.loads(read_until(info_r, deadline, json_complete) or b"{}")
            if ready != b"x" or not isinstance(info.get("child-pid"), int):
                raise OSError("bubblewrap did not start")
            return proc, info["child-pid"]
        except (OSError, ValueError, TimeoutError) as err:
            kill_group(proc.pid)
            proc.wait()
            said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SandboxError(self._refusal(said.strip()[-500:] or str(err))) from None
        finally:
            os.close(info_r)
            os.close(ready_r)
            if proc.stderr is not None:
                proc.stderr.close()

    def spawn(self, hidden: frozenset[str], notebook: bytes | None = None) -> Sandbox:
        """A fresh sandbox, its package copy without the components ``hidden``, serving requests. Raises
        SandboxError when no sandbox has ever started, SandboxLost when this one does not."""
        with self.lock:
            self.count += 1
            number = self.count
            copy = package_copy.build(self.run_dir, hidden)
        ours, theirs = socket.socketpair()
        status, status_theirs = socket.socketpair()
        box = Sandbox(ours, status, None, None, [])
        try:
            try:
                if self.cgroups is not None:
                    with self.lock:
                        box.group = self.cgroups.create(self.limits.memory_mb * (1 << 20) + INTERPRETER_BYTES +
                                                        TMPFS_BYTES, PROCESSES)
                spec: dict[str, Any] = {
                    "sandbox": self.bwrap is not None, "memory_mb": self.limits.memory_mb, "open_files": OPEN_FILES,
                    "cpu_seconds": self.limits.cpu_seconds, "cgroup": box.group is not None,
                    "processes": None if box.group else user_processes(self.uid) + EXTRA_PROCESSES}
                if self.bwrap:
                    box.holder, spec["pid"] = self._holder(number, copy, notebook, box.files)
                    spec.update(path=[COPY_MOUNT, *self.interpreter.path], workdir="/tmp", env=ENV)
                else:
                    workdir = self._private_folder(f"work-{number}-")
                    box.files.append(workdir)
                    spec.update(path=[str(copy), *self.interpreter.path], workdir=str(workdir),
                                env={**ENV, "HOME": str(workdir), "TMPDIR": str(workdir), "MPLCONFIGDIR":
                                     str(workdir / "matplotlib"), "IPYTHONDIR": str(workdir / ".ipython")})
                try:
                    with self.lock:
                        if self.control is None:
                            raise SandboxError("the zygote is not running")
                        socket.send_fds(self.control, [json.dumps(spec).encode()],
                                        [theirs.fileno(), status_theirs.fileno()])
                except OSError:
                    raise SandboxError("the grader's pre-loaded interpreter has ended") from None
            finally:
                theirs.close()
                status_theirs.close()
            if box.group is not None:  # the process that enters the sandbox waits until it is in its cgroup
                box.read_status(STARTUP_TIMEOUT, joining=True)
                if box.joining is None:
                    raise OSError(box.error or "it did not report")
                box.group.add(box.joining)
                box.status.sendall(b"go\n")
            ready = wire.receive(ours, time.monotonic() + STARTUP_TIMEOUT)
        except (TimeoutError, EOFError, OSError, wire.ProtocolError) as err:
            box.read_status(1.0)
            why = box.error or (str(err) if isinstance(err, OSError) else "") or type(err).__name__
            box.close()
            if not self.started:
                raise SandboxError(self._refusal(f"a process could not enter it ({why})")) from None
            raise SandboxLost("died", f"the sandboxed process did not start ({why})") from None
        except BaseException:
            box.close()
            raise
        box.read_status(0)
        if ready != {"ready": True}:
            box.close()
            raise SandboxLost("garbled", "an unexpected first message")
        self.started = True
        return box

    def close(self) -> None:
        self._stop_zygote()
        if self.cgroups is not None:
            self.cgroups.close()
            self.cgroups = None
        shutil.rmtree(self.run_dir, ignore_errors=True)
