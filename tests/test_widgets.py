"""The KV-cache calculator of lesson 04: its numbers (the chapter's figures) and that the widget reacts."""

import pytest

from modern_block.classroom.widgets import GPU_BYTES, cache_calculator, cache_report
from modern_block.presets import GiB


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
