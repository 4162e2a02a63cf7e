"""Data parallelism on the CPU: two gloo processes on 127.0.0.1 against one process.

Two ways of starting the processes: children of ``training_setup.start_child`` with torchrun's
environment (cheap: forked from a server that has imported torch), and once the real ``torchrun`` for
what only it does (stopping every process when one of them dies). A torchrun launch costs three fresh
interpreters, so there is one; the resume it prints runs in such children, which the trainer cannot
tell from torchrun's.

Why two processes match one process with gradient accumulation to the last bit, and one process
without it only approximately: with the same global batch of 4 sequences, process r (or micro-batch r)
computes the mean loss of its 2 sequences; DDP sums the two gradients and halves them, gradient
accumulation halves each and sums them, and halving is exact in binary floating point: the same
numbers. One pass over all 4 sequences instead averages 4 per-sequence terms in another order, and
float addition is not associative, so the last bits of the gradient differ; AdamW then divides by
sqrt(v), which carries those ~1e-7 relative differences into the weights, and they grow with the steps
(the README quotes them after 10 and 400 steps). Over the 6 steps here 1e-5 on the loss leaves about
20x room over what the runs show (up to ~5e-7).
"""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from training_setup import CORPUS, ROOT, evals, never_online, output, run, start_child, tiny, wait_for  # noqa: F401

from modern_block.training import cli, config, distributed
from modern_block.training import trainer as T
from modern_block.training.checkpoint import load_checkpoint
from modern_block.training.run_folder import CHECKPOINT, METRICS, SUMMARY

TOLERANCE = 1e-5  # one process without accumulation vs two processes: see the module docstring


# ---- the helpers, in one process ---------------------------------------------------------------------
def test_ranks_come_from_torchruns_environment():
    assert distributed.ranks_from_env({}) == distributed.Ranks() and not distributed.Ranks().distributed
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    ranks = distributed.ranks_from_env(env)
    assert ranks == distributed.Ranks(3, 4, 1, 2) and ranks.distributed and not ranks.is_main
    with pytest.raises(ValueError, match="RANK must be an integer"):
        distributed.ranks_from_env({**env, "RANK": "x"})
    with pytest.raises(ValueError, match="inconsistent torchrun environment: RANK=4, WORLD_SIZE=4"):
        distributed.ranks_from_env({**env, "RANK": "4"})


def test_in_one_process_nothing_is_exchanged():
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_sum(t) is t and distributed.gather_objects("x") == ["x"]
    assert distributed.agree_or_raise(None, 7) == [7]
    with pytest.raises(KeyError, match="mine"):
        distributed.agree_or_raise(KeyError("mine"))


# ---- two processes started here ----------------------------------------------------------------------
def _two_processes(tmp_path: Path, job) -> list[dict]:
    """Run ``job()`` in two child processes (``start_child``: they share this one's imports), with the
    environment torchrun would give them (rank, world size, the address of a store this process serves
    on a free port); returns what each job returned. ``job`` is pickled: a module-level function."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # port 0: a free one
    procs = [start_child(tmp_path / f"rank{rank}.log", _child, rank, store.port, job, tmp_path) for rank in range(2)]
    assert [wait_for(p, 300) for p in procs] == [0, 0], "\n".join(output(p) for p in procs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def _child(rank: int, port: int, job, tmp_path: Path) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    try:
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(job()))
    finally:
        distributed._leave()


def _outcome(result: T.TrainResult) -> dict:
    return {"losses": result.losses, "evals": evals(result), "world_size": result.world_size,
            "weights": sum(float(p.double().sum()) for p in result.model.parameters())}


def _whole_and_until(cfg: config.TrainConfig, whole: Path, part: Path, until: int) -> dict:
    """A whole run into ``whole`` (its outcome returned), and one into ``part`` stopped after ``until`` steps."""
    out = _outcome(run(cfg, whole))
    run(cfg, part, until=until)
    return out


def _resumed(cfg: config.TrainConfig, out: Path) -> dict:
    return _outcome(run(cfg, out, resume=True))


def test_two_processes_take_the_steps_of_one_with_the_same_global_batch(tmp_path):
    cfg = tiny("llama", batch_size=4, eval_batches=3, dropout=0.0, max_steps=6)  # 3 eval batches: 2 + 1
    accumulated = run(replace(cfg, micro_batch_size=2))  # one process, two passes of 2 sequences per step
    one_pass = run(cfg)

    rank0, rank1 = _two_processes(tmp_path, partial(_whole_and_until, cfg, tmp_path / "two", tmp_path / "half", 4))
    assert rank0 == rank1, "every process holds the same losses and the same weights"
    assert rank0["world_size"] == 2
    assert rank0["losses"] == accumulated.losses, "gradient accumulation: the same numbers"
    assert [list(e) for e in evals(accumulated)] == rank0["evals"]
    gap = max(abs(a - b) for a, b in zip(rank0["losses"], one_pass.losses, strict=True))
    print(f"two processes vs one pass over the batch: largest loss difference {gap:.2e}")
    assert gap < TOLERANCE
    lines = (tmp_path / "two" / METRICS).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 4, 6], "one writer: each evaluation once"
    assert json.loads((tmp_path / "two" / SUMMARY).read_text())["world_size"] == 2
    # a run begun on two processes finishes on one (micro-batches of 2 keep the numbers)
    finished = run(replace(cfg, micro_batch_size=2), tmp_path / "half", resume=True)
    assert finished.losses == accumulated.losses


def test_resume_with_two_processes_repeats_the_run_exactly(tmp_path):
    cfg = tiny("gpt2", batch_size=4, dropout=0.1, max_steps=8)  # dropout: every process's random state matters

    whole, _ = _two_processes(tmp_path, partial(_whole_and_until, cfg, tmp_path / "whole", tmp_path / "split", 5))
    ckpt = load_checkpoint(tmp_path / "split" / CHECKPOINT)
    assert ckpt["step"] == 5 and ckpt["world_size"] == 2 and len(ckpt["rng_ranks"]) == 2
    assert not torch.equal(ckpt["rng_ranks"][0]["cpu"], ckpt["rng_ranks"][1]["cpu"]), "a dropout stream each"
    resumed, _ = _two_processes(tmp_path, partial(_resumed, cfg, tmp_path / "split"))
    assert resumed == whole


# ---- the real torchrun -------------------------------------------------------------------------------
FLAGS = ["--arch", "gpt2", "--quick", "--max-steps", "30", "--eval-interval", "2", "--batch-size", "4",
         "--block-size", "16", "--eval-batches", "2", "--dropout", "0", "--no-progress"]


def _torchrun(args: list[str], tmp_path: Path, **kw) -> subprocess.Popen:
    """``torchrun --nproc_per_node 2`` (as ``python -m torch.distributed.run``), rendezvous on
    127.0.0.1 at a port it picks; the processes find the text as the tests do and never go online."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "https_proxy": "http://127.0.0.1:9", "http_proxy":
           "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)}  # a closed port: any download fails at once
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", *args]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


def _worker_pid(launcher_pid: int, local_rank: int) -> int:
    """The pid of the process torchrun started for ``local_rank`` (its child with that LOCAL_RANK)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher_pid and f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no process with LOCAL_RANK={local_rank} under {launcher_pid}")


def _main_printing_to(argv: list[str], folder: Path) -> int:
    """``cli.train_main(argv)`` with what it prints in ``folder``/out<RANK>.txt."""
    with open(folder / f"out{os.environ['RANK']}.txt", "w") as f, contextlib.redirect_stdout(f):
        return cli.train_main(argv)


def _kill_rank_1_after_the_first_checkpoint(out: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """Train under torchrun into ``out``, kill rank 1 once the first checkpoint is written; (all output, rank 0's
    "error: rank 0: ..." lines)."""
    launch = _torchrun(["--nproc_per_node", "2", "-m", "modern_block", "train", *FLAGS, "--out", str(out)], tmp_path)
    deadline = time.monotonic() + 300
    while not (out / CHECKPOINT).exists():  # the first checkpoint (step 2) is written ...
        assert launch.poll() is None and time.monotonic() < deadline, launch.communicate()[0]
        time.sleep(0.02)
    os.kill(_worker_pid(launch.pid, 1), signal.SIGKILL)  # ... then rank 1 dies, as the OOM killer would do it
    output = launch.communicate(timeout=300)[0]
    assert launch.returncode != 0, output
    return output, [line for line in output.splitlines() if line.startswith("error: rank 0: ")]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc (Linux)")
def test_torchrun_stops_every_process_when_one_dies_and_the_printed_command_resumes_exactly(tmp_path):
    cfg = config.quick_config("gpt2", max_steps=30, eval_interval=2, batch_size=4, block_size=16, eval_batches=2,
                         dropout=0.0, micro_batch_size=2)  # what FLAGS ask for, in one process and two micro-batches
    reference = T.train(cfg, progress=False, verbose=False)
    for attempt in range(2):
        out = tmp_path / f"run{attempt}"
        output, message = _kill_rank_1_after_the_first_checkpoint(out, tmp_path)
        if message or "Unable to shutdown process" not in output:
            break
        # on a heavily loaded machine rank 0 can sit in a C call past torchrun's 30 s grace: say so, try once more
        print(f"attempt {attempt}: torchrun had to SIGKILL rank 0 before it printed its error:\n{output}")
    assert len(message) == 1, output
    print(message[0])
    assert re.match(r"error: rank 0: (another process of this run stopped or cannot be reached \(.*\)|stopped by "
                    r"SIGTERM \(torchrun sends it .*\))\. The last good checkpoint", message[0]), message[0]
    kept = load_checkpoint(out / CHECKPOINT)  # loadable, and its checksum holds
    assert f"The last good checkpoint (step {kept['step']}) is kept in {out / CHECKPOINT}" in message[0]
    assert 2 <= kept["step"] < 30 and "[rank0]: Traceback" not in output

    command = shlex.split(output.split("resume with: ")[1].splitlines()[0])
    assert command[:6] == ["torchrun", "--nproc_per_node", "2", "-m", "modern_block", "train"]
    assert command[6:] == [*FLAGS, "--out", str(out), "--resume"]

    # the printed command's options, in two processes with torchrun's environment
    assert _two_processes(tmp_path, partial(_main_printing_to, command[6:], tmp_path)) == [0, 0]
    assert f"resumed from {out / CHECKPOINT} at step {kept['step']}" in (tmp_path / "out0.txt").read_text()
    assert (tmp_path / "out1.txt").read_text() == "", "rank 0 alone prints"
    final = load_checkpoint(out / CHECKPOINT)
    assert final["step"] == 30 and final["losses"] == reference.losses, "continued exactly"
    rows = [json.loads(x) for x in (out / METRICS).read_text().splitlines()]
    assert [(r["step"], r["train_loss"], r["val_loss"]) for r in rows] == evals(reference)


# ---- on two GPUs (benchmarks/gpu_check.sh, part 3) ---------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_with_nccl_take_the_steps_of_one(tmp_path):
    flags = ["--arch", "llama", "--full", "--max-steps", "200", "--eval-interval", "50", "--dropout", "0",
             "--device", "cuda", "--no-progress"]  # nanoGPT's model and batch of 64, 200 steps
    launch = _torchrun(["--nproc_per_node", "2", "-m", "modern_block", "train", *flags, "--out", str(tmp_path / "two")],
                       tmp_path)
    output = launch.communicate(timeout=480)[0]
    print(output[-3000:])
    assert launch.returncode == 0 and "2 process(es) × 1 micro-batch(es) of 32 sequences" in output
    two = [json.loads(x) for x in (tmp_path / "two" / METRICS).read_text().splitlines()]
    cfg = config.gpu_config("llama", max_steps=200, eval_interval=50, dropout=0.0, device="cuda", micro_batch_size=32)
    one = T.train(cfg, progress=False, verbose=False)
    summary = json.loads((tmp_path / "two" / SUMMARY).read_text())
    print(f"one GPU: {one.tokens_per_s:,.0f} tok/s, MFU {one.mfu}; two GPUs: {summary['tokens_per_s']:,.0f} tok/s, "
          f"MFU {summary['mfu']} per device")
    assert summary["world_size"] == 2
    # bf16 autocast and kernels that add in varying order: the runs drift apart a little in 200 steps
    for a, b in zip(two, one.metrics, strict=True):
        assert a["step"] == b["step"] and abs(a["val_loss"] - b["val_loss"]) < 0.03, (a, b)
