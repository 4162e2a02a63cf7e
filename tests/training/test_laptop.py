"""The scale presets (quick, laptop, gpu) and the shape options of train and compare."""

from dataclasses import asdict

import pytest
from training_setup import never_online  # noqa: F401 (never_online is an autouse fixture)

from modern_block import __main__ as entry
from modern_block.training import cli
from modern_block.training.config import LAPTOP, laptop_config, quick_config, scale_config


def _config(argv, monkeypatch, quick_env=False):
    if not quick_env:
        monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    parser = cli.train_parser()
    args = parser.parse_args(argv)
    return cli.config_from_args(parser, args, "llama", None)


def test_scales_are_presets_and_the_shape_options_override_them(monkeypatch):
    cfg = _config(["--arch", "llama", "--scale", "laptop"], monkeypatch)
    assert cfg == laptop_config("llama") and cfg.tokens_per_step == 12 * 64 and cfg.max_steps == 2000
    assert _config(["--arch", "llama", "--laptop"], monkeypatch) == cfg
    sized = _config(["--arch", "llama", "--laptop", "--d", "192", "--n-layers", "6", "--n-heads", "6",
                     "--n-kv-heads", "3", "--block-size", "128"], monkeypatch)
    assert (sized.d, sized.n_layers, sized.n_heads, sized.n_kv_heads, sized.block_size) == (192, 6, 6, 3, 128)
    assert asdict(sized) | dict(d=128, n_layers=4, n_heads=4, n_kv_heads=2, block_size=64) == asdict(cfg)
    assert _config(["--arch", "llama", "--scale", "quick", "--d", "48"], monkeypatch) == quick_config("llama", d=48)
    assert scale_config("gpu", "gpt2") == scale_config("gpu", "gpt2", **{})
    with pytest.raises(ValueError, match="scale must be one of"):
        scale_config("huge")


def test_quick_mode_wins_over_a_scale_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv("MODERN_BLOCK_QUICK", "1")
    assert _config(["--arch", "llama", "--scale", "laptop"], monkeypatch, quick_env=True) == quick_config("llama")
    assert "--scale laptop is ignored" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["train", "--arch", "llama", "--quick", "--d", "30", "--n-heads", "4"], "d (30) must be divisible by n_heads"),
    (["train", "--arch", "llama", "--quick", "--n-heads", "4", "--n-kv-heads", "3"], "by n_kv_heads (3)"),
    (["train", "--arch", "llama", "--quick", "--d", "0"], "expected a positive integer"),
    (["train", "--arch", "llama", "--scale", "laptop", "--quick"], "not allowed with argument"),
    (["train", "--arch", "bert", "--quick"], "invalid choice"),
    (["compare", "--scale", "laptop", "--lr", "1e-3"], "drop --lr and --min-lr"),
    (["compare", "--scale", "laptop", "--seeds", "0", "1"], "must be different seeds; both hold [0]"),
    (["compare", "--scale", "laptop", "--selection-seeds", "4", "4"], "--selection-seeds must be distinct"),
    (["compare", "--quick", "--models", "gpt2_nobias"], "the quick study trains"),
    (["compare", "--ladder", "--study", "quick"], "--ladder is --study ladder"),
    (["compare", "--seeds", "1", "1"], "--seeds must be distinct"),
    (["compare", "--seeds", str(10**20)], "expected a seed in"),
    (["compare", "--rates", "1e-3", "1e-3"], "--rates must be distinct"),
    (["compare", "--workers", "0"], "expected a positive integer"),
])
def test_bad_shape_and_scale_options_are_usage_errors(argv, message, monkeypatch, capsys):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    with pytest.raises(SystemExit) as exc:
        entry.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_train_takes_any_model_of_the_ladder_by_name(monkeypatch):
    parser = cli.train_parser()
    args = parser.parse_args(["--arch", "gpt2_nobias", "--quick"])
    assert args.arch == "gpt2_nobias"
    with pytest.raises(SystemExit):
        parser.parse_args(["--arch", "ladder:gpt2", "--quick"])


def test_the_laptop_preset_is_nanogpts_cpu_recipe():
    # nanoGPT's README: --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
    # --lr_decay_iters=2000 --dropout=0.0 --eval_iters=20; shakespeare_char: lr 1e-3 -> 1e-4, warmup 100, beta2 0.99
    expected = dict(block_size=64, batch_size=12, n_layers=4, n_heads=4, d=128, max_steps=2000, dropout=0.0,
                    eval_batches=20, lr=1e-3, min_lr=1e-4, warmup_steps=100, beta2=0.99, weight_decay=0.1,
                    grad_clip=1.0, device="cpu", compile=False)
    assert {k: LAPTOP[k] for k in expected} == expected
