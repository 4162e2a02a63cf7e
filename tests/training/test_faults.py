"""Fault injection, CI-sized: what an outside run did to the trainer and ``compare``, as tests.

- ``kill -9`` at random moments of a training, each time resumed: the weights and losses equal an
  uninterrupted run's, bit for bit, and no temporary file survives the next start;
- kills inside checkpoint writes (the process dies with a half-written temporary file): the next
  start removes it and the resumed run is exact;
- a small file system that fills up (a tmpfs, mounted in a private mount namespace of a child;
  skipped, with the reason, where the process may not mount one): every run finishes or ends with one
  line and exit status 1, leaving no temporary file, and continues exactly once there is room again;
- ``compare`` killed with SIGKILL: no worker outlives it by 5 s; Ctrl-C: it stops at the next step,
  starts no queued run, says only what happened;
- damaged checkpoints: every damage is refused with a ``CheckpointError`` naming the file, or loads
  exactly what was saved.

Each test prints one row of the closing table of issue 26: fault | tries | survived | leftovers | message.
Children start from the fork server of ``training_setup.start_child``; ``compare``'s workers are spawned by it.
"""

import contextlib
import ctypes
import io
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from training_setup import never_online, output, run, start_child, tiny, wait_for  # noqa: F401 (autouse fixture)

from modern_block.training import cli, files
from modern_block.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from modern_block.training.config import ConfigError
from modern_block.training.run_folder import CHECKPOINT, METRICS, SUMMARY

CFG = tiny("llama", max_steps=12, eval_interval=2)  # a checkpoint every 2 steps; dropout 0.1: RNG states matter


def _row(fault: str, tries: int, survived: int, leftovers: str, message: str) -> None:
    """One row of the fault table (``pytest -s`` prints them: fault | tries | survived | leftovers | message)."""
    print(f"FAULT | {fault} | {tries} | {survived} | {leftovers} | {message}")


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".write-test"))


def _weights(model) -> list[torch.Tensor]:
    return [t.clone() for t in model.state_dict().values()]


@pytest.fixture(scope="module")
def reference():
    result = run(CFG)
    return result.losses, _weights(result.model)


def _resumed_equals(reference, out: Path) -> bool:
    result = run(CFG, out, resume=True)
    losses, weights = reference
    return result.losses == losses and all(torch.equal(a, b) for a, b in zip(weights, _weights(result.model),
                                                                               strict=True))


# ---- kill -9 during training -------------------------------------------------------------------------
def _slow_training(out: Path) -> None:  # ~12 steps of 20 ms: the kills land in steps, evaluations and writes
    run(CFG, out, resume=True, on_step=lambda trainer: time.sleep(0.02))


def test_random_kill_9_during_training_resumes_bit_for_bit(tmp_path, reference):
    rng, tries, survived, left = random.Random(26), 4, 0, []
    for i in range(tries):
        out = tmp_path / f"run{i}"

        for k in range(2):  # killed twice, then left to finish
            child = start_child(tmp_path / f"child{i}-{k}.log", _slow_training, out)
            time.sleep(rng.uniform(0.02, 0.6))
            os.kill(child.pid, signal.SIGKILL)
            wait_for(child)
        survived += _resumed_equals(reference, out)
        left += _temporaries(out)
    _row("kill -9 during training (twice per run), then resume", tries, survived, f"{len(left)} temporary files",
         "none needed: the resume says where it continues from")
    assert survived == tries and not left


# ---- kills inside checkpoint writes ------------------------------------------------------------------
def _dies_while_writing_a_checkpoint_after(n_bytes: int):
    """A stand-in for ``files._open_for_writing`` that kills its own process (SIGKILL) once ``n_bytes`` of
    a checkpoint's temporary file are written: the process dies inside the write."""
    real = files._open_for_writing

    def opener(fd: int):
        f = real(fd)
        if not os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(CHECKPOINT + "."):
            return f
        written = [0]
        write = f.write

        def dying_write(data):
            written[0] += len(data)
            if written[0] > n_bytes:
                write(bytes(data)[: max(0, n_bytes - (written[0] - len(data)))])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return write(data)

        f.write = dying_write
        return f

    return opener


def _dies_at_a_checkpoint(cut: int, at_write: int, out: Path) -> None:
    count = [0]

    def arm(trainer):  # before the chosen checkpoint, every write of ckpt.pt dies after `cut` bytes
        count[0] += trainer.step % CFG.eval_interval == CFG.eval_interval - 1
        if count[0] == at_write:
            files._open_for_writing = _dies_while_writing_a_checkpoint_after(cut)

    run(CFG, out, on_step=arm)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="names an open file through /proc (Linux)")
def test_kills_inside_checkpoint_writes_leave_nothing_after_the_next_start(tmp_path, reference):
    rng, tries, survived, before, after = random.Random(7), 4, 0, 0, []
    for i in range(tries):
        out = tmp_path / f"run{i}"
        cut = rng.randrange(1, 200_000)  # a tiny model's checkpoint is ~300 kB
        at_write = rng.randrange(1, 4)  # the first, second or third checkpoint

        child = start_child(tmp_path / f"child{i}.log", _dies_at_a_checkpoint, cut, at_write, out)
        assert wait_for(child) == -signal.SIGKILL, "the child died inside the checkpoint write:\n" + output(child)
        before += len(_temporaries(out))
        survived += _resumed_equals(reference, out)
        after += _temporaries(out)
    _row("kill -9 inside a checkpoint write", tries, survived,
         f"{before} temporary files before the next start, {len(after)} after", "the next start removes them")
    assert before == tries, "each kill left its half-written temporary file"
    assert survived == tries and not after


# ---- a small file system that fills up ---------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUSER, MS_REC, MS_PRIVATE = 0x00020000, 0x10000000, 0x4000, 0x40000


def _private_tmpfs(where: Path, size: int) -> None:
    """In this (forked) process: a mount namespace of its own, and a tmpfs of ``size`` bytes at ``where``.
    As root the namespace needs nothing more; otherwise a user namespace maps this user to root in it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare: " + os.strerror(ctypes.get_errno()))
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks to the host
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /: " + os.strerror(ctypes.get_errno()))
    where.mkdir(parents=True, exist_ok=True)
    if libc.mount(b"tmpfs", str(where).encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs: " + os.strerror(ctypes.get_errno()))


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` up to ``leave`` bytes free."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "ab") as f:
        f.write(b"\0" * max(0, free - leave))


def _cli(argv: list[str], err_file: Path) -> int:
    """``python -m modern_block train ARGV`` in this process, its stderr kept in ``err_file``."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.train_main(argv)
        except SystemExit as exit_:
            code = exit_.code
        except BaseException:  # noqa: BLE001 - a traceback is what the test looks for
            import traceback

            buffer.write("Traceback\n" + traceback.format_exc())
            code = 99
    err_file.write_text(buffer.getvalue())
    return code


TMPFS_FLAGS = ["--arch", "llama", "--quick", "--max-steps", "12", "--eval-interval", "2", "--batch-size", "4",
               "--block-size", "16", "--eval-batches", "2", "--lr", "0.01", "--min-lr", "0.001", "--warmup-steps",
               "2", "--seed", "5", "--no-progress", "--device", "cpu"]


def _sweep(mount: Path, frees: list[int], reference: list[float], tmp_path: Path, report: Path) -> None:
    """In a child: a tmpfs of 16 MB at ``mount``, filled to each of ``frees`` bytes free in turn; a run on
    each, resumed with room again where it stopped (its losses must equal ``reference``)."""
    _private_tmpfs(mount, 16 << 20)
    rows = []
    for i, free in enumerate(frees):
        (mount / "filler").unlink(missing_ok=True)
        _fill(mount, free)
        out = mount / f"run{i}"
        code = _cli([*TMPFS_FLAGS, "--out", str(out)], tmp_path / f"err{i}")
        temporaries = _temporaries(mount)
        (mount / "filler").unlink()  # room again: the run continues where it stopped
        resumed = None
        if code == 1 and (out / CHECKPOINT).exists():
            resumed = _cli([*TMPFS_FLAGS, "--out", str(out), "--resume"], tmp_path / f"resume{i}") == 0
            resumed = resumed and load_checkpoint(out / CHECKPOINT)["losses"] == reference
        rows.append({"free": free, "code": code, "err": (tmp_path / f"err{i}").read_text(),
                     "temporaries": temporaries, "folder_left": out.exists() and not any(out.iterdir()),
                     "resumed": resumed, "resume_err": (tmp_path / f"resume{i}").read_text()
                     if (tmp_path / f"resume{i}").exists() else ""})
        shutil.rmtree(out, ignore_errors=True)  # the next try starts on an empty disk
    report.write_text(json.dumps(rows))


def test_a_small_file_system_that_fills_up(tmp_path):
    """Free space from nothing to enough for a run, on a tmpfs: the lock, the metrics, the checkpoints, their
    rewrites and the summary each meet a full disk somewhere in the sweep. Then room again: --resume goes on."""
    mount, report = tmp_path / "disk", tmp_path / "report.json"
    assert _cli([*TMPFS_FLAGS, "--out", str(tmp_path / "room")], tmp_path / "room.err") == 0
    reference = load_checkpoint(tmp_path / "room" / CHECKPOINT)["losses"]  # a 4 MB checkpoint, at steps 2, 4, ...
    frees = [0, 6_000, 10_000, 1_000_000, 6_000_000, 9_000_000, 13_000_000]

    child = start_child(tmp_path / "child.log", _sweep, mount, frees, reference, tmp_path, report)
    if wait_for(child, 300) != 0 and not report.exists():
        pytest.skip(f"cannot mount a tmpfs here (no mount namespace for this process): {output(child)[-300:]}")
    rows = json.loads(report.read_text())
    for r in rows:
        lines = r["err"].strip().splitlines()
        assert r["code"] in (0, 1), r
        assert "Traceback" not in r["err"], r["err"]
        if r["code"] == 1:
            errors = [line for line in lines if line.startswith("error: ")]
            assert len(errors) == 1 and "No space left on device" in errors[0], r
        assert not r["temporaries"] and not r["folder_left"], r
        assert r["resumed"] in (None, True), (r["free"], r["resume_err"])
    failed = [r for r in rows if r["code"] == 1]
    assert failed and any(r["code"] == 0 for r in rows), "the sweep meets a full disk and also room enough"
    messages = sorted({re.sub(r"/\S+", "<path>", r["err"].strip().splitlines()[-1]) for r in failed})
    _row("full file system (tmpfs, free space swept 0 B - 12 MB)", len(rows),
         sum(r["code"] in (0, 1) and "Traceback" not in r["err"] for r in rows),
         f"{sum(len(r['temporaries']) for r in rows)} temporary files, "
         f"{sum(r['folder_left'] for r in rows)} empty folders", " // ".join(messages))


# ---- compare killed ----------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


COMPARE = ["--quick", "--workers", "2", "--rates", "0.01", "0.02", "--selection-seeds", "0", "--seeds", "1",
           "--max-steps", "100000", "--eval-interval", "50", "--batch-size", "4", "--block-size", "16",
           "--eval-batches", "1", "--no-progress"]


def _compare_main(out: Path) -> int:
    os.setpgid(0, 0)  # its own process group, as a shell gives a job: Ctrl-C reaches it and its workers
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (pytest may run in the background)
    return cli.compare_main([*COMPARE, "--out", str(out)])  # the child's exit status (130 after Ctrl-C)


def _compare_parent(out: Path, log: Path) -> multiprocessing.Process:
    """``compare`` in a child process, with two workers and four long runs (two of them queued)."""
    return start_child(log, _compare_main, out)


def _training_workers(parent: multiprocessing.Process, out: Path, timeout: float = 120) -> list[int]:
    """The worker processes of a forked ``compare`` once both are training (each run has logged its first
    evaluation, so each worker has set itself up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [p for p in _children(parent.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        if len(workers) == 2 and len([m for m in out.glob("*/" + METRICS) if m.stat().st_size]) == 2:
            return workers
        time.sleep(0.05)
    raise AssertionError("the workers did not start training")


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still alive after ``seconds`` (those are then killed)."""
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc (Linux)")
def test_a_killed_compare_leaves_no_worker_behind(tmp_path):
    out = tmp_path / "cmp"
    parent = _compare_parent(out, tmp_path / "log")
    workers = _training_workers(parent, out)
    children = _children(parent.pid)  # the workers (and multiprocessing's resource tracker, if it started one)
    os.kill(parent.pid, signal.SIGKILL)
    wait_for(parent)
    t0 = time.monotonic()
    orphans = _gone_within(children, 5)
    gone_in = time.monotonic() - t0
    _row("compare killed with SIGKILL (2 workers training)", 1, int(not orphans),
         f"{len(orphans)} of {len(children)} child processes alive after 5 s (all gone in {gone_in:.1f} s)",
         "none (the workers die with their parent)")
    assert not orphans and len(workers) == 2


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc (Linux)")
def test_ctrl_c_stops_compare_at_the_next_step_and_starts_no_queued_run(tmp_path):
    out, log = tmp_path / "cmp", tmp_path / "log"
    parent = _compare_parent(out, log)
    _training_workers(parent, out)
    children = _children(parent.pid)
    os.killpg(parent.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole process group
    t0 = time.monotonic()
    code = wait_for(parent, 60)
    stopped_in = time.monotonic() - t0
    text = log.read_text()
    runs = sorted(p.parent.name for p in out.glob("*/" + METRICS))
    leftover = _gone_within(children, 5)
    _row("Ctrl-C on compare (2 runs training, 2 queued)", 1, int(code == 130 and len(runs) == 2 and not leftover),
         f"{len(leftover)} processes; {len(runs)} run folders (the 2 that ran); stopped in {stopped_in:.1f} s",
         (text.strip().splitlines() or ["(compare printed nothing)"])[-1][:200])
    assert code == 130 and stopped_in < 30, text
    assert len(runs) == 2, f"a queued run started: {runs}"
    assert "Traceback" not in text and "checkpoint" not in text, text
    assert not leftover


# ---- damaged checkpoints ---------------------------------------------------------------------------------
def _resave(edit):
    def damage(path: Path):
        ckpt = load_checkpoint(path)
        del ckpt["checksum"]
        edit(ckpt)
        save_checkpoint(ckpt, path)  # a valid file with a valid checksum, holding something wrong
    return damage


def _set(key, value):
    return _resave(lambda ckpt: ckpt.__setitem__(key, value))


DAMAGES = {
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(5000)),
    "not a dict": lambda p: torch.save([1, 2, 3], p),
    "missing keys": lambda p: torch.save({"step": 4}, p),
    "no checksum": lambda p: torch.save({k: v for k, v in torch.load(p, weights_only=True).items()
                                         if k != "checksum"}, p),
    "format from the future": _set("format", 99),
    "format not a number": _set("format", "3"),
    "step not an int": _set("step", "4"),
    "step beyond the losses": _set("step", 10**6),
    "losses not numbers": _set("losses", ["a"] * 4),
    "elapsed not a number": _set("elapsed_s", None),
    "config not a dict": _set("config", [1]),
    "config with an unknown setting": _resave(lambda c: c["config"].__setitem__("warp", 9)),
    "config breaking a rule": _resave(lambda c: c["config"].__setitem__("lr", -1.0)),
    "chars not text": _set("chars", 7),
    "model of another shape": _resave(lambda c: c["model"].__setitem__(
        next(iter(c["model"])), torch.zeros(3, 3))),
    "model key missing": _resave(lambda c: c["model"].pop(next(iter(c["model"])))),
    "optimizer state garbage": _set("optimizer", {"state": 5}),
    "sampler state garbage": _set("sampler", torch.zeros(3)),
    "random state garbage": _set("rng_cpu", torch.zeros(3, dtype=torch.uint8)),
    "random state of 5 processes": _set("rng_ranks", [{"cpu": torch.zeros(3), "cuda": None}] * 5),
    "metrics not rows": _set("metrics", "x"),
    "metrics beyond its step": _resave(lambda c: c["metrics"].append({"step": 10**6, "val_loss": 1.0})),
    "run id not text": _set("run_id", 5),
}


def test_the_malformed_checkpoint_table(tmp_path):
    """Every damage, and 24 random truncations and bit flips, is refused naming the file, or (a flip in bytes the
    format does not read) loads exactly what was saved. Never another exception, never a silent wrong state."""
    cfg = replace(CFG, max_steps=4)
    good = tmp_path / "good"
    run(cfg, good)
    original = (good / CHECKPOINT).read_bytes()
    saved = load_checkpoint(good / CHECKPOINT)["checksum"]
    rng = random.Random(3)
    cases = list(DAMAGES.items())
    cases += [(f"truncated at {n}", lambda p, n=n: p.write_bytes(original[:n]))
              for n in sorted(rng.sample(range(1, len(original)), 12))]
    cases += [(f"bit flip at {n}", lambda p, n=n: p.write_bytes(original[:n] + bytes([original[n] ^ (1 << rng.randrange(
        8))]) + original[n + 1:])) for n in sorted(rng.sample(range(len(original)), 12))]
    refused, exact, wrong = 0, 0, []
    for name, damage in cases:
        out = tmp_path / "case"
        out.mkdir(exist_ok=True)
        (out / CHECKPOINT).write_bytes(original)
        for other in (METRICS, SUMMARY):
            (out / other).write_bytes((good / other).read_bytes())
        damage(out / CHECKPOINT)
        try:
            result = run(cfg, out, resume=True)
        except (CheckpointError, ConfigError) as err:
            named = str(out / CHECKPOINT) in str(err) or "checkpoint" in str(err)
            refused += named
            if not named:
                wrong.append((name, repr(err)))
            continue
        except Exception as err:  # noqa: BLE001 - any other exception is a finding
            wrong.append((name, f"{type(err).__name__}: {err}"))
            continue
        if load_checkpoint(out / CHECKPOINT)["checksum"] == saved and result.finished:
            exact += 1
        else:
            wrong.append((name, "loaded a different state"))
    _row(f"damaged checkpoint ({len(DAMAGES)} kinds, 12 truncations, 12 bit flips)", len(cases), refused + exact,
         "none (the folder is read, not changed)", f"{refused} refused naming the file, {exact} read exactly")
    assert not wrong, wrong
