"""How the tests hold a lesson's check against a wrong implementation: it must fail, diagnose the mistake and
name at most one."""

import pytest

from modern_block.classroom.checks import CheckFailed
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
