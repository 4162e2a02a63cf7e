"""What an architecture costs (modern_block/interop/config_counts.py): parameters by component equal to the model
transformers builds on the meta device, for every preset and every outside config; active parameters; the KV
cache per token (lessons 04 and 05) and at a context with windows and chunks; the weights' bytes."""

import pytest

from modern_block.interop.config_arch import read_architecture
from modern_block.interop.config_counts import (
    active_parameters,
    cache_bytes,
    kv_bytes_per_token,
    parameter_counts,
    weight_bytes,
)
from modern_block.interop.config_fields import Fields
from modern_block.interop.config_source import CONFIG_PRESETS, PUBLISHED, load_config
from modern_block.kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from modern_block.presets import cache_size

TOTALS = {  # (total, active) of the models transformers builds from these configs on the meta device
    "Llama 3.1 8B": (8_030_261_248, None), "Llama 3.1 70B": (70_553_706_496, None), "Qwen3-0.6B": (596_049_920, None),
    "Qwen3-235B-A22B": (235_093_634_560, 22_190_763_520), "Mistral 7B v0.3": (7_248_023_552, None),
    "Gemma 3 27B": (27_009_346_304, None), "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
    "DeepSeek-V3": (671_026_404_352, 37_552_282_624), "Kimi K2": (1_026_408_209_408, 32_861_477_888),
    "SmolLM2-135M-Instruct": (134_515_008, None),
    "Qwen2.5-7B": (7_615_616_512, None), "Mistral Small 3": (23_572_403_200, None),
    "OLMo 2 7B": (7_298_617_344, None), "Mixtral 8x7B": (46_702_792_704, 12_879_925_248),
    "Llama 4 Scout (text)": (107_769_861_120, 17_172_894_720), "Gemma 2 9B": (9_241_705_984, None),
    "Phi-4-mini": (3_836_021_760, None), "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
}


def arch(name, **extra):
    return read_architecture(Fields(load_config(name) | extra))


def test_every_named_config_is_counted():
    assert set(TOTALS) == set(CONFIG_PRESETS) | set(PUBLISHED) - {"Mamba 130M"}  # a state-space model: refused


@pytest.mark.parametrize("name", list(TOTALS))
def test_totals_and_active_parameters_equal_transformers_on_the_meta_device(name):
    a = arch(name)
    counts = parameter_counts(a)
    total, active = TOTALS[name]
    assert sum(counts.values()) == total and active_parameters(a, counts) == (active or total)
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from modern_block.interop.config_reference import reference_totals

    cfg = load_config(name)
    if cfg.get("attn_temperature_tuning") == 4:  # Scout writes 4; transformers 5 types this switch as a bool
        cfg["attn_temperature_tuning"] = True
    want = reference_totals(cfg)
    assert {k: v for k, v in counts.items() if v} == {k: v for k, v in want["components"].items() if v}
    assert (total, active or total, kv_bytes_per_token(a, 2)) == (want["total"], want["active"],
                                                                   want["kv_bytes_per_token"])


def test_components_follow_each_block():
    llama = parameter_counts(arch("Llama 3.1 8B"))
    assert llama["embedding"] == llama["head"] == 128256 * 4096 and llama["ffn"] == 32 * 3 * 4096 * 14336
    olmo = parameter_counts(arch("OLMo 2 7B"))  # two norms per layer after the sublayers, QK-norm over all heads
    assert olmo["norms"] == 32 * (2 * 4096 + 4096 + 4096) + 4096
    gemma = parameter_counts(arch("Gemma 2 9B"))  # tied; four norms per layer
    assert gemma["head"] == 0 and gemma["norms"] == 42 * 4 * 3584 + 3584
    qwen = parameter_counts(arch("Qwen2.5-7B"))  # q, k, v biases
    assert qwen["attention"] == 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512)
    mixtral = parameter_counts(arch("Mixtral 8x7B"))
    assert mixtral["experts"] == 32 * 8 * 3 * 4096 * 14336 and mixtral["router"] == 32 * 4096 * 8
    scout = parameter_counts(arch("Llama 4 Scout (text)"))  # one shared expert as wide as a routed one
    assert scout["shared_experts"] == 48 * 3 * 5120 * 8192 and scout["router"] == 48 * 5120 * 16
    oss = parameter_counts(arch("gpt-oss-120b"))  # experts carry biases; router bias; 64 sinks per layer
    assert oss["experts"] == 36 * 128 * (3 * 2880 * 2880 + 2 * 2880 + 2880) and oss["router"] == 36 * (2880 + 1) * 128
    assert oss["attention"] == 36 * (2 * 2880 * 64 * 64 + 2 * 2880 * 8 * 64 + (64 + 16) * 64 + 2880 + 64)


def test_active_parameters_leave_out_the_unpicked_routed_experts():
    ds = arch("DeepSeek-V3")
    counts = parameter_counts(ds)
    assert active_parameters(ds, counts) == sum(counts.values()) - 58 * 248 * 3 * 7168 * 2048
    assert counts["shared_experts"] == 58 * 3 * 7168 * 2048


def test_kv_bytes_follow_lessons_04_and_05_and_the_presets_windows():
    assert kv_bytes_per_token(arch("Llama 3.1 70B"), 2) == kv_cache_bytes_per_token(80, 8, 128, 2) == 327_680
    assert cache_bytes(arch("Llama 3.1 70B"), 2, 131072) == 40 * 2**30
    assert kv_bytes_per_token(arch("DeepSeek-V3"), 2) == mla_cache_bytes_per_token(61, 512, 64, 2) == 70_272
    assert kv_bytes_per_token(arch("Kimi K2"), 2) == 70_272
    for name in ("Gemma 3 27B", "gpt-oss-120b"):
        for context in (100, 4096, 131072):
            assert cache_bytes(arch(name), 2, context) == cache_size(name, context)
    scout = arch("Llama 4 Scout (text)")  # 36 chunked layers hold one chunk at most, 12 global ones everything
    per_layer = kv_bytes_per_token(scout, 2) // 48
    assert cache_bytes(scout, 2, 131072) == per_layer * (36 * 8192 + 12 * 131072)
    assert cache_bytes(scout, 2, 4096, batch=3) == 3 * kv_bytes_per_token(scout, 2) * 4096


def test_weight_bytes_by_format():
    oss = arch("gpt-oss-120b")
    counts = parameter_counts(oss)
    stored, notes = weight_bytes(load_config("gpt-oss-120b"), oss, counts)
    biases = 36 * 128 * (2 * 2880 + 2880)
    assert stored["experts"] == pytest.approx((counts["experts"] - biases) * 17 / 32 + 2 * biases)
    assert notes == ["no torch_dtype in the config: weights and cache counted in bf16"]
    ds = arch("DeepSeek-V3")
    stored, _ = weight_bytes(load_config("DeepSeek-V3"), ds, parameter_counts(ds))
    assert stored["experts"] == pytest.approx(parameter_counts(ds)["experts"] * (1 + 4 / 128**2))
    phi = load_config("Phi-4-mini") | {"quantization_config": {"bits": 4, "group_size": 64}}
    stored, notes = weight_bytes(phi, arch("Phi-4-mini"), parameter_counts(arch("Phi-4-mini")))
    assert stored is None and "not modelled" in notes[0]  # no guess at a format the card does not know
    with pytest.raises(ValueError, match="'torch_dtype' must be one of"):
        weight_bytes(load_config("Llama 3.1 8B") | {"torch_dtype": "int3"}, arch("Llama 3.1 8B"), {})
