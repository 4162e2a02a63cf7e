"""The system calls a submission may not make: a seccomp filter built with libseccomp (through its own Python
binding, ``seccomp``, where the system has it: Debian's ``python3-seccomp`` with the system's site packages;
else ``pyseccomp``, which calls the same library), as Flatpak builds its own, exported as the classic BPF
program that bubblewrap's ``--seccomp FD`` and ``prctl(PR_SET_SECCOMP)`` load.

Refused with EPERM: io_uring, the kernel keyring, ptrace and reading or writing other processes' memory,
every way to mount or to make or enter a namespace (``unshare``, ``setns``, ``clone`` with a namespace flag;
``clone3``, whose flags the filter cannot read, answers ENOSYS so that the C library falls back to ``clone``),
BPF programs, performance counters, userfaultfd, kexec and kernel modules; and every way to hold memory that
no address-space limit counts and no cgroup may be there to count: memfd, System V shared memory, message
queues and semaphores, POSIX message queues, and new sockets (the buffers of a Unix socket are charged to no
cgroup: a process could hold gigabytes in them). A new AF_UNIX socket answers EPERM, one of any other family
EAFNOSUPPORT; the socket the grader hands over is the only one. System calls of another architecture (the
32-bit ABI) kill the process.
Everything else is allowed: the filter narrows the kernel's surface, the namespaces and the unprivileged
uid do the isolating.
"""

from __future__ import annotations

import errno
import functools
import socket
import tempfile

DENIED = ("io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "ptrace",
          "process_vm_readv", "process_vm_writev", "mount", "umount", "umount2", "pivot_root", "move_mount",
          "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns", "bpf",
          "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
          "delete_module", "open_by_handle_at", "name_to_handle_at", "acct", "swapon", "swapoff", "reboot",
          "memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open")
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}


class SeccompUnavailable(Exception):
    """libseccomp or its Python binding is missing: no filter can be built."""


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The filter as a BPF program (8 bytes per instruction). Raises SeccompUnavailable."""
    sc = binding()
    rules = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        _add(sc, rules, sc.ERRNO(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS.values():  # clone(flags, ...): the first argument, one rule per flag
        _add(sc, rules, sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _add(sc, rules, sc.ERRNO(errno.ENOSYS), "clone3")
    for name in ("socket", "socketpair"):
        _add(sc, rules, sc.ERRNO(errno.EAFNOSUPPORT), name, sc.Arg(0, sc.NE, socket.AF_UNIX))
        _add(sc, rules, sc.ERRNO(errno.EPERM), name, sc.Arg(0, sc.EQ, socket.AF_UNIX))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


def binding():
    """libseccomp's own binding where it is importable, else pyseccomp. Raises SeccompUnavailable."""
    try:
        import seccomp as sc  # type: ignore[import-not-found]

        return sc
    except ImportError:
        pass
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as err:
        raise SeccompUnavailable(f"the seccomp binding is missing ({err}): pip install pyseccomp, and libseccomp "
                                 "(Debian/Ubuntu: apt-get install libseccomp2)") from None
    return sc


def _add(sc, rules, action: int, name: str, *args) -> None:
    try:
        rules.add_rule(action, name, *args)
    except (OSError, RuntimeError, ValueError):  # a system call this architecture does not have
        if sc.resolve_syscall(sc.system_arch(), name) >= 0:
            raise
