"""What the training tests share: a small inline corpus, a tiny configuration, a runner, a disk
that fills up, a fixture that keeps every test offline (import it into a test module to apply
it there), and a way to start a child process that may train."""

import errno
import multiprocessing
import os
import sys
import traceback
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from modern_block.training.config import TrainConfig
from modern_block.training.data import Corpus, load_corpus
from modern_block.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
TEXT = "".join(f"{w} the quick brown fox {i % 7} jumps over the lazy dog; " for i, w in
               enumerate(["First", "Citizen", "Before", "we", "proceed", "any", "further"] * 60))
CORPUS = Corpus(TEXT, "test-text", "inline")


def _refuse_downloads(*args, **kwargs):
    raise urllib.error.URLError("the tests do not use the network")


@pytest.fixture(autouse=True)
def never_online(monkeypatch, tmp_path):
    """The command-line tests load the text as users do; they must never reach the internet: they
    read $MODERN_BLOCK_DATA (CI sets it) or fall back to the standard library's source text."""
    monkeypatch.setattr(urllib.request, "urlopen", _refuse_downloads)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def tiny(arch="llama", **kw) -> TrainConfig:
    base = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=10, lr=1e-2,
                min_lr=1e-3, warmup_steps=2, eval_interval=4, eval_batches=2, dropout=0.1, log_interval=1,
                compile=False, device="cpu", seed=5)
    base.update(kw)
    return TrainConfig(arch=arch, **base)


def run(cfg, out=None, **kw):
    return train(cfg, out, corpus=CORPUS, progress=False, verbose=False, **kw)


def evals(result):
    return [(m["step"], m["train_loss"], m["val_loss"]) for m in result.metrics]


SMALL = ["--max-steps", "4", "--eval-interval", "2", "--batch-size", "4", "--block-size", "16",
         "--eval-batches", "1", "--no-progress"]


def disk_fills_up_after(n_bytes: int):
    """A stand-in for ``run_folder._open_for_writing`` whose file raises ENOSPC once ``n_bytes``
    have been written, as a real file does when the disk fills up in the middle of a write."""
    class FillsUp:
        def __init__(self, fd):
            self.file, self.written = open(fd, "wb"), 0  # noqa: SIM115 - closed by __exit__

        def write(self, data):
            self.written += len(data)
            if self.written > n_bytes:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    return FillsUp


def rerun_committed(config: dict, made_with: str, corpus_name: str, steps: int, threads: int = 1):
    """The first ``steps`` steps of a committed run, trained again from its recorded settings on ``threads``
    threads (the TrainResult); skips the test where the run cannot repeat to the last bit: another torch than
    ``made_with``, or another text than ``corpus_name`` (no MODERN_BLOCK_DATA)."""
    if made_with != torch.__version__:
        pytest.skip(f"the run was made with torch {made_with}, this is {torch.__version__}")
    corpus = load_corpus(verbose=False)
    if corpus.name != corpus_name:
        pytest.skip(f"the run used {corpus_name}; this machine has {corpus.name!r} (set MODERN_BLOCK_DATA)")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return train(TrainConfig(**config), corpus=corpus, checkpoints=False, progress=False, verbose=False,
                     until=steps)
    finally:
        torch.set_num_threads(before)


# A child forked from a test process cannot train once that process has run a backward pass with autograd's
# worker threads started (torch refuses: "Unable to handle autograd's threading in combination with fork-based
# multiprocessing"; whether they start depends on the build and on what ran before in that process). So children
# are forked from multiprocessing's fork server instead: a fresh interpreter that imports torch and the trainer
# once and never trains, which keeps a child's start at milliseconds.
FRESH = multiprocessing.get_context("forkserver")
FRESH.set_forkserver_preload(["training_setup", "modern_block.training.cli"])


def start_child(log: Path, target, *args) -> multiprocessing.Process:
    """Start ``target(*args)`` in a new process with this one's environment, intra-op thread count and
    offline guard, its stdout and stderr in ``log``. Its exit status is what ``target`` returns if that is an
    int, else 0; 1 if it raises (the traceback is in ``log``). ``target`` and ``args`` travel by pickle: a
    module-level function (``functools.partial`` for bound arguments)."""
    child = FRESH.Process(target=_child_main, args=(dict(os.environ), torch.get_num_threads(), str(log), target, args))
    child.start()
    child.log = Path(log)  # type: ignore[attr-defined]
    return child


def wait_for(child: multiprocessing.Process, timeout: float = 120) -> int:
    """The exit status of a child of ``start_child``, or -signal when a signal killed it; a child still
    running after ``timeout`` seconds is killed and the test fails."""
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
        child.join()
        raise AssertionError(f"child {child.pid} did not finish in {timeout} s:\n{output(child)[-2000:]}")
    return child.exitcode


def output(child: multiprocessing.Process) -> str:
    """What a child of ``start_child`` wrote to stdout and stderr (its traceback, if it raised)."""
    return child.log.read_text(errors="replace")  # type: ignore[attr-defined]


def _child_main(env: dict, threads: int, log: str, target, args) -> None:
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)
    urllib.request.urlopen = _refuse_downloads
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    code = 1
    try:
        result = target(*args)
        code = result if isinstance(result, int) else 0
    except BaseException:  # noqa: BLE001 - the parent judges by the exit status and reads the log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no pytest teardown, no atexit handlers
