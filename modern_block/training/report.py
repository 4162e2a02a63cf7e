"""The one report of a study: DIR/results.json, DIR/report.md (from results.json alone, so a committed report
can be checked against its data) and DIR/curves.png; and the figures lessons 05, 08 and 08b draw (the attention
study's loss against cache bytes among them)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import refused_writes, shown, write_atomic, write_text_atomic
from ..statistics import (
    CONFIDENCE,
    PairedDifference,
    band,
    format_seeds,
    holm_verdicts,
    markdown_table,
    mean_interval,
    paired_difference,
    selection_row,
)
from .ladder import cache_bytes_per_token, get_rung
from .workers import final_loss

if TYPE_CHECKING:
    from .study import Results

COLORS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray")


def report_text(results: Results) -> str:
    """report.md: the design, each model's chosen rate and reported loss, the paired differences with their
    verdicts, the anchor against its published loss, and the throughput."""
    s, b, mach = results.study, results.study.base, results.machine
    chosen, sel = results.chosen_rates(), results.selections
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
    pairs = [(a, b_) for a, b_ in s.pairs if a in sel and b_ in sel]
    if pairs and len(results.complete_seeds) > 1:
        diffs = [results.difference(a, b_) for a, b_ in pairs]
        rows = [{"b minus a": f"{b_} minus {a}", f"difference ± half-width [{CONFIDENCE:.0%} interval]": d.format(),
                 "verdict": d.verdict} for d, (a, b_) in zip(diffs, pairs, strict=True)]
        title = f"## Paired differences ({len(pairs)} comparison{'s' * (len(pairs) > 1)}, each at {CONFIDENCE:.0%}"
        if len(pairs) > 1 and not any(d.diverged for d in diffs):  # the chance of any false verdict among them
            title += f"; the last column adjusts the verdicts for all {len(pairs)} together, by Holm's method"
            for row, holm in zip(rows, holm_verdicts(diffs), strict=True):
                row["after Holm"] = holm
        lines += [title + ")", "", markdown_table(rows), ""]
    if s.anchor is not None:
        lines += [_anchor_sentence(results), ""]
    lines += [_stress_sentence(results, model, factor) for model, factor in s.stress if model in chosen]
    lines += [""] if s.stress and chosen else []
    lines += _throughput(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def _widened(widen: int) -> str:
    """How a sweep grows at an edge, in words (nothing without ``widen``)."""
    if not widen:
        return ""
    return (f"; a sweep whose best rate is an end one is widened by the next rate beyond it, one step of the sweep "
            f"at a time, at most {widen} per side, so that the chosen rate ends inside its sweep")


def selection_table(results: Results) -> str:
    """Each model's chosen rate, selection means and reported mean ± interval, as a Markdown table."""
    sel = results.selections
    return markdown_table([selection_row(sel[m], f"{m}: {get_rung(m).change}") for m in results.study.models])


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
    """The model at ``factor`` times its chosen rate on the reported seeds: how many runs diverged (an outcome,
    not a failure), and when none did, the paired difference against its chosen rate."""
    lr, seeds, base = results.chosen_rates()[model], results.study.reported_seeds, results.study.stress_base
    rate = results.stress_rate(model, factor)
    if rate is None:
        return f"{model} at {factor:g}x {base}'s chosen rate: not run yet."
    hot = {s: results.record(model, rate, s) for s in seeds}
    done = {s: final_loss(r) for s, r in hot.items() if r is not None}
    whose = "its" if base in (None, model) else f"{base}'s"
    text = f"{model} at {rate:g} ({factor:g}x {whose} chosen rate) on seeds {format_seeds(seeds)}: "
    if not done:
        return text + "not run yet."
    diverged = sorted(s for s, v in done.items() if math.isinf(v))
    text += f"{len(diverged)} of {len(done)} finished runs diverged" + (
        f" (seeds {format_seeds(diverged)})" if diverged else "") + "; "
    base = {s: final_loss(r) for s in done if (r := results.record(model, lr, s)) is not None}
    if diverged or len(base) < 2:
        finite = [v for v in done.values() if math.isfinite(v)]
        return text + ("final losses " + ", ".join(f"{v:.4f}" for v in finite) + "." if finite else "none finished.")
    pair = paired_difference(base, {s: done[s] for s in base})
    return text + f"minus its chosen rate, paired by seed: {pair.format()}, {pair.verdict}."


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


def plot_differences(rows: list[tuple[str, PairedDifference]], path=None, title: str = "differences, 95% intervals"):
    """Paired differences with their intervals against a line at zero."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    for i, (_, d) in enumerate(rows):
        if d.diverged:
            ax.text(0, i, "a run diverged", va="center")
            continue
        color = "tab:gray" if not d.decided else "tab:blue" if d.mean < 0 else "tab:red"
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
    ``reference`` (None for the reference itself). ValueError before every model has 2 reported seeds."""
    if len(results.complete_seeds) < 2:
        raise ValueError(f"an interval needs 2 reported seeds finished by every model of study {results.study.name!r}; "
                         f"{len(results.complete_seeds)} are ({len(results.runs)} runs finished)")
    selections = results.selections
    if reference not in selections:
        raise ValueError(f"reference must be one of the study's models {list(selections)}, got {reference!r}")
    shape = results.study.base.shape
    rows = []
    for model, sel in selections.items():
        params = {r.get("n_params") for r in results.runs if r["model"] == model and r.get("n_params")}
        rows.append({"model": model, "change": get_rung(model).change,
                     "cache_bytes": cache_bytes_per_token(model, shape, bytes_per_elem),
                     "params": params.pop() if len(params) == 1 else None, "lr": sel.lr, "selection": sel,
                     "difference": None if model == reference else results.difference(reference, model)})
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
                    "verdict": "" if d is None else d.verdict})
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
        ax.annotate(r["model"], (x, interval.mean), textcoords="offset points", xytext=(5, 3), fontsize=8, color=color)
        if r["difference"] is None:
            ax.axhline(interval.mean, color=color, linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(seen), [f"{b:,}" for b in sorted(seen)])
    ax.minorticks_off()
    ax.set(xlabel="KV-cache bytes per token (bf16, all layers)", ylabel="final val loss (nats/char)", title=title)
    ax.grid(alpha=0.3)
    return _finish(fig, path)
