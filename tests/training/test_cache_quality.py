"""The attention study: its models (ladder.ATTENTIONS, built by ladder.py) differ in their attention alone and match
in parameters; its design (study.STUDIES["attention"], with the stress runs at a multiple of the chosen rate); and
the quality-against-cache picture and table (training/report.py) drawn from its results."""

import math
from dataclasses import asdict, fields, replace

import matplotlib
import pytest
import torch
from decodes import assert_decodes_agree, cached_logits
from training_setup import CORPUS, never_online, tiny  # noqa: F401 (never_online is an autouse fixture)

from modern_block import KVCache, generate
from modern_block.training import cli
from modern_block.training.config import QUICK_ENV
from modern_block.training.ladder import (
    ATTENTION_NAMES,
    ATTENTIONS,
    Rung,
    cache_bytes_per_token,
    get_rung,
    gpt2_parameters,
    ladder_model,
)
from modern_block.training.report import cache_quality_rows, cache_quality_table, plot_cache_quality, report_text
from modern_block.training.statistics import HIGHER, INCONCLUSIVE, LOWER
from modern_block.training.study import STUDIES, Results, Study, middle_out, run_study

matplotlib.use("Agg")
STUDY = STUDIES["attention"]
SHAPE, V = STUDY.base.shape, 65  # tinyshakespeare's 65 characters
ATTENTION_FIELDS = {"attention", "gqa", "n_kv_heads", "kv_latent", "qk_norm"}


def _params(model: str) -> int:
    with torch.device("meta"):
        return ladder_model(model, SHAPE, V).num_parameters()


def test_the_arms_differ_in_their_attention_only():
    mha = get_rung("mha")
    for rung in ATTENTIONS[1:]:
        changed = rung.differences(mha)
        assert changed and set(changed) <= ATTENTION_FIELDS, (rung.name, changed)
    configs = {m: asdict(STUDY.config(m, 1e-3, 1)) for m in STUDY.models}  # one run's settings per arm
    for m, cfg in configs.items():
        assert {k for k, v in cfg.items() if v != configs["mha"][k]} <= {"arch"}, m
    shapes = {}
    for m in STUDY.models:  # embeddings, norms and head are the same; attention and FFN hidden size may not be
        with torch.device("meta"):
            model = ladder_model(m, SHAPE, V)
        shapes[m] = {n: tuple(p.shape) for n, p in model.named_parameters() if ".attn." not in n and ".ffn." not in n}
        assert all(type(b.ffn).__name__ == "SwiGLU" for b in model.blocks)
    assert all(s == shapes["mha"] for s in shapes.values())


def test_the_arms_match_in_parameters_through_the_ffn():
    """Each arm's d_ff is chosen so that its total is closest to GPT-2's at this shape: within 2% of MHA's."""
    counts = {m: _params(m) for m in STUDY.models}
    budget = gpt2_parameters(SHAPE, V)
    for m, n in counts.items():
        assert abs(n / counts["mha"] - 1) <= 0.02 and abs(n / budget - 1) <= 0.01, (m, n, counts["mha"])
    with torch.device("meta"):  # what an arm saves in K/V projections went back into its FFN
        d_ff = {m: ladder_model(m, SHAPE, V).blocks[0].ffn.w_up.out_features for m in ("mha", "gqa2", "mqa")}
    assert d_ff["mha"] < d_ff["gqa2"] < d_ff["mqa"]


def test_the_arms_build_the_attention_they_name_and_cache_what_the_formula_says():
    per_layer = {"mha": 2 * 8 * 16, "gqa4": 2 * 4 * 16, "gqa2": 2 * 2 * 16, "mqa": 2 * 16, "mla56": 56 + 8,
                 "mla24": 24 + 8, "mha_qk_norm": 2 * 8 * 16}  # K and V of each K/V head, or latent + RoPE key
    expected = {m: n * 4 * 2 for m, n in per_layer.items()}  # 4 layers, 2 bytes (bf16)
    assert {m: cache_bytes_per_token(m, SHAPE) for m in ATTENTION_NAMES} == expected
    assert expected["mla56"] == expected["gqa2"] and expected["mla24"] == expected["mqa"], "the same-cache pairs"
    small = replace(SHAPE, n_layers=2, block_size=24)
    idx = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    for m in ATTENTION_NAMES:
        torch.manual_seed(0)
        model = ladder_model(m, small, V).eval()
        attn = model.blocks[0].attn
        if m.startswith("mla"):
            assert (attn.d_c, attn.rope_dim, attn.d_nope, attn.d_v) == (get_rung(m).kv_latent, 8, 16, 16)
        else:
            assert (attn.h, attn.kv, attn.dh) == (8, {"gqa4": 4, "gqa2": 2, "mqa": 1}.get(m, 8), 16)
            assert (type(attn.q_norm).__name__ == "RMSNorm") == (m == "mha_qk_norm")
        cache = KVCache(len(model.blocks), 12)
        with torch.no_grad():
            model(idx, cache)
        assert cache.nbytes() == cache_bytes_per_token(m, small, bytes_per_elem=4) * 12 * 2, m
        assert_decodes_agree(model, lambda s, model=model: cached_logits(model, s, 4),
                             generate(model, idx[:, :4], 6, use_cache=False), generate(model, idx[:, :4], 6), 4, 1e-5,
                             f"{m}: cached against recomputed")


def test_attention_switches_are_checked():
    for kwargs, message in ((dict(attention="mla"), "go together"), (dict(kv_latent=8), "go together"),
                            (dict(attention="llama", positions="rope", n_kv_heads=2), "needs gqa=True"),
                            (dict(attention="mla", kv_latent=8), "positions='rope'"),
                            (dict(attention="mla", kv_latent=8, positions="rope", qk_norm=True), "attention='llama'"),
                            (dict(attention="llama", gqa=True, n_kv_heads=0), "n_kv_heads")):
        with pytest.raises(ValueError, match=message):
            Rung("bad", **kwargs)
    with pytest.raises(ValueError, match="n_heads"):  # 6 query heads cannot share 4 K/V heads
        ladder_model("gqa4", replace(SHAPE, n_heads=6, d=96), V)


def test_the_attention_study_design():
    s = STUDY
    assert s.base.n_heads == 8 and s.base.d // s.base.n_heads == 16, "two GQA settings need 8 heads"
    assert asdict(replace(s.base, n_heads=4)) == asdict(STUDIES["laptop"].base), "otherwise the laptop recipe"
    assert len(s.rates) >= 4 and len(s.selection_seeds) >= 1 and len(s.reported_seeds) >= 3
    assert set(s.pairs) == {("mha", m) for m in s.models if m != "mha"}
    assert s.stress_base == "mha" and s.stress == tuple((m, f) for f in (2.0, 4.0, 8.0) for m in ("mha", "mha_qk_norm"))
    assert middle_out(s.rates) == [1e-3, 5e-4, 2e-3, 2.5e-4, 4e-3]
    assert middle_out((3.0, 1.0, 2.0)) == [2.0, 1.0, 3.0] and middle_out((1.0,)) == [1.0]
    order = Results(s).planned("selection")
    assert [lr for _, lr, _ in order[:len(s.models)]] == [1e-3] * len(s.models), "every arm at one rate first"
    for bad, message in (((("gpt2", 4.0),), "does not train"), ((("mha", 1.0),), "other than 1"),
                         ((("mha", -2.0),), "positive"), ((("mha", math.inf),), "finite")):
        with pytest.raises(ValueError, match=message):
            replace(s, stress=bad)
    assert s.with_options(models=("mha", "mqa")).stress == (("mha", 2.0), ("mha", 4.0), ("mha", 8.0))
    assert s.with_options(models=("gqa2", "mha_qk_norm")).stress == (), "no stress without the base model's rate"


def test_the_command_line_names_the_attention_study(monkeypatch, tmp_path):
    monkeypatch.delenv(QUICK_ENV, raising=False)
    parser = cli.compare_parser()
    args = parser.parse_args(["--study", "attention", "--out", str(tmp_path), "--workers", "2"])
    assert cli.study_from_args(parser, args) == STUDY
    args = parser.parse_args(["--study", "attention", "--models", "mha", "mla56", "--seeds", "4", "5"])
    assert cli.study_from_args(parser, args).models == ("mha", "mla56")


def test_stress_runs_train_at_a_multiple_of_the_chosen_rate_and_divergence_is_an_outcome(tmp_path):
    base = tiny("gpt2", max_steps=8, eval_interval=4, dropout=0.0, warmup_steps=0, grad_clip=0.0)
    study = Study("t", base, ("mha", "mqa"), (1e-2,), (0,), (1, 2), (("mha", "mqa"),),
                  stress=(("mha", 1e5), ("mqa", 2.0)))
    res = run_study(study, tmp_path, CORPUS, say=lambda text: None)
    chosen = res.chosen_rates()
    stress = [r for r in res.runs if r["role"] == "stress"]
    assert sorted((r["model"], r["lr"], r["seed"]) for r in stress) == sorted(
        [("mha", chosen["mha"] * 1e5, s) for s in (1, 2)] + [("mqa", chosen["mqa"] * 2.0, s) for s in (1, 2)])
    assert res.complete and all(r["diverged"] for r in stress if r["model"] == "mha")
    assert all(r["final_val_loss"] is not None for r in stress if r["model"] == "mqa")
    assert set(res.selections["mha"].reported) == {1, 2}, "stress runs are not reported runs"
    text = report_text(Results.from_json(res.to_json()))
    assert f"mha at {chosen['mha'] * 1e5:g} (100000x its chosen rate) on seeds 1, 2: 2 of 2 finished runs " \
           "diverged (seeds 1, 2)." in text
    assert f"| mqa at {2 * chosen['mqa']:g} (2x its chosen rate) minus mqa at its own {chosen['mqa']:g} |" in text
    assert "| not adjusted (a run diverged) |" in text, "a diverged comparison has no p-value to adjust"
    assert "4 heads (K/V heads or latent: each model's own)" in text, "not the budget's n_kv_heads, which none uses"
    again = run_study(study, tmp_path, CORPUS, train=False, say=lambda text: None)
    assert again.complete and len(again.runs) == len(res.runs), "read back, nothing trained"
    assert Results.from_json(res.to_json()).study == study


def _synthetic(losses: dict[str, list[float]], seeds=(1, 2, 3)) -> Results:
    """Results of the attention study with made-up final losses: selection at 1e-3 best for every arm."""
    res = Results(STUDY)
    for m, values in losses.items():
        for lr in STUDY.rates:
            res.add(m, lr, 0, "selection", {"final_val_loss": 2.0 + abs(math.log(lr / 1e-3)), "n_params": 800_000})
        for s, v in zip(seeds, values, strict=False):
            res.add(m, 1e-3, s, "reported", {"final_val_loss": v, "n_params": 800_000})
    return res


def test_the_cache_quality_rows_table_and_picture(tmp_path):
    losses = {m: [1.60, 1.62, 1.61] for m in STUDY.models}
    losses["mqa"] = [1.70, 1.72, 1.71]  # worse by 0.10 on every seed
    losses["mla56"] = [1.50, 1.52, 1.51]  # better by 0.10 on every seed
    losses["mla24"] = [1.61, 1.60, 1.63]  # +0.01 ± more than that
    losses["gqa4"] = [1.60, 1.62, None]  # seed 3 diverged
    rows = {r["model"]: r for r in cache_quality_rows(_synthetic(losses))}
    assert list(rows) == list(STUDY.models) and rows["mha"]["difference"] is None
    assert rows["mqa"]["difference"].verdict == HIGHER and rows["mqa"]["difference"].mean == pytest.approx(0.10)
    assert rows["mla56"]["difference"].verdict == LOWER and rows["mla56"]["cache_bytes"] == 512
    assert rows["mla24"]["difference"].verdict.startswith(INCONCLUSIVE)
    assert rows["gqa4"]["difference"].diverged and rows["mqa"]["params"] == 800_000
    assert rows["mha"]["selection"].interval.mean == pytest.approx(1.61)
    table = {r["attention"]: r for r in cache_quality_table(list(rows.values()))}
    assert table["mha"]["minus mha"] == "reference" and table["mqa"]["verdict"] == HIGHER
    assert table["mqa"]["cache bytes/token"] == "256" and table["gqa4"]["minus mha"] == "a run diverged"
    fig = plot_cache_quality(list(rows.values()), tmp_path / "q.png")
    assert (tmp_path / "q.png").stat().st_size > 0
    assert len(fig.axes[0].containers) == len(STUDY.models) - 1, "one point per attention, the diverged one left out"
    assert fig.axes[0].get_xscale() == "log"


def test_cache_quality_needs_two_finished_reported_seeds():
    with pytest.raises(ValueError, match="2 reported seeds finished by every model"):
        cache_quality_rows(_synthetic({m: [1.6] for m in STUDY.models}))
    with pytest.raises(ValueError, match="reference must be one of"):
        cache_quality_rows(_synthetic({m: [1.6, 1.7] for m in STUDY.models}), reference="gpt2")


def test_rung_fields_of_the_ladder_models_are_unchanged():
    """The fields the attention arms added default to what the ladder's models had: no K/V override, no latent."""
    from modern_block.training.ladder import MODELS

    added = {f.name for f in fields(Rung)} & {"n_kv_heads", "kv_latent"}
    assert added == {"n_kv_heads", "kv_latent"}
    assert all(getattr(r, name) is None for r in MODELS for name in added)
