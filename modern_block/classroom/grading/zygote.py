"""The pre-loaded interpreter that puts each submission's process into its sandbox.

It imports torch and IPython once (a fresh interpreter per notebook would cost a class most of its time), then per
submission forks a joiner that waits to be moved into the sandbox's cgroup, enters its namespaces with setns(2)
as ``nsenter(1)`` does, and forks the student's process, which drops its capabilities, loads the seccomp filter,
closes every file but its socket and serves the grader (``runner.boot``). It runs as the sandbox user and is not
dumpable; bubblewrap makes the namespaces and mounts, this file only joins them.
"""

import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import sys

NAMESPACES = (("mnt", 0x00020000), ("net", 0x40000000), ("ipc", 0x08000000), ("uts", 0x04000000),
              ("pid", 0x20000000))
CLONE_NEWUSER = 0x10000000
NS_GET_PARENT = 0xB702  # ioctl: the user namespace that owns this one
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_DUMPABLE = 22, 2, 4
BOOT = "from modern_block.classroom.grading.runner import boot"

_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _setns(fd: int, kind: int, what: str) -> None:
    if _libc.setns(fd, kind) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot enter the sandbox's {what} namespace: {os.strerror(errno)}")


def enter(pid: int) -> None:
    """Enter the namespaces and the root of the sandbox whose first process is ``pid``. The mount, network,
    IPC, UTS and pid namespaces belong to the user namespace bubblewrap made first; the processes live in the
    one it nested inside it (``--disable-userns``): enter that last."""
    user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    others = [(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY), kind, name) for name, kind in NAMESPACES]
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    owner = fcntl.ioctl(user, NS_GET_PARENT)
    own = os.stat("/proc/self/ns/user").st_ino
    if os.fstat(owner).st_ino != own:
        _setns(owner, CLONE_NEWUSER, "user")
    for fd, kind, name in others:
        _setns(fd, kind, name)
        if name == "mnt":
            os.fchdir(root)
            os.chroot(".")
    if os.fstat(user).st_ino != os.fstat(owner).st_ino:
        _setns(user, CLONE_NEWUSER, "user")
    for fd in (user, owner, root, *(fd for fd, _, _ in others)):
        os.close(fd)


def drop_capabilities() -> None:
    """Give up every capability (entering a user namespace grants them all inside it) and any way to regain
    one (no new privileges)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    if _libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs failed")


def load_filter(program: bytes) -> None:
    """Put this process, and every process and thread it will start, under the seccomp filter ``program``
    (classic BPF, 8 bytes an instruction; no_new_privs is set first). Irreversible."""
    if not program or len(program) % 8:
        raise OSError("no seccomp program")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot load the seccomp filter")


def student(sock_fd: int, spec: dict, program: bytes) -> None:
    """The student's process, once inside: contain itself, then serve the grader. Never returns."""
    try:
        os.setsid()  # its own session and process group: kill(0, ...) reaches nothing of the grader's
        if spec.get("sandbox"):
            drop_capabilities()
            load_filter(program)
        os.closerange(3, sock_fd)
        os.closerange(sock_fd + 1, 1 << 16)
        if spec.get("open_files"):  # bounds the pipes (and their buffers) a process can hold
            resource.setrlimit(resource.RLIMIT_NOFILE, (spec["open_files"], spec["open_files"]))
        os.chdir(spec["workdir"])
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open("output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # its own, never the grader's
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.path[:] = spec["path"]
        namespace: dict = {}
        exec(BOOT, namespace)  # the sandbox's copy of the package: the zygote never imported it
        namespace["boot"]({**spec, "fd": sock_fd})
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)


def joiner(sock_fd: int, status_fd: int, spec: dict, program: bytes) -> None:
    """Put a process for the student into the sandbox, wait for it, report how it ended. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if spec.get("cgroup"):  # the grader moves this process into the sandbox's cgroup, then says go
            os.write(status_fd, json.dumps({"joining": os.getpid()}).encode() + b"\n")
            if os.read(status_fd, 3) != b"go\n":
                raise OSError("not moved into the sandbox's cgroup")
        if spec.get("sandbox"):
            enter(spec["pid"])
        pid = os.fork()
        if pid == 0:
            os.close(status_fd)
            student(sock_fd, spec, program)
        os.close(sock_fd)
        os.write(status_fd, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        os.write(status_fd, json.dumps({"status": status}).encode() + b"\n")
    except BaseException as err:
        try:
            os.write(status_fd, json.dumps({"error": f"{type(err).__name__}: {err}"}).encode() + b"\n")
        except OSError:
            pass
    finally:
        os._exit(0)


def main(control_fd: int, path: list, program: bytes) -> None:
    """Import what every submission needs, then fork a joiner for each request on the control socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot make the zygote non-dumpable")
    for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"):  # only for systemd-run, which started it
        os.environ.pop(name, None)
    sys.path[:] = path
    import IPython.core.interactiveshell  # noqa: F401
    import torch

    torch.set_num_threads(1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # matplotlib is optional for the exercises
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # joiners are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    control.sendall(b"ready\n")
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 16, 2)
        except OSError:
            data, fds = b"", []
        if not data or len(fds) != 2:
            os._exit(0)
        if os.fork() == 0:
            control.close()
            joiner(fds[0], fds[1], json.loads(data), program)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]), bytes.fromhex(sys.argv[3]))
