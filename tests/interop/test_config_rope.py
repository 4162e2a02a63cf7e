"""RoPE as a config states it (modern_block/interop/config_rope.py): base, rotated share, NoPE layers, local
layers' base, and every scaling type transformers knows, read the same from either spelling."""

import math

import pytest

from modern_block.interop.config_arch import read_architecture
from modern_block.interop.config_fields import Fields
from modern_block.interop.config_rope import SCALING, rope_parameters, rope_summary
from modern_block.interop.config_source import load_config


def rope(cfg):
    f = Fields(cfg)
    return rope_summary(f, read_architecture(f))


def test_wavelengths_and_the_scaling_types():
    r = rope(load_config("Llama 3.1 8B"))
    assert r["shortest"] == pytest.approx(2 * math.pi)
    assert r["longest"] == pytest.approx(2 * math.pi * 500000 ** (126 / 128), rel=1e-9)
    assert (r["scaling"], r["factor"], r["original"], r["extends_to"]) == ("llama3", 8.0, 8192, 131072)
    assert r["longest_scaled"] == pytest.approx(8 * r["longest"], rel=1e-6)  # the long waves / 8
    scout = rope(load_config("Llama 4 Scout (text)"))  # equal low and high factors: a step, every long wave / 16
    assert scout["longest_scaled"] == pytest.approx(16 * scout["longest"], rel=1e-6) and scout["nope_layers"] == 12
    ds = rope(load_config("DeepSeek-V3"))
    assert (ds["dim"], ds["scaling"], ds["factor"], ds["extends_to"]) == (64, "yarn", 40, 163840)
    assert rope(load_config("Gemma 3 27B"))["scaling"] == "linear"
    assert rope(load_config("Mistral 7B v0.3"))["scaling"] is None
    dynamic = rope(load_config("Llama 3.1 8B") | {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0,
                                                                   "original_max_position_embeddings": 8192}})
    assert dynamic["longest_scaled"] > dynamic["longest"] and set(SCALING) >= {
        "linear", "dynamic", "yarn", "longrope", "llama3"}


def test_longrope_and_partial_rotary_phi4_mini():
    r = rope(load_config("Phi-4-mini"))
    assert (r["dim"], r["share"], r["scaling"], r["original"], r["extends_to"]) == (96, 0.75, "longrope", 4096, 131072)
    assert r["factor"] == 32  # absent: transformers' rule, max_position_embeddings / original
    long_factor = load_config("Phi-4-mini")["rope_scaling"]["long_factor"]
    assert r["longest_scaled"] == pytest.approx(r["longest"] * long_factor[-1], rel=1e-6)  # θ from float32


def test_both_spellings_read_the_same():
    old = load_config("Llama 3.1 8B")
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    assert rope(new) == rope(old)
    gemma = load_config("Gemma 3 27B")
    params = rope_parameters(Fields(gemma))
    assert params["sliding"]["rope_theta"] == 10000 and params["full"]["rope_theta"] == 1e6
    assert rope(gemma)["local_base"] == 10000


def test_an_unknown_scaling_type_is_named_not_interpreted():
    r = rope(load_config("Llama 3.1 8B") | {"rope_scaling": {"rope_type": "spiral", "factor": 2.0}})
    assert r["not_interpreted"] == "rope_type 'spiral' is not one this card explains" and "longest_scaled" not in r
    with pytest.raises(ValueError, match="'rope_theta' must be a number > 1"):
        rope(load_config("Llama 3.1 8B") | {"rope_theta": 0.5})
