"""The two ways a check ends without passing; every other module of the checks imports them from here."""


class NotAttempted(AssertionError):
    """The code under test still raises ``NotImplementedError``: the exercise has not been done yet."""


class CheckFailed(AssertionError):
    """The code runs but disagrees with the reference; the message says what is likely wrong."""
