"""The one report of a study: DIR/results.json, DIR/report.md (from results.json alone, so a committed report
can be checked against its data) and DIR/curves.png; and the figures lessons 05, 08 and 08b draw (the attention
study's loss against cache bytes among them)."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .files import refused_writes, shown, write_atomic, write_text_atomic
from .ladder import cache_bytes_per_token, get_rung
from .statistics import (
    CONFIDENCE,
    HIGHER,
    LOWER,
    PairedDifference,
    adjusted_verdict,
    band,
    format_seeds,
    holm,
    markdown_table,
    mean_interval,
    p_value,
    paired_difference,
    selection_row,
)
from .workers import final_loss

if TYPE_CHECKING:
    from .study import Results

COLORS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray")


def report_text(results: Results) -> str:
    """report.md: the design, each model's chosen rate and reported loss, the paired differences with their
    verdicts, the anchor against its published loss, and the throughput."""
    s, b, mach = results.study, results.study.base, results.machine
    chosen = results.chosen_rates()
    own = any(get_rung(m).n_kv_heads or get_rung(m).kv_latent for m in s.models)  # each model fixes its K/V heads
    kv = "K/V heads or latent: each model's own" if own else f"{b.n_kv_heads} K/V heads where a model shares them"
    lines = [f"# Study `{s.name}`: {', '.join(s.models)}", "",
             f"`{results.command}`: {len(results.runs)} runs on {results.corpus}, torch {mach.get('torch')}, "
             f"{mach.get('cpus')} CPUs ({mach.get('processor') or mach.get('machine')}), one thread per run, "
             f"{results.wall_s:,.0f} s of wall time in the last session.", "",
             f"Budget: d = {b.d}, {b.n_layers} layers, {b.n_heads} heads ({kv}), context {b.block_size}, "
             f"batch {b.batch_size}, {b.max_steps} steps, warmup {b.warmup_steps} then a cosine to a tenth of the "
             f"peak, AdamW betas ({b.beta1}, {b.beta2}), weight decay {b.weight_decay}, clip {b.grad_clip}, dropout "
             f"{b.dropout}. Loss: the final validation loss on {b.eval_batches} fixed "
             f"batches of the last 10% of the text. Each model's peak rate is chosen from "
             f"{', '.join(f'{r:g}' for r in s.rates)} on selection seeds {format_seeds(s.selection_seeds)} (lowest "
             f"mean{_widened(s.widen)}) and reported on seeds {format_seeds(s.reported_seeds)}; differences are "
             f"paired by seed, with a "
             f"t-based {CONFIDENCE:.0%} interval and a verdict from that interval alone.", ""]
    if not results.complete:
        lines += [f"INCOMPLETE: {len(results.runs)} runs finished; rates chosen so far: "
                  + (", ".join(f"{m} {lr:g}" for m, lr in chosen.items()) or "none")
                  + f"; reported seeds finished by every model: {format_seeds(results.complete_seeds) or 'none'}.", ""]
    if len(results.complete_seeds) > 1:
        lines += [selection_table(results), ""]
    verdicts = study_verdicts(results)
    counted = sum(v.p_holm is not None for v in verdicts)
    holm_note = (f"; the last column adjusts the verdicts of all {counted} distinct comparisons of this study "
                 f"together{' (these and the stress runs below)' if s.stress else ''}, by Holm's method, and is "
                 "the one to read" if counted > 1 else "")
    rows = [_verdict_row(v, "b minus a", counted > 1) for v in verdicts if v.kind == "pair"]
    if rows:
        lines += [f"## Paired differences ({len(rows)} comparison{'s' * (len(rows) > 1)}, each at "
                  f"{CONFIDENCE:.0%}{holm_note})", "", markdown_table(rows), ""]
    if s.anchor is not None:
        lines += [_anchor_sentence(results), ""]
    stress = [_verdict_row(v, "stress comparison", counted > 1) for v in verdicts if v.kind == "stress"]
    if s.stress and chosen:
        lines += [f"## Stress: {_stress_design(results)}", "", *([markdown_table(stress), ""] if stress else []),
                  *[_stress_sentence(results, model, factor) for model, factor in s.stress], ""]
    lines += _throughput(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def _widened(widen: int) -> str:
    """How a sweep grows at an edge, in words (nothing without ``widen``)."""
    if not widen:
        return ""
    return (f"; a sweep whose best rate is an end one is widened by the next rate beyond it, one step of the sweep "
            f"at a time, at most {widen} per side, so that the chosen rate ends inside its sweep")


def selection_table(results: Results) -> str:
    """Each model's parameters, chosen rate, selection means and reported mean ± interval, as a Markdown table."""
    sel = results.selections
    rows = []
    for m in results.study.models:
        row = selection_row(sel[m], f"{m}: {get_rung(m).change}")
        params = {r.get("n_params") for r in results.runs if r["model"] == m and r.get("n_params")}
        rows.append({"model": row.pop("model"), "parameters": f"{params.pop():,}" if len(params) == 1 else "?"} | row)
    return markdown_table(rows)


@dataclass(frozen=True)
class Verdict:
    """One comparison a study draws: ``difference`` (b minus a, paired by seed), its two-sided p-value and its
    verdict after Holm's adjustment over every distinct comparison of the study (``p_holm`` and ``adjusted``
    None where a run diverged); ``same_as`` names the earlier comparison of the same two models when this one
    repeats it (counted once); ``kind``: "pair" (two models at their chosen rates) or "stress"."""

    name: str
    kind: str
    difference: PairedDifference
    p: float | None = None
    p_holm: float | None = None
    adjusted: str | None = None
    same_as: str | None = None


def study_verdicts(results: Results, extra: tuple = ()) -> list[Verdict]:
    """Every comparison drawn from the study (its pairs, the ``extra`` pairs (a, b) a lesson draws too, then its
    stress comparisons), each distinct one counted once in one Holm family: the course's multiplicity rule, for
    reports and lessons alike. A repeat of a comparison (the same two models, either way round) takes the
    first one's adjusted p-value and is marked ``same_as``."""
    drawn = _pair_comparisons(results, tuple(results.study.pairs) + tuple(extra)) + _stress_comparisons(results)
    first: dict = {}
    for i, (_, _, key, _) in enumerate(drawn):
        first.setdefault(key, i)
        first.setdefault(key[::-1], i)
    counted = [i for i, (_, _, key, d) in enumerate(drawn) if first[key] == i and not d.diverged]
    p_holm = dict(zip(counted, holm([p_value(drawn[i][3]) for i in counted]), strict=True)) if counted else {}
    out = []
    for i, (name, kind, key, d) in enumerate(drawn):
        p, adjusted_p = None if d.diverged else p_value(d), p_holm.get(first[key])
        out.append(Verdict(name, kind, d, p, adjusted_p, None if adjusted_p is None or d.diverged
                           else adjusted_verdict(d, adjusted_p), None if first[key] == i else drawn[first[key]][0]))
    return out


def _pair_comparisons(results: Results, pairs: tuple) -> list[tuple]:
    """(name, "pair", key, difference) for each pair (a, b) with reported runs, b minus a; the key names the two
    models by their switches, so that twins (the ladder's gqa is Llama without QK-norm) make one key."""
    sel = results.selections
    if len(results.complete_seeds) < 2:
        return []
    return [(f"{b} minus {a}", "pair", (get_rung(a).switches, get_rung(b).switches), results.difference(a, b))
            for a, b in dict.fromkeys(pairs) if a in sel and b in sel]


def _losses_at(results: Results, model: str, lr: float) -> dict[int, float] | None:
    """Reported seed -> final loss of ``model`` at ``lr`` (inf: diverged); None until every seed is in."""
    runs = {s: results.record(model, lr, s) for s in results.study.reported_seeds}
    return {s: final_loss(r) for s, r in runs.items() if r is not None} if all(runs.values()) else None


def _stress_comparisons(results: Results) -> list[tuple]:
    """Each stress run set minus the model at its chosen rate, and with ``stress_base``, each stressed model
    minus the base model at the same rate, paired over the reported seeds (once every run is in)."""
    s, chosen = results.study, results.chosen_rates()
    out: list[tuple] = []
    at_rate: dict[float, dict[str, dict]] = {}  # rate -> model -> its losses there
    for model, factor in s.stress:
        rate = results.stress_rate(model, factor)
        if rate is None or model not in chosen:
            continue
        hot, own = _losses_at(results, model, rate), _losses_at(results, model, chosen[model])
        if hot is None or own is None or len(hot) < 2:
            continue
        at_rate.setdefault(rate, {})[model] = hot
        whose = "its" if s.stress_base in (None, model) else f"{s.stress_base}'s"
        key = ((get_rung(model).switches, chosen[model]), (get_rung(model).switches, rate))
        out.append((f"{model} at {rate:g} ({factor:g}x {whose} chosen rate) minus {model} at its own "
                    f"{chosen[model]:g}", "stress", key, paired_difference(own, hot)))
    base = s.stress_base
    for rate, by_model in at_rate.items():
        for model, hot in by_model.items():
            if base is not None and model != base and base in by_model:
                key = ((get_rung(base).switches, rate), (get_rung(model).switches, rate))
                out.append((f"{model} minus {base} at the same rate {rate:g}", "stress", key,
                            paired_difference(by_model[base], hot)))
    return out


def _verdict_row(v: Verdict, first: str, adjusted: bool = True) -> dict[str, str]:
    """A comparison's row: the difference with its interval, its raw verdict, and (when the study draws more
    than one) the adjusted one."""
    d = v.difference
    if v.adjusted is None:
        after = "not adjusted (a run diverged)"
    else:
        after = f"{v.adjusted} (p {v.p_holm:.3g})"
    if v.same_as is not None:
        after += f"; the comparison of {v.same_as}, counted once"
    row = {first: v.name, f"difference ± half-width [{CONFIDENCE:.0%} interval]": d.format(),
           "verdict": d.verdict, "p": "" if v.p is None else f"{v.p:.3g}"}
    return row | ({"after Holm (adjusted p)": after} if adjusted else {})


def _stress_design(results: Results) -> str:
    s = results.study
    factors = sorted(dict.fromkeys(f for _, f in s.stress))
    models = list(dict.fromkeys(m for m, _ in s.stress))
    whose = (f"{s.stress_base}'s chosen rate, the same absolute rates for every model"
             if s.stress_base else "each model's own chosen rate")
    return (f"{', '.join(models)} at {', '.join(f'{f:g}x' for f in factors)} {whose}, on seeds "
            f"{format_seeds(s.reported_seeds)} (diverging is an outcome to report)")


def _anchor_sentence(results: Results) -> str:
    """The anchor at its published rate: is the published loss where one more run of ours would fall?"""
    anchor = results.study.anchor
    assert anchor is not None
    got = {r["seed"]: final_loss(r) for r in results.runs if (r["model"], r["lr"]) == (anchor.model, anchor.lr)}
    values = [got[k] for k in sorted(got)]
    text = f"{anchor.model} at {anchor.source}'s rate {anchor.lr:g} on seeds {format_seeds(sorted(got))}: "
    if len(values) < 2:
        return text + (f"{values[0]:.4f} (one seed: no spread to hold {anchor.published} against)." if values
                       else "not run yet.")
    interval = mean_interval(values)
    low, high = interval.next_value_range
    inside = low <= anchor.published <= high
    return (text + f"{interval.format()} over {len(values)} seeds (range {min(values):.4f}-{max(values):.4f}). "
            f"{anchor.source} reports {anchor.published} from one run, so it is held against where one more run "
            f"falls: {CONFIDENCE:.0%} prediction interval {low:.4f}-{high:.4f}, and {anchor.published} is "
            + ("inside it: within the seed spread." if inside else "outside it: beyond the seed spread."))


def _stress_sentence(results: Results, model: str, factor: float) -> str:
    """The model at ``factor`` times a chosen rate (its own, or the study's ``stress_base``'s) on the reported
    seeds: how many runs diverged (an outcome, not a failure) and the final loss of the others; the paired
    differences are in the stress table."""
    seeds, base = results.study.reported_seeds, results.study.stress_base
    rate = results.stress_rate(model, factor)
    whose = "its" if base in (None, model) else f"{base}'s"
    if rate is None:
        return f"{model} at {factor:g}x {whose} chosen rate: not run yet (no rate chosen yet)."
    done = {s: final_loss(r) for s in seeds if (r := results.record(model, rate, s)) is not None}
    text = f"{model} at {rate:g} ({factor:g}x {whose} chosen rate) on seeds {format_seeds(seeds)}: "
    if not done:
        return text + "not run yet."
    diverged = sorted(s for s, v in done.items() if math.isinf(v))
    finite = [v for v in done.values() if math.isfinite(v)]
    text += f"{len(diverged)} of {len(done)} finished runs diverged" + (
        f" (seeds {format_seeds(diverged)})" if diverged else "")
    if len(finite) > 1:
        return text + f"; final loss{' of the others' * bool(diverged)} {mean_interval(finite).format()}."
    return text + (f"; final loss {finite[0]:.4f}." if finite else ".")


def _throughput(results: Results) -> list[str]:
    done = [r for r in results.runs if r.get("tokens_per_s")]
    if not done:
        return []
    b = results.study.base
    tps = sorted(r["tokens_per_s"] for r in done)
    per_cpu = sorted(b.max_steps * b.tokens_per_step / r["cpu_s"] for r in done if r.get("cpu_s") and not r["resumed"])
    return [f"Throughput, one thread per run: median {tps[len(tps) // 2]:,.0f} tokens/s of wall time over {len(tps)} "
            f"runs (range {tps[0]:,.0f}-{tps[-1]:,.0f}: the machine's load moves it)"
            + (f"; per CPU-second, which the load does not change, {per_cpu[0]:,.0f}-{per_cpu[-1]:,.0f} tokens over "
               f"the {len(per_cpu)} runs trained in one session" if per_cpu else "") + "."]


def write_results(results: Results, out_dir) -> Path:
    """Write DIR/results.json, DIR/report.md and DIR/curves.png; returns the report's path."""
    out = Path(out_dir)
    with refused_writes(f"create the report's folder {shown(out)}"):
        out.mkdir(parents=True, exist_ok=True)
    data = results.to_json()
    with refused_writes(f"write {shown(out / 'results.json')}"):
        write_text_atomic(out / "results.json", json.dumps(data, indent=1) + "\n")
        write_text_atomic(out / "report.md", report_text(type(results).from_json(data)))
    chosen = results.chosen_rates()
    curves = {m: [(results.record(m, chosen[m], s) or {}).get("metrics", []) for s in results.complete_seeds]
              for m in chosen}
    curves = {m: c for m, c in curves.items() if all(len(rows) > 1 for rows in c)}
    if curves and len(results.complete_seeds) > 0:
        import matplotlib.pyplot as plt

        plt.close(plot_curve_bands(curves, out / "curves.png", title=f"study {results.study.name}: reported seeds, "
                                   f"val loss mean and {CONFIDENCE:.0%} band"))
    return out / "report.md"


# ---- figures ------------------------------------------------------------------------------------------
def _finish(fig, path):
    """Lay the figure out, save it when ``path`` is given, return it."""
    fig.tight_layout()
    if path is not None:
        image = io.BytesIO()
        fig.savefig(image, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
        with refused_writes(f"write the figure {shown(Path(path))}"):
            write_atomic(Path(path), lambda f: f.write(image.getvalue()))
    return fig


def plot_sweep(selections: dict, path=None, title: str = "mean final val loss against the peak learning rate"):
    """Each model's mean final loss on the selection seeds per rate, its chosen rate circled."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k, (model, sel) in enumerate(selections.items()):
        rates = [lr for lr, m in sel.selection_means.items() if math.isfinite(m)]
        color = COLORS[k % len(COLORS)]
        ax.plot(rates, [sel.selection_means[lr] for lr in rates], color=color, marker="o",
                label=f"{model} (chosen {sel.lr:g})")
        ax.plot([sel.lr], [sel.selection_means[sel.lr]], marker="o", markersize=12, markerfacecolor="none",
                color=color)
    ax.set_xscale("log")
    ax.set(xlabel="peak learning rate", ylabel="final val loss (nats/char)", title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def plot_curve_bands(groups: dict[str, list], path=None, title: str = "validation loss, seed mean and 95% band"):
    """Validation loss against step per model: the mean over its seeds and a t-based 95% band, from the
    second evaluation on (after the first drop from ln V). ``groups``: label -> runs or metric lists."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (name, runs) in enumerate(groups.items()):
        rows = [run.metrics if hasattr(run, "metrics") else run.get("metrics", run) if isinstance(run, dict)
                else run for run in runs]
        rows = [r for r in rows if r]  # a diverged run has none
        steps = [m["step"] for m in rows[0]][1:]
        curves = [[m["val_loss"] for m in r][1:] for r in rows]
        color = COLORS[k % len(COLORS)]
        if len(curves) > 1:
            mean, low, high = band(curves)
            ax.fill_between(steps, low, high, color=color, alpha=0.25, linewidth=0)
        else:
            mean = curves[0]
        ax.plot(steps, mean, color=color, marker="o", markersize=3, label=f"{name} ({len(curves)} seeds)")
    ax.set(xlabel="step", ylabel="val loss (nats/char)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _finish(fig, path)


def plot_curves(results: Results, labels: dict | None = None, path=None,
                title: str = "validation loss, seed mean and 95% band"):
    """Each model's validation curves at its chosen rate: mean and 95% band over the reported seeds;
    ``labels``: model -> the name its curve carries."""
    return plot_curve_bands({(labels or {}).get(m, m): results.reported(m) for m in results.selections}, path, title)


def plot_differences(rows: list[tuple[str, PairedDifference]], path=None, title: str = "differences, 95% intervals",
                     adjusted: list[str | None] | None = None):
    """Paired differences with their intervals against a line at zero: blue where the verdict is "lower", red
    where "higher", gray where inconclusive. ``adjusted``: the verdicts after Holm's adjustment, one per row
    (``Verdict.adjusted``): the colours follow them, so a verdict that does not survive is drawn gray."""
    import matplotlib.pyplot as plt

    if adjusted is not None and len(adjusted) != len(rows):
        raise ValueError(f"adjusted must hold one verdict per row ({len(rows)}), got {len(adjusted)}")
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for i, (_, d) in enumerate(rows):
        if d.diverged:
            ax.text(0, i, "a run diverged", va="center", fontsize=9)
            continue
        word = d.verdict if adjusted is None else adjusted[i]
        color = "tab:blue" if word == LOWER else "tab:red" if word == HIGHER else "tab:gray"
        ax.errorbar([d.mean], [i], xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set(xlabel="difference in val loss (nats/char); < 0: lower loss", title=title)
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path)


# ---- quality against cache size (the attention study) ------------------------------------------------------
def cache_quality_rows(results: Results, reference: str = "mha", bytes_per_elem: int = 2) -> list[dict]:
    """One row per model of ``results`` with its reported seeds finished: model, what it changes, cache bytes per
    token (bf16 by default), parameters, chosen rate, the ``Selection`` and the paired difference against
    ``reference`` (None for the reference itself) with its verdict after Holm's adjustment over the study's
    comparisons (None where the study does not draw it). ValueError before every model has 2 reported seeds."""
    if len(results.complete_seeds) < 2:
        raise ValueError(f"an interval needs 2 reported seeds finished by every model of study {results.study.name!r}; "
                         f"{len(results.complete_seeds)} are ({len(results.runs)} runs finished)")
    selections = results.selections
    if reference not in selections:
        raise ValueError(f"reference must be one of the study's models {list(selections)}, got {reference!r}")
    shape = results.study.base.shape
    adjusted = {v.name: v.adjusted for v in study_verdicts(results)}  # the study's one Holm family
    rows = []
    for model, sel in selections.items():
        params = {r.get("n_params") for r in results.runs if r["model"] == model and r.get("n_params")}
        rows.append({"model": model, "change": get_rung(model).change,
                     "cache_bytes": cache_bytes_per_token(model, shape, bytes_per_elem),
                     "params": params.pop() if len(params) == 1 else None, "lr": sel.lr, "selection": sel,
                     "difference": None if model == reference else results.difference(reference, model),
                     "adjusted": adjusted.get(f"{model} minus {reference}")})
    return rows


def cache_quality_table(rows: list[dict], reference: str = "mha") -> list[dict[str, str]]:
    """``cache_quality_rows`` as text, for ``statistics.markdown_table``."""
    out = []
    for r in rows:
        d = r["difference"]
        out.append({"attention": r["model"], "cache bytes/token": f"{r['cache_bytes']:,}",
                    "parameters": f"{r['params']:,}" if r["params"] else "?", "chosen lr": f"{r['lr']:g}",
                    f"val loss, mean ± {CONFIDENCE:.0%}": r["selection"].interval.format(),
                    f"minus {reference}": "reference" if d is None else d.format(),
                    "verdict": "" if d is None else d.verdict,
                    "after Holm": "" if d is None else r.get("adjusted") or "not in the study's comparisons"})
    return out


def plot_cache_quality(rows: list[dict], path=None, title: str = "validation loss against KV-cache bytes per token"):
    """Each attention as a point: its reported mean validation loss with the 95% interval (t-based, over the
    reported seeds) against its cache bytes per token, on a log axis, points of one cache size spread apart a
    little; a dashed line at the reference's mean; diverged models are left out."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    seen: dict[int, int] = {}
    for k, r in enumerate(rows):
        interval = r["selection"].interval
        if not math.isfinite(interval.mean):
            continue
        color = COLORS[k % len(COLORS)]
        nth = seen[r["cache_bytes"]] = seen.get(r["cache_bytes"], -1) + 1
        x = r["cache_bytes"] * 2 ** (0.08 * nth)  # beside the points of the same size, not on them
        ax.errorbar([x], [interval.mean], yerr=[[interval.mean - interval.low], [interval.high - interval.mean]],
                    fmt="o", color=color, capsize=4)
        ax.annotate(r["model"], (x, interval.mean), textcoords="offset points", xytext=(5, 3), fontsize=9, color=color)
        if r["difference"] is None:
            ax.axhline(interval.mean, color=color, linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(seen), [f"{b:,}" for b in sorted(seen)])
    ax.minorticks_off()
    ax.set(xlabel="KV-cache bytes per token (bf16, all layers)", ylabel="final val loss (nats/char)", title=title)
    ax.grid(alpha=0.3)
    return _finish(fig, path)
