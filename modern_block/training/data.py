"""The training text (tinyshakespeare from $MODERN_BLOCK_DATA, the cache or a checked download; else, announced,
the standard library's source), a character tokenizer, the 90/10 split and a seeded batch sampler."""

import contextlib
import hashlib
import os
import sysconfig
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..interop.verify import sha256_of
from ..validate import positive_int
from .files import write_atomic

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINYSHAKESPEARE_CHARS = 1_115_394  # and bytes (ASCII): a file of another size is not hashed
TINYSHAKESPEARE_FILE = "tinyshakespeare.txt"
DATA_ENV = "MODERN_BLOCK_DATA"
FALLBACK_CHARS = 1_000_000  # about as much text as tinyshakespeare


class ChecksumError(ValueError):
    """A file's sha256 is not the expected one (corrupt, truncated or a different file)."""


@dataclass
class Corpus:
    """The text and where it came from. ``name`` is "tinyshakespeare" or "python-stdlib"."""

    text: str
    name: str
    source: str  # a path, a URL, or a description of the fallback


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/modern_block``, else ``~/.cache/modern_block``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "modern_block"


def download(url: str, dest, sha256: str, timeout: float = 30.0, size: int | None = None) -> Path:
    """Fetch ``url`` into ``dest`` only if its bytes have ``sha256`` (and at most ``size`` of them), else a
    ``ChecksumError`` and nothing written; an ``OSError`` when the source cannot be reached."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def fetch(out) -> None:
        h, received = hashlib.sha256(), 0
        with urllib.request.urlopen(url, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(1 << 16), b""):
                received += len(chunk)
                if size is not None and received > size:
                    raise ChecksumError(f"the file from {url} is longer than the expected {size:,} bytes "
                                        "(a different file); it was not kept")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise ChecksumError(f"the file from {url} has sha256 {h.hexdigest()}, expected {sha256} "
                                "(corrupt, truncated or a different file); it was not kept")

    write_atomic(dest, fetch)
    return dest


def _wrong(path: Path) -> str | None:
    """Why ``path`` is not tinyshakespeare (its size is checked before anything is hashed), or None."""
    size = path.stat().st_size
    if size != TINYSHAKESPEARE_CHARS:
        return f"it has {size:,} bytes, not the {TINYSHAKESPEARE_CHARS:,} of tinyshakespeare"
    if sha256_of(path) != TINYSHAKESPEARE_SHA256:
        return "it does not have the expected sha256"
    return None


def stdlib_text() -> tuple[str, str]:
    """(text, description): the standard library's top-level ``*.py`` files in name order, up to ``FALLBACK_CHARS``."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(folder.glob("*.py")):
        if total >= FALLBACK_CHARS:
            break
        with contextlib.suppress(OSError, UnicodeDecodeError):
            parts.append(path.read_text(encoding="utf-8"))
            total += len(parts[-1])
    text = "".join(parts)[:FALLBACK_CHARS]
    return text, f"{len(text):,} characters of Python source from {len(parts)} files in {folder}"


def load_corpus(url: str = TINYSHAKESPEARE_URL, data_dir=None, cache=None, fallback: bool = True,
                timeout: float = 30.0, verbose: bool = True) -> Corpus:
    """tinyshakespeare from ``data_dir`` (default ``$MODERN_BLOCK_DATA``), the ``cache`` or ``url``; when none
    has it, the standard library's source, announced (``fallback=False``: the error instead)."""
    say = print if verbose else (lambda *a, **k: None)
    from_env = data_dir is None and bool(os.environ.get(DATA_ENV))
    data_dir = data_dir if data_dir is not None else os.environ.get(DATA_ENV)
    named = f"{DATA_ENV}={data_dir}" if from_env else f"the data folder {data_dir}"
    if data_dir:
        local = Path(data_dir) / TINYSHAKESPEARE_FILE
        if not Path(data_dir).is_dir():
            say(f"warning: {named}: no such folder; looking for {TINYSHAKESPEARE_FILE} in the cache instead")
        elif not local.is_file():
            say(f"warning: {named} holds no {TINYSHAKESPEARE_FILE}; looking in the cache instead")
        elif (why := _wrong(local)) is None:
            return Corpus(local.read_text(encoding="utf-8"), "tinyshakespeare", str(local))
        else:
            say(f"warning: {local}: {why}; ignoring it")
    cached = Path(cache if cache is not None else cache_dir()) / TINYSHAKESPEARE_FILE
    if cached.is_file():
        if (why := _wrong(cached)) is None:
            return Corpus(cached.read_text(encoding="utf-8"), "tinyshakespeare", str(cached))
        say(f"the cached copy {cached} is corrupt or incomplete ({why}); fetching it again")
        cached.unlink()
    try:
        say(f"downloading tinyshakespeare from {url}")
        download(url, cached, TINYSHAKESPEARE_SHA256, timeout, TINYSHAKESPEARE_CHARS)
        return Corpus(cached.read_text(encoding="utf-8"), "tinyshakespeare", url)
    except (OSError, ChecksumError) as err:  # URLError is an OSError
        if not fallback:
            raise
        text, description = stdlib_text()
        hint = (f"{named} holds no usable {TINYSHAKESPEARE_FILE}: put the real file there" if data_dir else
                f"Set {DATA_ENV} to a folder holding {TINYSHAKESPEARE_FILE}")
        say(f"tinyshakespeare is not available ({err}).\n"
            f"USING A DIFFERENT CORPUS: {description}. Losses are not comparable with tinyshakespeare's. "
            f"{hint} to use the real text offline.")
        return Corpus(text, "python-stdlib", description)


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of a text."""

    def __init__(self, chars: str):
        if not isinstance(chars, str) or not chars:
            raise ValueError("chars must be a non-empty string of distinct characters")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars = "".join(sorted(chars))
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)  # sorted code points

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids, int64 of shape [len(text)]. Unknown characters raise a ValueError naming them."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one code point per character
        ids = np.searchsorted(self._codes, codes)  # position in the sorted vocabulary
        known = (ids < len(self._codes)) & (self._codes[np.minimum(ids, len(self._codes) - 1)] == codes)
        if not known.all():
            unknown = sorted({chr(c) for c in codes[~known].tolist()})
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise ValueError(f"text contains {len(unknown)} character(s) not in the tokenizer's vocabulary of "
                             f"{self.vocab_size}: {shown}{more}")
        return torch.from_numpy(ids.astype(np.int64))

    def decode(self, ids) -> str:
        """Text of a sequence of ids (tensor or list)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return "".join(self.chars[i] for i in ids)


def train_val_split(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first (1 - val_fraction) of the tokens for training, the rest for validation: no window in both."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_train = int(len(ids) * (1.0 - val_fraction))
    return ids[:n_train], ids[n_train:]


def load_text(corpus: Corpus | None = None,
              verbose: bool = True) -> tuple[Corpus, CharTokenizer, torch.Tensor, torch.Tensor]:
    """``corpus`` (default: ``load_corpus()``), the tokenizer of its characters and the 90/10 train/val split of
    its ids: every lesson's data in one call, ``corpus, tok, train_ids, val_ids = load_text()``."""
    corpus = corpus if corpus is not None else load_corpus(verbose=verbose)
    tokenizer = CharTokenizer.from_text(corpus.text)
    train_ids, val_ids = train_val_split(tokenizer.encode(corpus.text))  # [N_train], [N_val] int64
    return corpus, tokenizer, train_ids, val_ids


class BatchSampler:
    """Random windows of ``block_size + 1`` tokens (x = window[:-1], y = window[1:]) from the sampler's own seeded
    generator, so the batches depend on ``seed`` alone; ``state()`` resumes them. Each of ``world_size``
    processes draws the whole batch and keeps its slice ``rank``: together they see what one process would."""

    def __init__(self, data: torch.Tensor, block_size: int, batch_size: int, seed: int = 0, device=None,
                 rank: int = 0, world_size: int = 1):
        positive_int("block_size", block_size)
        positive_int("batch_size", batch_size)
        positive_int("world_size", world_size)
        if batch_size % world_size:
            raise ValueError(f"batch_size ({batch_size}) must be divisible by world_size ({world_size})")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        if data.dim() != 1 or len(data) < block_size + 1:
            raise ValueError(f"data must be a 1-D tensor of more than block_size={block_size} tokens, "
                             f"got shape {list(data.shape)}")
        self.data = data.to(device) if device is not None else data
        self.block_size, self.batch_size = block_size, batch_size
        share = batch_size // world_size
        self.share = slice(rank * share, (rank + 1) * share)  # this process's part of every batch
        self.generator = torch.Generator().manual_seed(seed)
        self._arange = torch.arange(block_size + 1, device=self.data.device)  # [T+1]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        n_starts = len(self.data) - self.block_size  # last start leaves room for the target
        starts = torch.randint(n_starts, (self.batch_size,), generator=self.generator)[self.share]  # [B/world], CPU
        windows = self.data[starts.to(self.data.device)[:, None] + self._arange]  # [B/world, T+1]
        return windows[:, :-1], windows[:, 1:]  # x, y: [B/world, T]

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def fixed_batches(data: torch.Tensor, block_size: int, batch_size: int, n_batches: int, seed: int = 0,
                  device=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` batches drawn once with their own seed: the same windows for every step, seed and model."""
    positive_int("n_batches", n_batches)
    sampler = BatchSampler(data, block_size, batch_size, seed, device)
    return [next(sampler) for _ in range(n_batches)]
