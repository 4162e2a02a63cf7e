"""How a run hears that it should stop (``trainer.StopSignals``): real signals sent to this process."""

import signal
import threading

import pytest

from modern_block.training.distributed import RankFailedError
from modern_block.training.trainer import StopSignals


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as a plain Python process has it (a test runner's worker may ignore it), restored afterwards."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_first_ctrl_c_asks_to_stop_and_the_second_aborts(ctrl_c_raises, capsys):
    with StopSignals(what_happens=" and save the checkpoint") as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    err = capsys.readouterr().err
    assert err.count("Ctrl-C") == 1
    assert "Ctrl-C: stopping after this step and save the checkpoint (press again to abort at once)" in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored on exit


def test_under_torchrun_ctrl_c_only_asks_and_sigterm_raises(ctrl_c_raises, capsys):
    term_before = signal.getsignal(signal.SIGTERM)
    with StopSignals(many=True) as stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # torchrun forwards the terminal's Ctrl-C: no abort
        assert stop.requested
        with pytest.raises(RankFailedError, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
    assert "press again" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is term_before
    with StopSignals(many=False):
        assert signal.getsignal(signal.SIGTERM) is term_before  # one process: SIGTERM keeps its default


def test_quiet_and_ignored_and_other_threads(ctrl_c_raises, capsys):
    with StopSignals(say=False) as stop:
        signal.raise_signal(signal.SIGINT)
    assert stop.requested and capsys.readouterr().err == ""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job: Ctrl-C stays ignored
    with StopSignals() as stop:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
    assert not stop.requested and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    entered = []

    def elsewhere():  # Python lets only the main thread install handlers: elsewhere nothing is installed
        with StopSignals(many=True):
            entered.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert entered == [signal.default_int_handler]
