"""How the tests hold a lesson's check against a wrong implementation: it must fail, diagnose the mistake and
name at most one."""

import pytest

from modern_block.classroom.checks import CheckFailed, NotAttempted
from modern_block.classroom.checks.diagnosis import named

__all__ = ["named", "rejects"]


def rejects(check, impl, *diagnosis: str) -> str:
    """Run ``check`` on a wrong ``impl``; assert it fails with every expected piece of the diagnosis, and that
    a message naming a mistake names exactly one."""
    with pytest.raises(CheckFailed) as info:
        check(impl)
    message = str(info.value)
    for piece in diagnosis:
        assert piece in message, f"expected {piece!r} in the diagnosis, got:\n{message}"
    assert len(named(message)) <= 1, f"more than one mistake named:\n{message}"
    return message


def passes_and_a_stub_is_not_attempted(check, impl, capsys) -> None:
    """The right answer passes with the check's message, and an untouched stub is "not attempted"."""
    check(impl)
    assert capsys.readouterr().out.startswith(f"✓ {check.__name__} passed")

    def stub(*args, **kwargs):
        raise NotImplementedError("write this")

    with pytest.raises(NotAttempted, match="write this"):
        check(stub)
