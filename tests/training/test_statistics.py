"""The statistics lesson 08 decides by: t quantiles against published tables and an independent integration,
paired intervals and their verdicts, and a rate chosen on selection seeds, reported on others (a study's
``Results``)."""

import math
import random
import re
from statistics import NormalDist

import pytest

from modern_block.training.statistics import (
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    band,
    choose_rate,
    format_seeds,
    holm,
    holm_verdicts,
    markdown_table,
    mean_interval,
    p_value,
    paired_difference,
    selection_row,
    t_quantile,
    verdict,
)
from modern_block.training.study import Results, Study

# Student's t, two-sided 95% (p = 0.975), as printed in the standard tables (3 decimals)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
T_95 = {1: 6.314, 2: 2.920, 5: 2.015, 10: 1.812, 30: 1.697}
T_995 = {1: 63.657, 2: 9.925, 5: 4.032, 10: 3.169, 30: 2.750}


@pytest.mark.parametrize(("p", "table"), [(0.975, T_975), (0.95, T_95), (0.995, T_995)])
def test_t_quantile_matches_published_tables(p, table):
    for df, published in table.items():
        assert abs(t_quantile(p, df) - published) <= 5e-4 + 1e-12, (p, df)  # the table rounds to 3 decimals
        assert t_quantile(1 - p, df) == pytest.approx(-t_quantile(p, df), abs=1e-12)


def test_t_quantile_closed_forms_and_the_normal_limit():
    # df = 1 (Cauchy): tan(pi (p - 1/2)); df = 2: (2p - 1) sqrt(2 / (4 p (1 - p)))
    for p in (0.6, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-11)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-11)
    z = NormalDist().inv_cdf(0.975)
    for df in (1000, 10_000):  # Cornish-Fisher: t = z + (z^3 + z) / (4 df) + O(1/df^2)
        assert t_quantile(0.975, df) == pytest.approx(z + (z ** 3 + z) / (4 * df), abs=5 / df ** 2)
    assert t_quantile(0.5, 7) == 0.0


def _t_cdf_by_integration(t: float, df: int, n: int = 20_000) -> float:
    """0.5 + the integral of the t density from 0 to t, by Simpson's rule (independent of the series)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = lambda x: math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))  # noqa: E731
    h = t / n
    s = f(0) + f(t) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 0.5 + s * h / 3


@pytest.mark.parametrize("df", [3, 4, 5, 8, 13, 30])
def test_t_quantile_agrees_with_numerical_integration(df):
    for p in (0.55, 0.9, 0.975, 0.995):
        assert _t_cdf_by_integration(t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)
        assert t_quantile(1 - p, df) == pytest.approx(-t_quantile(p, df), abs=1e-12)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: t_quantile(0.975, 0), "df must be an int"),
    (lambda: t_quantile(0.975, 2.0), "df must be an int"),
    (lambda: t_quantile(1.0, 3), "p must be a probability"),
    (lambda: t_quantile(0.0, 3), "p must be a probability"),
])
def test_t_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_mean_interval_by_hand():
    iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # mean 3, sd sqrt(2.5), se sqrt(0.5), t_{0.975, 4} = 2.776445
    assert iv.mean == 3.0 and iv.sd == pytest.approx(math.sqrt(2.5)) and iv.df == 4
    assert iv.half_width == pytest.approx(2.7764451052 * math.sqrt(0.5), rel=1e-9)
    assert (iv.low, iv.high) == pytest.approx((3 - iv.half_width, 3 + iv.half_width))
    assert iv.format(2) == "3.00 ± 1.96"
    assert mean_interval([2.0, math.inf]).format() == "diverged"
    with pytest.raises(ValueError, match="at least 2"):
        mean_interval([1.0])
    with pytest.raises(TypeError, match="numbers"):
        mean_interval([1.0, "2"])


def test_verdict_comes_from_the_interval_alone():
    assert verdict(-0.2, -0.1) == LOWER
    assert verdict(0.1, 0.2) == HIGHER
    assert verdict(-0.1, 0.3) == f"{INCONCLUSIVE} (the interval holds 0; it could hide an effect of up to ±0.3000)"
    assert verdict(-0.12345, 0.0, digits=2).startswith(INCONCLUSIVE) and "±0.12)" in verdict(-0.12345, 0.0, 2)
    with pytest.raises(ValueError, match="low <= high"):
        verdict(0.2, 0.1)


def test_pairing_removes_the_noise_the_seeds_share():
    # seeds differ a lot (shared noise), b is 0.05 lower on every seed, give or take 0.005
    a = [2.0, 2.4, 2.8, 2.2]
    b = [x - 0.05 + e for x, e in zip(a, (0.004, -0.003, 0.005, -0.004), strict=True)]
    paired = paired_difference(a, b)
    assert paired.mean == pytest.approx(-0.0495) and paired.verdict == LOWER and paired.high < 0
    unpaired = mean_interval(b).mean - mean_interval(a).mean  # the same mean difference, judged unpaired:
    se = math.sqrt(mean_interval(a).se ** 2 + mean_interval(b).se ** 2)
    assert unpaired == pytest.approx(paired.mean) and abs(unpaired) < 2 * se  # lost in the seeds' spread
    assert str(paired).endswith(f"(95% interval, 4 paired seeds): {LOWER}") and paired.decided
    half = paired.interval.half_width
    assert paired.format() == f"-0.0495 ± {half:.4f} [{paired.low:+.4f}, {paired.high:+.4f}]"
    assert paired.high - paired.low == pytest.approx(2 * half)


def test_paired_difference_pairs_by_seed_and_checks_its_input():
    a = {0: 2.0, 1: 2.5, 2: 3.0}
    b = {2: 3.2, 0: 2.2, 1: 2.7001}  # another order: paired by seed, not by position
    d = paired_difference(a, b)
    assert d.seeds == (0, 1, 2) and d.differences == pytest.approx((0.2, 0.2001, 0.2)) and d.verdict == HIGHER
    same = paired_difference([1.0, 2.0, 3.0], [1.1, 1.9, 3.0])
    assert same.verdict.startswith(INCONCLUSIVE) and not same.decided
    diverged = paired_difference({0: 2.0, 1: 2.1}, {0: None, 1: 2.0})
    assert diverged.diverged and diverged.verdict == "a run diverged" and "diverged" in str(diverged)
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(ValueError, match="same length"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_difference([1.0], [2.0])
    with pytest.raises(TypeError, match="both be mappings"):
        paired_difference({0: 1.0, 1: 2.0}, [1.0, 2.0])


def _table():
    """Two models, 3 rates, selection seeds 0-1 at every rate, reported seeds 2-4 at some rates."""
    rows = []
    gpt2 = {1e-3: {0: 2.00, 1: 2.02, 2: 2.10, 3: 2.12, 4: 2.08},
            2e-3: {0: 1.98, 1: 2.00, 2: 2.06, 3: 2.07, 4: 2.05},  # the best on the selection seeds
            4e-3: {0: 2.05, 1: 1.99, 2: 1.90, 3: 1.91, 4: 1.92}}  # best on the reported seeds: must not be picked
    llama = {1e-3: {0: 1.95, 1: 1.97}, 2e-3: {0: 1.90, 1: None}, 4e-3: {0: 1.93, 1: 1.94, 2: 2.00, 3: 2.01, 4: 1.99}}
    for model, runs in (("gpt2", gpt2), ("llama", llama)):
        for lr, by_seed in runs.items():
            rows += [{"model": model, "lr": lr, "seed": s, "loss": v} for s, v in by_seed.items()]
    return rows


def select_and_report(rows, selection, reported, models=("gpt2", "llama"), rates=(1e-3, 2e-3, 4e-3)):
    """The selections of a study that ran ``rows`` (its one rate rule, as ``compare`` applies it)."""
    from modern_block.training.config import quick_config

    study = Study("t", quick_config("gpt2"), tuple(models), tuple(rates), tuple(selection), tuple(reported))
    runs = [{"model": r["model"], "lr": r["lr"], "seed": r["seed"], "role": "t", "final_val_loss": r["loss"]}
            for r in rows if r["model"] in models]
    return Results(study, runs)


def difference(results, a, b):
    return results.difference(a, b)


def test_a_rate_is_chosen_on_selection_seeds_and_reported_on_the_others():
    rows = _table()
    before = [dict(r) for r in rows]
    res = select_and_report(rows, (0, 1), (2, 3, 4))
    sel = res.selections
    assert rows == before  # pure: the table is not changed
    g, ll = sel["gpt2"], sel["llama"]
    assert g.lr == 2e-3 and g.reported == {2: 2.06, 3: 2.07, 4: 2.05}  # not 4e-3, better on seeds 2-4
    assert g.selection_means == pytest.approx({1e-3: 2.01, 2e-3: 1.99, 4e-3: 2.02}) and not g.at_edge
    assert g.selection_losses[4e-3] == {0: 2.05, 1: 1.99}  # only the selection seeds, at every rate
    assert g.selection_means[g.lr] - g.interval.mean == pytest.approx(1.99 - 2.06)  # the selection seeds flatter it
    assert ll.lr == 4e-3 and ll.at_edge and math.isinf(ll.selection_means[2e-3])  # a diverged run is never chosen
    assert g.interval.mean == pytest.approx(2.06) and g.interval.n == 3
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    assert select_and_report(shuffled, (0, 1), (2, 3, 4)).selections == sel  # the order of the rows does not matter
    d = difference(res, "gpt2", "llama")
    assert d.differences == pytest.approx((2.00 - 2.06, 2.01 - 2.07, 1.99 - 2.05)) and d.verdict == LOWER
    assert list(select_and_report(rows, [0, 1], [2, 3, 4], models=["llama"]).selections) == ["llama"]


def test_a_tie_goes_to_the_lower_rate():
    rows = [{"model": "gpt2", "lr": lr, "seed": s, "loss": 2.0} for lr in (2e-3, 1e-3) for s in (0, 1, 2)]
    assert select_and_report(rows, [0], [1, 2], ["gpt2"], (2e-3, 1e-3)).selections["gpt2"].lr == 1e-3


def test_choose_rate_lowest_mean_lower_rate_on_a_tie_and_never_a_non_finite_mean():
    assert choose_rate({1e-3: 2.1, 2e-3: 1.9, 4e-3: 2.0}) == 2e-3
    assert choose_rate({4e-3: 1.9, 1e-3: 1.9, 2e-3: 2.0}) == 1e-3  # a tie: the lower rate, whatever the order
    assert choose_rate({1e-3: 2.5, 2e-3: math.inf, 4e-3: math.nan}) == 1e-3  # diverged or undefined: never chosen
    assert choose_rate({1e-3: math.nan, 2e-3: 3.0}) == 2e-3  # a nan first does not win (min alone would pick it)
    assert choose_rate({2e-3: -math.inf, 4e-3: 1.0}) == 4e-3
    assert choose_rate({4e-3: math.inf, 2e-3: math.nan}) == 2e-3  # all non-finite: the lowest rate
    assert choose_rate({3e-4: 7.0}) == 3e-4
    with pytest.raises(ValueError, match="means_by_rate"):
        choose_rate({})


def test_no_rate_before_every_selection_run_and_no_report_before_every_model_has_a_seed():
    rows = [r for r in _table() if not (r["model"] == "gpt2" and r["lr"] == 1e-3 and r["seed"] == 1)]
    res = select_and_report(rows, (0, 1), (2, 3, 4))
    assert res.chosen_rates() == {"llama": 4e-3} and res.selections == {} and res.complete_seeds == []
    res = select_and_report(_table(), (0, 1), (2, 3, 4, 5))
    assert res.complete_seeds == [2, 3, 4] and res.selections["gpt2"].reported_seeds == (2, 3, 4)
    with pytest.raises(ValueError, match="different seeds; both hold"):
        select_and_report(_table(), (0, 1), (1, 2))
    with pytest.raises(ValueError, match="must be models with reported runs"):
        difference(res, "gpt2", "mla")


def test_ladder_and_leave_one_out_differences():
    rows = [{"model": m, "lr": 1e-3, "seed": s, "loss": base + 0.01 * s}
            for m, base in (("gpt2", 2.0), ("rope", 1.9), ("llama", 1.9)) for s in range(4)]
    sel = select_and_report(rows, [0], [1, 2, 3], ("gpt2", "rope", "llama"), (1e-3,))
    assert difference(sel, "gpt2", "rope").verdict == LOWER and not difference(sel, "rope", "llama").decided
    assert round(difference(sel, "llama", "gpt2").mean, 6) == 0.1
    assert round(difference(sel, "llama", "rope").mean, 6) == 0.0


def test_band_is_the_pointwise_mean_and_interval():
    mean, low, high = band([[3.0, 2.0, 1.0], [3.2, 2.2, 1.4]])
    assert mean == pytest.approx([3.1, 2.1, 1.2])
    half = 12.706204736 * math.sqrt(0.02) / math.sqrt(2)  # sd of two values 0.2 apart: 0.2 / sqrt(2)
    assert high[0] - mean[0] == pytest.approx(half) and mean[0] - low[0] == pytest.approx(half)
    with pytest.raises(ValueError, match="one length"):
        band([[1.0, 2.0], [1.0]])


def test_formatting():
    assert format_seeds([3, 2, 4, 5]) == "2-5" and format_seeds([0, 2]) == "0, 2" and format_seeds([7]) == "7"
    sel = select_and_report(_table(), (0, 1), (2, 3, 4)).selections
    row = selection_row(sel["gpt2"], "GPT-2")
    assert row["model"] == "GPT-2" and row["chosen lr"] == "0.002" and row["reported seeds"] == "2-4"
    assert row["mean on selection seeds 0, 1"] == "0.001: 2.0100, 0.002: 1.9900, 0.004: 2.0200"
    assert selection_row(sel["llama"])["chosen lr"] == "0.004 (edge)"
    assert "0.002: diverged" in selection_row(sel["llama"])["mean on selection seeds 0, 1"]
    table = markdown_table([row, selection_row(sel["llama"], "Llama")])
    lines = table.splitlines()
    assert lines[0].startswith("| model | chosen lr |") and lines[1] == "|" + "---|" * 5 and len(lines) == 4
    assert lines[2].split(" | ")[3] == sel["gpt2"].interval.format()
    with pytest.raises(ValueError, match="same keys"):
        markdown_table([{"a": "1"}, {"b": "2"}])


def test_the_next_value_range_is_a_prediction_interval_by_hand():
    # 1, 2, 3, 4: mean 2.5, sd sqrt(5/3); t(0.975, 3) = 3.182446; half-width t * sd * sqrt(1 + 1/4)
    interval = mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446305284263 * math.sqrt(5 / 3) * math.sqrt(1.25)
    low, high = interval.next_value_range
    assert low == pytest.approx(2.5 - half, abs=1e-9) and high == pytest.approx(2.5 + half, abs=1e-9)
    assert high - low > 2 * interval.half_width  # one run spreads more than the mean


def test_every_refusal_names_its_argument_and_rule():
    for call, kind, message in (
            (lambda: mean_interval("2.0 2.1"), TypeError, "values must be a sequence of numbers, got str"),
            (lambda: paired_difference([1.0, "x"], [1.0, 2.0]), TypeError, "a must hold numbers"),
            (lambda: paired_difference([1.0, 2.0], [1.0, "x"]), TypeError, "b must hold numbers"),
            (lambda: paired_difference({0: 1.0}, [1.0]), TypeError, "a and b must both be mappings seed -> loss"),
            (lambda: band([[1.0, "x"], [1.0, 2.0]]), TypeError, "curves[i] must hold numbers"),
            (lambda: verdict(math.nan, 0.1), ValueError, "low and high must be numbers"),
            (lambda: choose_rate({}), ValueError, "means_by_rate must hold at least one rate"),
            (lambda: markdown_table([]), ValueError, "rows must be a non-empty sequence of mappings")):
        with pytest.raises(kind, match=re.escape(message)):
            call()


def test_divergence_travels_through_every_result():
    diverged = mean_interval([1.0, math.inf])
    assert (diverged.n, diverged.format()) == (2, "diverged") and math.isnan(diverged.sd)
    d = paired_difference([2.0, 2.1, 2.3], [1.9, 2.2, 2.1])
    assert d.seeds == (0, 1, 2) and d.interval.n == 3
    blown = paired_difference([None, 2.0], [1.0, 2.0])  # None: a diverged run
    assert blown.diverged and blown.format() == "a run diverged"
    assert math.isnan(paired_difference([math.inf, 1.0], [2.0, 3.0]).differences[0])
    mean, low, high = band([[3.0, 2.0], [3.2, 2.4], [3.1, 2.2]])
    assert mean == pytest.approx([3.1, 2.2]) and all(lo < m < h for lo, m, h in zip(low, mean, high, strict=True))


def test_a_rate_tried_on_reported_seeds_only_is_not_a_candidate():
    rows = _table() + [{"model": "gpt2", "lr": 8e-3, "seed": 2, "loss": 1.0}]  # a stray run, reported seed only
    assert select_and_report(rows, (0, 1), (2, 3, 4)).selections["gpt2"].lr == 2e-3


def test_a_markdown_table_exactly():
    assert markdown_table([{"a": 1, "b": "x"}]) == "| a | b |\n|---|---|\n| 1 | x |"
    assert markdown_table([{"a": 1}, {"a": 2}]) == "| a |\n|---|\n| 1 |\n| 2 |"


# ---- Holm's adjustment for a table of comparisons ---------------------------------------------------------


def test_holm_against_a_hand_computed_case():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005·4 = 0.02; 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04,
    # carried up to 0.06 (the running maximum). Back in the input's order: 0.03, 0.06, 0.06, 0.02.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6])  # capped at 1 only when needed: 0.3·2, then max(0.6, 0.6)
    assert holm([0.7, 0.8]) == [1.0, 1.0]  # 0.7·2 = 1.4 -> 1
    assert holm([0.02]) == [0.02]  # one comparison: nothing to adjust


def test_holm_rejects_bad_input():
    for bad in ([], [1.5], [-0.1, 0.2]):
        with pytest.raises(ValueError, match="p_values"):
            holm(bad)
    with pytest.raises(TypeError, match="^p_values must be a sequence"):
        holm("0.1")
    with pytest.raises(TypeError, match="^p_values must hold numbers"):
        holm(["0.1"])
    assert holm([0.0, 1.0, 0.5]) == [0.0, 1.0, 1.0]  # both ends of [0, 1] are probabilities


def test_p_value_of_differences_without_spread_and_of_a_diverged_run():
    assert p_value(paired_difference([1.0, 2.0], [1.0, 2.0])) == 1.0  # every difference 0: no evidence at all
    assert p_value(paired_difference([1.0, 2.0], [2.0, 3.0])) == 0.0  # every difference +1, no spread: certain
    with pytest.raises(ValueError, match=r"^d must hold finite differences \(a run diverged\)"):
        p_value(paired_difference([None, 2.0], [1.0, 2.0]))


def test_p_value_agrees_with_the_interval_and_a_hand_computed_t():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1/sqrt(3), t = 2·sqrt(3) = 3.4641 on 2 df.
    # For 2 df, P(|T| >= t) = 1 - t / sqrt(2 + t²) = 1 - 3.4641/3.7417 = 0.07418.
    d = paired_difference([0.0, 0.0, 0.0], [0.1, 0.2, 0.3])
    t = 2 * math.sqrt(3)
    assert p_value(d) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert (p_value(d) < 0.05) == d.decided  # the interval holds 0 here: p > 0.05
    strong = paired_difference([0.0] * 4, [0.30, 0.31, 0.29, 0.30])
    assert p_value(strong) < 0.05 and strong.decided


def test_holm_verdicts_name_the_direction_only_below_alpha():
    lower = paired_difference([1.0] * 4, [0.70, 0.69, 0.71, 0.70])  # p tiny: survives any adjustment
    weak = paired_difference([1.0] * 3, [0.90, 1.02, 0.85])  # decided? no: the interval holds 0
    assert holm_verdicts([lower, weak]) == [LOWER, "inconclusive after Holm's adjustment"]
    assert holm_verdicts([paired_difference([0.0] * 4, [0.30, 0.31, 0.29, 0.30])]) == [HIGHER]
