"""The user the sandboxes run as: never uid 0, whatever starts the grader; a name that is root, or unknown, is
passed over."""

import os
import pwd

from modern_block.classroom.grading.sandbox_user import sandbox_user, user_processes


def test_a_root_grader_picks_an_unprivileged_user_and_anyone_else_runs_them_as_itself(monkeypatch):
    if os.geteuid() != 0:
        assert sandbox_user() is None
        return
    nobody = pwd.getpwnam("nobody")
    for named in ("root", "no-such-user-here"):  # root is refused, an unknown name skipped
        monkeypatch.setenv("MODERN_BLOCK_SANDBOX_USER", named)
        uid, gid = sandbox_user()
        assert uid != 0 and gid != 0
    monkeypatch.setenv("MODERN_BLOCK_SANDBOX_USER", "nobody")
    assert sandbox_user() == (nobody.pw_uid, nobody.pw_gid)


def test_processes_are_counted_per_user():
    assert user_processes(os.getuid()) >= 1  # this one at least
    assert user_processes(2**31 - 7) == 0  # a uid nobody has
