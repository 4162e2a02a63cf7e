"""The experiments of lesson 08 and their command line (python -m modern_block compare)."""

import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
from training_setup import CORPUS, SMALL, never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import __main__ as entry
from modern_block.training import compare_cli as cli
from modern_block.training.config import TrainConfig
from modern_block.training.data import Corpus
from modern_block.training.experiments import ARMS, compare, gap, run_ablations, run_ladder, sweep
from modern_block.training.report import plot_ladder, write_report
from modern_block.training.run_folder import CHECKPOINT, METRICS
from modern_block.training.rungs import ABLATION_NAMES, LADDER_NAMES, LLAMA_END
from modern_block.training.workers import Diverged, WorkerPool, train_many

ROOT = Path(__file__).resolve().parents[1]
BASE = tiny("gpt2", max_steps=4, eval_interval=2, dropout=0.0)


def test_sweep_stands_each_model_at_its_own_best_rate():
    arms = sweep(BASE, ["gpt2_untied", "llama"], rates=(1e-4, 3e-2), seeds=(0, 1), corpus=CORPUS)
    for rung, arm in arms.items():
        assert arm.rates == [1e-4, 3e-2] and all(len(runs) == 2 for runs in arm.runs.values())
        assert arm.lr == min(arm.rates, key=arm.mean_at)
        assert arm.val_losses == [r.best_val_loss for r in arm.best] and arm.val_losses[0] != arm.val_losses[1]
        assert arm.mean == pytest.approx(sum(arm.val_losses) / 2) and arm.std > 0
        for lr, runs in arm.runs.items():
            for seed, run in zip((0, 1), runs, strict=True):
                assert (run.config.arch, run.config.lr, run.config.seed) == (f"ladder:{rung}", lr, seed)
                assert run.config.min_lr == pytest.approx(lr * BASE.min_lr / BASE.lr)
        assert arm.at_edge  # two rates: the best is always an edge


def test_compare_holds_the_head_fixed_and_changes_only_the_block():
    for tie in (False, True):
        arms = compare(BASE, rates=(1e-2,), seeds=(0,), tie=tie, corpus=CORPUS)
        assert tuple(arms) == ARMS[tie]
        (a,), (b,) = (arm.best for arm in arms.values())
        for run in (a, b):
            assert (run.model.head.weight is run.model.emb.weight) == tie
        diff = {k for k, v in vars(a.config).items() if getattr(b.config, k) != v}
        assert diff == {"arch"}, "same budget, schedule, seed and rate: only the model differs"
        assert abs(b.n_params / a.n_params - 1) <= 0.02
        assert a.losses and a.losses[0] != b.losses[0]


def test_results_do_not_depend_on_workers_and_the_cache_reuses_runs():
    configs = [TrainConfig(**{**vars(BASE), "arch": f"ladder:{r}"}) for r in ("gpt2_untied", "no_gqa")]
    here = train_many(configs, CORPUS, workers=1)
    with WorkerPool(CORPUS, 2) as pool:
        there = train_many(configs, workers=pool)
        with pytest.raises(ValueError, match="different corpus"):
            train_many(configs, Corpus("other text " * 100, "other", "inline"), workers=pool)
    for a, b in zip(here, there, strict=True):
        assert a.losses == b.losses and a.metrics[-1]["val_loss"] == b.metrics[-1]["val_loss"]
        assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(),
                                                     strict=True))
    cache = {}
    first = train_many(configs, CORPUS, cache=cache)
    again = train_many(configs[::-1], CORPUS, cache=cache)
    assert again[0] is first[1] and again[1] is first[0], "identical configurations train once"
    with pytest.raises(ValueError, match="workers must be"):
        train_many(configs, CORPUS, workers=0)


def test_a_diverged_run_counts_as_inf_and_is_never_chosen():
    arms = sweep(tiny("gpt2", max_steps=12, eval_interval=6, warmup_steps=0, grad_clip=0.0), ["gpt2_untied"],
                 rates=(1e-2, 1e3), seeds=(0,), corpus=CORPUS)
    arm = arms["gpt2_untied"]
    (blown,) = arm.runs[1e3]
    assert isinstance(blown, Diverged) and blown.best_val_loss == math.inf and "became" in blown.message
    assert arm.lr == 1e-2 and math.isfinite(arm.mean)
    assert arm.row()["rates"]["1000"] is None, "JSON has no inf: a diverged rate is null"


def test_sweep_rejects_a_bad_grid():
    for rates, seeds, message in (((), (0,), "rates must be"), ((1e-3, 1e-3), (0,), "rates must be distinct"),
                                  ((math.nan,), (0,), "rates must be"), ((1e-3,), (0, 0), "seeds must be distinct"),
                                  ((1e-3,), (0.5,), "seeds must be ints")):
        with pytest.raises(ValueError, match=message):
            sweep(BASE, ["gpt2"], rates, seeds, corpus=CORPUS)
    with pytest.raises(ValueError, match="rung must be one of"):
        sweep(BASE, ["gpt3"], (1e-3,), (0,), corpus=CORPUS)


def test_gap_and_its_verdict():
    g = gap([2.0, 2.2], [1.5, 1.7])  # means 2.1 and 1.6, std 0.1414 each: SE = 0.1414
    assert g.delta == pytest.approx(-0.5) and g.se == pytest.approx(math.sqrt(0.02 / 2 + 0.02 / 2))
    assert g.resolved and g.verdict() == "lower loss"
    close = gap([2.0, 2.2], [2.05, 2.25])
    assert not close.resolved and close.verdict().startswith("no difference at this scale")
    assert gap([2.0], [1.0]).se is None and "one seed" in gap([2.0], [1.0]).verdict()
    assert "+0.5000 ± " in str(gap({"val_losses": [1.5, 1.7]}, {"val_losses": [2.0, 2.2]}))


def test_ladder_and_ablation_rows_share_runs_through_the_cache():
    cache = {}
    rows = run_ladder(BASE, rates=(1e-2,), seeds=(0, 1), rungs=("gpt2_untied", LLAMA_END), corpus=CORPUS, cache=cache)
    n = len(cache)
    loo = run_ablations(BASE, rates=(1e-2,), seeds=(0, 1), rungs=("no_gqa",), corpus=CORPUS, cache=cache)
    assert [r["rung"] for r in rows] == ["gpt2_untied", LLAMA_END] and [r["rung"] for r in loo] == [LLAMA_END, "no_gqa"]
    assert len(cache) == n + 2, "the reference came from the ladder's runs"
    no_qk_norm = run_ablations(BASE, rates=(1e-2,), seeds=(0, 1), rungs=("no_qk_norm",), corpus=CORPUS, cache=cache)
    gqa = run_ladder(BASE, rates=(1e-2,), seeds=(0, 1), rungs=("gqa",), corpus=CORPUS, cache=cache)
    assert len(cache) == n + 4, "no_qk_norm is the ladder's gqa model under another name: trained once"
    assert no_qk_norm[1]["val_losses"] == gqa[0]["val_losses"]
    assert loo[0]["val_losses"] == rows[1]["val_losses"]
    for r in rows + loo:
        assert r["lr"] == 1e-2 and len(r["val_losses"]) == 2 and r["std"] > 0
        assert [m["step"] for m in r["metrics"][0]] == [0, 2, 4]
    fig = plot_ladder(rows, ablations=loo)
    assert len(fig.axes) == 2
    assert LADDER_NAMES[0] == "gpt2" and LADDER_NAMES[-1] == LLAMA_END and ABLATION_NAMES[-1] == "llama_tied"


def test_write_report_states_the_design(tmp_path):
    arms = compare(BASE, rates=(3e-3, 1e-2), seeds=(0, 1), corpus=CORPUS)
    report = write_report(arms, tmp_path, "test", 1.0).read_text()
    for needle in ("Output head: untied in every arm", "peak rates 0.003, 0.01", "| chosen peak learning rate |",
                   "mean best val loss per rate", "best val loss, mean ± std", "Llama minus GPT-2:",
                   "Parameter ratio", "### GPT-2", "### Llama", "![learning-rate sweep](sweep.png)"):
        assert needle in report, needle
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["runs"]["gpt2_untied"]) == {"0.003", "0.01"} and len(results["runs"]["llama"]["0.01"]) == 2
    assert results["table"]["llama"]["lr"] == arms["llama"].lr
    for png in ("loss_curves.png", "sweep.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_compare_cli_rejects_bad_arguments(capsys):
    for argv, message in ((["compare", "--seeds", "1", "1"], "--seeds must be distinct"),
                          (["compare", "--seeds", str(10**20)], "expected a seed in"),
                          (["compare", "--lr", "0"], "expected a positive finite number"),
                          (["compare", "--lr", "1e-3", "--rates", "1e-3"], "give one of them"),
                          (["compare", "--rates", "1e-3", "1e-3"], "--rates must be distinct"),
                          (["compare", "--workers", "0"], "expected a positive integer")):
        with pytest.raises(SystemExit) as exc:
            entry.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    assert entry.main(["fit"]) == 2 and "unknown command 'fit'" in capsys.readouterr().err


def test_compare_cli_writes_report_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["--quick", "--out", str(out), "--rates", "0.003", "0.01", "--lr-llama", "0.02",
                     "--seeds", "0", *SMALL]) == 0
    report = (out / "report.md").read_text()
    assert "Output head: untied in every arm" in report
    assert "| mean best val loss per rate | 0.003: " in report and "| 0.02: " in report
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"gpt2_untied", "llama"} and set(results["runs"]["llama"]) == {"0.02"}
    for rung, lr in (("gpt2_untied", "0.003"), ("gpt2_untied", "0.01"), ("llama", "0.02")):
        assert (out / f"{rung}-lr{lr}-seed0" / METRICS).exists()
        assert not (out / f"{rung}-lr{lr}-seed0" / CHECKPOINT).exists(), "compare keeps no checkpoints"
    assert 0.98 <= results["table"]["llama"]["params"] / results["table"]["gpt2_untied"]["params"] <= 1.02
    assert cli.main(["--quick", "--tied", "--out", str(tmp_path / "tied"), "--lr", "0.01", *SMALL]) == 0
    assert "Output head: tied in every arm" in (tmp_path / "tied" / "report.md").read_text()
    assert "report:" in capsys.readouterr().out


def test_readme_quotes_the_committed_lesson_08_run():
    """The README's lesson-08 paragraph states what the committed run shows: every decimal figure it quotes is in
    the notebook's saved outputs, and every verdict it gives is the one its paired 95% interval supports, as printed
    by the lesson."""
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("Lesson 08 in quick mode", 1)[1].split("\n\n", 1)[0]
    nb = nbformat.read(ROOT / "notebooks" / "08_train_llama_vs_gpt2.ipynb", as_version=4)
    outputs = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    quoted = re.findall(r"[−-]?\d+\.\d+|\d{1,3}(?:,\d{3})+", paragraph)
    assert len(quoted) >= 8, quoted
    for number in quoted:
        assert number.replace("−", "-").lstrip("+") in outputs, f"README quotes {number}, which lesson 08 does not show"
    num = r"([+−-]\d+\.\d+)"
    claims = re.findall(num + r" \[" + num + ", " + num + r"\]: (lower|higher|no difference at this scale)",
                        paragraph)
    assert len(claims) >= 2, "the caption gives its verdicts with their intervals"
    for mean, low, high, word in claims:
        low_f, high_f = (float(x.replace("−", "-")) for x in (low, high))
        expected = "lower" if high_f < 0 else "higher" if low_f > 0 else "no difference at this scale"
        assert word == expected, (mean, low, high, word)
        printed = f"{mean} [{low}, {high}]".replace("−", "-")
        assert re.search(re.escape(printed) + r" \(95% interval, \d+ paired seeds\): " + word, outputs), printed


@pytest.mark.parametrize("where", ["a run's metrics", "the report"])
def test_compare_cli_a_full_disk_is_one_line_and_keeps_the_runs(tmp_path, monkeypatch, capsys, where):
    import errno

    from modern_block.training import files, report, run_folder

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def append_fails(self, row):
        with files.refused_writes(f"append an evaluation to {self.metrics}"):
            full()

    if where == "the report":  # report.py turns the OSError into one line naming the file
        monkeypatch.setattr(report, "write_text_atomic", full)
    else:
        monkeypatch.setattr(run_folder.RunFolder, "append_metrics", append_fails)
    out = tmp_path / "cmp"
    assert cli.main(["--quick", "--out", str(out), "--lr", "0.01", "--seeds", "0", *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not ") and "(No space left on device)" in err and "No report written" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not [p for p in out.rglob("*") if p.name.endswith(files.TEMPORARY)]


def test_compare_cli_an_out_path_too_long_is_one_line(tmp_path, capsys):
    assert cli.main(["--quick", "--out", str(tmp_path / ("y" * 300)), "--lr", "0.01", "--seeds", "0", *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write in --out") and "File name too long" in err
    assert len(err.strip().splitlines()) == 1


def test_select_then_report_chooses_on_some_seeds_and_reports_on_others():
    from modern_block.training.experiments import final_loss, select_then_report
    from modern_block.training.report import plot_curve_bands, plot_differences

    study = select_then_report(BASE, ["gpt2_untied", "llama"], rates=(1e-4, 3e-2), selection_seeds=(0,),
                               reported_seeds=(1, 2), corpus=CORPUS)
    for rung, sel in study.selections.items():
        at = {lr: final_loss(runs[0]) for lr, runs in study.selection[rung].runs.items()}
        assert sel.lr == min(at, key=at.get) and sel.selection_seeds == (0,)
        arm = study.reported[rung]
        assert arm.rates == [sel.lr] and [r.config.seed for r in arm.best] == [1, 2]
        assert sel.reported == {1: final_loss(arm.best[0]), 2: final_loss(arm.best[1])}
    d = study.difference("gpt2_untied", "llama")
    expected = [study.selections["llama"].reported[s] - study.selections["gpt2_untied"].reported[s] for s in (1, 2)]
    assert d.mean == pytest.approx(sum(expected) / 2) and d.low < d.mean < d.high
    with pytest.raises(ValueError, match="must be different seeds"):
        select_then_report(BASE, ["llama"], rates=(1e-2,), selection_seeds=(0, 1), reported_seeds=(1,), corpus=CORPUS)
    fig = plot_curve_bands({arm.label: arm.best for arm in study.reported.values()})
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[0].collections) == 2  # two means, two bands
    fig = plot_differences([("llama", d), ("same", d)])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["llama", "same"]
