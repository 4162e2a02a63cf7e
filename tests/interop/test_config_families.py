"""Every causal-LM family transformers implements (its auto mapping, enumerated when the test runs) is read by the
config card exactly or refused with the reason (modern_block/interop/config_families.py).

For each family, a small config (its defaults, scaled down) goes to ``config_card``. A family the card reads must
give the model transformers builds from the same config on the meta device: the total, every component, the
active parameters and the KV cache per token. Any other family must raise ``ConfigRefused`` (a ValueError) naming
the family and the fields it cannot interpret; no other exception, and no card, is allowed."""

import dataclasses
import json
import re

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from modern_block.interop.config_card import ConfigRefused, config_card  # noqa: E402
from modern_block.interop.config_families import ALIASES, DEFAULTS, FAMILIES, Family, family_name  # noqa: E402
from modern_block.interop.config_fields import GLOSSARY, lesson_and_meaning  # noqa: E402
from modern_block.interop.config_reference import family_defaults, reference_totals  # noqa: E402

transformers.logging.set_verbosity_error()
CAUSAL_LM_FAMILIES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
             intermediate_size_mlp=80, moe_intermediate_size=32, shared_expert_intermediate_size=48, vocab_size=320,
             num_local_experts=8, num_experts=8, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
             kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
             qk_head_dim=24, sliding_window=64, attention_chunk_size=64)
KEEP_NONE = {"q_lora_rank", "sliding_window", "attention_chunk_size", "num_key_value_heads"}  # None is a choice


def small_config(model_type: str, **extra) -> dict:
    """The family's default config with its sizes scaled down (6 layers at most, per-layer lists cut to them),
    as ``config.json`` would hold it; a multimodal config with its text_config scaled the same way. ``extra``
    overrides fields before transformers derives the others (None: derive this one too)."""
    cls = CONFIG_MAPPING[model_type]
    try:
        base = json.loads(cls().to_json_string(use_diff=False))
    except Exception:  # transformers cannot build this family's own defaults: its declared defaults, unchecked
        base = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        return json.loads(json.dumps({**base, "model_type": model_type}, default=str))
    if isinstance(base.get("text_config"), dict) and base["text_config"].get("model_type") in CONFIG_MAPPING:
        return {**base, "text_config": small_config(base["text_config"]["model_type"])}
    own = getattr(cls, "attribute_map", {})  # a common name -> the family's own (GPT-2's n_embd for hidden_size)
    small = {own.get(k, k): v for k, v in SMALL.items()}
    over = {k: v for k, v in small.items() if k in base and not (base[k] is None and k in KEEP_NONE)}
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(base.get(key), int) and base[key] >= SMALL["vocab_size"]:
            over[key] = 0
    depth = own.get("num_hidden_layers", "num_hidden_layers")
    layers = base.get(depth)
    if isinstance(layers, int):
        over[depth] = min(layers, 6)
        for key, value in base.items():
            if isinstance(value, list) and len(value) == layers and key not in over:
                over[key] = value[:over[depth]]
    if extra:
        return json.loads(cls(**(over | extra)).to_json_string(use_diff=False))
    try:
        return json.loads(cls(**over).to_json_string(use_diff=False))
    except Exception:  # the scaled sizes break one of the family's own rules: its defaults, unscaled
        return base


def assert_card_is_transformers(cfg: dict, what: str):
    """The card's totals, components, active parameters, cache per token and cache layers equal transformers'."""
    card = config_card(cfg)
    want = reference_totals(cfg, card.cache_elem_bytes)
    got = {k: v for k, v in card.params.items() if v}
    assert got == {k: v for k, v in want["components"].items() if v}, what
    assert (card.total, card.active, card.kv_bytes_per_token()) == (
        want["total"], want["active"], want["kv_bytes_per_token"]), what
    layers = [("full", None) if layer.attention == "full" else (layer.attention, layer.window)
              for layer in card.arch.layers]
    assert layers == want["layers"], what
    return card


@pytest.mark.parametrize("model_type", CAUSAL_LM_FAMILIES)
def test_every_causal_lm_family_is_read_exactly_or_refused_with_the_reason(model_type):
    cfg = small_config(model_type)
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg else cfg
    read = family_name(text.get("model_type", "")) is not None
    try:
        card = config_card(cfg)
    except ConfigRefused as err:
        assert not read, f"{model_type}: a family the card reads refused its own defaults: {err}"
        message = str(err)
        assert err.fields and repr(text.get("model_type")) in message
        assert all(repr(key) in message for key in err.fields)
        assert not re.search(r"\d{5,}", message.replace(str(err.fields), "")), "no totals in a refusal"
        return
    assert read, f"{model_type} is not a family the card reads, yet it gave {card.total:,} parameters"
    assert_card_is_transformers(cfg, model_type)


VARIANTS = [  # each changes one thing a family may read; applied where the family has the fields
    {"tie_word_embeddings": "flip"}, {"attention_bias": "flip"}, {"mlp_bias": "flip"}, {"use_bias": "flip"},
    {"qkv_bias": "flip"}, {"attention_out_bias": "flip"}, {"use_qk_norm": "flip"},
    {"use_sliding_window": True, "max_window_layers": 2, "layer_types": None},
    {"sliding_window": None, "layer_types": None}, {"num_key_value_heads": 1}, {"head_dim": 24},
    {"first_k_dense_replace": 2}, {"decoder_sparse_step": 2, "mlp_only_layers": [0]},
    {"interleave_moe_layer_step": 2, "moe_layers": None}, {"n_shared_experts": 2}, {"q_lora_rank": None},
    {"no_rope_layer_interval": 2, "no_rope_layers": None, "layer_types": None},
    {"sliding_window_pattern": 3, "layer_types": None}, {"attention_chunk_size": None, "layer_types": None},
    {"n_inner": 96}, {"add_cross_attention": True},
]


def variants(model_type: str):
    defaults = DEFAULTS[model_type]["defaults"]
    pattern = GLOSSARY["accepted"]["sliding_window_pattern"]["families"]
    for variant in VARIANTS:
        first = next(iter(variant))
        if first in defaults or first == "head_dim" or first == "sliding_window_pattern" and model_type in pattern:
            yield {k: (not defaults[k] if v == "flip" else v) for k, v in variant.items()
                   if k in defaults or v is not None}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_family_read_follows_transformers_through_its_own_switches(model_type):
    """Biases, tying, QK-norm, windows, MoE placement, shared experts, NoPE layers, MLA's query rank: every
    switch the family has, flipped one at a time, and the config written as an older file would be."""
    for variant in variants(model_type):
        try:
            cfg = small_config(model_type, **variant)
        except Exception:  # transformers itself rejects this combination for the family
            continue
        try:
            assert_card_is_transformers(cfg, f"{model_type} with {variant}")
        except ConfigRefused as err:  # refused: only for a field the variant set, named with the reason
            assert set(err.fields) <= set(variant), (variant, err)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_family_is_read_from_only_the_fields_a_file_states(model_type):
    """A config.json states what differs from the family's defaults (and older files spell RoPE as rope_theta and
    rope_scaling): the card fills the rest with the family's own defaults, as transformers does."""
    full = small_config(model_type)
    cls = CONFIG_MAPPING[model_type]
    stated = json.loads(cls(**{k: v for k, v in full.items() if k != "model_type"}).to_json_string())
    assert_card_is_transformers({**stated, "model_type": model_type}, f"{model_type}, stated fields only")
    rope = full.get("rope_parameters") or {}
    if "rope_theta" in rope and "layer_types" not in stated:
        older = {k: v for k, v in stated.items() if k != "rope_parameters"} | {
            "model_type": model_type, "rope_theta": rope["rope_theta"],
            "rope_scaling": None if rope.get("rope_type", "default") == "default" else
            {k: v for k, v in rope.items() if k != "rope_theta"}}
        assert_card_is_transformers(older, f"{model_type}, written as an older file")


def test_the_families_read_are_families_transformers_implements():
    assert set(FAMILIES) <= set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert {target for target, _ in ALIASES.values()} <= set(FAMILIES)
    assert all(isinstance(spec, Family) for spec in FAMILIES.values())


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_familys_defaults_are_transformers_own(model_type):
    assert DEFAULTS[model_type] == family_defaults(model_type), (
        "configs/transformers-defaults.json is stale: run config_reference.write_defaults()")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_field_a_family_reads_has_a_glossary_line(model_type):
    own = DEFAULTS[model_type]
    for key in list(own["defaults"]) + list(own["aliases"]):
        assert lesson_and_meaning(key) is not None, (model_type, key)
    for key, rule in GLOSSARY["accepted"].items():
        assert lesson_and_meaning(key) is not None and rule["why"], key
