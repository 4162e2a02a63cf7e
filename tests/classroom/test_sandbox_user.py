"""The user the sandboxes run as: never uid 0 and never a shared user such as ``nobody``, whatever starts the
grader; a root grader makes its own system user when it is missing, and a user named in the environment must be
unused."""

import os
import pwd
import secrets
import shutil
import subprocess

import pytest

from modern_block.classroom.grading import sandbox_user as su
from modern_block.classroom.grading.sandbox_user import SANDBOX_USER, sandbox_user, user_processes

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a grader started by anyone else runs sandboxes as itself")


def test_a_grader_that_is_not_root_runs_the_sandboxes_as_itself():
    if os.geteuid() == 0:
        pytest.skip("this suite runs as root")
    assert sandbox_user() is None


def _admin(tool: str) -> str:
    """useradd / userdel by path where PATH lacks the sbin folders (root from cron or ``env -i``), as the grader
    finds useradd."""
    return shutil.which(tool) or f"/usr/sbin/{tool}"


@as_root
def test_a_root_grader_makes_its_own_user_when_it_is_missing(monkeypatch):
    name = f"mb-test-{secrets.token_hex(3)}"
    monkeypatch.setattr(su, "SANDBOX_USER", name)
    monkeypatch.delenv("MODERN_BLOCK_SANDBOX_USER", raising=False)
    try:
        uid, gid = sandbox_user()
        entry = pwd.getpwnam(name)
        assert (uid, gid) == (entry.pw_uid, entry.pw_gid) and uid != 0 and gid != 0
        assert uid != pwd.getpwnam("nobody").pw_uid and entry.pw_shell.endswith(("nologin", "false"))
        assert sandbox_user() == (uid, gid)  # found the second time, not made again
    finally:
        subprocess.run([_admin("userdel"), name], capture_output=True)


@as_root
def test_root_shared_unknown_and_busy_users_are_refused(monkeypatch):
    for named, why in (("root", "root's or shared"), ("nobody", "root's or shared"),
                       ("no-such-user-here", "not a user")):
        monkeypatch.setenv("MODERN_BLOCK_SANDBOX_USER", named)
        with pytest.raises(LookupError, match=why):
            sandbox_user()
    name = f"mb-busy-{secrets.token_hex(3)}"
    subprocess.run([_admin("useradd"), "--system", "--no-create-home", name], check=True, capture_output=True)
    try:
        uid, gid = pwd.getpwnam(name).pw_uid, pwd.getpwnam(name).pw_gid
        monkeypatch.setenv("MODERN_BLOCK_SANDBOX_USER", name)
        assert sandbox_user() == (uid, gid)  # unused: accepted
        code = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print(1, flush=True); time.sleep(30)"
        busy = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "python3", "-c",
                                 code], stdout=subprocess.PIPE)
        try:
            busy.stdout.readline()  # not dumpable now, as the zygote: its /proc folder is root's
            assert os.stat(f"/proc/{busy.pid}/environ").st_uid == 0 and user_processes(uid) == 1
            with pytest.raises(LookupError, match="other processes run as"):
                sandbox_user()
        finally:
            busy.kill()
            busy.wait()
    finally:
        subprocess.run([_admin("userdel"), name], capture_output=True)
    monkeypatch.delenv("MODERN_BLOCK_SANDBOX_USER")
    assert sandbox_user() == (pwd.getpwnam(SANDBOX_USER).pw_uid, pwd.getpwnam(SANDBOX_USER).pw_gid)


def test_processes_are_counted_per_user():
    assert user_processes(os.getuid()) >= 1  # this one at least
    assert user_processes(2**31 - 7) == 0  # a uid nobody has
