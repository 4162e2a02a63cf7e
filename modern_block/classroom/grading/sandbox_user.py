"""The unprivileged user the sandboxes run as: never root, whatever user starts the grader.

Bubblewrap maps the submission's uid to the uid that starts it. Started by root it would map it to host uid 0:
capabilities dropped, but the kernel's owner checks still pass (``/proc/sys`` is root's). So a grader started
as root starts bubblewrap and the zygote as a dedicated system user (``useradd --system modern-block-sandbox``,
as docs/grader.Dockerfile does), or the one ``$MODERN_BLOCK_SANDBOX_USER`` names, else ``nobody``; a grader
started by anyone else runs them as itself.
"""

from __future__ import annotations

import os
import pwd

SANDBOX_USER = "modern-block-sandbox"


def sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) the sandboxes run as when this process is root; None otherwise (they run as its user).
    Raises LookupError when no unprivileged user is found."""
    if os.geteuid() != 0:
        return None
    for name in (os.environ.get("MODERN_BLOCK_SANDBOX_USER"), SANDBOX_USER, "nobody"):
        try:
            entry = pwd.getpwnam(name) if name else None
        except KeyError:
            continue
        if entry is not None and entry.pw_uid != 0 and entry.pw_gid != 0:
            return entry.pw_uid, entry.pw_gid
    raise LookupError("the grader runs as root and found no unprivileged user to run the submissions as: create "
                      f"one (useradd --system {SANDBOX_USER}) or name one in MODERN_BLOCK_SANDBOX_USER")


def user_processes(uid: int) -> int:
    """How many processes ``uid`` has now (what a per-user process limit counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count
