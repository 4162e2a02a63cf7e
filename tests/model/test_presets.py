"""Real models' attention facts and cache sizes."""

import pytest

from modern_block import (
    PRESETS,
    cache_size,
    kv_cache_bytes_per_token,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_presets_and_sliding_windows():
    assert cache_size("Llama 3 8B", 1000, batch=2, dtype="fp32") == 2 * 1000 * kv_cache_bytes_per_token(32, 8, 128, 4)
    oss = PRESETS["gpt-oss-120b"]
    per_layer = 2 * 8 * 64 * 2
    assert cache_size(oss, 131_072) == per_layer * (18 * 131_072 + 18 * 128)
    assert cache_size(oss, 100) == oss.bytes_per_token() * 100  # below the window every layer holds everything
    with pytest.raises(ValueError, match="preset must be one of"):
        cache_size("GPT-5", 10)
    with pytest.raises(ValueError, match="dtype must be one of"):
        cache_size("Llama 3 8B", 10, dtype="int3")


# published totals of the dense models (model cards), against the count from the recorded config
PUBLISHED = {"Llama 2 7B": 6.74e9, "Llama 3 8B": 8.03e9, "Llama 3 70B": 70.6e9, "Mistral 7B": 7.25e9,
             "Qwen3-0.6B": 0.6e9, "Gemma 3 27B": 27e9}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_dense_parameter_counts_from_the_config_match_the_published_totals(name):
    assert PRESETS[name].n_params is None  # computed, not typed in
    assert PRESETS[name].parameters() == pytest.approx(PUBLISHED[name], rel=0.01)


def test_weight_bytes():
    assert PRESETS["Llama 3 70B"].parameters() == 70_553_706_496
    assert PRESETS["Llama 3 70B"].weight_bytes("bf16") == 2 * 70_553_706_496
    assert PRESETS["DeepSeek-V3"].weight_bytes("fp8") == 671 * 10**9  # MoE: the published total
    with pytest.raises(ValueError, match="dtype must be one of"):
        PRESETS["Llama 3 8B"].weight_bytes("int3")


def test_a_preset_missing_what_a_count_needs_says_so():
    from modern_block import ModelPreset

    partial = ModelPreset("sketch", n_layers=2, n_heads=4, n_kv_heads=4, head_dim=8, d_model=32)
    with pytest.raises(ValueError, match="sketch: counting its parameters needs d_model, vocab_size and d_ff"):
        partial.parameters()
    with pytest.raises(ValueError, match="sketch: an MLA cache needs kv_latent_dim and rope_dim"):
        ModelPreset("sketch", n_layers=2, n_heads=4, n_kv_heads=4, head_dim=8, attention="mla").bytes_per_token()


# the same model in PRESETS and in interop/configs (the published config.json the config capstone reads)
SAME_MODEL = {"Llama 3 8B": "Llama 3.1 8B", "Llama 3 70B": "Llama 3.1 70B", "Mistral 7B": "Mistral 7B v0.3",
              "Qwen3-0.6B": "Qwen3-0.6B", "Qwen3-235B-A22B": "Qwen3-235B-A22B", "Gemma 3 27B": "Gemma 3 27B",
              "gpt-oss-120b": "gpt-oss-120b", "DeepSeek-V3": "DeepSeek-V3", "Kimi K2": "Kimi K2"}


@pytest.mark.parametrize("preset", SAME_MODEL)
def test_a_preset_says_what_its_published_config_says(preset):
    from modern_block.interop.config_card import config_card

    p, card = PRESETS[preset], config_card(SAME_MODEL[preset])
    a = card.arch
    assert (p.n_layers, p.n_heads, p.head_dim, p.d_model, p.vocab_size, p.tied, p.qk_norm) == (
        a.n_layers, a.n_heads, a.head_dim, a.d, a.vocab, a.tied, a.qk_norm)
    assert (p.n_sliding_layers, p.sliding_window) == (a.sliding_layers, a.window)
    if p.attention == "mla":
        assert (p.kv_latent_dim, p.rope_dim, p.q_lora_rank, p.v_head_dim) == (
            a.mla["kv_lora_rank"], a.mla["qk_rope_head_dim"], a.mla["q_lora_rank"], a.mla["v_head_dim"])
    else:
        assert a.mla is None and p.n_kv_heads == a.n_kv_heads
    if p.n_params is None:  # a dense model: both count every weight from the config
        assert p.d_ff == a.d_ff and p.parameters() == card.total
    else:  # a rounded published total against the count from the whole config, experts included
        assert abs(card.total / p.n_params - 1) < 0.02
    assert p.cache_bytes(131_072) == card.cache_bytes(131_072)  # bf16, windows full
