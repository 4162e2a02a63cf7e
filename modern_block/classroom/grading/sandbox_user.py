"""The unprivileged user the sandboxes run as: never root, never shared.

Started by root, bubblewrap would map the submission to host uid 0, whose owner checks still pass; so a grader
started as root uses the system user ``modern-block-sandbox`` (made with ``useradd --system`` when missing) or the
one ``$MODERN_BLOCK_SANDBOX_USER`` names, never ``nobody`` (any daemon running as it could reach the sandboxes).
A grader started by anyone else runs them as itself.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

SANDBOX_USER = "modern-block-sandbox"
SHARED = ("nobody", "nfsnobody")


def _overflow_uid() -> int:
    """The uid the kernel shows for unmapped users (``nobody``, 65534 by default)."""
    try:
        with open("/proc/sys/kernel/overflowuid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65534


def _create(name: str) -> None:
    """Make ``name`` a system user with a group of its own, no home folder and no login shell."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    shell = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)), "/bin/false")
    try:
        subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", shell, name], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass  # looked up again by the caller, which says what to do


def sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) the sandboxes run as when this process is root; None otherwise (they run as its user).
    Raises LookupError when there is no such user and none can be made, or the one named is shared."""
    if os.geteuid() != 0:
        return None
    named = os.environ.get("MODERN_BLOCK_SANDBOX_USER")
    name = named or SANDBOX_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if named:
            raise LookupError(f"MODERN_BLOCK_SANDBOX_USER names {name!r}, which is not a user here") from None
        _create(name)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise LookupError(f"the grader runs as root and could not create the user the sandboxes run as: "
                              f"create it (useradd --system --user-group {SANDBOX_USER}) or name another unused "
                              "one in MODERN_BLOCK_SANDBOX_USER") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0 or name in SHARED or entry.pw_uid == _overflow_uid():
        raise LookupError(f"the sandboxes cannot run as {name!r} (uid {entry.pw_uid}, gid {entry.pw_gid}): root's "
                          f"or shared with other services; use {SANDBOX_USER}, made for the grader alone")
    if named and user_processes(entry.pw_uid):
        raise LookupError(f"MODERN_BLOCK_SANDBOX_USER names {name!r}, which other processes run as now: the "
                          "sandboxes need a user of their own")
    return entry.pw_uid, entry.pw_gid


def user_processes(uid: int) -> int:
    """How many processes run as ``uid`` now (what a per-user process limit counts), read from their status
    (a process that is not dumpable, as the zygote, shows root as the owner of its /proc folder)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    line = next(line for line in f if line.startswith("Uid:"))
                count += int(line.split()[1]) == uid
            except (OSError, StopIteration, ValueError, IndexError):
                pass
    return count
