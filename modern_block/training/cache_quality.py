"""Quality against inference-cache size: each attention of a study (``STUDIES["attention"]``) as one point, its
reported validation loss with the 95% interval against the bytes a token adds to its cache, and the table
beside it (cache bytes, parameters, chosen rate, mean ± 95%, paired difference against a reference)."""

import math

from ..statistics import CONFIDENCE
from .ladder import cache_bytes_per_token
from .report import COLORS, _finish
from .rungs import get_rung
from .study import Results


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
