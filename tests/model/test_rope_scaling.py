"""RoPE scaling (modern_block.rope) against Hugging Face's own implementation.

Each rule is compared with ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` on several
configurations, real ones (Llama 3.1 8B, Llama 3.2 1B, Qwen2.5 with YaRN, DeepSeek-V3, gpt-oss) and
small ones chosen so that every band of a piecewise rule holds at least one frequency.
"""

import math
import os
import re

import pytest
import torch

from modern_block import LlamaStyleLM
from modern_block.rope import (
    RotaryEmbedding,
    check_rope_scaling,
    dynamic_ntk_frequencies,
    linear_frequencies,
    llama3_frequencies,
    rope_cache,
    rope_frequencies,
    scaled_frequencies,
    yarn_attention_factor,
    yarn_frequencies,
)

if os.environ.get("CI", "").lower() not in ("", "0", "false"):
    import transformers  # in CI a missing transformers must fail the run, never skip it
else:
    transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

transformers.logging.set_verbosity_error()

# name: (head_dim, rope_theta, max_position_embeddings, rope parameters without rope_theta)
CONFIGS = {
    "linear-2": (64, 10000.0, 4096, dict(rope_type="linear", factor=2.0)),
    "linear-4-dh128": (128, 500000.0, 8192, dict(rope_type="linear", factor=4.0)),
    "linear-2.5-dh16": (16, 10000.0, 256, dict(rope_type="linear", factor=2.5)),
    "dynamic-2": (64, 10000.0, 2048, dict(rope_type="dynamic", factor=2.0)),
    "dynamic-4-dh128": (128, 1e6, 4096, dict(rope_type="dynamic", factor=4.0)),
    "dynamic-8-dh16": (16, 10000.0, 64, dict(rope_type="dynamic", factor=8.0)),
    "yarn-qwen2.5": (128, 1e6, 131072, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)),
    "yarn-deepseek-v3": (64, 10000.0, 163840, dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                                  beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)),
    "yarn-gpt-oss": (64, 150000.0, 131072, dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096,
                                               beta_fast=32.0, beta_slow=1.0, truncate=False)),
    "yarn-small-attention_factor": (32, 10000.0, 512, dict(rope_type="yarn", factor=4.0, attention_factor=1.3,
                                                          original_max_position_embeddings=128, beta_fast=8.0,
                                                          beta_slow=2.0)),
    # YaRN's defaults on a Llama-3-like base: with β_fast = 33, i_fast would floor to 17 instead of 18
    "yarn-default-betas": (128, 500000.0, 32768, dict(rope_type="yarn", factor=4.0,
                                                      original_max_position_embeddings=8192)),
    # a small base: i_slow (≈ 17.7) is clamped to d_h − 1 = 15 and the ramp reaches the slowest pairs
    "yarn-i_slow-clamped": (16, 10.0, 4096, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024)),
    # β_fast = β_slow, untruncated: i_fast = i_slow ≈ 3.2, a step instead of a ramp
    "yarn-step": (16, 10000.0, 4096, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                          beta_fast=4.0, beta_slow=4.0, truncate=False)),
    "yarn-mscale-only": (32, 10000.0, 512, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128,
                                                mscale=0.707)),
    "yarn-mscale-ratio": (32, 10000.0, 512, dict(rope_type="yarn", factor=1.5, original_max_position_embeddings=128,
                                                 mscale=0.707, mscale_all_dim=1.0)),
    "llama3-3.1-8B": (128, 500000.0, 131072, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "llama3-3.2-1B": (64, 500000.0, 131072, dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "llama3-small": (32, 10000.0, 1024, dict(rope_type="llama3", factor=4.0, low_freq_factor=2.0,
                                             high_freq_factor=8.0, original_max_position_embeddings=256)),
}
RTOL = 1e-6  # relative: the frequencies span many orders of magnitude


def hf_config(head_dim, theta, max_pos, params):
    return transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                    max_position_embeddings=max_pos,
                                    rope_parameters={"rope_theta": theta, **params})


def ours_for(head_dim, theta, max_pos, params, seq_len=None):
    scaling = dict(params)
    if scaling["rope_type"] == "dynamic":  # Hugging Face's dynamic rule takes L₀ from max_position_embeddings
        scaling["original_max_position_embeddings"] = max_pos
    return scaled_frequencies(head_dim, theta, scaling, seq_len=seq_len)


def max_rel(a, b):
    return ((a.double() - b.double()).abs() / b.double().abs()).max().item()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_scaled_frequencies_equal_hugging_face(name):
    head_dim, theta, max_pos, params = CONFIGS[name]
    kind = params["rope_type"]
    lengths = [None, max_pos, 2 * max_pos + 3, 4 * max_pos] if kind == "dynamic" else [None]
    for seq_len in lengths:
        ref, ref_factor = ROPE_INIT_FUNCTIONS[kind](hf_config(head_dim, theta, max_pos, params), "cpu",
                                                    seq_len=seq_len)
        ours, factor = ours_for(head_dim, theta, max_pos, params, seq_len)
        assert ours.shape == ref.shape == (head_dim // 2,) and ours.dtype == torch.float32
        rel = max_rel(ours, ref)
        print(f"{name} seq_len={seq_len}: max relative difference {rel:.1e}, attention factor {factor:.6f}")
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)
        assert factor == pytest.approx(ref_factor, rel=1e-12)
        plain = rope_frequencies(head_dim, theta)
        if kind != "dynamic" or (seq_len or 0) > max_pos:
            assert not torch.allclose(ours, plain, rtol=1e-3, atol=0)  # the rule did change something


def test_piecewise_configs_exercise_every_band():
    """The comparisons above are only worth something if each band of each rule is populated."""
    for name in ("llama3-3.1-8B", "llama3-3.2-1B", "llama3-small"):
        head_dim, theta, _, p = CONFIGS[name]
        plain = rope_frequencies(head_dim, theta)
        ours = llama3_frequencies(plain, p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                                  p["original_max_position_embeddings"])
        kept, divided = torch.isclose(ours, plain), torch.isclose(ours, plain / p["factor"])
        middle = ~kept & ~divided
        assert kept.any() and divided.any() and middle.any(), name
        assert kept[:1].all() and divided[-1:].all()  # fast pairs kept, slow pairs interpolated
        assert (plain / p["factor"] < ours)[middle].all() and (ours < plain)[middle].all()
    for name in ("yarn-qwen2.5", "yarn-deepseek-v3", "yarn-gpt-oss", "yarn-small-attention_factor"):
        head_dim, theta, _, p = CONFIGS[name]
        plain = rope_frequencies(head_dim, theta)
        ours = yarn_frequencies(head_dim, theta, p["factor"], p["original_max_position_embeddings"],
                                p.get("beta_fast", 32), p.get("beta_slow", 1), p.get("truncate", True))
        kept, divided = torch.isclose(ours, plain), torch.isclose(ours, plain / p["factor"])
        assert kept.any() and divided.any() and (~kept & ~divided).any(), name


def test_each_rule_follows_its_formula():
    theta = rope_frequencies(16, 10000.0)
    torch.testing.assert_close(linear_frequencies(theta, 4.0), theta / 4, rtol=0, atol=0)
    # dynamic NTK: unchanged up to L₀; beyond it the fastest pair keeps θ_0 = 1 and the slowest one is
    # divided by exactly s·L/L₀ − (s − 1)
    torch.testing.assert_close(dynamic_ntk_frequencies(16, 1e4, 4.0, 100, 128), theta, rtol=0, atol=0)
    stretched = dynamic_ntk_frequencies(16, 1e4, 4.0, 256, 128)
    assert stretched[0] == 1.0
    assert stretched[-1].item() == pytest.approx(theta[-1].item() / (4 * 2 - 3), rel=1e-5)
    # YaRN's temperature: 0.1 ln s + 1, and DeepSeek's ratio (1 when both mscales are equal)
    assert yarn_attention_factor(4.0) == pytest.approx(0.1 * math.log(4) + 1)
    assert yarn_attention_factor(0.5) == 1.0
    assert yarn_attention_factor(40.0, 1.0, 1.0) == 1.0
    assert yarn_attention_factor(40.0, 1.0, 0.707) > 1.0


def test_rope_cache_carries_the_attention_factor():
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)
    cos, sin = rope_cache(64, 16, 1e4, scaling=yarn)
    theta, factor = scaled_frequencies(16, 1e4, yarn)
    assert factor == pytest.approx(0.1 * math.log(4) + 1)
    angles = torch.outer(torch.arange(64.0), theta)
    torch.testing.assert_close(cos, angles.cos() * factor)
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, factor**2))  # q and k grow by the factor
    plain_cos, _ = rope_cache(64, 16, 1e4)
    torch.testing.assert_close(rope_cache(64, 16, 1e4, scaling=None)[0], plain_cos, rtol=0, atol=0)


def test_scaled_model_keeps_relative_positions():
    """Any scaling only changes the frequencies: scores still depend on the offset alone."""
    torch.manual_seed(0)
    for scaling in (dict(rope_type="linear", factor=4.0),
                    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=16),
                    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)):
        model = LlamaStyleLM(50, d=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=64,
                             qk_norm=False, rope_scaling=scaling).eval()
        idx = torch.randint(0, 50, (1, 8))
        with torch.no_grad():
            first = model(idx, positions=torch.arange(8))
            shifted = model(idx, positions=torch.arange(40, 48))
        torch.testing.assert_close(first, shifted, atol=1e-4, rtol=0)
        assert model.rope_scaling == scaling and model.rope_scaling is not scaling  # a validated copy


def test_dynamic_model_table_depends_on_the_length():
    scaling = dict(rope_type="dynamic", factor=2.0, original_max_position_embeddings=16)
    torch.manual_seed(0)
    model = LlamaStyleLM(50, d=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=64,
                         rope_scaling=scaling).eval()
    plain = LlamaStyleLM(50, d=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_len=64).eval()
    plain.load_state_dict(model.state_dict())
    idx = torch.randint(0, 50, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(model(idx[:, :16]), plain(idx[:, :16]), rtol=0, atol=0)  # up to L₀: plain
        assert (model(idx) - plain(idx)).abs().max() > 1e-3  # beyond: a new base for the whole sequence


TYPES = "['linear', 'dynamic', 'yarn', 'llama3']"


@pytest.mark.parametrize("scaling, error, message", [
    ([("rope_type", "linear")], TypeError,
     "rope_scaling must be a dict such as {'rope_type': 'linear', 'factor': 4.0} or None, got list"),
    (dict(rope_type="longrope", factor=2.0), ValueError,
     f"rope_scaling['rope_type'] must be one of {TYPES}, got 'longrope'"),
    (dict(factor=2.0), ValueError, f"rope_scaling['rope_type'] must be one of {TYPES}, got None"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0), ValueError,
     "rope_scaling of type 'llama3' needs the keys ['original_max_position_embeddings']"),
    (dict(rope_type="linear", factor=2.0, rope_theta=1e4), ValueError,
     "rope_scaling of type 'linear' does not take ['rope_theta'] (the base is rope_base)"),
    (dict(rope_type="linear", factor=2.0, beta_fast=32.0), ValueError,
     "rope_scaling of type 'linear' does not take ['beta_fast']"),  # the hint about the base only for rope_theta
    (dict(rope_type="linear", factor=0.0), ValueError, "rope_scaling['factor'] must be a number > 0, got 0.0"),
    (dict(rope_type="linear", factor=None), ValueError, "rope_scaling['factor'] must be a number > 0, got None"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
          original_max_position_embeddings=8192), ValueError,
     "rope_scaling needs high_freq_factor > low_freq_factor > 0, got 1.0 and 4.0"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=2.0, high_freq_factor=2.0,  # the blend would divide by 0
          original_max_position_embeddings=8192), ValueError,
     "rope_scaling needs high_freq_factor > low_freq_factor > 0, got 2.0 and 2.0"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=0.0, high_freq_factor=4.0,  # L₀/low would divide by 0
          original_max_position_embeddings=8192), ValueError,
     "rope_scaling needs high_freq_factor > low_freq_factor > 0, got 4.0 and 0.0"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=0), ValueError,
     "rope_scaling['original_max_position_embeddings'] must be positive, got 0"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=None, high_freq_factor=4.0,
          original_max_position_embeddings=8192), ValueError,
     "rope_scaling['low_freq_factor'] must be a number >= 0, got None"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor="4",
          original_max_position_embeddings=8192), ValueError,
     "rope_scaling['high_freq_factor'] must be a number >= 0, got '4'"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=-32.0), ValueError,
     "rope_scaling['beta_fast'] must be a number >= 0, got -32.0"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_slow="1"), ValueError,
     "rope_scaling['beta_slow'] must be a number >= 0, got '1'"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=-1.0), ValueError,
     "rope_scaling['mscale'] must be a number >= 0, got -1.0"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale_all_dim=True), ValueError,
     "rope_scaling['mscale_all_dim'] must be a number >= 0, got True"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, attention_factor=0.0), ValueError,
     "rope_scaling['attention_factor'] must be a number > 0, got 0.0"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, truncate="no"), TypeError,
     "rope_scaling['truncate'] must be True or False, got 'no'"),
])
def test_bad_scalings_are_refused_by_name(scaling, error, message):
    """The whole message: it names the key and the rule (and, for rope_theta only, where the base goes)."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        check_rope_scaling(scaling)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        LlamaStyleLM(50, d=32, n_layers=1, n_heads=2, d_ff=32, rope_scaling=scaling)


@pytest.mark.parametrize("scaling", [None, dict(rope_type="linear", factor=4.0),
                                     dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16),
                                     dict(rope_type="dynamic", factor=2.0, original_max_position_embeddings=16)],
                         ids=["plain", "linear", "yarn", "dynamic"])
def test_the_rotary_module_returns_the_tables_of_the_positions_asked(scaling):
    """Static rules: rows of the table computed once; dynamic NTK: the angles for the length processed (the
    largest position + 1), which is what rope_cache of that length holds, computed from tensors only."""
    rope = RotaryEmbedding(8, 64, 500.0, scaling)
    for positions in (torch.arange(40), torch.arange(5, 9), torch.tensor([[0, 1, 2], [30, 31, 32]])):
        cos, sin = rope(positions)
        want_cos, want_sin = rope_cache(int(positions.max()) + 1 if rope.dynamic else 64, 8, 500.0, scaling=scaling)
        assert cos.shape == (*positions.shape, 4)
        assert torch.equal(cos, want_cos[positions]) and torch.equal(sin, want_sin[positions])
    assert (rope.cos is None) == rope.dynamic  # dynamic NTK keeps no table


def test_dynamic_frequencies_from_a_tensor_length_equal_the_int_ones():
    for seq_len in (3, 16, 17, 40, 1000):
        by_int = dynamic_ntk_frequencies(64, 1e4, 4.0, seq_len, 16)
        assert torch.equal(dynamic_ntk_frequencies(64, 1e4, 4.0, torch.tensor(seq_len), 16), by_int)
    assert torch.equal(dynamic_ntk_frequencies(64, 1e4, 4.0, 16, 16), rope_frequencies(64, 1e4))  # L ≤ L₀: plain


@pytest.mark.parametrize("name", ["yarn-qwen2.5", "yarn-default-betas", "yarn-i_slow-clamped"])
def test_yarn_frequencies_defaults_are_the_papers(name):
    """Left out, β_fast = 32, β_slow = 1 and truncate = True (the YaRN paper's, and Hugging Face's, defaults)."""
    head_dim, theta, max_pos, params = CONFIGS[name]
    assert not {"beta_fast", "beta_slow", "truncate"} & set(params)
    ref, _ = ROPE_INIT_FUNCTIONS["yarn"](hf_config(head_dim, theta, max_pos, params), "cpu")
    ours = yarn_frequencies(head_dim, theta, params["factor"], params["original_max_position_embeddings"])
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.5, 2.0, 4.0, 40.0])
@pytest.mark.parametrize("mscale, mscale_all_dim", [(None, None), (0.707, None), (None, 1.0), (0.707, 1.0),
                                                    (1.0, 0.707), (1.0, 1.0)])
def test_yarn_attention_factor_equals_hugging_face(factor, mscale, mscale_all_dim):
    params = dict(rope_type="yarn", factor=factor, original_max_position_embeddings=128)
    params.update({k: v for k, v in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)) if v is not None})
    _, ref = ROPE_INIT_FUNCTIONS["yarn"](hf_config(32, 10000.0, 512, params), "cpu")
    assert yarn_attention_factor(factor, mscale, mscale_all_dim) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("attention_factor", [0.5, 1.0, 2.0])
def test_rope_cache_multiplies_the_tables_by_an_explicit_attention_factor(attention_factor):
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32, attention_factor=attention_factor)
    cos, sin = rope_cache(64, 16, 1e4, scaling=yarn)
    torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, attention_factor**2))


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def test_frequencies_stay_float32_under_a_float64_default_dtype(float64_default):
    """Hugging Face computes θ in float32 whatever the default dtype; so does every rule here."""
    assert rope_frequencies(16, 1e4).dtype == torch.float32
    for name, (head_dim, theta, max_pos, params) in CONFIGS.items():
        ref, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_config(head_dim, theta, max_pos, params), "cpu",
                                                          seq_len=3 * max_pos)
        ours, _ = ours_for(head_dim, theta, max_pos, params, seq_len=3 * max_pos)
        assert ours.dtype == ref.dtype == torch.float32, name
        torch.testing.assert_close(ours, ref, rtol=RTOL, atol=0)


def test_dynamic_frequencies_equal_hugging_face_bit_for_bit():
    """The new base b' is computed in float64, as Hugging Face does in Python, then θ' in float32 like it."""
    for name in ("dynamic-2", "dynamic-4-dh128", "dynamic-8-dh16"):
        head_dim, theta, max_pos, params = CONFIGS[name]
        for seq_len in (max_pos + 1, 2 * max_pos + 3, 3 * max_pos + 7, 10 * max_pos + 11, 100003):
            ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf_config(head_dim, theta, max_pos, params), "cpu", seq_len=seq_len)
            ours, _ = ours_for(head_dim, theta, max_pos, params, seq_len)
            assert torch.equal(ours, ref), (name, seq_len)


def test_dynamic_frequencies_stay_on_the_device_of_the_length():
    """The meta device stands in for a GPU: from a length held on it, nothing is computed elsewhere."""
    theta = dynamic_ntk_frequencies(16, 1e4, 2.0, torch.tensor(40, device="meta"), 16)
    assert theta.device.type == "meta" and theta.shape == (8,)
    rope = RotaryEmbedding(16, 64, 1e4, dict(rope_type="dynamic", factor=2.0, original_max_position_embeddings=16))
    cos, sin = rope(torch.arange(40, device="meta"))
    assert cos.device.type == sin.device.type == "meta" and cos.shape == (40, 8)


@pytest.mark.parametrize("extra", [dict(beta_fast=None, beta_slow=None, mscale=None, mscale_all_dim=None),
                                   dict(beta_fast=0, beta_slow=0, mscale=0, mscale_all_dim=0),
                                   dict(beta_fast=32, beta_slow=1, mscale=1, mscale_all_dim=1, truncate=False,
                                        attention_factor=1.2)])
def test_yarn_takes_the_optional_values_hugging_face_configs_hold(extra):
    """None and 0 mean "the default" for YaRN's betas and mscales (as in Hugging Face); whole numbers are numbers."""
    scaling = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, **extra)
    assert check_rope_scaling(scaling) == scaling
