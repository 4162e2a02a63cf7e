"""The system calls a submission may not make: a libseccomp filter (the system's ``seccomp`` binding where it
has one, else ``pyseccomp``), exported as the BPF program bubblewrap's ``--seccomp FD`` and ``prctl`` load.

It narrows the kernel's surface and refuses every way to hold memory no limit counts (memfd, System V and POSIX
IPC, new sockets); the namespaces and the unprivileged uid do the isolating. The list is ``DENIED`` below.
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
    except ImportError:
        try:
            import pyseccomp as sc
        except (ImportError, OSError, RuntimeError) as err:
            raise SeccompUnavailable(f"the seccomp binding is missing ({err}): pip install pyseccomp, and "
                                     "libseccomp (Debian/Ubuntu: apt-get install libseccomp2)") from None
    return sc


def _add(sc, rules, action: int, name: str, *args) -> None:
    try:
        rules.add_rule(action, name, *args)
    except (OSError, RuntimeError, ValueError):  # a system call this architecture does not have
        if sc.resolve_syscall(sc.system_arch(), name) >= 0:
            raise
