"""Interactive widgets used by the lessons (ipywidgets 7.7 and 8.x; imported lazily).

Each is built by a function that returns it (a lesson displays it, a test drives it) as a ``Panel``, displayed
with a static version of its state (HTML, or a PNG) for wherever widgets do not render. The numbers behind a
widget come from a plain function that a lesson can also print.
"""

import base64
import functools
import html
import io
import json
import math
import time
from pathlib import Path

from ..presets import BYTES_PER_ELEM, PRESETS, GiB, ModelPreset

GPU_BYTES = 80 * 10**9  # an "80 GB" GPU (A100/H100 80GB): decimal gigabytes, as vendors count them
CONTEXT_LENGTHS = tuple(2**k for k in range(10, 21))  # 1,024 .. 1,048,576 tokens
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_bundle(widget, fallback_html: str | None = None, fallback_png: bytes | None = None) -> dict:
    """A display bundle with a widget view and a static fallback: HTML, or a PNG image (ipywidgets 7.7 and 8.x)."""
    bundle = {WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id},
              "text/plain": "(interactive widget: run the cell to use it)"}
    if fallback_html is not None:
        bundle["text/html"] = fallback_html
    if fallback_png is not None:
        bundle["image/png"] = base64.b64encode(fallback_png).decode("ascii")
    return bundle


@functools.cache
def _panel_class():
    import ipywidgets as widgets

    class Panel(widgets.VBox):
        """A VBox displayed with a static version of its current state beside the widget view."""

        def __init__(self, children, static):
            super().__init__(children)
            self.static = static  # () -> {"fallback_html": str} or {"fallback_png": bytes}

        def _ipython_display_(self, **kwargs):
            from IPython.display import display

            display(widget_bundle(self, **self.static()), raw=True)

    return Panel


def panel(children, static):
    """A ``Panel`` of ``children`` whose static version is ``static()`` (keyword arguments of ``widget_bundle``)."""
    return _panel_class()(children, static)


def figure_explorer(draw, **controls):
    """Controls (sliders, dropdowns; their names are ``draw``'s keyword arguments) that redraw ``draw(**values)``,
    a function returning a matplotlib figure. Where widgets do not render, the figure of the current values shows."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import Image, clear_output, display

    if not callable(draw):
        raise TypeError(f"draw must be a function that returns a figure, got {type(draw).__name__}")
    if not controls or not all(isinstance(c, widgets.ValueWidget) for c in controls.values()):
        raise ValueError(f"controls must be one or more widgets with a value, as keywords, got {controls!r}")
    out = widgets.Output()
    shown = {}

    def redraw(_=None):
        fig = draw(**{name: c.value for name, c in controls.items()})
        buf = io.BytesIO()  # the PNG as the inline backend draws it (its dpi, tight bounding box)
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight", facecolor="white")
        shown["png"] = buf.getvalue()
        plt.close(fig)  # drawn once, here: the inline backend must not show it again
        with out:
            clear_output(wait=True)
            display(Image(data=shown["png"], format="png"))

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    return panel([widgets.HBox(list(controls.values())), out], lambda: {"fallback_png": shown["png"]})


# ---- Lesson 04: the KV-cache calculator ---------------------------------------------------------------------------


def attention_kind(p: ModelPreset) -> str:
    """What a preset's attention is called: MHA (a K/V head per query head), MQA (one), GQA-n or MLA."""
    if p.attention == "mla":
        return "MLA"
    if p.n_kv_heads == p.n_heads:
        return "MHA"
    return "MQA" if p.n_kv_heads == 1 else f"GQA-{p.n_kv_heads}"


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
        "attention": attention_kind(p),
        "bytes_per_token": p.bytes_per_token(BYTES_PER_ELEM[dtype]),
        "total_bytes": total,
        "total_gib": total / GiB,
        "gpus": math.ceil(total / gpu_bytes),
        "weight_bytes": p.weight_bytes(dtype),
        "gpus_with_weights": math.ceil((total + p.weight_bytes(dtype)) / gpu_bytes),
    }


def _report_html(r: dict, context_len: int, batch: int, dtype: str) -> str:
    p = PRESETS[r["preset"]]
    if p.attention == "mla":
        kind = "MLA: a latent and a RoPE key per layer"
    elif r["attention"] == "MHA":
        kind = f"MHA: {p.n_heads} K/V heads, one per query head"
    else:
        kind = f"{r['attention']}: {p.n_kv_heads} K/V head{'s' * (p.n_kv_heads > 1)} for {p.n_heads} query heads"
    note = ""
    if p.n_sliding_layers:
        note = (f"<br><i>{p.n_sliding_layers} of {p.n_layers} layers keep only a {p.sliding_window:,}-token window;"
                f" the total counts that.</i>")
    return (f"<div class='kv-cache-report' style='line-height:1.5'><b>{html.escape(r['preset'])}</b> ({kind}; "
            f"{dtype})<br>bytes per token: <b class='kv-bytes-per-token'>{r['bytes_per_token']:,} B</b><br>"
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
    return panel([widgets.HBox([preset_w, dtype_w]), widgets.HBox([context_w, batch_w]), out],
                 lambda: {"fallback_html": out.value})


# ---- Lesson 11: the config reader ---------------------------------------------------------------------------------


def _value_html(value) -> str:
    """A config value for the field table: JSON, long lists summarised, at most 40 characters; short values stay
    on one line, long ones may wrap anywhere (they are data, not words)."""
    if isinstance(value, list) and len(value) > 4:
        value = value[:3] + [f"... {len(value):,} items"]
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= 40 else text[:39] + "…"
    wrap = "white-space:nowrap" if len(text) <= 24 else "overflow-wrap:anywhere"
    return f"<code style='{wrap}'>{html.escape(text)}</code>"


def _card_html(card, context: int, gpu: str) -> str:
    """The card as HTML that wraps at words: the summary, then one table row per field."""
    lines = card.summary(context, gpu).splitlines()
    summary = "".join(f"<div style='padding-left:{2 if line.startswith('  ') else 0}em; text-indent:"
                      f"{-1 if line.startswith('  ') else 0}em'>{html.escape(line.strip())}</div>" for line in lines)
    cell = "style='padding:1px 8px 1px 0; vertical-align:top; text-align:left'"
    rows = "".join(
        f"<tr><td {cell}><code>{html.escape(f.key)}</code></td><td {cell}>{html.escape(f.lesson or '?')}</td>"
        f"<td {cell}>{_value_html(f.value)}</td>"
        f"<td {cell}>{html.escape(f.meaning)}{' → ' + html.escape(f.implies) if f.implies else ''}</td></tr>"
        for f in card.fields)
    head = "".join(f"<th {cell}>{h}</th>" for h in ("field", "lesson", "value", "what it means"))
    return (f"<div class='config-card' style='line-height:1.4'>{summary}</div>"
            f"<table class='config-fields' style='border-collapse:collapse; margin-top:6px; line-height:1.35'>"
            f"<tr>{head}</tr>{rows}</table>")


def config_reader(preset: str = "Llama 3.1 8B", gpu: str = "H100 SXM", context_len: int = 131072):
    """Lesson 11's config reader: pick a preset, give a path (a config.json, a folder holding one, or a .gguf file)
    and press Enter or "Read", or upload a config.json. The card says which source it describes; choosing one
    source clears the others. A file that cannot be read gets a one-line message above the card, only when asked."""
    import ipywidgets as widgets

    from ..interop.config_card import CONFIG_PRESETS, GPU_BANDWIDTH, config_card

    for name, value, allowed in (("preset", preset, CONFIG_PRESETS), ("gpu", gpu, GPU_BANDWIDTH)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    if not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len must be a positive int, got {context_len!r}")
    preset_w = widgets.Dropdown(options=list(CONFIG_PRESETS), value=preset, description="preset")
    gpu_w = widgets.Dropdown(options=list(GPU_BANDWIDTH), value=gpu, description="GPU")
    context_w = widgets.Dropdown(options=[(f"{n:,}", n) for n in sorted(set(CONTEXT_LENGTHS) | {context_len})],
                                 value=context_len, description="context")
    path_w = widgets.Text(value="", placeholder="a config.json, its folder or a .gguf file, then Enter",
                          description="path", continuous_update=False, layout=widgets.Layout(width="30em"))
    read_w = widgets.Button(description="Read", tooltip="read the file or folder named in the path box")
    upload_w = widgets.FileUpload(accept=".json", multiple=False, description="config.json")
    out = widgets.HTML()
    inputs = (preset_w, gpu_w, context_w, path_w, read_w, upload_w)
    state: dict = {"card": None, "what": "", "status": "", "read_path": None, "read_at": -math.inf}
    resetting = []  # non-empty while the reader clears an input itself: those changes read nothing

    def show():
        status = state["status"]
        top = f"<div class='config-reader-status'>{status}</div>" if status else ""
        card = "" if state["card"] is None else (
            f"<div class='config-card-source'>Showing <b>{html.escape(state['what'])}</b>:</div>"
            + _card_html(state["card"], context_w.value, gpu_w.value))
        out.value = top + card

    def reset(keep):  # clear every source input but ``keep``, the one the card now describes
        resetting.append(True)
        try:
            if keep is not preset_w:
                preset_w.value = None
            if keep is not path_w:
                path_w.value = ""
            if keep is not upload_w and upload_w.value:
                upload_w.value = () if isinstance(upload_w.value, tuple) else {}
        finally:
            resetting.pop()

    def fail(message: str):
        state["status"] = (f"<span class='config-card-error' style='color:rgb(198, 40, 40)'>✗ "
                           f"{html.escape(message)}</span>")
        show()

    def read(source, what: str, keep, name=None):
        state["status"] = f"<span class='config-reader-busy'>⏳ Reading {html.escape(what)} …</span>"
        show()
        for w in inputs:
            w.disabled = True
        try:
            card = config_card(source, name=name)
        except (ValueError, TypeError, OSError) as err:
            return fail(str(err).splitlines()[0])
        finally:
            for w in inputs:
                w.disabled = False
        state.update(card=card, what=what, status="")
        reset(keep)
        show()

    def read_path():
        text = path_w.value.strip()
        path = Path(text).expanduser()
        if path.is_dir() and not (path / "config.json").is_file():
            fail(f"The folder {path} holds no config.json.")
        elif path.is_dir() or path.is_file():
            path = path / "config.json" if path.is_dir() else path
            read(str(path), f"the file {path}", path_w, name=path.parent.name if path.name == "config.json" else None)
        else:
            fail(f"No file or folder at {path}.")
        state.update(read_path=text, read_at=time.monotonic())

    def on_preset(change):
        if not resetting and change["new"] is not None:
            read(change["new"], f"the preset {change['new']}", preset_w)

    def on_path(change):
        if resetting:
            return
        if change["new"].strip():
            read_path()
        elif state["status"]:  # an emptied box takes its error with it
            state["status"] = ""
            show()

    def on_read(_):
        if not path_w.value.strip():
            return read(preset_w.value, f"the preset {preset_w.value}", preset_w) if preset_w.value else None
        just_read = state["read_path"] == path_w.value.strip() and time.monotonic() - state["read_at"] < 1.0
        if not just_read:  # leaving the box for the button has already read it
            read_path()

    def on_upload(change):
        if resetting or not change["new"]:
            return
        value = change["new"]  # ipywidgets 8: a tuple of dicts; 7.7: a dict of dicts keyed by file name
        item = value[-1] if isinstance(value, tuple) else list(value.values())[-1]
        name = item["name"] if "name" in item else item["metadata"]["name"]
        try:
            config = json.loads(bytes(item["content"]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return fail(f"{name} is not JSON ({err}).")
        read(config, f"the uploaded file {name}", upload_w, name=name)

    preset_w.observe(on_preset, names="value")
    path_w.observe(on_path, names="value")
    upload_w.observe(on_upload, names="value")
    read_w.on_click(on_read)
    gpu_w.observe(lambda _: show(), names="value")
    context_w.observe(lambda _: show(), names="value")
    read(preset, f"the preset {preset}", preset_w)
    return panel([widgets.HBox([preset_w, gpu_w, context_w]), widgets.HBox([path_w, read_w, upload_w]), out],
                 lambda: {"fallback_html": out.value})
