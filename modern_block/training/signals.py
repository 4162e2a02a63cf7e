"""Ctrl-C stops a run after the step in progress (a second aborts); SIGTERM under torchrun is a ``RankFailedError``."""

import signal
import sys
import threading

from .distributed import RankFailedError


class StopSignals:
    """While active the first Ctrl-C sets ``requested``; ``many`` (torchrun): SIGTERM raises, a second Ctrl-C waits."""

    def __init__(self, many: bool = False, what_happens: str = "", say: bool = True):
        self.requested = False
        self.many, self.what_happens, self.say = many, what_happens, say
        self._previous: dict[int, object] = {}

    def _ctrl_c(self, signum, frame):
        if self.requested and not self.many:
            raise KeyboardInterrupt
        if not self.requested and self.say:
            print(f"\nCtrl-C: stopping after this step{self.what_happens}"
                  f"{' (press again to abort at once)' if not self.many else ''}", file=sys.stderr, flush=True)
        self.requested = True

    def _sigterm(self, signum, frame):
        raise RankFailedError("stopped by SIGTERM (torchrun sends it to every process when one of them fails or "
                              "when torchrun itself is stopped)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._ctrl_c)
            if self.many:
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._sigterm)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False
