"""The architecture a config describes (modern_block/interop/config_arch.py): sizes, and what each layer is (full,
sliding or chunked attention; RoPE or NoPE; dense or MoE), read by each family's own rule."""

import pytest

from modern_block.interop.config_arch import read_architecture
from modern_block.interop.config_fields import Fields
from modern_block.interop.config_source import load_config


def arch(name_or_cfg, **extra):
    cfg = load_config(name_or_cfg) | extra
    f = Fields(cfg)
    a = read_architecture(f)
    return a, f


def kinds(a):
    return "".join({"full": "F", "sliding": "S", "chunked": "C"}[layer.attention] for layer in a.layers)


def test_windows_follow_each_familys_rule():
    gemma3, _ = arch("Gemma 3 27B")  # layer_types as written: five local layers, then one global
    assert kinds(gemma3) == ("SSSSSF" * 11)[:62] and {layer.window for layer in gemma3.layers} == {None, 1024}
    gemma2, _ = arch("Gemma 2 9B")  # no layer_types: Gemma 2 alternates, local first
    assert kinds(gemma2) == "SF" * 21 and gemma2.window == 4096
    qwen, _ = arch("Qwen2.5-7B", use_sliding_window=True, max_window_layers=20)  # Qwen2: windows from layer 20 on
    assert kinds(qwen) == "F" * 20 + "S" * 8 and qwen.window == 131072
    assert kinds(arch("Qwen2.5-7B")[0]) == "F" * 28  # use_sliding_window false: sliding_window is not read
    mistral, _ = arch("Mistral 7B v0.3", sliding_window=4096)  # Mistral: one window for every layer
    assert kinds(mistral) == "S" * 32
    assert kinds(arch("Gemma 3 27B", layer_types=None, sliding_window_pattern=3)[0]) == ("SSF" * 21)[:62]


def test_llama4_has_chunked_rope_layers_and_global_nope_layers():
    scout, _ = arch("Llama 4 Scout (text)")
    assert kinds(scout) == "CCCF" * 12 and scout.window == 8192
    assert [layer.rope for layer in scout.layers] == [True, True, True, False] * 12 and scout.nope_layers == 12
    assert scout.moe_layers == 48 and (scout.n_experts, scout.top_k, scout.n_shared) == (16, 1, 1)
    assert scout.qk_norm_kind == "weightless" and scout.d_ff is None
    derived, _ = arch("Llama 4 Scout (text)", no_rope_layers=[], moe_layers=None, interleave_moe_layer_step=2)
    assert kinds(derived) == "CCCF" * 12 and [layer.moe for layer in derived.layers] == [False, True] * 24
    assert derived.d_ff == 16384  # intermediate_size_mlp: the dense layers' width


def test_moe_placement_follows_each_familys_rule():
    ds, _ = arch("DeepSeek-V3")  # the first three layers dense
    assert [layer.moe for layer in ds.layers[:4]] == [False, False, False, True] and ds.moe_layers == 58
    qwen, _ = arch("Qwen3-235B-A22B", decoder_sparse_step=2, mlp_only_layers=[1])
    assert [layer.moe for layer in qwen.layers[:6]] == [False, False, False, True, False, True]
    mixtral, _ = arch("Mixtral 8x7B")
    assert mixtral.moe_layers == 32 and mixtral.d_ff is None and mixtral.experts.width == 14336


def test_sizes_follow_the_family():
    assert arch("Qwen3-0.6B")[0].head_dim == 128  # head_dim given: not 1024 / 16
    assert arch("Qwen2.5-7B")[0].head_dim == 128  # no head_dim: 3584 / 28
    assert arch("DeepSeek-V3")[0].head_dim == 192  # MLA: qk_nope 128 + qk_rope 64
    olmo, _ = arch("OLMo 2 7B")
    assert (olmo.qk_norm_kind, olmo.spec.layer_norms) == ("all_heads", ("post_attention_layernorm",
                                                                         "post_feedforward_layernorm"))
    qwen = arch("Qwen2.5-7B")[0]
    assert (qwen.qkv_bias, qwen.o_bias, qwen.tied) == (True, False, False)  # Qwen2: q, k, v biases always
    gemma, f = arch("Gemma 2 9B")
    assert gemma.tied and gemma.activation == "gelu_pytorch_tanh" and "tie_word_embeddings absent" in \
        gemma.assumptions[0]
    kimi, _ = arch("Kimi K2")
    assert kimi.family == "deepseek_v3" and kimi.model_type == "kimi_k2" and "DeepseekV3" in kimi.assumptions[0]


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        arch("Llama 3.1 8B", num_key_value_heads=5)
    with pytest.raises(ValueError, match="'layer_types' must list one str per layer"):
        arch("Gemma 3 27B", layer_types=["full_attention"])
    with pytest.raises(ValueError, match="head_dim is missing and hidden_size"):
        arch("Qwen2.5-7B", num_attention_heads=27, num_key_value_heads=27)
    with pytest.raises(TypeError, match="'sliding_window' must be an int or null"):
        arch("Mistral 7B v0.3", sliding_window="4k")
    _, f = arch("Gemma 3 27B", layer_types=["mamba"] * 62)
    assert "not attention layers" in f.problems["layer_types"]
