"""The trainer, the command lines, the ladder and the GPU benchmark's smoke mode (tiny models, CPU)."""

import json
import math
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from repo_files import load_module

from modern_block import GPT2LM, LlamaStyleLM
from modern_block import __main__ as cli
from modern_block import train as T
from modern_block.data import Corpus
from modern_block.device import autocast_dtype, choose_device, flops_per_token, matmul_parameters, mfu, peak_flops
from modern_block.ladder import RUNG_NAMES, ModelShape, build_model, ladder_model, run_ladder, size_table

ROOT = Path(__file__).resolve().parents[1]
TEXT = "".join(f"{w} the quick brown fox {i % 7} jumps over the lazy dog; " for i, w in
               enumerate(["First", "Citizen", "Before", "we", "proceed", "any", "further"] * 60))
CORPUS = Corpus(TEXT, "test-text", "inline")


@pytest.fixture(autouse=True)
def _never_online(monkeypatch, tmp_path):
    """The command-line tests load the text as users do; they must never reach the internet: they
    read $MODERN_BLOCK_DATA (CI sets it) or fall back to the standard library's source text."""
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("the tests do not use the network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def tiny(arch="llama", **kw) -> T.TrainConfig:
    base = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=10, lr=1e-2,
                min_lr=1e-3, warmup_steps=2, eval_interval=4, eval_batches=2, dropout=0.1, log_interval=1,
                compile=False, device="cpu", seed=5)
    base.update(kw)
    return T.TrainConfig(arch=arch, **base)


def run(cfg, out=None, **kw):
    return T.train(cfg, out, corpus=CORPUS, progress=False, verbose=False, **kw)


def evals(result):
    return [(m["step"], m["train_loss"], m["val_loss"]) for m in result.metrics]


# ---- exact resume, interruption, non-finite loss --------------------------------------------------
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


# ---- schedule, optimizer, device, FLOPs -------------------------------------------------------------
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


def test_mfu_arithmetic_by_hand():
    # GPT2LM(V=65, d=32, 2 layers, 4 heads, max_len=16), counted by hand:
    # wte 65·32 = 2080, wpe 16·32 = 512, final LayerNorm 64, and per layer:
    # ln1 64 + qkv 32·96+96 = 3168 + proj 32·32+32 = 1056 + ln2 64 + fc 32·128+128 = 4224 + proj 128·32+32 = 4128
    per_layer = 64 + 3168 + 1056 + 64 + 4224 + 4128  # 12,704
    total = 2080 + 512 + 2 * per_layer + 64  # 28,064 (the head is the tied wte)
    gpt2 = GPT2LM(65, 32, 2, 4, 16)
    assert gpt2.num_parameters() == total == 28_064
    assert matmul_parameters(gpt2) == total - 512, "the position table is only looked up"
    fpt = flops_per_token(matmul_parameters(gpt2), n_layers=2, n_heads=4, head_dim=8, seq_len=16)
    assert fpt == 6 * 27_552 + 12 * 2 * 4 * 8 * 16 == 177_600
    assert mfu(fpt, 1e6, 312e12) == pytest.approx(177_600e6 / 312e12)  # 1M tokens/s on an A100: 0.0569%
    assert mfu(fpt, 1e6, None) is None
    # an untied Llama: the input embedding is only looked up, the head is a matrix multiply
    llama = LlamaStyleLM(65, 32, 2, 4, 2, d_ff=64, max_len=16, tie=False)
    # per layer: 2 norms 64 + wq 1024 + wk 512 + wv 512 + wo 1024 + QK-norm 16 + SwiGLU 3·32·64 = 6144
    assert llama.num_parameters() == 2080 + 2080 + 2 * 9296 + 32 == 22_784
    assert matmul_parameters(llama) == 22_784 - 2080
    tied = LlamaStyleLM(65, 32, 2, 4, 2, d_ff=64, max_len=16, tie=True)
    assert matmul_parameters(tied) == tied.num_parameters() == 20_704


def test_peak_flops_table_and_precision_rule():
    assert peak_flops("NVIDIA H100 80GB HBM3") == ("H100 SXM", 989e12)
    assert peak_flops("NVIDIA H100 PCIe") == ("H100 PCIe", 756e12)
    assert peak_flops("NVIDIA H200") == ("H200 SXM", 989e12)
    assert peak_flops("NVIDIA A100-SXM4-40GB") == ("A100", 312e12)
    assert peak_flops("NVIDIA L4") == ("L4", 121e12) and peak_flops("NVIDIA L40S") == ("L40S", 362e12)
    assert peak_flops("NVIDIA A10") == ("A10", 125e12)
    assert peak_flops("Tesla T4") == ("T4 (fp16)", 65e12)
    assert peak_flops("NVIDIA A10G") is None and peak_flops("some new GPU") is None
    assert autocast_dtype((7, 5)) == torch.float16, "T4: fp16 + GradScaler, even if bf16 is 'supported'"
    assert autocast_dtype((8, 0)) == autocast_dtype((9, 0)) == torch.bfloat16
    cpu = choose_device("cpu")
    assert cpu.amp_dtype is None and cpu.peak is None and not cpu.needs_scaler and cpu.precision == "fp32"
    with pytest.raises(ValueError, match="device must be"):
        choose_device("tpu")


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


# ---- the ladder -----------------------------------------------------------------------------------
RENAME = {"wte": "emb", "wpe": "pos", "ln1": "norm1", "ln2": "norm2", "mlp": "ffn", "ln_f": "norm",
          "attn_norm": "norm1", "ffn_norm": "norm2"}


def _ladder_name(name: str) -> str:
    return ".".join(RENAME.get(part, part) for part in name.split("."))


@pytest.mark.parametrize("rung, reference", [("gpt2", "gpt2"), ("untied", "llama")])
def test_ladder_ends_are_gpt2lm_and_llamastylelm(rung, reference):
    shape = ModelShape(d=48, n_layers=2, n_heads=6, n_kv_heads=2, block_size=32)
    torch.manual_seed(0)
    ref = build_model(reference, shape, 65)
    torch.manual_seed(0)
    lad = ladder_model(rung, shape, 65)
    assert lad.num_parameters() == ref.num_parameters()
    ref_state, lad_state = ref.state_dict(), lad.state_dict()
    assert sorted(map(_ladder_name, ref_state)) == sorted(lad_state)
    for name, value in ref_state.items():  # same seed, same draws in the same order: the same weights
        assert torch.equal(lad_state[_ladder_name(name)], value), name
    idx = torch.randint(0, 65, (2, 32))
    assert torch.equal(lad(idx), ref(idx))
    prompt = idx[:, :5]
    from modern_block import generate
    assert torch.equal(generate(lad, prompt, 8), generate(ref, prompt, 8)), "KV-cache decoding too"


@pytest.mark.parametrize("shape", [ModelShape(), T.quick_config().shape, ModelShape(32, 2, 4, 2, 16)],
                         ids=["gpu", "quick", "tiny"])
def test_every_rung_is_within_2_percent_of_gpt2(shape):
    rows = size_table(shape, 65)
    assert [r["rung"] for r in rows] == list(RUNG_NAMES)
    assert rows[0]["ratio"] == 1.0
    for row in rows:
        assert 0.98 <= row["ratio"] <= 1.02, row
    with torch.device("meta"):  # count without allocating
        assert build_model("llama", shape, 65).num_parameters() == rows[-1]["params"]


def test_run_ladder_gives_mean_and_spread():
    rows = run_ladder(tiny(max_steps=2, eval_interval=2), seeds=(0, 1), rungs=("gpt2", "rope"), corpus=CORPUS,
                      progress=False, verbose=False)
    assert [r["rung"] for r in rows] == ["gpt2", "rope"]
    for r in rows:
        assert len(r["val_losses"]) == 2 and r["val_losses"][0] != r["val_losses"][1]
        assert r["mean"] == pytest.approx(sum(r["val_losses"]) / 2) and r["std"] > 0
        assert [m["step"] for m in r["metrics"][0]] == [0, 2]


# ---- command lines --------------------------------------------------------------------------------
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


def test_compare_cli_rejects_bad_arguments(capsys):
    for argv, message in ((["compare", "--seeds", "1", "1"], "--seeds must be distinct"),
                          (["compare", "--lr", "0"], "expected a positive finite number"),
                          (["fit"], "invalid choice: 'fit'")):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_argument_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "modern_block.train", "--arch", "llama", "--batch-size", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "expected a positive integer" in proc.stderr and "Traceback" not in proc.stderr


SMALL = ["--max-steps", "4", "--eval-interval", "2", "--batch-size", "4", "--block-size", "16",
         "--eval-batches", "1", "--no-progress"]


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


def test_compare_cli_writes_report_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--quick", "--out", str(out), "--lr-llama", "0.02", *SMALL]) == 0
    report = (out / "report.md").read_text()
    assert "| learning rate (peak -> min) | 0.003 -> 0.0003 | 0.02 -> 0.002 |" in report
    for needle in ("| parameters |", "FLOPs per token", "best val loss (1 seed)", "tokens/s", "| MFU |",
                   "wall time", "Parameter ratio Llama / GPT-2", "### GPT-2", "### Llama-style", "KV-cache"):
        assert needle in report, needle
    assert (out / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((out / "results.json").read_text())
    assert set(results["table"]) == {"gpt2", "llama"}
    for arch in ("gpt2", "llama"):
        assert (out / f"{arch}-seed0" / T.METRICS).exists()
        assert not (out / f"{arch}-seed0" / T.CHECKPOINT).exists(), "compare keeps no checkpoints"
    ratio = results["table"]["llama"]["params"] / results["table"]["gpt2"]["params"]
    assert 0.98 <= ratio <= 1.02


def test_sample_uses_the_kv_cache_deterministically():
    result = run(tiny("llama", max_steps=2))
    a = T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a == T.sample(result.model, result.tokenizer, "the ", 10, seed=1)
    assert a.startswith("the ") and len(a) == 14
    greedy = T.sample(result.model, result.tokenizer, "the ", 10, temperature=0.0)
    ids = result.tokenizer.encode("the ")[None]
    from modern_block import generate
    assert greedy == result.tokenizer.decode(generate(result.model, ids, 10, use_cache=False)[0])


# ---- the GPU benchmark's smoke mode -----------------------------------------------------------------
def test_gpu_benchmark_smoke_mode(tmp_path):
    bench = load_module("benchmarks/gpu_train.py")
    assert bench.main(["--smoke", "--out", str(tmp_path), "--seeds", "0", "1"]) == 0
    report = json.loads((tmp_path / "gpu_results.json").read_text())
    assert set(report["comparison"]) == {"gpt2", "llama"}
    assert [r["rung"] for r in report["ladder"]["rows"]] == list(RUNG_NAMES)
    assert report["ladder"]["ends_from_comparison"]
    assert report["ladder"]["rows"][0]["val_losses"] == report["comparison"]["gpt2"]["best_val_losses"]
    for png in ("loss_curves.png", "ladder.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "| rung | change |" in (tmp_path / "results_snippet.md").read_text()


def test_ladder_budget_fits_the_time_left():
    fit = lambda left_s: bench_steps(left_s)  # noqa: E731
    assert fit(10_000) == 5000, "plenty of time: the full budget, ends reused"
    assert fit(5) == 250, "never below one unit"
    mid = fit(200)
    assert 250 <= mid < 5000 and mid % 250 == 0


def bench_steps(left_s: float) -> int:
    bench = load_module("benchmarks/gpu_train.py")
    # comparison: 6 runs took 120 s; ladder: 15 runs at the full budget, 21 below it
    return bench.ladder_steps_for(left_s, 0.0, 120.0, 6, 15, 21, 5000, 250)


def test_replace_keeps_validation():
    with pytest.raises(ValueError):
        replace(tiny(), max_steps=0)
