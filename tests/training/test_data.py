"""modern_block.training.data: finding, downloading and verifying the text; tokenizer, split, sampler.

Network tests never leave this machine: the "download" source is a file:// URL or an HTTP server
on 127.0.0.1.
"""

import hashlib
import http.server
import os
import socket
import threading
from pathlib import Path

import pytest
import torch

from modern_block.training import data
from modern_block.training.data import (
    TINYSHAKESPEARE_CHARS,
    TINYSHAKESPEARE_FILE,
    TINYSHAKESPEARE_SHA256,
    BatchSampler,
    CharTokenizer,
    ChecksumError,
    download,
    fixed_batches,
    load_corpus,
    train_val_split,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_dir() -> Path:
    """The folder with the real text: $MODERN_BLOCK_DATA, else ../shared/data beside the project."""
    folder = Path(os.environ.get(data.DATA_ENV) or ROOT.parent / "shared" / "data")
    if not (folder / TINYSHAKESPEARE_FILE).is_file():
        pytest.skip(f"no {TINYSHAKESPEARE_FILE} in {folder}; set {data.DATA_ENV}")
    return folder


@pytest.fixture(scope="module")
def real_bytes(real_dir) -> bytes:
    return (real_dir / TINYSHAKESPEARE_FILE).read_bytes()


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(data.DATA_ENV, raising=False)


def _serve(folder: Path):
    """An HTTP server for ``folder`` on 127.0.0.1 in a thread; returns (base URL, server)."""
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder), **k)  # noqa: E731
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_copy_is_found_through_the_environment(real_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(real_dir))
    corpus = load_corpus(url="file:///nonexistent/x.txt", cache=tmp_path, verbose=False)
    assert corpus.name == "tinyshakespeare" and corpus.name == "tinyshakespeare"
    assert len(corpus.text) == TINYSHAKESPEARE_CHARS
    assert hashlib.sha256(corpus.text.encode()).hexdigest() == TINYSHAKESPEARE_SHA256
    assert not any(tmp_path.iterdir()), "a verified local copy must not be copied into the cache"


def test_download_from_a_file_url_fills_the_cache_atomically(real_dir, tmp_path, no_env):
    cache = tmp_path / "cache"
    url = (real_dir / TINYSHAKESPEARE_FILE).as_uri()
    corpus = load_corpus(url=url, cache=cache, verbose=False)
    assert corpus.source == url and len(corpus.text) == TINYSHAKESPEARE_CHARS
    assert [p.name for p in cache.iterdir()] == [TINYSHAKESPEARE_FILE], "no temporary file may be left"
    assert data.sha256_of(cache / TINYSHAKESPEARE_FILE) == TINYSHAKESPEARE_SHA256
    again = load_corpus(url="file:///nonexistent/x.txt", cache=cache, verbose=False)  # now from the cache
    assert again.source == str(cache / TINYSHAKESPEARE_FILE) and again.text == corpus.text


@pytest.mark.parametrize("damage", ["truncated", "flipped byte"])
def test_a_corrupt_cached_file_is_detected_and_fetched_again(real_dir, real_bytes, tmp_path, no_env, capsys, damage):
    cache = tmp_path / "cache"
    cache.mkdir()
    bad = real_bytes[:50_000] if damage == "truncated" else real_bytes[:-1] + b"?"
    (cache / TINYSHAKESPEARE_FILE).write_bytes(bad)
    url, server = _serve(real_dir)
    try:
        corpus = load_corpus(url=f"{url}/{TINYSHAKESPEARE_FILE}", cache=cache)
    finally:
        server.shutdown()
    assert "corrupt or incomplete" in capsys.readouterr().out
    assert corpus.name == "tinyshakespeare" and len(corpus.text) == TINYSHAKESPEARE_CHARS
    assert (cache / TINYSHAKESPEARE_FILE).read_bytes() == real_bytes


def test_a_local_copy_with_a_wrong_checksum_is_ignored(real_dir, real_bytes, tmp_path, monkeypatch, capsys):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / TINYSHAKESPEARE_FILE).write_bytes(real_bytes[:-1] + b"?")  # the right size, one byte changed
    monkeypatch.setenv(data.DATA_ENV, str(fake))
    corpus = load_corpus(url=(real_dir / TINYSHAKESPEARE_FILE).as_uri(), cache=tmp_path / "cache")
    assert "does not have the expected sha256" in capsys.readouterr().out
    assert len(corpus.text) == TINYSHAKESPEARE_CHARS
    assert (fake / TINYSHAKESPEARE_FILE).read_bytes()[-1:] == b"?", "the user's folder is never modified"


def test_a_file_of_the_wrong_size_is_refused_before_it_is_hashed(real_dir, tmp_path, monkeypatch, capsys):
    big = tmp_path / "big"
    big.mkdir()
    with open(big / TINYSHAKESPEARE_FILE, "wb") as f:  # 2 GB, sparse: reading it whole would take minutes
        f.truncate(2 * 10**9)
    monkeypatch.setenv(data.DATA_ENV, str(big))

    def never(path):
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(data, "sha256_of", never)
    url = (real_dir / TINYSHAKESPEARE_FILE).as_uri()
    corpus = load_corpus(url=url, cache=tmp_path / "cache")
    assert "has 2,000,000,000 bytes, not the 1,115,394 of tinyshakespeare; ignoring it" in capsys.readouterr().out
    assert corpus.name == "tinyshakespeare" and corpus.source == url, "fetched instead (the download checks itself)"


@pytest.mark.parametrize("case", ["no such folder", "no file in it"])
def test_a_data_folder_without_the_text_is_named_in_the_warning(tmp_path, monkeypatch, capsys, case):
    folder = tmp_path / "data"
    if case == "no file in it":
        folder.mkdir()
    monkeypatch.setenv(data.DATA_ENV, str(folder))
    corpus = load_corpus(url="file:///nonexistent/x.txt", cache=tmp_path / "cache")
    out = capsys.readouterr().out
    expected = "no such folder" if case == "no such folder" else f"holds no {TINYSHAKESPEARE_FILE}"
    assert f"warning: {data.DATA_ENV}={folder}" in out and expected in out
    assert corpus.name == "python-stdlib" and f"{data.DATA_ENV}={folder} holds no usable {TINYSHAKESPEARE_FILE}" in out
    assert f"Set {data.DATA_ENV} to a folder" not in out, "no hint to set the variable that is set"


def test_a_partial_download_is_rejected_and_nothing_is_kept(real_bytes, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "input.txt").write_bytes(real_bytes[: len(real_bytes) // 2])  # the connection "dropped" halfway
    url, server = _serve(served)
    cache = tmp_path / "cache"
    try:
        with pytest.raises(ChecksumError, match="sha256"):
            download(f"{url}/input.txt", cache / TINYSHAKESPEARE_FILE, TINYSHAKESPEARE_SHA256)
    finally:
        server.shutdown()
    assert list(cache.iterdir()) == [], "neither the file nor its temporary may remain"


def test_download_verifies_small_files_too(tmp_path):
    src = tmp_path / "src.txt"
    src.write_bytes(b"hello\n")
    dest = tmp_path / "out" / "copy.txt"
    download(src.as_uri(), dest, hashlib.sha256(b"hello\n").hexdigest())
    assert dest.read_bytes() == b"hello\n"
    with pytest.raises(ChecksumError, match="longer than the expected 3 bytes"):  # cut off at the size, unhashed
        download(src.as_uri(), tmp_path / "out" / "long.txt", hashlib.sha256(b"hel").hexdigest(), size=3)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["copy.txt"]


@pytest.mark.parametrize("source", ["closed port", "missing file"])
def test_offline_fallback_uses_the_standard_library_and_says_so(tmp_path, no_env, capsys, source):
    url = f"http://127.0.0.1:{_closed_port()}/input.txt" if source == "closed port" else "file:///nonexistent/x.txt"
    corpus = load_corpus(url=url, cache=tmp_path, timeout=5)
    out = capsys.readouterr().out
    assert "tinyshakespeare is not available" in out
    assert "USING A DIFFERENT CORPUS" in out and "characters of Python source" in out
    assert corpus.name == "python-stdlib" and corpus.name == "python-stdlib"
    assert len(corpus.text) == data.FALLBACK_CHARS
    assert "def " in corpus.text and "import " in corpus.text
    assert load_corpus(url=url, cache=tmp_path, verbose=False).text == corpus.text, "deterministic"
    assert list(tmp_path.iterdir()) == [], "nothing cached from a failed download"


def test_no_fallback_raises(tmp_path, no_env):
    with pytest.raises(OSError):
        load_corpus(url="file:///nonexistent/x.txt", cache=tmp_path, fallback=False, verbose=False)


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.cache_dir() == tmp_path / "xdg" / "modern_block"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.cache_dir() == tmp_path / "home" / ".cache" / "modern_block"


# ---- tokenizer, split, sampler --------------------------------------------------------------------
def test_tokenizer_round_trip_on_the_whole_text(real_dir):
    text = (real_dir / TINYSHAKESPEARE_FILE).read_text()
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65 and tok.chars == "".join(sorted(set(text)))
    ids = tok.encode(text)
    assert ids.dtype == torch.int64 and ids.shape == (len(text),)
    assert tok.decode(ids) == text


def test_tokenizer_non_ascii_round_trip_and_unknown_characters():
    tok = CharTokenizer.from_text("abc é€\n")
    assert tok.decode(tok.encode("€é a\ncab")) == "€é a\ncab"
    assert tok.encode("").shape == (0,)
    with pytest.raises(ValueError, match=r"2 character\(s\) not in .*'z' \(U\+007A\).*'ü' \(U\+00FC\)"):
        tok.encode("abzüz")
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 7\)"):
        tok.decode([0, 7])
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("aab")
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(b"abc")


def test_split_is_contiguous_90_10():
    ids = torch.arange(1000)
    train, val = train_val_split(ids)
    assert len(train) == 900 and len(val) == 100
    assert torch.equal(torch.cat([train, val]), ids)
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(ids, 1.0)


def test_sampler_is_seeded_shifted_and_resumable():
    data_ = torch.arange(500)
    a, b = BatchSampler(data_, 8, 4, seed=3), BatchSampler(data_, 8, 4, seed=3)
    x, y = next(a)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1), "targets are the inputs shifted by one"
    assert torch.equal(x, next(b)[0]), "same seed, same batches"
    assert not torch.equal(next(BatchSampler(data_, 8, 4, seed=4))[0], x)
    state = a.state()
    expected = [next(a)[0] for _ in range(3)]
    a.set_state(state)
    assert all(torch.equal(next(a)[0], e) for e in expected), "restoring the state replays the batches"
    starts = torch.cat([next(a)[0][:, 0] for _ in range(200)])
    assert starts.min() >= 0 and starts.max() <= 500 - 9, "every window and its target fit in the data"
    with pytest.raises(ValueError, match="more than block_size"):
        BatchSampler(torch.arange(8), 8, 2)


def test_fixed_batches_are_the_same_every_time():
    data_ = torch.arange(300)
    one, two = fixed_batches(data_, 16, 4, 3, seed=7), fixed_batches(data_, 16, 4, 3, seed=7)
    assert len(one) == 3
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(one, two, strict=True))
