"""The one study (modern_block/training/study.py), its report (report.py) and its command line (cli.py)."""

import errno
import json
import math
import re
from dataclasses import asdict, replace
from pathlib import Path

import nbformat
import pytest
import torch
from training_setup import CORPUS, SMALL, never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block.training import cli, files, report, run_folder
from modern_block.training import study as S
from modern_block.training.config import quick_config
from modern_block.training.report import plot_curve_bands, plot_differences, report_text, write_results
from modern_block.training.run_folder import CHECKPOINT, METRICS, SUMMARY
from modern_block.training.statistics import HIGHER, INCONCLUSIVE, LOWER
from modern_block.training.study import STUDIES, Anchor, Progress, Results, Study, run_study, time_left
from modern_block.training.workers import Diverged, read_record, run_dir, train_many

ROOT = Path(__file__).resolve().parents[2]
BASE = tiny("gpt2", max_steps=6, eval_interval=3, dropout=0.0, warmup_steps=2)
MODELS = ("gpt2_nobias", "llama", "llama_tied")


def _study(**changes) -> Study:
    return replace(Study("test", BASE, MODELS, (1e-3, 1e-2), (0,), (1, 2), (("gpt2_nobias", "llama"),),
                         Anchor("gpt2_nobias", 3e-3, 3.5, "a paper")), **changes)


def test_a_study_chooses_on_some_seeds_reports_on_others_and_resumes(tmp_path):
    said = []
    res = run_study(_study(), tmp_path, CORPUS, command="test", say=said.append)
    lines = [line for line in said if line.startswith("[")]  # not a terminal: one line per run, all 14 counted
    assert [line.split("]")[0] for line in lines] == [f"[{k}/14" for k in range(1, 15)], said
    assert lines[0].split()[1] == "selection" and lines[-1].split()[1] == "anchor"
    assert all(re.search(r"\(\d+ s, ~\d+ s left\)$", line) for line in lines), lines
    selection = [r for r in res.runs if r["role"] == "selection"]
    assert len(selection) == 3 * 2 and {r["seed"] for r in selection} == {0}
    for m, sel in res.selections.items():
        at = {r["lr"]: r["final_val_loss"] for r in selection if r["model"] == m}
        assert sel.lr == min(at, key=at.get), "the rate with the lowest loss on the selection seed"
        reported = [r for r in res.runs if r["model"] == m and r["role"] == "reported"]
        assert {r["seed"] for r in reported} == {1, 2} and {r["lr"] for r in reported} == {sel.lr}
    anchor = [r for r in res.runs if r["role"] == "anchor"]
    assert [(r["model"], r["lr"], r["seed"]) for r in anchor] == [("gpt2_nobias", 3e-3, 1), ("gpt2_nobias", 3e-3, 2)]
    for r in res.runs:  # one budget: only the model, the rate and the seed change; the record's names
        assert {k for k, v in r["config"].items() if v != asdict(BASE)[k]} <= {"arch", "lr", "min_lr", "seed"}
        assert r["config"]["arch"] == f"ladder:{r['model']}" and r["config"]["min_lr"] == pytest.approx(r["lr"] / 10)
        assert r["final_val_loss"] == r["metrics"][-1]["val_loss"] and len(r["train_losses"]) == 6
        assert (tmp_path / f"{r['model']}-lr{r['lr']:g}-seed{r['seed']}" / CHECKPOINT).exists()
    d = res.difference("gpt2_nobias", "llama")
    expected = [res.selections["llama"].reported[s] - res.selections["gpt2_nobias"].reported[s] for s in (1, 2)]
    assert d.mean == pytest.approx(sum(expected) / 2) and d.low < d.mean < d.high

    report_path = write_results(res, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report_path.read_text() == report_text(Results.from_json(saved)) == report_text(res)
    assert "gpt2_nobias at a paper's rate 0.003 on seeds 1, 2: " in report_path.read_text()
    assert f"| llama minus gpt2_nobias | {d.format()} | {d.verdict} |" in report_path.read_text()

    said.clear()  # the same study again: every run is read back, none trained
    again = run_study(_study(), tmp_path, CORPUS, command="test", say=said.append)
    assert not any(line.startswith("[") for line in said), said
    assert [r["final_val_loss"] for r in again.runs] == [r["final_val_loss"] for r in res.runs]


def test_the_laptop_ladder_and_the_attention_stress_follow_the_issue():
    """The ladder at nanoGPT's CPU recipe: the tied->untied, RMSNorm, SwiGLU, RoPE rungs and their
    leave-one-outs from Llama, each rate inside its sweep, 3 reported seeds; the attention study's stress puts
    MHA and MHA with QK-norm at the same 2x, 4x and 8x MHA's chosen rate on its 5 reported seeds."""
    ladder, laptop = STUDIES["ladder_laptop"], STUDIES["laptop"]
    assert ladder.base == laptop.base and (ladder.base.d, ladder.base.n_layers, ladder.base.block_size,
                                           ladder.base.batch_size, ladder.base.max_steps) == (128, 4, 64, 12, 2000)
    for rung in ("gpt2_untied", "rmsnorm", "swiglu", "rope"):
        before = ladder.models[ladder.models.index(rung) - 1]
        assert (before, rung) in ladder.pairs
    for left_out in ("no_rmsnorm", "no_swiglu", "no_rope", "llama_tied"):
        assert ("llama", left_out) in ladder.pairs
    assert ladder.selection_seeds == (0,) and len(ladder.reported_seeds) >= 3 and ladder.widen >= 2
    attention = STUDIES["attention"]
    assert attention.stress_base == "mha" and attention.reported_seeds == (1, 2, 3, 4, 5)
    assert {(m, f) for m, f in attention.stress} == {(m, f) for m in ("mha", "mha_qk_norm") for f in (2, 4, 8)}


def test_a_study_is_checked_when_built():
    for changes, message in ((dict(selection_seeds=(0, 1), reported_seeds=(1,)), "different seeds; both hold [1]"),
                             (dict(rates=(1e-3, 1e-3)), "rates must be a non-empty sequence of distinct"),
                             (dict(rates=(-1.0,)), "lr must be a positive"),
                             (dict(models=("gpt3",)), "rung must be one of"),
                             (dict(pairs=(("gpt2", "llama"),)), "pairs name models the study does not train")):
        with pytest.raises(ValueError, match=re.escape(message)):
            _study(**changes)


def test_the_course_studies_are_configurations_of_one_design():
    assert set(STUDIES) == {"quick", "laptop", "gpu", "ladder", "ablations", "attention", "ladder_laptop"}
    assert STUDIES["ladder"].base == quick_config("gpt2"), "the quick ladder: the 90-step preset, a live demo"
    assert STUDIES["quick"].base.max_steps == 300 and STUDIES["quick"].widen, "lesson 08: below the bigram loss"
    assert STUDIES["laptop"].anchor.lr == 1e-3 and STUDIES["laptop"].anchor.published == 1.88
    for study in STUDIES.values():
        assert not set(study.selection_seeds) & set(study.reported_seeds)
        assert all(set(p) <= set(study.models) for p in study.pairs)


def test_a_sweep_widens_until_the_chosen_rate_is_inside_it(tmp_path):
    """A model whose best rate is an end of the sweep is tried one step beyond it, until the best is inside (or
    ``widen`` steps are spent on that side); every widened run is a selection run on the selection seeds."""
    study = Study("t", BASE, ("gpt2_untied",), (1e-5, 2e-5), (0,), (1, 2), widen=2)
    res = run_study(study, tmp_path, CORPUS, say=lambda text: None)
    sweep = res.sweep("gpt2_untied")  # 6 steps at 1e-5 barely move: the best is the highest rate, twice
    assert sweep == [1e-5, 2e-5, 4e-5, 8e-5] and res.selections["gpt2_untied"].lr == 8e-5
    assert res.selections["gpt2_untied"].at_edge, "widen=2 stops after two steps even at an edge"
    assert {r["lr"] for r in res.runs if r["role"] == "selection"} == set(sweep)
    wide = run_study(replace(study, widen=9, rates=(1e-3, 1e3)), tmp_path, CORPUS, say=lambda text: None)
    low = wide.sweep("gpt2_untied")  # 1e3 diverges, 1e-3 is best: one step below it, and that is inside
    assert low[:2] == [1e-9, 1e-3] and not wide.selections["gpt2_untied"].at_edge
    assert "widened" in report_text(wide) and wide.to_json()["widen"] == 9
    assert Results.from_json(wide.to_json()).sweep("gpt2_untied") == low
    with pytest.raises(ValueError, match="widen must be a non-negative int"):
        replace(study, widen=-1)
    with pytest.raises(ValueError, match="widen needs at least 2 rates"):
        replace(study, rates=(1e-3,))


def test_equal_rate_stress_runs_every_stressed_model_at_the_base_models_rates(tmp_path):
    study = Study("t", BASE, ("gpt2_untied", "llama"), (1e-3, 1e-2), (0,), (1, 2),
                  stress=(("gpt2_untied", 2.0), ("llama", 2.0)), stress_base="gpt2_untied")
    res = run_study(study, tmp_path, CORPUS, say=lambda text: None)
    hot = 2 * res.chosen_rates()["gpt2_untied"]
    assert sorted((r["model"], r["lr"], r["seed"]) for r in res.runs if r["role"] == "stress") == [
        ("gpt2_untied", hot, 1), ("gpt2_untied", hot, 2), ("llama", hot, 1), ("llama", hot, 2)]
    text = report_text(Results.from_json(res.to_json()))
    assert f"llama at {hot:g} (2x gpt2_untied's chosen rate)" in text, text
    assert f"llama minus gpt2_untied at the same rate {hot:g}" in text
    with pytest.raises(ValueError, match="stress_base names 'gpt3'"):
        replace(study, stress_base="gpt3")


def test_committed_runs_are_reused_only_with_the_same_settings_and_text(tmp_path, monkeypatch, capsys):
    """``compare --reuse results.json`` reads a committed study's finished runs instead of training them again,
    writes each into its run folder, and trains what the committed file lacks or made otherwise."""
    study = _study(anchor=None)
    first = run_study(study, tmp_path / "a", CORPUS, say=lambda text: None)
    committed = first.to_json()
    said: list[str] = []
    again = run_study(study, tmp_path / "b", CORPUS, say=said.append, reuse=[committed])
    assert not any(line.startswith("[") for line in said), "nothing trained: every run reused"
    assert [r["final_val_loss"] for r in again.runs] == [r["final_val_loss"] for r in first.runs]
    assert all(read_record(run_dir(tmp_path / "b", study.config(r["model"], r["lr"], r["seed"])),
                           study.config(r["model"], r["lr"], r["seed"])) for r in again.runs)
    other = run_study(study, tmp_path / "c", CORPUS, say=said.append, reuse=[committed | {"corpus": "other"}],
                      train=False)
    assert other.runs == [], "another text: nothing reused"
    older = committed | {"runs": [{k: v for k, v in r.items() if k != "finished"} for r in committed["runs"]]}
    again = run_study(study, tmp_path / "f", CORPUS, say=said.append, reuse=[older], train=False)
    assert len(again.runs) == len(first.runs), "records written before 'finished' existed: by their last step"
    longer = replace(study, base=replace(BASE, max_steps=7))
    assert run_study(longer, tmp_path / "d", CORPUS, say=said.append, reuse=[committed], train=False).runs == []
    path = tmp_path / "results.json"
    path.write_text(json.dumps(committed))
    monkeypatch.setattr("modern_block.training.study.load_corpus", lambda verbose: CORPUS)
    argv = ["--quick", "--out", str(tmp_path / "e"), "--collect", "--reuse", str(path), "--no-progress"]
    with pytest.raises(SystemExit):
        cli.compare_main(argv[:-2] + [str(tmp_path / "missing.json")])
    assert "--reuse" in capsys.readouterr().err


@pytest.mark.slow
def test_results_do_not_depend_on_workers_and_identical_runs_train_once():
    configs = [replace(BASE, arch=f"ladder:{r}") for r in ("gpt2_untied", "no_gqa")]
    here = train_many(configs, CORPUS, workers=1)
    there = train_many(configs, CORPUS, workers=2)
    for a, b in zip(here, there, strict=True):
        assert a.losses == b.losses and a.metrics[-1]["val_loss"] == b.metrics[-1]["val_loss"]
        assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(),
                                                     strict=True))
    twice = train_many(configs + configs[:1], CORPUS)
    assert twice[2] is twice[0], "identical configurations train once"
    with pytest.raises(ValueError, match="workers must be"):
        train_many(configs, CORPUS, workers=0)


@pytest.mark.slow
def test_a_study_spawns_its_workers_once_and_trains_as_one_process_does(monkeypatch):
    made = []

    class CountedPool(S.WorkerPool):
        def __init__(self, corpus, n):
            made.append(n)
            super().__init__(corpus, n)

    monkeypatch.setattr(S, "WorkerPool", CountedPool)
    study = _study(anchor=None)  # two rounds: 3 models x 2 rates on seed 0, then 3 models on seeds 1 and 2
    alone = run_study(study, None, CORPUS, say=lambda text: None)
    pooled = run_study(study, None, CORPUS, workers=2, say=lambda text: None)
    assert made == [2], "one pool of two workers for both rounds"
    assert [(r["model"], r["lr"], r["seed"], r["final_val_loss"]) for r in pooled.runs] == [
        (r["model"], r["lr"], r["seed"], r["final_val_loss"]) for r in alone.runs]
    pool = S.WorkerPool(CORPUS, 1)  # its process starts with its first run: none here
    try:
        with pytest.raises(ValueError, match="pool holds another text"):
            train_many([BASE, replace(BASE, seed=1)], replace(CORPUS, text=CORPUS.text[:-1]), 2, pool=pool)
    finally:
        pool.close()


def test_a_diverged_run_counts_as_inf_and_is_never_chosen(tmp_path):
    base = replace(BASE, max_steps=12, eval_interval=6, warmup_steps=0, grad_clip=0.0)
    res = run_study(Study("t", base, ("gpt2_untied",), (1e-2, 1e3), (0,), (1, 2)), tmp_path, CORPUS,
                    say=lambda text: None)
    blown = res.record("gpt2_untied", 1e3, 0)
    assert blown["diverged"] and "became" in blown["diverged"] and blown["final_val_loss"] is None
    assert res.chosen_rates() == {"gpt2_untied": 1e-2}
    assert read_record(run_dir(tmp_path, base.__class__(**blown["config"])), base.__class__(**blown["config"]))
    (blown_run,) = train_many([replace(base, arch="ladder:gpt2_untied", lr=1e3, min_lr=1e2)], CORPUS)
    assert isinstance(blown_run, Diverged) and blown_run.best_val_loss == math.inf


def test_a_record_made_with_other_settings_is_not_reused(tmp_path):
    cfg = replace(BASE, arch="ladder:llama")
    (result,) = train_many([cfg], CORPUS, out_dir=tmp_path)
    folder = run_dir(tmp_path, cfg)
    assert read_record(folder, cfg) == json.loads(json.dumps(result.summary())) | {"run_id": read_record(
        folder, cfg)["run_id"]}
    assert read_record(folder, replace(cfg, device=None, log_interval=5)) is not None, "runtime fields may differ"
    assert read_record(folder, replace(cfg, d=64)) is None
    (folder / SUMMARY).write_text("{broken")
    assert read_record(folder, cfg) is None


def test_collect_reads_what_is_finished_and_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MODERN_BLOCK_QUICK", raising=False)
    argv = ["--study", "laptop", "--collect", "--out", str(tmp_path), "--d", "32", "--n-layers", "2", "--block-size",
            "16", "--batch-size", "4", "--max-steps", "6", "--warmup-steps", "2", "--eval-interval", "3",
            "--eval-batches", "1", "--rates", "0.001", "0.01", "--seeds", "1", "2", "--device", "cpu"]
    assert cli.compare_main(argv) == 0  # nothing finished yet: an empty, incomplete result
    empty = json.loads((tmp_path / "results.json").read_text())
    assert empty["runs"] == [] and not empty["complete"] and "INCOMPLETE" in (tmp_path / "report.md").read_text()
    study = cli.study_from_args(cli.compare_parser(), cli.compare_parser().parse_args(argv))
    run_study(study, tmp_path, CORPUS, say=lambda text: None)
    monkeypatch.setattr("modern_block.training.study.load_corpus", lambda verbose: CORPUS)
    assert cli.compare_main(argv) == 0
    full = json.loads((tmp_path / "results.json").read_text())
    anchor = 0 if Results.from_json(full).chosen_rates()["gpt2_nobias"] == 1e-3 else 2  # 1e-3 on seeds 1, 2
    assert full["complete"] and len(full["runs"]) == 3 * 2 + 3 * 2 + anchor
    assert "INCOMPLETE" not in (tmp_path / "report.md").read_text() and (tmp_path / "curves.png").exists()


def test_compare_prints_the_interval_lesson_08_computes(tmp_path, monkeypatch, capsys):
    """The CLI's report and a reader of its results.json (as lesson 08 reads the committed ones) give one interval."""
    monkeypatch.setattr("modern_block.training.study.load_corpus", lambda verbose: CORPUS)
    out = tmp_path / "cmp"
    assert cli.compare_main(["--quick", "--out", str(out), "--rates", "0.003", "0.01", "--selection-seeds", "0",
                     "--seeds", "1", "2", *SMALL]) == 0
    printed = capsys.readouterr().out
    res = Results.from_json(json.loads((out / "results.json").read_text()))
    d = res.difference("gpt2_untied", "llama")
    assert f"| llama minus gpt2_untied | {d.format()} | {d.verdict} |" in printed
    assert d.verdict in (LOWER, HIGHER) or d.verdict.startswith(INCONCLUSIVE)
    for m, lr in res.chosen_rates().items():
        assert (out / f"{m}-lr{lr:g}-seed1" / METRICS).exists()


@pytest.mark.parametrize("where", ["a run's metrics", "the report"])
def test_compare_cli_a_full_disk_is_one_line_and_keeps_the_runs(tmp_path, monkeypatch, capsys, where):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def append_fails(self, row):
        with files.refused_writes(f"append an evaluation to {self.metrics}"):
            full()

    if where == "the report":  # report.py turns the OSError into one line naming the file
        monkeypatch.setattr(report, "write_text_atomic", full)
    else:
        monkeypatch.setattr(run_folder.RunFolder, "append_metrics", append_fails)
    monkeypatch.setattr("modern_block.training.study.load_corpus", lambda verbose: CORPUS)
    out = tmp_path / "cmp"
    assert cli.compare_main(["--quick", "--out", str(out), "--rates", "0.01", "--selection-seeds", "0", "--seeds", "1",
                             "2", *SMALL]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: could not ") and "(No space left on device)" in err and "No report written" in err
    assert not [p for p in out.rglob("*") if p.name.endswith(files.TEMPORARY)]


def test_compare_cli_refuses_an_out_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    with pytest.raises(SystemExit) as info:
        cli.compare_main(["--quick", "--out", str(afile), *SMALL])
    assert info.value.code == 2 and afile.read_text() == "mine"
    assert f"--out {afile} is a file, not a folder" in capsys.readouterr().err


def test_compare_cli_an_out_path_too_long_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("modern_block.training.study.load_corpus", lambda verbose: CORPUS)
    assert cli.compare_main(["--quick", "--out", str(tmp_path / ("y" * 300)), "--rates", "0.01", "--selection-seeds",
                             "0", "--seeds", "1", "2", *SMALL]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: cannot write in --out") and "File name too long" in err


def test_the_anchor_is_held_against_where_one_more_run_falls():
    def sentence(losses):
        res = Results(_study())
        for seed, loss in losses.items():
            res.add("gpt2_nobias", 3e-3, seed, "anchor", {"final_val_loss": loss})
        return report._anchor_sentence(res)

    inside = sentence({0: 3.49, 1: 3.50, 2: 3.51, 3: 3.52})
    assert "prediction interval" in inside and "3.5 is inside it: within the seed spread." in inside
    assert "3.5 is outside it: beyond the seed spread." in sentence({0: 3.55, 1: 3.551, 2: 3.552})
    assert "one seed" in sentence({0: 3.9})


def test_figures_of_the_lesson(tmp_path):
    res = run_study(replace(_study(), anchor=None, models=MODELS[:2]), None, CORPUS, say=lambda text: None)
    fig = plot_curve_bands({m: res.reported(m) for m in res.selections})
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[0].collections) == 2  # two means, two bands
    d = res.difference("gpt2_nobias", "llama")
    fig = plot_differences([("llama", d), ("same", d)])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["llama", "same"]


def test_what_the_lessons_ask_of_the_report_functions():
    res = run_study(replace(_study(), anchor=None, models=MODELS[:2]), None, CORPUS, say=lambda text: None)
    table = report.selection_table(res)
    assert table in report_text(res)
    assert table.count("\n") == 1 + len(res.selections)  # a header, its rule and a row per model
    labels = [line.get_label() for line in report.plot_curves(res, {"llama": "Llama"}).axes[0].lines]
    assert labels == [f"gpt2_nobias ({len(res.complete_seeds)} seeds)", f"Llama ({len(res.complete_seeds)} seeds)"]
    sweep = report.plot_sweep(res.selections, title="t").axes[0]
    assert sweep.get_title() == "t" and len(sweep.lines) == 2 * len(res.selections)  # a curve and a chosen rate each


def test_lesson_08_imports_at_most_15_names_from_the_training_package():
    """Lesson 08 shows the loop and the study behind it; it does not lean on the package's whole surface."""
    import ast

    nb = nbformat.read(ROOT / "notebooks" / "08_train_llama_vs_gpt2.ipynb", as_version=4)
    names = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            code = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            names |= {alias.name for node in ast.walk(ast.parse(code)) if isinstance(node, ast.ImportFrom)
                      and (node.module or "").startswith("modern_block.training") for alias in node.names}
    assert {"train", "run_study", "STUDIES", "Results"} <= names and len(names) <= 15, sorted(names)


def test_readme_quotes_the_committed_lesson_08_run():
    """The README's lesson-08 paragraph states what the committed runs show: every decimal figure it quotes is in
    the saved outputs of lessons 08 and 08b, and every verdict it gives is the one its paired 95% interval supports."""
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("Lesson 08 in quick mode", 1)[1].split("\n\n", 1)[0]
    nbs = [nbformat.read(ROOT / "notebooks" / name, as_version=4)  # the paragraph's ladder figures are 08b's
           for name in ("08_train_llama_vs_gpt2.ipynb", "08b_ladder_and_ablations.ipynb")]
    outputs = "\n".join(o.get("text", "") for nb in nbs for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    quoted = re.findall(r"[−-]?\d+\.\d+|\d{1,3}(?:,\d{3})+", paragraph)
    assert len(quoted) >= 8, quoted
    for number in quoted:
        assert number.replace("−", "-").lstrip("+") in outputs, f"README quotes {number}, not shown by lessons 08/08b"
    num = r"([+−-]\d+\.\d+)"
    claims = re.findall(num + r" \[" + num + ", " + num + r"\]: (lower|higher|inconclusive)", paragraph)
    assert len(claims) >= 2, "the caption gives its verdicts with their intervals"
    for _, low, high, word in claims:
        low_f, high_f = (float(x.replace("−", "-")) for x in (low, high))
        assert word == ("lower" if high_f < 0 else "higher" if low_f > 0 else "inconclusive"), (low, high, word)


def test_the_time_left_is_the_pace_of_the_runs_trained_so_far():
    assert time_left(30.0, 3, 5) == pytest.approx(50.0)  # 10 s a run, 5 to go
    assert time_left(30.0, 3, 0) == 0.0 and time_left(0.0, 0, 7) is None


def test_progress_without_a_terminal_is_a_line_per_finished_run_with_the_time_left(monkeypatch):
    clock = iter([100.0, 110.0, 130.0, 131.0])
    monkeypatch.setattr(S.time, "perf_counter", lambda: next(clock))
    said = []
    progress = Progress(5, said.append, bar=False)
    progress.read_back(1)  # counted as done; it sets no pace
    cfg = BASE
    progress("selection", replace(cfg, lr=4e-3, seed=0), {"final_val_loss": 2.5})
    progress.expect(4)  # the anchor turned out not to be needed
    progress("reported", replace(cfg, lr=4e-3, seed=3), {"final_val_loss": None})
    assert said == ["[2/5] selection gpt2 lr 0.004 seed 0: final val loss 2.5000 (10 s, ~30 s left)",
                    "[3/4] reported  gpt2 lr 0.004 seed 3: diverged (30 s, ~15 s left)"]
