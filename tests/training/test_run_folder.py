"""A run's files: the lock, atomic writes (unique temporary names, a full disk), the checkpoint's
checks (empty, truncated, garbage, missing keys, a flipped bit) and the torn metrics line."""

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from training_setup import disk_fills_up_after

from modern_block.training import checkpoint as CK
from modern_block.training import files as F
from modern_block.training import run_folder as R


def _state(step=3):
    return {"format": CK.CHECKPOINT_FORMAT, "config": {"lr": 0.01}, "chars": "ab", "corpus": "t", "step": step,
            "elapsed_s": 1.5, "losses": [2.0 / (i + 1) for i in range(step)],
            "model": {"w": torch.randn(64, 64), "b": torch.zeros(64)},
            "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}},
                          "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}]},
            "scaler": None, "rng_cpu": torch.get_rng_state(), "rng_cuda": None, "sampler": torch.get_rng_state(),
            "run_id": "a1b2", "metrics": [{"step": 0, "val_loss": 4.2}]}


def test_a_checkpoint_round_trips_with_its_checksum(tmp_path):
    path = tmp_path / R.CHECKPOINT
    CK.save_checkpoint(_state(), path)
    ckpt = CK.load_checkpoint(path)
    assert ckpt["step"] == 3 and torch.equal(ckpt["model"]["w"], torch.load(path, weights_only=True)["model"]["w"])
    assert ckpt["checksum"] == torch.load(path, weights_only=True)["checksum"] == CK.digest(
        {k: v for k, v in ckpt.items() if k != "checksum"})
    assert [p.name for p in tmp_path.iterdir()] == [R.CHECKPOINT], "no temporary file left behind"


def test_the_checksum_is_the_documented_walk_over_the_state():
    """Spelled out by hand: dicts as "{" key-repr value ... "}", lists "[" ... "]", tuples "(" ... "]", tensors as
    "T<dtype><shape>" and their bytes, anything else its repr. A checkpoint written today keeps verifying only if
    this never changes; and it tells apart states that a looser walk would confuse."""
    import hashlib

    w = torch.tensor([[1.5, -2.0], [0.25, 8.0]])
    state = {"step": 3, "w": w, "betas": (0.9, 0.99), "losses": [2.0, None], "ids": torch.arange(3, dtype=torch.uint8)}
    by_hand = (b"{" + b"'step'" + b"3" + b"'w'" + b"Ttorch.float32(2, 2)" + w.numpy().tobytes()
               + b"'betas'" + b"(" + b"0.9" + b"0.99" + b"]" + b"'losses'" + b"[" + b"2.0" + b"None" + b"]"
               + b"'ids'" + b"Ttorch.uint8(3,)" + bytes([0, 1, 2]) + b"}")
    assert CK.digest(state) == hashlib.sha256(by_hand).hexdigest()
    assert CK.digest(w.T) == CK.digest(w.T.contiguous())  # the values, not the memory layout
    assert len({CK.digest(x) for x in ({"step": 3}, {"step": "3"}, {"step": [3]}, {"step": (3,)}, {"s": 3}, [3], (3,),
                                       {"step": torch.tensor([3])}, {"step": torch.tensor([[3]])},
                                       {"step": torch.tensor([3], dtype=torch.int32)})}) == 10


def test_a_checkpoint_comes_back_as_it_went_in_on_the_cpu(tmp_path):
    """Tuples stay tuples, tensors come back as CPU copies with their values and dtypes, the step and the rest as
    they were; what was verified is the checksum of exactly that."""
    state = _state()
    path = tmp_path / R.CHECKPOINT
    CK.save_checkpoint(state, path)
    back = CK.load_checkpoint(path)
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert type(back["optimizer"]["param_groups"][0]["betas"]) is tuple
    for key in ("step", "losses", "run_id", "metrics", "scaler", "rng_cuda", "chars", "corpus", "config"):
        assert back[key] == state[key], key
    assert all(torch.equal(back["model"][k], state["model"][k]) for k in state["model"])
    assert "checksum" not in state, "the caller's state is not changed"


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b""), r"is empty \(0 bytes\)"),
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "cannot be read: it is truncated, damaged"),
    (lambda p: p.write_bytes(bytes(range(256)) * 40), "cannot be read: it is truncated, damaged"),
    (lambda p: torch.save({"step": 3, "model": {}}, p), r"lacks \['format', 'config'"),
    (lambda p: torch.save([1, 2, 3], p), "holds a list, not a checkpoint"),
])
def test_a_damaged_checkpoint_is_a_clear_error_naming_the_file(tmp_path, damage, message):
    path = tmp_path / R.CHECKPOINT
    CK.save_checkpoint(_state(), path)
    damage(path)
    with pytest.raises(CK.CheckpointError, match=message) as exc:
        CK.load_checkpoint(path)
    assert str(path) in str(exc.value) and "--overwrite" in str(exc.value)


def test_a_flipped_bit_in_the_weights_fails_the_checksum(tmp_path):
    path = tmp_path / R.CHECKPOINT
    state = _state()
    CK.save_checkpoint(state, path)
    raw = bytearray(path.read_bytes())
    at = raw.find(state["model"]["w"].numpy().tobytes()[:64])  # the weights are stored as they are in memory
    assert at > 0
    raw[at + 1000] ^= 0x01  # one bit of one float of w
    path.write_bytes(bytes(raw))
    loaded = torch.load(path, weights_only=True)  # torch itself reads it without complaint ...
    assert not torch.equal(loaded["model"]["w"], state["model"]["w"])
    with pytest.raises(CK.CheckpointError, match="fails its checksum"):  # ... the checksum does not
        CK.load_checkpoint(path)


def test_a_full_disk_while_writing_keeps_the_old_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / R.CHECKPOINT
    CK.save_checkpoint(_state(step=4), path)
    before = path.read_bytes()
    monkeypatch.setattr(F, "_open_for_writing", disk_fills_up_after(2000))  # mid-write, as a real disk
    with pytest.raises(CK.CheckpointError, match=r"could not write the checkpoint .*ckpt.pt \(No space left on "
                                                r"device; .* MiB free .*unchanged"):
        CK.save_checkpoint(_state(step=8), path)
    assert path.read_bytes() == before and CK.load_checkpoint(path)["step"] == 4
    assert [p.name for p in tmp_path.iterdir()] == [R.CHECKPOINT], "the temporary file was removed"


def test_concurrent_writes_use_distinct_temporary_files(tmp_path):
    path, inside, release, seen = tmp_path / "summary.json", threading.Event(), threading.Event(), []

    def slow(f):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        inside.set()
        release.wait(10)
        f.write(b"first")

    writer = threading.Thread(target=F.write_atomic, args=(path, slow))
    writer.start()
    inside.wait(10)
    F.write_text_atomic(path, "second")  # while the first is still writing its own temporary file
    release.set()
    writer.join(10)
    assert len(seen[0]) == 1 and seen[0][0].startswith("summary.json.") and seen[0][0].endswith(".tmp")
    assert path.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_lock_refuses_a_second_writer_and_dies_with_its_process(tmp_path):
    # another process takes the folder's lock as RunLock does (an flock on DIR/.lock, its pid inside)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys\n"
        "f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "f.write(f'pid {os.getpid()}, started now'); f.flush(); print('locked', flush=True); sys.stdin.read()"),
        str(tmp_path / R.LOCK)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(R.RunFolderError, match=rf"in use by another training \(pid {holder.pid}, started now\)"):
            R.RunLock(tmp_path)
    finally:
        holder.kill()  # as kill -9 would: the operating system releases the lock
        holder.wait(10)
    lock = R.RunLock(tmp_path)  # no stale lock
    with pytest.raises(R.RunFolderError, match="in use by another training"):
        R.RunLock(tmp_path)  # and within one process too (a second Trainer on the same folder)
    lock.release()
    R.RunLock(tmp_path).release()


def test_a_torn_last_metrics_line_is_dropped_and_said(tmp_path):
    path = tmp_path / R.METRICS
    rows = [{"step": 0, "val_loss": 4.1}, {"step": 4, "val_loss": 3.2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "train_lo')
    said = []
    assert R.read_metrics(path, say=said.append) == rows
    assert len(said) == 1 and "dropped line(s) [3]" in said[0] and str(path) in said[0]


def test_out_must_be_a_writable_folder(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(R.RunFolderError, match="is a file, not a folder"):
        R.prepare(tmp_path / "a_file")
    with pytest.raises(R.RunFolderError, match=r"cannot write in --out .*below \(Not a directory\)"):
        R.prepare(tmp_path / "a_file" / "below")
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if R.os.geteuid() == 0:  # root writes anywhere: have the probe fail as it would for anyone else
        def denied(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied")
        monkeypatch.setattr(R.tempfile, "mkstemp", denied)
    with pytest.raises(F.StorageError, match=r"cannot write in --out .*read_only \(Permission denied\)"):
        R.prepare(read_only)


MALFORMED = {  # key -> wrong values, each alone in an otherwise good state: ``malformed`` names exactly that key
    "losses": [["a", "b", "c"], (2.0, 1.0, 0.5), [2.0, 1.0], [2, 1, 0]],
    "elapsed_s": [None, True, "1.5"],
    "config": [[1], None],
    "chars": ["", 7],
    "corpus": [None, 3],
    "model": [{"w": [1.0]}, [torch.zeros(2)]],
    "optimizer": [[], None],
    "scaler": [[], 5],
    "rng_cpu": [torch.zeros(3), torch.zeros(2, 3, dtype=torch.uint8), None],
    "rng_cuda": [torch.zeros(3), 5],
    "sampler": [torch.zeros(3), None],
    "run_id": ["", 5],
    "metrics": ["x", [{"step": 4}], [{"step": -1}], [{"step": True}], [5], [{"val_loss": 1.0}]],
}


@pytest.mark.parametrize("key", list(MALFORMED))
def test_malformed_names_the_one_value_of_the_wrong_kind(key):
    assert CK.malformed(_state()) is None
    for wrong in MALFORMED[key]:
        assert CK.malformed(_state() | {key: wrong}) == f"{key} of the wrong kind", (key, wrong)


def test_malformed_checks_the_step_the_format_and_every_processs_random_state():
    cpu = torch.get_rng_state()
    assert CK.malformed(_state(step=0) | {"metrics": [{"step": 0}]}) is None  # a checkpoint before the first step
    for edge in ({"chars": "a"}, {"run_id": "a"}, {"rng_cuda": cpu}):  # one character, one letter, a GPU's state
        assert CK.malformed(_state() | edge) is None, edge
    for step in (-1, "3", 3.0, True):
        assert CK.malformed(_state() | {"step": step}) == f"step {step!r}"
    for fmt in (2, 4, "3", True):
        assert CK.malformed(_state() | {"format": fmt}).startswith(f"format {fmt!r}: this trainer reads format 3")
    two = {"world_size": 2, "rng_ranks": [{"cpu": cpu, "cuda": None}, {"cpu": cpu, "cuda": None}]}
    assert CK.malformed(_state() | two) is None
    assert CK.malformed(_state() | {"world_size": 2}) is None  # one process's state, rank 0's, for every rank
    for ranks in (two["rng_ranks"][:1], [two["rng_ranks"][0], {"cpu": torch.zeros(3), "cuda": None}],
                  [two["rng_ranks"][0], {"cuda": None}], two["rng_ranks"][0]):
        assert CK.malformed(_state() | two | {"rng_ranks": ranks}) == "rng_ranks of the wrong kind", ranks
    for size in (0, -1, True, 2.0):
        assert CK.malformed(_state() | {"world_size": size}) == "world_size of the wrong kind", size
    assert CK.malformed(_state() | {"chars": "", "corpus": None}) == "chars, corpus of the wrong kind"


class _RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_loading_a_checkpoint_runs_no_code_and_says_why_a_file_is_refused(tmp_path, monkeypatch):
    path, marker = tmp_path / R.CHECKPOINT, tmp_path / "the-code-ran"
    torch.save({"step": 1, "x": _RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(CK.CheckpointError, match="cannot be read: it is truncated, damaged or not a checkpoint"):
        CK.load_checkpoint(path)
    assert not marker.exists(), "an object in the file ran code while it was loaded"
    with pytest.raises(CK.CheckpointError, match=r"the checkpoint .*nowhere\.pt cannot be read \(No such file"):
        CK.load_checkpoint(tmp_path / "nowhere.pt")
    CK.save_checkpoint(_state(), path)
    for error, shown in ((RuntimeError("x" * 300 + "\nsecond line"), "RuntimeError: " + "x" * 160 + ")"),
                         (ValueError(""), "(ValueError: ValueError)")):
        monkeypatch.setattr(CK.torch, "load", lambda *a, error=error, **k: (_ for _ in ()).throw(error))
        with pytest.raises(CK.CheckpointError) as info:
            CK.load_checkpoint(path)
        assert shown in str(info.value) and "second line" not in str(info.value)


def test_a_failed_checkpoint_write_says_why_and_how_much_room_is_left(tmp_path, monkeypatch):
    path = tmp_path / R.CHECKPOINT
    usage = type("Usage", (), {"free": 3 * 2**20})
    monkeypatch.setattr(CK.shutil, "disk_usage", lambda folder: usage)
    for error, why in ((RuntimeError("y" * 300 + "\nsecond line"), "(" + "y" * 200 + "; 3 MiB free on that disk)"),
                       (OSError(errno.ENOSPC, "No space left on device"), "(No space left on device; 3 MiB free")):
        monkeypatch.setattr(CK, "write_atomic", lambda p, write, error=error: (_ for _ in ()).throw(error))
        with pytest.raises(CK.CheckpointError) as info:
            CK.save_checkpoint(_state(), path)
        assert why in str(info.value) and "second line" not in str(info.value)
        assert str(info.value).endswith(". The file there before this write is unchanged")
