"""Reading a config's fields as its family reads them (modern_block/interop/config_fields.py): the family's own
fields and defaults, the fields every config carries, the older spellings accepted at the values transformers
builds the published model under, and every other field refused by name with the reason."""

import pytest

from modern_block.interop.config_fields import BOOKKEEPING, GLOSSARY, ConfigRefused, Fields, lesson_and_meaning
from modern_block.interop.config_source import load_config

LESSONS = {f"{n:02d}" for n in range(12)} | {"09b"}


def test_the_glossary_names_a_lesson_and_a_meaning_for_each_field():
    for section in ("config.json", "gguf"):
        for key, (lesson, meaning) in GLOSSARY[section].items():
            assert lesson in LESSONS and meaning, key
    for key, rule in GLOSSARY["accepted"].items():
        assert lesson_and_meaning(key) is not None and rule["why"] and rule["values"], key
    assert all(lesson_and_meaning(key) is not None for key in BOOKKEEPING if not key.startswith("gguf"))


def test_a_field_absent_takes_the_familys_own_default_and_says_so():
    gemma = Fields(load_config("Gemma 2 9B"))
    assert "tie_word_embeddings" not in gemma.cfg and gemma.flag("tie_word_embeddings") is True
    assert gemma.absent == {"tie_word_embeddings": True}
    llama = Fields({k: v for k, v in load_config("Llama 3.1 8B").items() if k != "tie_word_embeddings"})
    assert llama.flag("tie_word_embeddings") is False and not llama.problems


def test_a_name_transformers_maps_to_a_field_is_read_as_that_field():
    qwen = Fields(load_config("Qwen3-235B-A22B"))  # writes num_experts; transformers 5 reads num_local_experts
    assert "num_experts" in qwen.cfg and qwen.int("num_local_experts") == 128 and not qwen.problems


@pytest.mark.parametrize("extra, field, why", [
    ({"banana_ratio": 0.7}, "banana_ratio", "not a field of llama's config"),
    ({"num_local_experts": 8}, "num_local_experts", "not a field of llama's config"),  # Mixtral's, not Llama's
    ({"rope_interleaved": True}, "rope_interleaved", "only false is interpreted"),
    ({"is_encoder_decoder": True}, "is_encoder_decoder", "a causal decoder has False"),
])
def test_a_field_the_card_cannot_interpret_is_named_with_the_reason(extra, field, why):
    f = Fields(load_config("Llama 3.1 8B") | extra)
    assert f.problems == {field: f.problems[field]} and why in f.problems[field]
    with pytest.raises(ConfigRefused) as err:
        f.refuse_if_unreadable()
    assert isinstance(err.value, ValueError) and err.value.family == "llama" and err.value.fields == f.problems
    assert str(err.value).startswith(f"model_type 'llama': the card cannot interpret {field!r} (") and \
        "No totals are given" in str(err.value)


def test_older_spellings_are_read_only_at_the_values_transformers_builds_under():
    qwen = load_config("Qwen2.5-7B")
    assert not Fields(qwen).problems and Fields(qwen | {"use_mrope": True}).problems == {
        "use_mrope": "True: only false is interpreted"}
    phi = load_config("Phi-4-mini")
    assert not Fields(phi).problems
    assert "full_attn_mod" in Fields(phi | {"full_attn_mod": 2}).problems
    assert "lm_head_bias" in Fields(phi | {"lm_head_bias": True}).problems
    gemma = load_config("Gemma 2 9B")
    assert "sliding_window_size" in Fields(gemma | {"sliding_window_size": 2048}).problems
    assert Fields(load_config("DeepSeek-V3") | {"moe_layer_freq": 2}).problems == {
        "moe_layer_freq": "2: only 1 is interpreted"}


def test_an_own_field_at_a_value_the_card_does_not_model_is_refused():
    f = Fields(load_config("Gemma 2 9B") | {"use_bidirectional_attention": True})
    assert "not a causal decoder" in f.problems["use_bidirectional_attention"]


def test_a_family_the_card_does_not_read_is_refused_with_its_unexplained_fields():
    f = Fields({"model_type": "mamba", "hidden_size": 768, "state_size": 16, "conv_kernel": 4, "vocab_size": 50280})
    assert set(f.problems) == {"model_type", "state_size", "conv_kernel"}
    assert "'mamba' is not a family this card reads" in f.problems["model_type"]
    with pytest.raises(TypeError, match="'model_type' must be a string"):
        Fields({"model_type": 7})


def test_typed_reads_name_the_field_and_the_rule():
    f = Fields(load_config("Llama 3.1 8B") | {"hidden_size": "4096", "attention_bias": "no"})
    with pytest.raises(TypeError, match="'hidden_size' must be an int, got str '4096'"):
        f.int("hidden_size")
    with pytest.raises(TypeError, match="'attention_bias' must be true or false"):
        f.flag("attention_bias")
    with pytest.raises(ValueError, match="'num_hidden_layers' must be >= 1, got 0"):
        Fields(load_config("Llama 3.1 8B") | {"num_hidden_layers": 0}).int("num_hidden_layers")
    with pytest.raises(ValueError, match="'vocab_size' is missing; every Llama config must give it"):
        Fields({"model_type": "llama"}).int("vocab_size")  # not llama's default: a size is stated, never assumed
