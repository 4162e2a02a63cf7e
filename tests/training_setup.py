"""What the training tests share: a small inline corpus, a tiny configuration, a runner, a disk
that fills up, and a fixture that keeps every test offline (import it into a test module to apply
it there)."""

import errno
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from modern_block.training.config import TrainConfig
from modern_block.training.data import Corpus, load_corpus
from modern_block.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
TEXT = "".join(f"{w} the quick brown fox {i % 7} jumps over the lazy dog; " for i, w in
               enumerate(["First", "Citizen", "Before", "we", "proceed", "any", "further"] * 60))
CORPUS = Corpus(TEXT, "test-text", "inline")


@pytest.fixture(autouse=True)
def never_online(monkeypatch, tmp_path):
    """The command-line tests load the text as users do; they must never reach the internet: they
    read $MODERN_BLOCK_DATA (CI sets it) or fall back to the standard library's source text."""
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("the tests do not use the network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
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
