"""The lessons' widgets (modern_block/classroom/widgets.py), driven from Python (tests/course/browser: in JupyterLab).

* lesson 04's KV-cache calculator: its numbers (the chapter's figures), that it reacts, and the attention's name
  (Llama 2 7B is plain MHA);
* every widget is displayed with a static version of its state (the calculator's report as HTML, an explorer's
  current figure as a PNG), which JupyterLab shows where the widget cannot be;
* lesson 11's config reader: it says which source its card describes and clears the other inputs, accepts a folder
  holding a config.json, reports a bad source in one short line only when asked, shows a busy sign while reading,
  and lays its fields out as a table that wraps at words.
"""

import base64
import datetime
import html
import json
import re
import time

import pytest

from modern_block.classroom.widgets import (
    GPU_BYTES,
    WIDGET_VIEW,
    attention_kind,
    cache_calculator,
    cache_report,
    config_reader,
    figure_explorer,
)
from modern_block.interop.config_card import config_card, load_config
from modern_block.interop.gguf import smollm2_path
from modern_block.presets import PRESETS, GiB


def test_report_gives_the_chapters_llama3_70b_figure():
    r = cache_report("Llama 3 70B", 131072, batch=1, dtype="bf16")
    assert r["bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    assert r["total_bytes"] == 327_680 * 131_072 and r["total_gib"] == 40.0
    assert r["gpus"] == 1
    # the weights (70.55B parameters, 141 GB in bf16) need two 80 GB GPUs on their own, three with the cache
    assert r["weight_bytes"] == 2 * 70_553_706_496 and r["gpus_with_weights"] == 3


def test_report_scales_with_batch_and_dtype_and_counts_gpus():
    one = cache_report("Llama 3 8B", 32768, batch=1, dtype="fp16")
    assert one["total_gib"] == 4.0  # the chapter's L=32, n_kv=8, d_h=128 example
    many = cache_report("Llama 3 8B", 32768, batch=48, dtype="fp32")
    assert many["total_bytes"] == one["total_bytes"] * 48 * 2
    assert many["gpus"] == -(-many["total_bytes"] // GPU_BYTES) and many["gpus"] > 1


def test_report_uses_mla_formula_and_sliding_windows():
    assert cache_report("DeepSeek-V3", 131072)["bytes_per_token"] == 61 * (512 + 64) * 2
    gpt_oss = cache_report("gpt-oss-120b", 131072)
    full_only = 18 * 2 * 8 * 64 * 2 * 131072 + 18 * 2 * 8 * 64 * 2 * 128
    assert gpt_oss["total_bytes"] == full_only


@pytest.mark.parametrize("kwargs, match", [
    (dict(preset="GPT-5", context_len=1024), "preset"),
    (dict(preset="Llama 3 8B", context_len=0), "context_len"),
    (dict(preset="Llama 3 8B", context_len=1024, dtype="int3"), "dtype"),
    (dict(preset="Llama 3 8B", context_len=1024, gpu_bytes=0), "gpu_bytes"),
])
def test_report_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cache_report(**kwargs)


def test_widget_updates_when_the_preset_changes():
    box = cache_calculator()
    controls = [w for row in box.children[:2] for w in row.children]
    preset = next(w for w in controls if w.description == "preset")
    batch = next(w for w in controls if w.description == "batch")
    out = box.children[2]
    assert "40.00 GiB" in out.value and "327,680 B" in out.value and "141 GB" in out.value
    preset.value = "DeepSeek-V3"
    mla = 61 * (512 + 64) * 2
    assert f"{mla:,} B" in out.value and f"{mla * 131072 / GiB:,.2f} GiB" in out.value
    batch.value = 10
    assert f"{10 * mla * 131072 / GiB:,.2f} GiB" in out.value


# ---- the label: Llama 2 7B is plain MHA ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset, kind", [("Llama 2 7B", "MHA"), ("Llama 3 8B", "GQA-8"), ("Llama 3 70B", "GQA-8"),
                                          ("Qwen3-235B-A22B", "GQA-4"), ("DeepSeek-V3", "MLA"), ("Kimi K2", "MLA")])
def test_the_attention_is_named_by_its_kv_heads(preset, kind):
    assert attention_kind(PRESETS[preset]) == kind == cache_report(preset, 1024)["attention"]


def test_the_calculator_calls_llama_2_7b_mha():
    box = cache_calculator(preset="Llama 2 7B")
    report = box.children[2].value
    assert "(MHA: 32 K/V heads, one per query head; bf16)" in report and "GQA" not in report
    box = cache_calculator(preset="Mistral 7B")
    assert "(GQA-8: 8 K/V heads for 32 query heads; bf16)" in box.children[2].value


# ---- displayed with a fallback ------------------------------------------------------------------------------------


def _displayed(widget, monkeypatch) -> dict:
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda bundle, raw: shown.append(bundle))
    widget._ipython_display_()
    (bundle,) = shown
    return bundle


def test_the_calculator_displays_with_its_current_report_as_html(monkeypatch):
    box = cache_calculator()
    next(w for w in box.children[0].children if w.description == "preset").value = "DeepSeek-V3"
    bundle = _displayed(box, monkeypatch)
    assert bundle[WIDGET_VIEW]["model_id"] == box.model_id
    assert bundle["text/html"] == box.children[2].value and "DeepSeek-V3" in bundle["text/html"]
    assert "VBox(" not in bundle["text/plain"]


def test_an_explorer_redraws_and_falls_back_to_its_current_figure(monkeypatch):
    import ipywidgets
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []

    def draw(k):
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [0, k])
        drawn.append(k)
        return fig

    slider = ipywidgets.IntSlider(value=1, min=0, max=3, description="k")
    box = figure_explorer(draw, k=slider)
    first = base64.b64decode(_displayed(box, monkeypatch)["image/png"])
    assert first.startswith(b"\x89PNG") and drawn == [1]
    slider.value = 3
    second = base64.b64decode(_displayed(box, monkeypatch)["image/png"])
    assert drawn == [1, 3] and second != first
    assert plt.get_fignums() == []  # every figure closed: the inline backend draws none twice


# ---- lesson 11's config reader ------------------------------------------------------------------------------------


class Reader:
    """The reader's controls by name, and what its card shows."""

    def __init__(self, **kwargs):
        self.box = config_reader(**kwargs)
        controls = [w for row in self.box.children[:2] for w in row.children]
        self.preset, self.gpu, self.context, self.path, self.read, self.upload = controls
        self.out = self.box.children[2]

    @property
    def showing(self) -> str:
        return re.search(r"Showing <b>(.*?)</b>", self.out.value).group(1)

    @property
    def error(self) -> str:
        found = re.search(r"class='config-card-error'[^>]*>(.*?)</span>", self.out.value)
        return html.unescape(found.group(1)) if found else ""


def _upload(name: str, data: bytes):
    return ({"name": name, "type": "application/json", "size": len(data), "content": memoryview(data),
             "last_modified": datetime.datetime.now(datetime.timezone.utc)},)


def test_the_reader_says_what_it_shows_and_clears_the_other_inputs(tmp_path):
    r = Reader()
    assert r.showing == "the preset Llama 3.1 8B" and "131,072 B/token" in r.out.value
    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_config("Qwen3-0.6B")))
    r.path.value = str(folder)  # a folder holding a config.json
    assert r.showing == f"the file {folder / 'config.json'}" and r.preset.value is None
    assert "Qwen3-0.6B (qwen3): 596,049,920 parameters" in r.out.value
    r.preset.value = "DeepSeek-V3"
    assert r.showing == "the preset DeepSeek-V3" and r.path.value == "" and "70,272 B/token" in r.out.value
    r.upload.value = _upload("mine.json", json.dumps(load_config("Mistral 7B v0.3")).encode())
    assert r.showing == "the uploaded file mine.json" and r.preset.value is None and r.path.value == ""
    r.preset.value = "Kimi K2"
    assert r.showing == "the preset Kimi K2" and r.upload.value == ()


def test_the_reader_reports_a_bad_source_in_one_short_line_and_keeps_its_card(tmp_path):
    r = Reader()
    r.path.value = "/no/such/place"
    assert r.error == "✗ No file or folder at /no/such/place." and r.showing == "the preset Llama 3.1 8B"
    r.path.value = ""  # an emptied box takes its error with it
    assert r.error == "" and r.showing == "the preset Llama 3.1 8B"
    r.path.value = str(tmp_path)
    assert r.error == f"✗ The folder {tmp_path} holds no config.json."
    (tmp_path / "bad.json").write_text("{")
    r.path.value = str(tmp_path / "bad.json")
    assert r.error.startswith(f"✗ {tmp_path / 'bad.json'} is not JSON") and "\n" not in r.error
    r.upload.value = _upload("broken.json", b"[1,")
    assert r.error.startswith("✗ broken.json is not JSON (") and r.showing == "the preset Llama 3.1 8B"
    for message in re.findall(r"class='config-card-error'[^>]*>(.*?)</span>", r.out.value):
        assert len(html.unescape(message)) < 200


@pytest.mark.slow
def test_the_reader_reads_only_when_asked_and_says_it_is_busy(monkeypatch):
    """A path is read when it is committed (Enter, or leaving the box) or on "Read"; GPU and context redraw the card
    without reading again; while a file is read the card says so and the inputs are disabled."""
    from modern_block.interop import config_card as cc

    calls, states, reader, real = [], [], [], cc.config_card

    def counting(source, name=None):
        calls.append(source)
        if reader:  # what the card and the path box show while the file is being read
            states.append((reader[0].out.value, reader[0].path.disabled))
        return real(source, name=name)

    monkeypatch.setattr(cc, "config_card", counting)
    r = Reader()
    reader.append(r)
    assert calls == ["Llama 3.1 8B"]
    calls.clear()
    r.gpu.value = "RTX 4090"
    r.context.value = 1024
    assert calls == [] and "on RTX 4090" in r.out.value
    gguf = smollm2_path()
    r.path.value = str(gguf)
    assert calls == [str(gguf)] and r.showing == f"the file {gguf}"
    busy, disabled = states[-1]
    assert "⏳ Reading the file" in busy and disabled and not r.path.disabled
    r.read.click()  # right after the same path was read by leaving the box: not read twice
    assert len(calls) == 1
    time.sleep(1.1)
    r.read.click()  # asked again later: read again
    assert len(calls) == 2
    r.path.value = ""
    r.read.click()  # nothing in the path box: the preset box is empty too, so nothing to read
    assert len(calls) == 2


def test_the_reader_table_has_one_row_per_field_and_short_values():
    r = Reader(preset="gpt-oss-120b")
    rows = re.findall(r"<tr>(.*?)</tr>", r.out.value)
    assert len(rows) == len(config_card("gpt-oss-120b").fields) + 1
    values = [html.unescape(v) for v in re.findall(r"<code style='[^']*'>(.*?)</code>", r.out.value)]
    assert values and max(map(len, values)) <= 40
    assert "<pre" not in r.out.value  # prose wraps at words; no fixed-width lines


@pytest.mark.parametrize("make, match", [
    (lambda: config_reader(preset="GPT-5"), r"preset must be one of \['Llama 3.1 8B'"),
    (lambda: config_reader(gpu="TPU"), r"gpu must be one of \['H100 SXM'"),
    (lambda: config_reader(context_len=0), "context_len must be a positive int, got 0"),
    (lambda: figure_explorer(lambda: None), "controls must be one or more widgets with a value"),
])
def test_the_widgets_refuse_bad_arguments_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    with pytest.raises(TypeError, match="draw must be a function that returns a figure, got int"):
        figure_explorer(3)
