"""The student's process, and the two processes that make it cheap and contained.

    grader ──control──▶ zygote (imported torch, IPython and the course package once; runs no student code)
       │                  └─ fork ─▶ shield (child subreaper: everything the student starts ends up here)
       └──socket────────────────────────└─ fork ─▶ runner: the student's code (``runner.serve``)

The runner starts in a session of its own, in a private working folder, with stdin from /dev/null and
stdout/stderr going to a file there (never to the grader), with limits on address space (memory), file
size, CPU time and core dumps, no new privileges, and, when the grader runs as root, as a user of
its own (a uid above 2,000,000,000, group nogroup) that can signal no other process. It sees a copy of the
course package without the repository around it (no solutions next to it). The grader closes the
shield's control socket to end a submission: the shield then kills the runner and every process it
started (also those that left with ``setsid``) and exits. Linux only.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import resource
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import wire

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 8, 36, 38
FILE_LIMIT = 16 << 20  # bytes a submission may write into one file (its output log included)
STARTUP_TIMEOUT = 180.0  # seconds for the zygote to import torch on a busy machine
FIRST_UID = 2_000_000_000  # as root, each submission runs as a user of its own above this (none can signal another)


class SandboxLost(BaseException):
    """The student's process timed out, died or sent garbage. A BaseException, so that no ``except
    Exception`` inside a check can mistake it for the student's error."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class SandboxError(Exception):
    """The grader cannot start student processes at all (exit status 2)."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 2048  # address space a submission may add to the pre-loaded interpreter
    cpu_seconds: int = 630  # CPU time of the student's process (a backstop; the grader's clocks act first)
    same_user: bool = False  # when root: run submissions as root, not as users of their own (weaker)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _only_read_capability() -> None:
    """Keep CAP_DAC_READ_SEARCH and nothing else (after ``setuid`` with PR_SET_KEEPCAPS): the process can
    read the Python installation even where only root may (``/root/.pyenv``), and can still signal or
    write nothing of another user."""
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = 1 << 2  # CAP_DAC_READ_SEARCH
    if ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def readable_by_all(path: str) -> bool:
    """Whether any user can read ``path`` (a folder): every folder above it lets others through."""
    p = Path(path).resolve()
    if not p.is_dir() or p.stat().st_mode & 0o005 != 0o005:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in p.parents)


# ---- in the zygote, the shield and the runner ----------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(root: int) -> list[int]:
    children, found, stack = _children_map(), [], [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            found.append(pid)
            stack.append(pid)
    return found


def _reap() -> list[tuple[int, int]]:
    done = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def kill_tree() -> None:
    """Kill every descendant of this process (it is a subreaper, so orphans come back to it) and reap them."""
    for _ in range(200):
        found = _descendants(os.getpid())
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        time.sleep(0.01)


def _runner_child(sock_fd: int, spec: dict) -> None:
    """Become the student's process: contain it, then serve the grader. Never returns."""
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        workdir = spec["workdir"]
        os.chdir(workdir)
        os.umask(0o077)
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        memory = vm + spec["memory_mb"] * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_seconds"], spec["cpu_seconds"] + 5))
        if spec.get("uid") is not None:
            _prctl(PR_SET_KEEPCAPS, int(spec["keep_read"]))
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
            if spec["keep_read"]:
                _only_read_capability()
            resource.setrlimit(resource.RLIMIT_NPROC, (2048, 2048))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file limit fails, it does not kill
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(os.path.join(workdir, "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(HOME=workdir, TMPDIR=workdir, PWD=workdir, MPLCONFIGDIR=workdir,
                          IPYTHONDIR=os.path.join(workdir, ".ipython"))
        import torch

        torch.set_num_threads(1)
        from .runner import serve

        serve(socket.socket(fileno=sock_fd))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)


def _shield(sock_fd: int, ctl_fd: int, spec: dict) -> None:
    """Start the runner, wait for the grader to close ``ctl_fd`` or the runner to end, report how it
    ended, then kill everything the runner left behind. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        pid = os.fork()
        if pid == 0:
            os.close(ctl_fd)
            _runner_child(sock_fd, spec)
        os.close(sock_fd)
        status = None
        while True:
            ready = select.select([ctl_fd], [], [], 0.1)[0]
            for child, code in _reap():
                if child == pid:
                    status = code
            if ready or status is not None:
                break
        kill_tree()
        if status is not None:
            try:
                os.write(ctl_fd, json.dumps({"status": status}).encode() + b"\n")
            except OSError:
                pass
    finally:
        os._exit(0)


def zygote_main(config: dict) -> None:
    """Import what every submission needs, then fork a shield for each request on the control socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _prctl(PR_SET_DUMPABLE, 0)  # no same-user process may ptrace the zygote
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a killed shield come back here, and are killed
    import IPython.core.interactiveshell  # noqa: F401
    import torch  # noqa: F401

    import modern_block  # noqa: F401
    import modern_block.classroom.checks  # noqa: F401
    from modern_block.classroom.grading import runner  # noqa: F401

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # matplotlib is optional for the exercises
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # shields are reaped by the kernel
    control = socket.socket(fileno=config["control_fd"])
    control.sendall(b"ready\n")
    shields: set[int] = set()
    while True:
        if not select.select([control], [], [], 1.0)[0]:
            shields = {pid for pid in shields if os.path.exists(f"/proc/{pid}")}
            for stray in set(_children_map().get(os.getpid(), [])) - shields:  # orphans of a killed shield
                _kill(stray)
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        except OSError:
            data, fds = b"", []
        if not data or len(fds) != 2:
            kill_tree()
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            control.close()
            _shield(fds[0], fds[1], json.loads(data))
        shields.add(pid)
        for fd in fds:
            os.close(fd)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# ---- in the grader ---------------------------------------------------------------------------------------

_BOOT = ("import json, sys; cfg = json.loads(sys.argv[1]); sys.path[:0] = [cfg['site']]; "
         "sys.path.extend(cfg['paths']); "
         "from modern_block.classroom.grading.sandbox import zygote_main; zygote_main(cfg)")


class Sandbox:
    """One submission's process, reached through a socket; ``close`` ends it and all it started."""

    def __init__(self, sock: socket.socket, ctl: socket.socket):
        self.sock, self.ctl, self.closed = sock, ctl, False

    def request(self, message: dict, deadline: float) -> dict:
        """Send one request and return the checked reply. Raises SandboxLost."""
        if self.closed:
            raise SandboxLost("died", "the process had already ended")
        try:
            wire.send(self.sock, message, timeout=max(0.01, deadline - time.monotonic()))
            reply = wire.clean(wire.receive(self.sock, deadline))
        except TimeoutError:
            self.close()
            raise SandboxLost("timed out") from None
        except (EOFError, OSError):
            how = self.how_it_ended()
            self.close()
            raise SandboxLost("died", how) from None
        except wire.ProtocolError as err:
            self.close()
            raise SandboxLost("garbled", str(err)) from None
        if not isinstance(reply, dict):
            self.close()
            raise SandboxLost("garbled", "a reply that is not a dict")
        return reply

    def how_it_ended(self) -> str:
        """The shield's report of the runner's exit, if it comes within a second."""
        try:
            if select.select([self.ctl], [], [], 1.0)[0]:
                status = json.loads(self.ctl.recv(1000).decode().strip() or "{}").get("status")
                if status is not None:
                    if os.WIFSIGNALED(status):
                        sig = os.WTERMSIG(status)
                        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
                        why = {"SIGKILL": " (killed: out of memory, or by the submission)",
                               "SIGXCPU": " (its CPU-time limit)", "SIGSEGV": " (a crash)"}.get(name, "")
                        return f"the process was ended by signal {name}{why}"
                    return f"the process exited with status {os.WEXITSTATUS(status)} (exit() or os._exit in the code?)"
        except (OSError, ValueError):
            pass
        return "the process ended (or closed its connection to the grader)"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for s in (self.sock, self.ctl):
                try:
                    s.close()
                except OSError:
                    pass


class Zygote:
    """The pre-loaded process that forks one contained process per submission."""

    def __init__(self, python: str | None = None, limits: Limits = Limits()):
        self.python, self.limits = python or sys.executable, limits
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.count = 0
        self.first_uid = FIRST_UID + secrets.randbelow(100_000) * 10_000  # two runs at once share no user
        if not sys.platform.startswith("linux"):
            raise SandboxError("the grader runs the submissions in Linux processes (fork, /proc, prctl): run it on "
                               "Linux or in the container of docs/instructors.md; in a notebook the checks work "
                               "everywhere")
        self.nogroup = None
        if os.geteuid() == 0 and not limits.same_user:
            try:
                self.nogroup = pwd.getpwnam("nobody").pw_gid
            except KeyError:
                self.nogroup = 65534
        self.keep_read = False  # set in start() when other users cannot read the Python installation
        self.run_dir = Path(tempfile.mkdtemp(prefix="modern-block-grade-"))
        os.chmod(self.run_dir, 0o711)
        self._copy_package()

    def _copy_package(self) -> None:
        """A copy of the course package alone: the repository around the installed package (solutions/ in a
        checkout) is not on the submissions' path."""
        package = Path(__file__).resolve().parents[2]  # modern_block/classroom/grading/sandbox.py -> modern_block
        site = self.run_dir / "site"
        shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path in [site, *site.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        (self.run_dir / "ipython").mkdir(mode=0o700)

    def _paths(self) -> list[str]:
        checkout = str(Path(__file__).resolve().parents[3])
        return [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p) != checkout
                and not os.path.isdir(os.path.join(p, "modern_block")) and os.path.abspath(p) != os.getcwd()]

    def start(self) -> None:
        """Start (or restart) the zygote and wait until it has imported everything."""
        self.stop()
        mine, theirs = socket.socketpair()
        same_python = os.path.realpath(self.python) == os.path.realpath(sys.executable)
        config = {"site": str(self.run_dir / "site"), "paths": self._paths() if same_python else [],
                  "control_fd": theirs.fileno()}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "IPYTHONDIR": str(self.run_dir / "ipython"), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
        for name in ("HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR"):  # the zygote finds matplotlib's font cache
            if name in os.environ:
                env[name] = os.environ[name]
        flags = ["-I", "-S"] if same_python else ["-I"]
        self.keep_read = not all(readable_by_all(p) for p in [sysconfig.get_paths()["stdlib"], *config["paths"]])
        log = open(self.run_dir / "zygote.log", "wb")
        try:
            self.proc = subprocess.Popen([self.python, *flags, "-c", _BOOT, json.dumps(config)], env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=[theirs.fileno()],
                                         start_new_session=True, cwd=self.run_dir)
        except OSError as err:
            raise SandboxError(f"cannot start {self.python}: {err}") from None
        finally:
            log.close()
            theirs.close()
        self.control = mine
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            if select.select([mine], [], [], 0.2)[0]:
                if mine.recv(16) == b"ready\n":
                    return
                break
        tail = (self.run_dir / "zygote.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise SandboxError(f"the sandbox process did not start with {self.python}:\n{tail}")

    def spawn(self) -> Sandbox:
        """A fresh, contained process for one submission (restarting the zygote once if it died)."""
        with self.lock:
            for attempt in range(2):
                if self.proc is None or self.proc.poll() is not None:
                    self.start()
                self.count += 1
                workdir = self.run_dir / f"w{self.count}"
                workdir.mkdir(mode=0o700)
                uid = self.first_uid + self.count if self.nogroup is not None else None  # a user per submission
                if uid is not None:
                    os.chown(workdir, uid, self.nogroup)
                spec = {"workdir": str(workdir), "memory_mb": self.limits.memory_mb, "uid": uid,
                        "gid": self.nogroup, "keep_read": self.keep_read, "cpu_seconds": self.limits.cpu_seconds}
                ours, runner_end = socket.socketpair()
                ctl, shield_end = socket.socketpair()
                try:
                    socket.send_fds(self.control, [json.dumps(spec).encode()],
                                    [runner_end.fileno(), shield_end.fileno()])
                    return Sandbox(ours, ctl)
                except OSError:
                    ours.close()
                    ctl.close()
                    self.proc.kill()
                    if attempt:
                        raise SandboxError("the sandbox process keeps dying") from None
                finally:
                    runner_end.close()
                    shield_end.close()

    def stop(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)
