"""The config card's words (modern_block/interop/config_text.py): a line per field with its lesson, and an
implication computed from this value for this family; the block in one line; the summary."""

import pytest

from modern_block.interop.config_card import config_card
from modern_block.interop.config_fields import ConfigRefused, Fields
from modern_block.interop.config_source import CONFIG_PRESETS, PUBLISHED, load_config
from modern_block.interop.config_text import field_lines, field_table

LESSONS = {f"{n:02d}" for n in range(12)} | {"09b"}


def line(card, key):
    return next(f for f in card.fields if f.key == key)


@pytest.mark.parametrize("name", list(CONFIG_PRESETS) + [n for n in PUBLISHED if n != "Mamba 130M"])
def test_every_field_of_every_named_config_is_explained_with_its_lesson(name):
    card = config_card(name)
    assert [f.key for f in card.fields] == list(load_config(name)), "each field of the file, in the file's order"
    assert card.unknown == [] and all(f.lesson in LESSONS and f.meaning for f in card.fields)
    assert "not interpreted" not in card.summary() and " ? " not in field_table(card.fields)
    assert max(map(len, (card.summary() + "\n" + card.field_table()).splitlines())) <= 100


def test_an_explanation_follows_the_value():
    gemma = config_card("Gemma 2 9B")
    assert line(gemma, "hidden_activation").implies.endswith("so the FFN is a GeGLU")
    assert "SwiGLU" not in line(gemma, "hidden_activation").implies + line(gemma, "intermediate_size").implies
    assert "this family's activation is hidden_activation" in line(gemma, "hidden_act").implies
    assert line(gemma, "intermediate_size").implies == "4·d"
    assert "4 per layer (sandwich" in line(gemma, "model_type").implies
    assert line(gemma, "sliding_window").implies == "21 of 42 layers sliding (4,096 tokens)"
    llama = config_card("Llama 3.1 8B")
    assert line(llama, "hidden_act").implies.endswith("so the FFN is a SwiGLU")
    assert "Meta's rule for Llama 3 8B" in line(llama, "intermediate_size").implies
    mistral = line(config_card("Mistral 7B v0.3"), "intermediate_size").implies
    assert "Llama 3" not in mistral and "no rule is credited to this model" in mistral
    olmo = line(config_card("OLMo 2 7B"), "model_type").implies
    assert "reordered: after attention and after the FFN" in olmo and "QK-norm: one norm over all query heads" in olmo
    scout = config_card("Llama 4 Scout (text)")
    assert line(scout, "no_rope_layers").implies == ("36 of 48 layers chunked (8,192 tokens); "
                                                     "12 of 48 layers without RoPE (NoPE)")
    assert line(scout, "num_local_experts").implies == "16 routed experts in each of 48 MoE layers (of 48)"
    assert "weightless" not in line(scout, "use_qk_norm").implies and "without weights" in line(
        scout, "use_qk_norm").implies
    off = config_card(load_config("Llama 4 Scout (text)") | {"use_qk_norm": False})
    assert line(off, "use_qk_norm").implies == "no QK-norm"


def flat(text: str) -> str:
    """The printed card with its wrapping undone."""
    return " ".join(text.split())


def test_the_summary_says_what_is_assumed_and_what_is_read():
    gemma = flat(config_card("Gemma 2 9B").summary())
    assert "assumed: tie_word_embeddings absent: Gemma 2's default, True (transformers' own)" in gemma
    assert "9,241,705,984 parameters" in gemma and "windows keep 51.6%" in gemma
    mixtral = flat(config_card("Mixtral 8x7B").summary())
    assert "46,702,792,704 parameters, 12,879,925,248 active per token" in mixtral
    assert "MoE: 32 of 32 layers, 8 routed experts (2 per token)" in mixtral
    phi = flat(config_card("Phi-4-mini").summary())
    assert "96 dims" in phi and "longrope scaling × 32 from 4,096 to 131,072 tokens" in phi
    assert "no shorter than the 131,072-token context: no effect" in phi


def test_a_refused_configs_lines_mark_what_is_not_interpreted():
    cfg = load_config("Llama 3.1 8B") | {"banana_ratio": 0.7}
    lines = field_lines(cfg, Fields(cfg), None)
    banana = next(f for f in lines if f.key == "banana_ratio")
    assert banana.lesson is None and banana.meaning == "not interpreted: not a field of llama's config"
    assert all(f.implies == "" for f in lines)  # no implication from a config the card does not read
    with pytest.raises(ConfigRefused) as err:
        config_card(cfg)
    assert [f.key for f in err.value.lines] == list(cfg)
