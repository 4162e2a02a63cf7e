"""The FFN a config describes (modern_block/interop/config_ffn.py): its activation as this value makes it, its
width against d, and a sizing rule credited only to the model whose authors publish it."""

from modern_block.ffn import swiglu_hidden_dim
from modern_block.interop.config_ffn import (
    META_RULES,
    activation_text,
    ffn_kind,
    ffn_rule,
    llama_rule_fits,
    ratio_text,
)


def test_metas_published_rules_reproduce_their_widths():
    for (d, d_ff), (_, multiple_of, mult) in META_RULES.items():
        assert swiglu_hidden_dim(d, multiple_of, mult) == d_ff


def test_a_rule_is_credited_only_to_the_model_that_uses_it():
    assert ffn_rule(4096, 14336, "llama") == ("3.5·d: Meta's rule for Llama 3 8B, int(8/3·d) × 1.3 rounded up to a "
                                             "multiple of 1,024")
    assert ffn_rule(4096, 11008, "llama").startswith("d_ff/d = 2.688: Meta's rule for Llama 2 7B")
    mistral = ffn_rule(4096, 14336, "mistral")  # Mistral 7B's width: the same number, not Llama 3's rule
    assert mistral.startswith("3.5·d (Llama's arithmetic") and "no rule is credited to this model" in mistral
    assert "Meta" not in mistral and "Llama 3" not in mistral
    assert ffn_rule(3584, 14336, "gemma2") == "4·d"  # Gemma 2 9B: a plain multiple, not a rounded 8/3·d rule
    assert ffn_rule(576, 1536, "llama") == "8/3·d exactly"  # SmolLM2: the derivation itself, no rounding
    assert ffn_rule(7168, 18432, "deepseek_v3") == "d_ff/d = 2.571: no rounded 8/3·d rule gives it"
    assert ratio_text(2880, 2880) == "1·d" and llama_rule_fits(4096, 14336)[0] == (1.3, [256, 512, 1024, 2048])


def test_the_activation_is_explained_by_its_value():
    assert activation_text("silu", True, "llama").endswith("so the FFN is a SwiGLU")
    assert activation_text("gelu_pytorch_tanh", True, "gemma2") == (
        "GELU (tanh approximation): the gate's activation, so the FFN is a GeGLU")
    assert "SwiGLU" not in activation_text("gelu_pytorch_tanh", True, "gemma2")
    assert activation_text("relu2", False, "arcee").startswith("squared ReLU, max(0, x)²: a plain two-matrix MLP")
    assert activation_text("gelu_pytorch_tanh", False, "starcoder2").endswith("activation between up and down")
    assert activation_text("silu", True, "gpt_oss").startswith("not read: gpt-oss's experts compute their own")
    assert "does not explain" in activation_text("mish", True, "llama")


def test_the_ffn_in_a_word_follows_gating_and_activation():
    assert ffn_kind("silu", True, "llama") == "SwiGLU" and ffn_kind("gelu_pytorch_tanh", True, "gemma2") == "GeGLU"
    assert ffn_kind("relu2", False, "arcee") == "plain MLP (squared ReLU)"
    assert ffn_kind("silu", True, "gpt_oss") == "clamped SwiGLU"
