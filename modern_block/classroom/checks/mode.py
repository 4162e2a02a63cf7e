"""How a check runs and reports: one explicit object, ``Mode``, instead of switches read from the environment.

``notebook``: failures print, the package looks as the grader shows it while the student's code runs, a value
item's cell runs again with the pieces hidden. ``script``: failures raise. ``graded``: inputs and extra cases drawn
from the grader's secret, nothing printed. ``Mode.current()`` picks notebook in a Jupyter kernel, else script;
``graded`` and ``answer_sources`` are blocks that set the mode of the checks called inside them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    kind: str  # "notebook", "script" or "graded"
    secret: int | None = None  # graded: the per-run secret the inputs are drawn from
    sources: tuple[str, ...] | None = None  # the cells that ran, in order (a value item's must be computed)
    namespace: Mapping | None = None  # notebook: the student's variables (a value item's cell runs again in a copy)
    observer: Callable | None = None  # tests: called with every judged case (tests/classroom/test_diagnosis.py)

    def __post_init__(self):
        if self.kind not in ("notebook", "script", "graded"):
            raise ValueError(f"kind must be 'notebook', 'script' or 'graded', got {self.kind!r}")
        if (self.kind == "graded") != (self.secret is not None):
            raise ValueError("a graded mode, and only a graded mode, has a secret")

    @classmethod
    def notebook(cls, sources=None, namespace: Mapping | None = None) -> Mode:
        return cls("notebook", sources=None if sources is None else tuple(sources), namespace=namespace)

    @classmethod
    def script(cls, sources=None, observer: Callable | None = None) -> Mode:
        return cls("script", sources=None if sources is None else tuple(sources), observer=observer)

    @classmethod
    def graded(cls, secret: int, sources=None) -> Mode:
        return cls("graded", secret=int(secret), sources=None if sources is None else tuple(sources))

    @property
    def is_graded(self) -> bool:
        return self.kind == "graded"

    @property
    def prints(self) -> bool:
        """A failure is printed (the notebook's loop goes on) instead of raised."""
        return self.kind == "notebook"

    @property
    def hides(self) -> bool:
        """The package's answers are hidden in this process while the student's code runs."""
        return self.kind == "notebook"

    def seeded(self, seed: int) -> int:
        """A check's fixed ``seed``; in the grader, mixed with the secret."""
        return seed if self.secret is None else (seed * 1_000_003 + self.secret) % 2**63

    @classmethod
    def current(cls) -> Mode:
        """The mode a check runs in when it is not given one."""
        chosen = _CHOSEN.get()
        if chosen is not None:
            return chosen
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is not None and getattr(shell, "kernel", None) is not None:
            return cls.notebook(shell.user_ns.get("In", []), shell.user_ns)
        return cls.script()


_CHOSEN: contextvars.ContextVar[Mode | None] = contextvars.ContextVar("modern_block_checks_mode", default=None)


@contextlib.contextmanager
def using(mode: Mode):
    """The checks called inside the block (in this thread or task) run in ``mode``."""
    token = _CHOSEN.set(mode)
    try:
        yield mode
    finally:
        _CHOSEN.reset(token)


@contextlib.contextmanager
def graded(secret: int):
    """The grader's mode for the checks called inside the block: ``Mode.graded(secret)`` (keeping cells given by
    an enclosing ``answer_sources``)."""
    before = _CHOSEN.get()
    with using(Mode.graded(secret, before.sources if before is not None else None)) as mode:
        yield mode


@contextlib.contextmanager
def answer_sources(sources):
    """The cells a value item's answer is read from (in the order they ran), for the checks called inside the
    block; the mode stays the enclosing one (a script's, if none)."""
    before = _CHOSEN.get() or Mode.script()
    with using(dataclasses.replace(before, sources=tuple(sources))) as mode:
        yield mode
