"""Interactive widgets used by the lessons (ipywidgets 7.7 and 8.x; imported lazily).

Each widget is built by a function that returns it, so a lesson displays it and a test can drive it.
The numbers behind a widget come from a plain function that a lesson can also print as a table.
"""

import html
import math

from ..presets import BYTES_PER_ELEM, PRESETS, GiB

GPU_BYTES = 80 * 10**9  # an "80 GB" GPU (A100/H100 80GB): decimal gigabytes, as vendors count them
CONTEXT_LENGTHS = tuple(2**k for k in range(10, 21))  # 1,024 .. 1,048,576 tokens


def cache_report(preset: str, context_len: int, batch: int = 1, dtype: str = "bf16",
                 gpu_bytes: int = GPU_BYTES) -> dict:
    """What a preset's KV cache costs: bytes per token (all layers), total bytes and GiB for ``batch``
    sequences of ``context_len`` tokens (sliding-window layers capped at their window), how many GPUs
    of ``gpu_bytes`` the cache alone fills, and how many the weights (in the same dtype) and the cache
    need together (a lower bound: activations and fragmentation come on top)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {preset!r}")
    if not isinstance(gpu_bytes, int) or gpu_bytes <= 0:
        raise ValueError(f"gpu_bytes must be a positive int, got {gpu_bytes!r}")
    p = PRESETS[preset]
    total = p.cache_bytes(context_len, batch, dtype)  # validates context_len, batch, dtype
    return {
        "preset": preset,
        "attention": p.attention,
        "bytes_per_token": p.bytes_per_token(BYTES_PER_ELEM[dtype]),
        "total_bytes": total,
        "total_gib": total / GiB,
        "gpus": math.ceil(total / gpu_bytes),
        "weight_bytes": p.weight_bytes(dtype),
        "gpus_with_weights": math.ceil((total + p.weight_bytes(dtype)) / gpu_bytes),
    }


def _report_html(r: dict, context_len: int, batch: int, dtype: str) -> str:
    p = PRESETS[r["preset"]]
    kind = "MLA latent + RoPE key" if p.attention == "mla" else f"GQA, {p.n_kv_heads} of {p.n_heads} heads"
    note = ""
    if p.n_sliding_layers:
        note = (f"<br><i>{p.n_sliding_layers} of {p.n_layers} layers keep only a {p.sliding_window:,}-token window;"
                f" the total counts that.</i>")
    return (f"<div class='kv-cache-report'><b>{html.escape(r['preset'])}</b> ({kind}, {dtype})<br>"
            f"bytes per token: <b class='kv-bytes-per-token'>{r['bytes_per_token']:,} B</b><br>"
            f"cache for {batch} × {context_len:,} tokens: <b class='kv-total-gib'>{r['total_gib']:,.2f} GiB</b>"
            f" ({r['total_bytes']:,} B)<br>"
            f"80 GB GPUs needed for the cache alone: <b class='kv-gpus'>{r['gpus']}</b>; "
            f"with the weights ({r['weight_bytes'] / 1e9:,.0f} GB in {dtype}): "
            f"<b class='kv-gpus-with-weights'>{r['gpus_with_weights']}</b>{note}</div>")


def cache_calculator(preset: str = "Llama 3 70B", context_len: int = 131072, batch: int = 1, dtype: str = "bf16"):
    """A KV-cache calculator: pick a model preset, context length, batch size and cache dtype; an HTML
    line shows bytes per token, the total in GiB and the number of 80 GB GPUs the cache alone needs."""
    import ipywidgets as widgets

    cache_report(preset, context_len, batch, dtype)  # validate the starting values
    contexts = sorted(set(CONTEXT_LENGTHS) | {context_len})
    preset_w = widgets.Dropdown(options=list(PRESETS), value=preset, description="preset")
    context_w = widgets.Dropdown(options=[(f"{n:,}", n) for n in contexts], value=context_len, description="context")
    batch_w = widgets.IntSlider(value=batch, min=1, max=max(64, batch), description="batch")
    dtype_w = widgets.Dropdown(options=list(BYTES_PER_ELEM), value=dtype, description="dtype")
    out = widgets.HTML()

    def update(_=None):
        r = cache_report(preset_w.value, context_w.value, batch_w.value, dtype_w.value)
        out.value = _report_html(r, context_w.value, batch_w.value, dtype_w.value)

    for w in (preset_w, context_w, batch_w, dtype_w):
        w.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([preset_w, dtype_w]), widgets.HBox([context_w, batch_w]), out])


def config_reader(preset: str = "Llama 3.1 8B", gpu: str = "H100 SXM", context_len: int = 131072):
    """Lesson 11's config reader: pick a preset or give a config.json / .gguf path (or upload a config.json);
    the card shows every field with its lesson and what the config implies at the chosen context and GPU."""
    import ipywidgets as widgets

    from ..interop.config_card import CONFIG_PRESETS, GPU_BANDWIDTH, config_card

    preset_w = widgets.Dropdown(options=list(CONFIG_PRESETS), value=preset, description="preset")
    path_w = widgets.Text(value="", placeholder="or a config.json / .gguf path", description="path")
    upload_w = widgets.FileUpload(accept=".json", multiple=False, description="config.json")
    gpu_w = widgets.Dropdown(options=list(GPU_BANDWIDTH), value=gpu, description="GPU")
    context_w = widgets.Dropdown(options=[(f"{n:,}", n) for n in sorted(set(CONTEXT_LENGTHS) | {context_len})],
                                 value=context_len, description="context")
    out = widgets.HTML()

    def _uploaded():
        value = upload_w.value  # ipywidgets 8: a tuple of dicts; 7.7: a dict of dicts
        items = list(value.values()) if isinstance(value, dict) else list(value)
        return bytes(items[-1]["content"]) if items else None

    state: dict = {"source": preset}  # the last source chosen: a preset, a path or an uploaded file

    def update(change=None):
        owner = getattr(change, "owner", None)
        if owner is preset_w:
            state["source"] = preset_w.value
        elif owner is path_w and path_w.value.strip():
            state["source"] = path_w.value.strip()
        elif owner is upload_w and _uploaded() is not None:
            state["source"] = _uploaded()
        try:
            card = config_card(state["source"])
            out.value = ("<pre class='config-card'>" + html.escape(card.summary(context_w.value, gpu_w.value))
                         + "\n\n" + html.escape(card.field_table()) + "</pre>")
        except (ValueError, TypeError, FileNotFoundError) as err:
            out.value = f"<pre class='config-card-error'>{html.escape(str(err))}</pre>"

    for w in (preset_w, path_w, upload_w, gpu_w, context_w):
        w.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([preset_w, gpu_w, context_w]), widgets.HBox([path_w, upload_w]), out])
