"""The laptop scale (``compare --scale laptop``), the shape options and the scale presets of train and compare."""

import json
from dataclasses import asdict

import pytest
from training_setup import CORPUS, never_online  # noqa: F401 (never_online is an autouse fixture)

from modern_block import __main__ as entry
from modern_block.training import compare_cli as cli
from modern_block.training import laptop, options, train_cli
from modern_block.training.config import LAPTOP, laptop_config, quick_config, scale_config

TINY = dict(d=32, n_layers=2, n_heads=4, n_kv_heads=2, block_size=16, batch_size=4, max_steps=6, warmup_steps=2,
            eval_interval=3, eval_batches=1, log_interval=1)


def _config(argv, monkeypatch, quick_env=False):
    if not quick_env:
        monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    parser = train_cli.build_parser()
    args = parser.parse_args(argv)
    return options.config_from_args(parser, args, "llama", None)


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
    (["compare", "--scale", "laptop", "--lr-llama", "1e-3"], "drop --lr-llama"),
    (["compare", "--scale", "laptop", "--tied"], "drop --tied"),
    (["compare", "--scale", "laptop", "--seeds", "0", "1"], "must be different seeds; both hold [0]"),
    (["compare", "--scale", "laptop", "--selection-seeds", "4", "4"], "--selection-seeds must be distinct"),
    (["compare", "--quick", "--anchor"], "belong to --scale laptop"),
])
def test_bad_shape_and_scale_options_are_usage_errors(argv, message, monkeypatch, capsys):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    with pytest.raises(SystemExit) as exc:
        entry.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_train_takes_any_model_of_the_ladder_by_name(monkeypatch):
    parser = train_cli.build_parser()
    args = parser.parse_args(["--arch", "gpt2_nobias", "--quick"])
    assert args.arch == "gpt2_nobias"
    with pytest.raises(SystemExit):
        parser.parse_args(["--arch", "ladder:gpt2", "--quick"])


def test_laptop_grid_selects_on_some_seeds_reports_on_others_and_resumes(tmp_path):
    base = laptop_config("gpt2", **TINY)
    said = []
    res = laptop.run_laptop(base, tmp_path, rates=(1e-3, 1e-2), selection_seeds=(0,), reported_seeds=(1, 2),
                            anchor=True, workers=1, command="test", say=said.append, corpus=CORPUS)
    runs = res["runs"]
    selection = [r for r in runs if r["role"] == "selection"]
    assert len(selection) == 3 * 2 and {r["seed"] for r in selection} == {0}
    sel = laptop.selections(res)
    for arm, s in sel.items():
        at = {r["lr"]: r["final_val"] for r in selection if r["arm"] == arm}
        assert s.lr == min(at, key=at.get), "the rate with the lowest loss on the selection seed"
        reported = [r for r in runs if r["arm"] == arm and r["role"] == "reported"]
        assert {r["seed"] for r in reported} == {1, 2} and {r["lr"] for r in reported} == {s.lr}
    anchor = [r for r in runs if r["role"] == "anchor"]
    assert all(r["arm"] == "gpt2" and r["lr"] == laptop.NANOGPT_RATE for r in anchor)
    assert len(anchor) == (0 if sel["gpt2"].lr == laptop.NANOGPT_RATE else 2)
    for r in runs:  # only the arch, the rate and the seed change between runs
        cfg = r["config"]
        assert {k for k, v in cfg.items() if v != asdict(base)[k]} <= {"arch", "lr", "min_lr", "seed"}
        assert cfg["arch"] == f"ladder:{laptop.LAPTOP_ARMS[r['arm']]}" and len(r["train_losses"]) == 6
        assert [m["step"] for m in r["metrics"]] == [0, 3, 6] and r["final_val"] == r["metrics"][-1]["val_loss"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["command"] == "test" and saved["selection_seeds"] == [0] and saved["reported_seeds"] == [1, 2]
    report = (tmp_path / "report.md").read_text()
    assert report == laptop.laptop_report(saved)
    assert "llama minus gpt2: " in report and "95% interval, 2 paired seeds" in report
    assert "GPT-2 at nanoGPT's rate 0.001 on seeds 0-2: " in report and "prediction interval" in report

    said.clear()  # the same command again: every run is read back, none trained
    again = laptop.run_laptop(base, tmp_path, rates=(1e-3, 1e-2), selection_seeds=(0,), reported_seeds=(1, 2),
                              anchor=True, workers=1, command="test", say=said.append, corpus=CORPUS)
    assert not any(line.startswith("[") for line in said), said
    assert [r["final_val"] for r in again["runs"]] == [r["final_val"] for r in runs]


def test_a_record_made_with_other_settings_is_not_reused(tmp_path):
    base = laptop_config("gpt2", **TINY)
    run = laptop.Run("llama", 1e-3, 0, "selection")
    cfg = run.config(base, laptop.LAPTOP_ARMS)
    rec = laptop.train_run(cfg, str(tmp_path / run.name), CORPUS)
    assert laptop.read_record(tmp_path / run.name, cfg) == json.loads(json.dumps(rec))
    assert laptop.read_record(tmp_path / run.name, run.config(laptop_config("gpt2", **(TINY | {"d": 64})),
                                                               laptop.LAPTOP_ARMS)) is None
    (tmp_path / run.name / laptop.RUN_RECORD).write_text("{broken")
    assert laptop.read_record(tmp_path / run.name, cfg) is None


def test_the_laptop_preset_is_nanogpts_cpu_recipe():
    # nanoGPT's README: --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
    # --lr_decay_iters=2000 --dropout=0.0 --eval_iters=20; shakespeare_char: lr 1e-3 -> 1e-4, warmup 100, beta2 0.99
    expected = dict(block_size=64, batch_size=12, n_layers=4, n_heads=4, d=128, max_steps=2000, dropout=0.0,
                    eval_batches=20, lr=1e-3, min_lr=1e-4, warmup_steps=100, beta2=0.99, weight_decay=0.1,
                    grad_clip=1.0, device="cpu", compile=False)
    assert {k: LAPTOP[k] for k in expected} == expected
    assert cli.build_parser().parse_args(["--scale", "laptop", "--anchor"]).anchor


def test_collect_reads_what_is_finished_and_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    base = laptop_config("gpt2", **TINY)
    flags = ["--d", "32", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2", "--block-size", "16",
             "--batch-size", "4", "--max-steps", "6", "--warmup-steps", "2", "--eval-interval", "3",
             "--eval-batches", "1", "--rates", "0.001", "0.01", "--seeds", "1", "2"]
    argv = ["--scale", "laptop", "--collect", "--out", str(tmp_path), *flags]
    assert cli.main(argv) == 0  # nothing finished yet: an empty, incomplete result
    empty = json.loads((tmp_path / "results.json").read_text())
    assert empty["runs"] == [] and not empty["complete"] and "INCOMPLETE" in (tmp_path / "report.md").read_text()
    laptop.run_laptop(base, tmp_path, rates=(1e-3, 1e-2), selection_seeds=(0,), reported_seeds=(1, 2), workers=1,
                      say=lambda text: None, corpus=CORPUS)
    assert cli.main(argv) == 0
    full = json.loads((tmp_path / "results.json").read_text())
    assert full["complete"] and len(full["runs"]) == 3 * 2 + 3 * 2
    assert "INCOMPLETE" not in (tmp_path / "report.md").read_text() and (tmp_path / "curves.png").exists()
    assert not list(tmp_path.glob("runs/*/ckpt.pt.tmp*"))


def test_the_anchor_is_held_against_where_one_more_run_falls():
    inside = laptop.anchor_sentence({0: 1.89, 1: 1.90, 2: 1.91, 3: 1.92})
    assert "prediction interval" in inside and "1.88 is inside it: within the seed spread." in inside
    outside = laptop.anchor_sentence({0: 1.95, 1: 1.951, 2: 1.952})
    assert "1.88 is outside it: beyond the seed spread." in outside
    assert "one seed" in laptop.anchor_sentence({0: 1.9})
