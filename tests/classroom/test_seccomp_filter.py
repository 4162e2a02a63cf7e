"""The seccomp filter of the grader's sandbox: built with libseccomp, loaded in a child process, it answers every
system call of the deny list with an error (EPERM; EAFNOSUPPORT for sockets other than AF_UNIX): the kernel's
riskier surfaces, and every way to hold memory no address-space limit counts (memfd, System V shared memory,
message queues and semaphores, POSIX message queues, new Unix sockets); and it leaves what Python, PyTorch, a
pipe and a subprocess need working."""

import json
import os
import subprocess
import sys

import pytest

from modern_block.classroom.grading import seccomp_filter

CHILD = r"""
import ctypes, errno, json, os, socket, subprocess, sys, threading
import pyseccomp
from modern_block.classroom.grading import seccomp_filter, zygote

libc = ctypes.CDLL(None, use_errno=True)
arch = pyseccomp.system_arch()


def call(name, *args):
    number = pyseccomp.resolve_syscall(arch, name)
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else errno.errorcode[ctypes.get_errno()]


def sock(family):
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        return 0
    except OSError as err:
        return errno.errorcode[err.errno]


def attempts():
    out = {name: call(name, 0, 0, 0, 0, 0) for name in ("io_uring_setup", "keyctl", "add_key", "request_key",
                                                       "bpf", "perf_event_open", "userfaultfd", "kexec_load",
                                                       "init_module", "finit_module", "mount", "umount2",
                                                       "pivot_root", "setns", "memfd_create", "memfd_secret",
                                                       "shmget", "msgget", "semget", "mq_open")}
    out["unshare(CLONE_NEWUSER)"] = call("unshare", 0x10000000)
    out["clone(CLONE_NEWNET)"] = call("clone", 0x40000000 | 17, 0, 0, 0, 0)  # SIGCHLD | CLONE_NEWNET
    out["AF_INET"], out["AF_NETLINK"], out["AF_UNIX"] = (sock(socket.AF_INET), sock(socket.AF_NETLINK),
                                                         sock(socket.AF_UNIX))
    try:
        socket.socketpair()
        out["socketpair"] = 0
    except OSError as err:
        out["socketpair"] = errno.errorcode[err.errno]
    return out


def in_child(name, *args):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if call(name, *args) == 0 else 1)
    return "allowed" if os.waitpid(pid, 0)[1] == 0 else "refused"


before = {"unshare(CLONE_NEWUSER)": in_child("unshare", 0x10000000), "io_uring_setup": call("io_uring_setup", 1, 0),
          "memfd_create": os.memfd_create("x") > 0, "socketpair": len(socket.socketpair()) == 2}
libc.prctl(38, 1, 0, 0, 0)  # no_new_privs, as the sandboxed process sets it
zygote.load_filter(seccomp_filter.program())
after = attempts()
after["ptrace(PTRACE_TRACEME)"] = call("ptrace", 0, 0, 0, 0)
after["subprocess"] = subprocess.run(["true"]).returncode  # clone3 answers ENOSYS: the C library falls back
after["pipe"] = len(os.pipe())
thread = threading.Thread(target=lambda: None)
thread.start()
thread.join()
import torch
after["torch"] = float(torch.ones(3).sum())
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")
def test_the_filter_denies_the_list_and_leaves_the_rest_working():
    try:
        program = seccomp_filter.program()
    except seccomp_filter.SeccompUnavailable as err:
        pytest.fail(f"the sandbox needs the seccomp filter: {err}")
    assert len(program) % 8 == 0 and len(program) > 8 * len(seccomp_filter.DENIED)
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    # before the filter this process may make a user namespace (the kernel allows it): the filter refuses it
    assert seen["before"]["unshare(CLONE_NEWUSER)"] == "allowed", seen
    assert seen["before"]["memfd_create"] is seen["before"]["socketpair"] is True, seen
    after = seen["after"]
    denied = {k: v for k, v in after.items() if k not in ("AF_INET", "AF_NETLINK", "subprocess", "torch", "pipe")}
    assert set(denied.values()) == {"EPERM"} and {"memfd_create", "shmget", "AF_UNIX", "socketpair"} <= set(denied), \
        denied
    assert after["AF_INET"] == after["AF_NETLINK"] == "EAFNOSUPPORT"
    assert after["subprocess"] == 0 and after["torch"] == 3.0 and after["pipe"] == 2


SYSTEM_BINDING = """import json, sys
sys.path.append(sys.argv[1])  # the system's site packages, where Debian's python3-seccomp lies
try:
    import seccomp
except ImportError as err:  # built for another Python
    print(json.dumps(["unavailable", str(err)]))
    sys.exit(0)
from modern_block.classroom.grading import seccomp_filter
print(json.dumps([seccomp_filter.binding().__name__, seccomp_filter.program().hex()]))"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")
def test_libseccomps_own_binding_is_used_where_it_is_and_builds_the_same_program():
    found = subprocess.run(["/usr/bin/python3", "-c", "import os, seccomp; print(os.path.dirname(seccomp.__file__))"],
                           capture_output=True, text=True) if os.path.exists("/usr/bin/python3") else None
    if found is None or found.returncode != 0:
        pytest.skip("the system has no libseccomp Python binding (Debian/Ubuntu: apt-get install python3-seccomp)")
    done = subprocess.run([sys.executable, "-c", SYSTEM_BINDING, found.stdout.strip()], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    name, program = json.loads(done.stdout)
    if name == "unavailable":
        pytest.skip(f"the system's binding is built for another Python: {program}")
    assert seccomp_filter.binding().__name__ == "pyseccomp"  # this environment's own: the fallback
    assert name == "seccomp" and bytes.fromhex(program) == seccomp_filter.program()  # the same filter, either way
