"""The trainer and its command line: exact resume, interruption, non-finite losses, the schedule,
validation, gradient accumulation, and a run that is never lost (each case of issue 17 as a user
meets it; the file-level mechanics are in test_run_folder.py, several processes in test_distributed.py)."""

import errno
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from training_setup import (  # noqa: F401 (never_online is an autouse fixture)
    CORPUS,
    ROOT,
    SMALL,
    TEXT,
    disk_fills_up_after,
    evals,
    never_online,
    run,
    tiny,
)

from modern_block import GPT2LM, generate
from modern_block.training import cli, config, files, parts, run_folder
from modern_block.training import trainer as T
from modern_block.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from modern_block.training.run_folder import CHECKPOINT, METRICS, SUMMARY


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_resume_after_ctrl_c_repeats_the_uninterrupted_run_exactly(arch, tmp_path):
    cfg = tiny(arch)  # dropout > 0: the torch RNG state matters too
    whole = run(cfg, tmp_path / "whole")

    def interrupt_at_6(trainer):  # between two evaluations (every 4 steps)
        if trainer.step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "split", on_step=interrupt_at_6)
    ckpt = torch.load(tmp_path / "split" / CHECKPOINT, weights_only=True)  # plain tensors and containers
    assert ckpt["step"] == 6 and len(ckpt["losses"]) == 6
    resumed = run(cfg, tmp_path / "split", resume=True)
    assert resumed.losses == whole.losses, "same loss at every step, to the last bit"
    assert len(whole.losses) == cfg.max_steps and all(math.isfinite(x) for x in whole.losses)
    assert evals(resumed) == evals(whole)
    for (name, p), q in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    lines = (tmp_path / "split" / METRICS).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 4, 8, 10], "each evaluation logged once"


@pytest.fixture
def python_sigint_handler():
    """Python's usual Ctrl-C handler for the test (a shell starts background jobs with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_real_sigint_finishes_the_step_and_saves(tmp_path, python_sigint_handler):
    cfg = tiny("gpt2", max_steps=6)
    whole = run(cfg)

    def ctrl_c_at_3(trainer):
        if trainer.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal or Jupyter's interrupt button does

    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path, on_step=ctrl_c_at_3)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler is restored"
    assert torch.load(tmp_path / CHECKPOINT, weights_only=True)["step"] == 3
    assert run(cfg, tmp_path, resume=True).losses == whole.losses


def test_pausing_with_until_and_resuming(tmp_path):
    cfg = tiny("llama", max_steps=6, eval_interval=3)
    whole = run(cfg)
    first = run(cfg, tmp_path, until=2)
    assert not first.finished and len(first.losses) == 2
    assert run(cfg, tmp_path, resume=True).losses == whole.losses


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    def poison_after_5(trainer):
        if trainer.step == 5:  # the checkpoint of step 4 is on disk
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))

    with pytest.raises(T.NonFiniteLossError, match=r"loss became nan at step 6 .*last good checkpoint \(step 4\)"):
        run(tiny("llama"), tmp_path, on_step=poison_after_5)
    ckpt = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert ckpt["step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_a_non_finite_state_never_replaces_the_checkpoint(tmp_path):
    trainer = T.Trainer(tiny("gpt2", max_steps=4), tmp_path, corpus=CORPUS, progress=False, verbose=False)
    trainer.run()
    before = (tmp_path / CHECKPOINT).read_bytes()
    with torch.no_grad():
        trainer.model.head.weight[0, 0] = float("inf")
    with pytest.raises(T.NonFiniteLossError, match="parameters became non-finite"):
        trainer.save_checkpoint()
    assert (tmp_path / CHECKPOINT).read_bytes() == before


def test_resume_refuses_different_settings(tmp_path):
    run(tiny("gpt2", max_steps=2), tmp_path)
    with pytest.raises(ValueError, match=r"lr \(saved 0.01, given 0.02\)"):
        run(tiny("gpt2", max_steps=2, lr=2e-2), tmp_path, resume=True)


def test_metrics_file_and_summary(tmp_path):
    result = run(tiny("llama", max_steps=8), tmp_path)
    rows = [json.loads(x) for x in (tmp_path / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 8]
    for r in rows:
        assert set(r) == {"step", "train_loss", "val_loss", "tokens_per_s", "mfu", "lr", "elapsed_s"}
        assert r["mfu"] is None, "no peak FLOP/s on a CPU"
    assert rows[0]["val_loss"] == pytest.approx(math.log(len(set(TEXT))), abs=0.15), "starts near ln(V)"
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.5, "it learns"
    assert rows[1]["tokens_per_s"] > 0
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["best_val_loss"] == result.best_val_loss == min(r["val_loss"] for r in rows)
    assert summary["n_params"] == result.model.num_parameters()


def test_compile_failure_falls_back_to_eager(monkeypatch):
    def broken_compile(model, **kw):
        def fails(*a, **k):
            raise RuntimeError("no compiler here")
        return fails

    monkeypatch.setattr(torch, "compile", broken_compile)
    with pytest.warns(UserWarning, match="torch.compile failed .*no compiler here"):
        result = run(tiny("gpt2", max_steps=2, compile=True))
    assert not result.compiled and len(result.losses) == 2


def test_learning_rate_schedule():
    cfg = tiny(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert config.lr_at(0, cfg) == pytest.approx(1e-3 / 11)
    assert config.lr_at(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert config.lr_at(10, cfg) == pytest.approx(1e-3)
    assert config.lr_at(60, cfg) == pytest.approx((1e-3 + 1e-4) / 2), "half way down the cosine"
    assert config.lr_at(110, cfg) == pytest.approx(1e-4)
    decay = [config.lr_at(s, cfg) for s in range(10, 110)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False)), "strictly decreasing after warmup"


def test_weight_decay_only_on_matrices():
    model = GPT2LM(65, 32, 2, 4, 16)
    opt = config.make_optimizer(model, tiny())
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_config_validation_and_quick_env(monkeypatch):
    with pytest.raises(ValueError, match="lr must be a positive finite"):
        tiny(lr=float("inf"))
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny("bert")
    with pytest.raises(ValueError, match="n_kv_heads"):
        tiny(n_kv_heads=3)
    gpu = config.gpu_config("gpt2")
    assert (gpu.n_layers, gpu.n_heads, gpu.d, gpu.block_size, gpu.batch_size, gpu.max_steps, gpu.dropout, gpu.lr,
            gpu.warmup_steps, gpu.min_lr, gpu.beta2) == (6, 6, 384, 256, 64, 5000, 0.2, 1e-3, 100, 1e-4, 0.99)
    assert config.with_rate(gpu, 4e-3).min_lr == pytest.approx(4e-4), "the cosine ends at a tenth of the peak"


def test_replace_keeps_validation():
    with pytest.raises(ValueError):
        replace(tiny(), max_steps=0)


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --arch"),
    (["--arch", "bert"], "invalid choice: 'bert'"),
    (["--arch", "llama", "--max-steps", "0"], "expected a positive integer, got 0"),
    (["--arch", "llama", "--lr", "nan"], "expected a positive finite number"),
    (["--arch", "llama", "--lr", "abc"], "expected a positive finite number, got 'abc'"),
    (["--arch", "llama", "--quick", "--full"], "not allowed with argument"),
    (["--arch", "llama", "--warmup-steps", "-3"], "warmup_steps must be a non-negative int"),
    (["--arch", "llama", "--min-lr", "1"], "min_lr must be in"),
    (["--arch", "llama", "--device", "tpu"], "--device: device must be"),
    (["--arch", "llama", "--batch-size", "1e20"], "expected a positive integer, got '1e20'"),
    (["--arch", "llama", "--batch-size", str(10**20)], "batch_size must be a positive int of at most 2,147,483,647"),
    (["--arch", "llama", "--lr", "1e308"], "lr must be a positive finite number of at most 1000"),
    (["--arch", "llama", "--seed", "1e20"], "expected a seed in [0, 2**63 - 1], got '1e20'"),
    (["--arch", "llama", "--seed", str(10**20)], "expected a seed in [0, 2**63 - 1]"),
    (["--arch", "llama", "--eval-batches", "1e8"], "expected a positive integer, got '1e8'"),
    (["--arch", "llama", "--batch-size", "8", "--micro-batch-size", "3"], "micro_batch_size (3) must divide"),
    (["--arch", "llama", "--resume", "--overwrite"], "not allowed with argument"),
])
def test_train_cli_rejects_bad_arguments_with_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.train_main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_bad_argument_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "modern_block", "train", "--arch", "llama", "--batch-size", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "expected a positive integer" in proc.stderr and "Traceback" not in proc.stderr


def test_train_cli_writes_metrics_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]) == 0
    rows = [json.loads(x) for x in (out / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert (out / CHECKPOINT).exists() and json.loads((out / SUMMARY).read_text())["finished"]
    assert "done: best val loss" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # a resume with other settings is a usage error
        cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), "--resume", *SMALL, "--lr", "0.5"])
    assert exc.value.code == 2 and "these differ: lr" in capsys.readouterr().err


def test_sample_uses_the_kv_cache_deterministically():
    result = run(tiny("llama", max_steps=2))
    a = T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a == T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a.startswith("the ") and len(a) == 14
    greedy = T.sample(result.model, result.tokenizer, "the ", 10, temperature=0.0)
    ids = result.tokenizer.encode("the ")[None]
    assert greedy == result.tokenizer.decode(generate(result.model, ids, 10, use_cache=False)[0])


def test_gradient_accumulation_takes_the_same_steps_as_one_pass():
    cfg = tiny("llama", max_steps=4, batch_size=4, dropout=0.0)
    whole = run(cfg)
    assert run(replace(cfg, micro_batch_size=4)).losses == whole.losses, "one micro-batch of all: the same bits"
    halves = run(replace(cfg, micro_batch_size=2))
    # two passes of 2 sequences: the gradients are summed in another order, so the last bits differ
    assert max(abs(a - b) for a, b in zip(halves.losses, whole.losses, strict=True)) < 1e-5


# ---- a run is never lost, and a user's mistake gets a message, not a traceback -----------------------


def test_an_existing_run_is_not_started_over_unless_asked(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]) == 0
    files = {name: (out / name).read_bytes() for name in (CHECKPOINT, METRICS, SUMMARY)}
    with pytest.raises(SystemExit) as exc:
        cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "already holds a run (a checkpoint (ckpt.pt), 3 evaluation(s) in metrics.jsonl, a summary.json)" in err
    assert "--resume to continue it, --overwrite to start it over" in err
    assert {name: (out / name).read_bytes() for name in files} == files, "not a byte changed"
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL, "--overwrite", "--lr", "0.01"]) == 0
    assert json.loads((out / SUMMARY).read_text())["config"]["lr"] == 0.01


def test_two_trainings_cannot_write_one_folder(tmp_path):
    first = T.Trainer(tiny(), tmp_path, corpus=CORPUS, progress=False, verbose=False)
    with pytest.raises(run_folder.RunFolderError, match="in use by another training"):
        run(tiny(), tmp_path, overwrite=True)
    first.run()
    first.close()
    assert run(tiny(max_steps=2), tmp_path, overwrite=True).finished, "free again once the first has finished"


def test_the_resume_command_printed_after_ctrl_c_continues_the_run(tmp_path, monkeypatch, capsys):
    flags = ["--arch", "llama", "--quick", "--lr", "0.02", "--seed", "7", "--max-steps", "6", "--eval-interval", "2",
             "--batch-size", "4", "--block-size", "16", "--eval-batches", "1", "--dropout", "0.1", "--no-progress"]
    assert cli.train_main([*flags, "--out", str(tmp_path / "whole")]) == 0
    original_run = T.Trainer.run

    def ctrl_c_after_step_3(self, until=None, on_step=None):
        def at_3(trainer):
            if trainer.step == 3:
                raise KeyboardInterrupt
        return original_run(self, until, at_3)

    monkeypatch.setattr(T.Trainer, "run", ctrl_c_after_step_3)
    out = tmp_path / "my run"  # a space: the command must quote it
    assert cli.train_main([*flags, "--out", str(out)]) == 130
    command = shlex.split(capsys.readouterr().err.split("resume with: ")[1])
    assert command[:4] == ["python", "-m", "modern_block", "train"] and "--resume" in command
    assert command[4:] == [*flags, "--out", str(out), "--resume"], "every flag of the run"
    monkeypatch.setattr(T.Trainer, "run", original_run)
    assert cli.train_main(command[4:]) == 0
    resumed, whole = (torch.load(d / CHECKPOINT, weights_only=True) for d in (out, tmp_path / "whole"))
    assert resumed["losses"] == whole["losses"]


def test_a_torn_metrics_line_is_dropped_on_resume_and_said(tmp_path, capsys):
    cfg = tiny("gpt2", max_steps=8)
    whole = run(cfg)
    run(cfg, tmp_path, until=4)
    with open(tmp_path / METRICS, "a") as f:
        f.write('{"step": 8, "train_loss": 2.')  # the process died while appending this line
    resumed = T.train(cfg, tmp_path, resume=True, corpus=CORPUS, progress=False)
    out = capsys.readouterr().out
    assert f"{tmp_path / METRICS}: dropped line(s) [3]" in out
    assert resumed.losses == whole.losses and evals(resumed) == evals(whole)
    assert [json.loads(x)["step"] for x in (tmp_path / METRICS).read_text().splitlines()] == [0, 4, 8]


def _flip_a_weight_bit(path):
    ckpt = torch.load(path, weights_only=True)
    weight = next(v for v in ckpt["model"].values() if v.numel() > 256)
    raw = bytearray(path.read_bytes())
    at = raw.find(weight.numpy().tobytes()[:64])
    raw[at + 100] ^= 0x10
    path.write_bytes(bytes(raw))


def _drop_a_model_key(path):
    ckpt = load_checkpoint(path)
    del ckpt["checksum"], ckpt["model"][next(iter(ckpt["model"]))]
    save_checkpoint(ckpt, path)  # a valid file with a valid checksum, for another model


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b""), r"is empty \(0 bytes\)"),
    (lambda p: p.write_bytes(p.read_bytes()[:5000]), "cannot be read: it is truncated, damaged"),
    (lambda p: p.write_bytes(b"not a checkpoint" * 100), "cannot be read: it is truncated, damaged"),
    (lambda p: torch.save({"step": 4}, p), r"lacks \['format'"),
    (_drop_a_model_key, r"does not fit this model \(Error\(s\) in loading state_dict"),
    (_flip_a_weight_bit, "fails its checksum"),
], ids=["empty", "truncated", "garbage", "missing keys", "missing model key", "bit flip"])
def test_resuming_from_a_damaged_checkpoint_names_the_file(tmp_path, damage, message):
    cfg = tiny("gpt2", max_steps=4)
    run(cfg, tmp_path)
    damage(tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError, match=message) as exc:
        run(cfg, tmp_path, resume=True)
    assert str(tmp_path / CHECKPOINT) in str(exc.value)


def test_the_command_line_reports_a_damaged_checkpoint_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]) == 0
    (out / CHECKPOINT).write_bytes(b"")
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL, "--resume"]) == 1
    assert capsys.readouterr().err.startswith(f"error: the checkpoint {out / CHECKPOINT} is empty (0 bytes)")


def test_a_full_disk_at_a_checkpoint_stops_the_run_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    cfg = tiny("llama", max_steps=10)

    def disk_full_after_step_6(trainer):
        if trainer.step == 6:  # the checkpoint of step 4 is on disk; the one of step 8 will not fit
            monkeypatch.setattr(files, "_open_for_writing", disk_fills_up_after(50_000))

    with pytest.raises(CheckpointError, match=r"ckpt.pt \(No space left on device; .*Training stopped. The last "
                                                r"good checkpoint \(step 4\) is kept in"):
        run(cfg, tmp_path, on_step=disk_full_after_step_6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", CHECKPOINT, METRICS], "no .tmp left"
    assert load_checkpoint(tmp_path / CHECKPOINT)["step"] == 4
    monkeypatch.undo()  # room again: the run goes on from step 4
    assert run(cfg, tmp_path, resume=True).losses == run(cfg).losses


@pytest.mark.parametrize("make_out, message", [
    (lambda d: d / "a_file", "is a file, not a folder"),
    (lambda d: d / "a_file" / "below", r"cannot write in --out .* \(Not a directory\)"),
])
def test_out_must_be_a_folder(tmp_path, make_out, message, capsys):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        cli.train_main(["--arch", "gpt2", "--quick", "--out", str(make_out(tmp_path)), *SMALL])
    assert exc.value.code == 2 and re.search(message, capsys.readouterr().err)


def test_out_in_a_read_only_folder_is_refused_up_front(tmp_path, monkeypatch, capsys):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: have the write fail as it does for anyone else
        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(run_folder.tempfile, "mkstemp", denied)
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(read_only / "run"), *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write in --out") and "(Permission denied)" in err and "did not start" in err
    assert len(err.strip().splitlines()) == 1 and list(read_only.iterdir()) == []


def test_sizes_that_cannot_fit_are_refused_before_anything_is_allocated(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.train_main(["--arch", "gpt2", "--quick", "--out", str(tmp_path), *SMALL, "--eval-batches", str(10**8)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and re.search(r"these sizes need at least [\d,.]+ GiB on cpu .*100,000,000 "
                                             r"evaluation batches per split.* lower --eval-batches", err)
    assert run_folder.existing_run(tmp_path) is None, "nothing written"


def test_resuming_a_finished_run_keeps_its_summary(tmp_path, capsys):
    cfg = tiny("gpt2", max_steps=8)
    run(cfg, tmp_path)
    before = json.loads((tmp_path / SUMMARY).read_text())
    assert before["tokens_per_s"] > 0
    again = T.train(cfg, tmp_path, resume=True, corpus=CORPUS, progress=False)
    assert "already finished (step 8 of 8); nothing to train" in capsys.readouterr().out
    after = json.loads((tmp_path / SUMMARY).read_text())
    for key in ("tokens_per_s", "best_val_loss", "final_val_loss", "steps", "finished", "n_params"):
        assert after[key] == before[key], key
    assert again.tokens_per_s == before["tokens_per_s"]


# ---- on a GPU (benchmarks/gpu_check.sh, part 1) ------------------------------------------------------


@pytest.mark.gpu
def test_gpu_training_with_autocast_and_compile_and_an_exact_enough_resume(tmp_path, recwarn):
    from modern_block.training.device import choose_device

    cfg = tiny("llama", device="cuda", compile=True, max_steps=8, dropout=0.0)
    whole = run(cfg, tmp_path / "whole")
    assert whole.compiled, "torch.compile fell back to eager: " + "; ".join(str(w.message) for w in recwarn)
    setup = choose_device("cuda")
    assert whole.precision == setup.precision and whole.device == torch.cuda.get_device_name()
    assert all(math.isfinite(x) for x in whole.losses) and whole.metrics[-1]["val_loss"] < whole.metrics[0]["val_loss"]
    if setup.peak is not None:
        assert whole.mfu is not None and 0 < whole.mfu < 1
    run(cfg, tmp_path / "split", until=4)
    resumed = run(cfg, tmp_path / "split", resume=True)
    # the same run up to kernel nondeterminism (atomic adds in some backward kernels, autotuned kernels)
    torch.testing.assert_close(resumed.losses, whole.losses, atol=2e-3, rtol=0)


@pytest.mark.gpu
def test_fp16_with_a_grad_scaler_on_the_gpu(tmp_path, monkeypatch):
    real_choose = parts.choose_device

    def fp16_everywhere(device=None):  # the T4 path (capability < 8.0) on whichever GPU this is
        setup = real_choose(device)
        return replace(setup, amp_dtype=torch.float16) if setup.device.type == "cuda" else setup

    monkeypatch.setattr(parts, "choose_device", fp16_everywhere)
    cfg = tiny("gpt2", device="cuda", max_steps=8)
    first = run(cfg, tmp_path, until=4)
    assert first.precision == "fp16 autocast + GradScaler"
    scaler = load_checkpoint(tmp_path / CHECKPOINT)["scaler"]
    assert scaler is not None and scaler["scale"] > 0, "the scaler's state is saved for the resume"
    result = run(cfg, tmp_path, resume=True)
    assert result.finished and all(math.isfinite(x) for x in result.losses)
    assert result.metrics[-1]["val_loss"] < result.metrics[0]["val_loss"]


# ---- the run folder tells the truth, leaves nothing behind, and a full disk is one line (issue 26) -------------


def test_the_checkpoint_carries_the_runs_identity_and_its_evaluations(tmp_path):
    run(tiny("gpt2", max_steps=6), tmp_path)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    rows = [json.loads(x) for x in (tmp_path / METRICS).read_text().splitlines()]
    assert ckpt["metrics"] == rows and [r["step"] for r in rows] == [0, 4, 6]
    assert ckpt["run_id"] == json.loads((tmp_path / SUMMARY).read_text())["run_id"]


@pytest.mark.parametrize("damage", ["torn line at the checkpoint's step", "line missing", "another run's lines"])
def test_a_resume_puts_back_the_checkpoints_own_evaluations(tmp_path, capsys, damage):
    cfg = tiny("gpt2", max_steps=8)
    whole = run(cfg)
    run(cfg, tmp_path, until=4)  # evaluations at 0 and 4, the checkpoint at 4
    path = tmp_path / METRICS
    lines = path.read_text().splitlines()
    if damage == "torn line at the checkpoint's step":
        path.write_text(lines[0] + "\n" + lines[1][:25])
    elif damage == "line missing":
        path.write_text(lines[1] + "\n")
    else:  # the folder's metrics and summary are another seed's
        other = tmp_path.parent / "other"
        run(replace(cfg, seed=99), other, until=4)
        for name in (METRICS, SUMMARY):
            (tmp_path / name).write_bytes((other / name).read_bytes())
    resumed = T.train(cfg, tmp_path, resume=True, corpus=CORPUS, progress=False)
    out = capsys.readouterr().out
    assert "did not hold the checkpoint's evaluations" in out and "it now holds the 2 the checkpoint carries" in out
    assert evals(resumed) == evals(whole) and resumed.losses == whole.losses
    assert [tuple(json.loads(x)[k] for k in ("step", "train_loss", "val_loss")) for x in path.read_text().splitlines()
            ] == evals(whole)
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["best_val_loss"] == whole.best_val_loss and summary["config"]["seed"] == cfg.seed
    if damage == "another run's lines":
        assert "another run's" in out


def test_a_summary_of_another_run_is_removed_on_resume(tmp_path, capsys):
    cfg = tiny("gpt2", max_steps=8)
    run(cfg, tmp_path, until=4)
    (tmp_path / SUMMARY).write_text(json.dumps({"run_id": "someone-else", "best_val_loss": 0.1}))
    trainer = T.Trainer(cfg, tmp_path, resume=True, corpus=CORPUS, progress=False)
    trainer.close()
    assert "summarised another run (someone-else)" in capsys.readouterr().out
    assert not (tmp_path / SUMMARY).exists(), "until this run writes its own"


def test_temporary_files_of_killed_writes_are_removed_at_the_next_start(tmp_path, capsys):
    cfg = tiny("gpt2", max_steps=8)
    run(cfg, tmp_path, until=4)
    for name in ("ckpt.pt.k2j3h4.tmp", "metrics.jsonl.x1.tmp", "summary.json.y2.tmp"):
        (tmp_path / name).write_bytes(b"\0" * 1000)
    (tmp_path / "notes.tmp").write_text("not ours")
    T.train(cfg, tmp_path, resume=True, corpus=CORPUS, progress=False)
    assert "removed 3 temporary file(s)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", CHECKPOINT, METRICS, "notes.tmp", SUMMARY]


@pytest.mark.parametrize("refusal", ["sizes that cannot fit", "settings that differ", "folder in use"])
def test_a_refused_run_leaves_no_folder_it_created(tmp_path, refusal, capsys):
    out = tmp_path / "new" / "deeper" / "run"
    if refusal == "sizes that cannot fit":
        argv = ["--arch", "gpt2", "--quick", "--out", str(out), *SMALL, "--eval-batches", str(10**8)]
    elif refusal == "settings that differ":
        run(tiny("gpt2", max_steps=2), out)
        argv = ["--arch", "gpt2", "--quick", "--out", str(out), *SMALL, "--resume"]
    else:
        holder = T.Trainer(tiny(), out, corpus=CORPUS, progress=False, verbose=False)
        argv = ["--arch", "gpt2", "--quick", "--out", str(out), *SMALL, "--overwrite"]
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    with pytest.raises(SystemExit) as exc:
        cli.train_main(argv)
    assert exc.value.code == 2
    if before is None:
        assert not (tmp_path / "new").exists(), "the folders it made are gone"
    else:
        assert sorted(p.name for p in out.iterdir()) == before, "an existing run's folder is left as it was"
    if refusal == "folder in use":
        holder.close()


@pytest.mark.parametrize("where", ["lock file", "first evaluation", "a later evaluation", "summary", "metrics rewrite"])
def test_a_full_disk_anywhere_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, where):
    out = tmp_path / "run"
    argv = ["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]
    if where == "metrics rewrite":
        assert cli.train_main(argv) == 0
        argv = [*argv, "--resume"]
    full = OSError(errno.ENOSPC, "No space left on device")

    def fails(*args, **kwargs):
        raise full

    if where == "lock file":
        monkeypatch.setattr(run_folder.os, "write", fails)
    elif where in ("first evaluation", "a later evaluation"):
        real = run_folder.RunFolder.append_metrics
        count = [0]

        def append(self, row):
            count[0] += 1
            if count[0] == (1 if where == "first evaluation" else 3):  # the 3rd: after the checkpoint of step 2
                with files.refused_writes(f"append an evaluation to {self.metrics}"):
                    raise full
            real(self, row)

        monkeypatch.setattr(run_folder.RunFolder, "append_metrics", append)
    else:  # every atomic write fails: the metrics rewrite of a resume, or the summary (checkpoints set aside)
        monkeypatch.setattr(files, "_open_for_writing", disk_fills_up_after(0))
        if where == "summary":
            monkeypatch.setattr(run_folder, "save_checkpoint", lambda state, path: None)
    code = cli.train_main(argv)
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "No space left on device" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    kept = {"lock file": "did not start", "first evaluation": "No checkpoint had been written yet",
            "a later evaluation": "The last good checkpoint (step 2) is kept", "summary": "The evaluations are in",
            "metrics rewrite": "is as it was"}[where]
    assert kept in err, err
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")], "no temporary file left"
    if where == "lock file":
        assert not out.exists(), "the refused run's folder is gone"


def test_an_out_path_longer_than_the_file_system_allows_is_one_line(tmp_path, capsys):
    out = tmp_path / ("x" * 300) / "run"
    assert cli.train_main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write in --out") and "File name too long" in err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400, "the path is shortened in the message"


def test_only_configuration_errors_are_usage_errors(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a bug inside the trainer")

    monkeypatch.setattr(T, "train_step", broken)
    with pytest.raises(ValueError, match="a bug inside the trainer"):  # a traceback, not "usage: ... exit 2"
        cli.train_main(["--arch", "gpt2", "--quick", "--out", str(tmp_path), *SMALL])
    assert issubclass(run_folder.RunFolderError, config.ConfigError)


def test_ctrl_c_says_only_what_happens(capsys, python_sigint_handler):
    def ctrl_c_at_2(trainer):
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        T.train(tiny("gpt2", max_steps=6), None, corpus=CORPUS, progress=False, on_step=ctrl_c_at_2)
    captured = capsys.readouterr()
    assert "Ctrl-C: stopping after this step (press again" in captured.err and "checkpoint" not in captured.err
    assert "interrupted after step 2: no checkpoint written" in captured.out


def test_a_process_that_ignores_ctrl_c_keeps_ignoring_it():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job; compare's workers
    try:
        seen = []
        run(tiny("gpt2", max_steps=2), on_step=lambda t: seen.append(signal.getsignal(signal.SIGINT)))
        assert seen == [signal.SIG_IGN, signal.SIG_IGN]
    finally:
        signal.signal(signal.SIGINT, previous)
