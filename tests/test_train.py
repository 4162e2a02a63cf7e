"""The trainer and its command line: exact resume, interruption, non-finite losses, the schedule, validation."""

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from training_setup import CORPUS, ROOT, SMALL, TEXT, evals, never_online, run, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import GPT2LM, generate
from modern_block import train as T


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_resume_after_ctrl_c_repeats_the_uninterrupted_run_exactly(arch, tmp_path):
    cfg = tiny(arch)  # dropout > 0: the torch RNG state matters too
    whole = run(cfg, tmp_path / "whole")

    def interrupt_at_6(trainer):  # between two evaluations (every 4 steps)
        if trainer.step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "split", on_step=interrupt_at_6)
    ckpt = torch.load(tmp_path / "split" / T.CHECKPOINT, weights_only=True)  # plain tensors and containers
    assert ckpt["step"] == 6 and len(ckpt["losses"]) == 6
    resumed = run(cfg, tmp_path / "split", resume=True)
    assert resumed.losses == whole.losses, "same loss at every step, to the last bit"
    assert len(whole.losses) == cfg.max_steps and all(math.isfinite(x) for x in whole.losses)
    assert evals(resumed) == evals(whole)
    for (name, p), q in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    lines = (tmp_path / "split" / T.METRICS).read_text().splitlines()
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
    assert torch.load(tmp_path / T.CHECKPOINT, weights_only=True)["step"] == 3
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
    ckpt = torch.load(tmp_path / T.CHECKPOINT, weights_only=True)
    assert ckpt["step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_a_non_finite_state_never_replaces_the_checkpoint(tmp_path):
    trainer = T.Trainer(tiny("gpt2", max_steps=4), tmp_path, corpus=CORPUS, progress=False, verbose=False)
    trainer.run()
    before = (tmp_path / T.CHECKPOINT).read_bytes()
    with torch.no_grad():
        trainer.model.head.weight[0, 0] = float("inf")
    with pytest.raises(T.NonFiniteLossError, match="parameters became non-finite"):
        trainer.save_checkpoint()
    assert (tmp_path / T.CHECKPOINT).read_bytes() == before


def test_resume_refuses_different_settings(tmp_path):
    run(tiny("gpt2", max_steps=2), tmp_path)
    with pytest.raises(ValueError, match=r"lr \(saved 0.01, given 0.02\)"):
        run(tiny("gpt2", max_steps=2, lr=2e-2), tmp_path, resume=True)


def test_metrics_file_and_summary(tmp_path):
    result = run(tiny("llama", max_steps=8), tmp_path)
    rows = [json.loads(x) for x in (tmp_path / T.METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 8]
    for r in rows:
        assert set(r) == {"step", "train_loss", "val_loss", "tokens_per_s", "mfu", "lr", "elapsed_s"}
        assert r["mfu"] is None, "no peak FLOP/s on a CPU"
    assert rows[0]["val_loss"] == pytest.approx(math.log(len(set(TEXT))), abs=0.15), "starts near ln(V)"
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.5, "it learns"
    assert rows[1]["tokens_per_s"] > 0
    summary = json.loads((tmp_path / T.SUMMARY).read_text())
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
    assert T.lr_at(0, cfg) == pytest.approx(1e-3 / 11)
    assert T.lr_at(9, cfg) == pytest.approx(1e-3 * 10 / 11)
    assert T.lr_at(10, cfg) == pytest.approx(1e-3)
    assert T.lr_at(60, cfg) == pytest.approx((1e-3 + 1e-4) / 2), "half way down the cosine"
    assert T.lr_at(110, cfg) == pytest.approx(1e-4)
    decay = [T.lr_at(s, cfg) for s in range(10, 110)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False)), "strictly decreasing after warmup"


def test_weight_decay_only_on_matrices():
    model = GPT2LM(65, 32, 2, 4, 16)
    opt = T.make_optimizer(model, tiny())
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
    gpu = T.gpu_config("gpt2")
    assert (gpu.n_layers, gpu.n_heads, gpu.d, gpu.block_size, gpu.batch_size, gpu.max_steps, gpu.dropout, gpu.lr,
            gpu.warmup_steps, gpu.min_lr, gpu.beta2) == (6, 6, 384, 256, 64, 5000, 0.2, 1e-3, 100, 1e-4, 0.99)
    monkeypatch.setenv(T.QUICK_ENV, "1")
    assert T.default_config("llama", quick=False) == T.quick_config("llama")


def test_replace_keeps_validation():
    with pytest.raises(ValueError):
        replace(tiny(), max_steps=0)


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --arch"),
    (["--arch", "bert"], "invalid choice: 'bert'"),
    (["--arch", "llama", "--max-steps", "0"], "expected a positive integer, got 0"),
    (["--arch", "llama", "--lr", "nan"], "expected a positive finite number"),
    (["--arch", "llama", "--lr", "abc"], "expected a positive number, got 'abc'"),
    (["--arch", "llama", "--quick", "--full"], "not allowed with argument"),
    (["--arch", "llama", "--warmup-steps", "-3"], "warmup_steps must be a non-negative int"),
    (["--arch", "llama", "--min-lr", "1"], "min_lr must be in"),
    (["--arch", "llama", "--device", "tpu"], "--device: device must be"),
])
def test_train_cli_rejects_bad_arguments_with_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        T.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_argument_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "modern_block.train", "--arch", "llama", "--batch-size", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "expected a positive integer" in proc.stderr and "Traceback" not in proc.stderr


def test_train_cli_writes_metrics_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert T.main(["--arch", "gpt2", "--quick", "--out", str(out), *SMALL]) == 0
    rows = [json.loads(x) for x in (out / T.METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert (out / T.CHECKPOINT).exists() and json.loads((out / T.SUMMARY).read_text())["finished"]
    assert "done: best val loss" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # a resume with other settings is a usage error
        T.main(["--arch", "gpt2", "--quick", "--out", str(out), "--resume", *SMALL, "--lr", "0.5"])
    assert exc.value.code == 2 and "these differ: lr" in capsys.readouterr().err


def test_sample_uses_the_kv_cache_deterministically():
    result = run(tiny("llama", max_steps=2))
    a = T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a == T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a.startswith("the ") and len(a) == 14
    greedy = T.sample(result.model, result.tokenizer, "the ", 10, temperature=0.0)
    ids = result.tokenizer.encode("the ")[None]
    assert greedy == result.tokenizer.decode(generate(result.model, ids, 10, use_cache=False)[0])
