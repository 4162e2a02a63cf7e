"""How the tests hold a lesson's check against a wrong implementation: it must fail, diagnose the mistake and
name at most one."""

import re

import pytest

from modern_block.classroom.checks import CheckFailed


def named(message: str) -> list[str]:
    """The mistakes a check's message names (``Likely mistake: A`` and ``or: B`` lines)."""
    match = re.search(r"\nLikely mistake: (.*?)\n\((?:Your output|These mistakes)", message, re.S)
    return match.group(1).split("\nor: ") if match else []


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
