"""The GPT-2 baseline: attention against nn.MultiheadAttention, the GELU MLP, the parameter count."""

import math

import pytest
import torch
import torch.nn as nn
from tiny_models import dropout_rates

import modern_block as mb
from modern_block import (
    GPT2LM,
    LlamaStyleLM,
)

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_gpt2_attention_matches_nn_multiheadattention():
    torch.manual_seed(0)
    d, h, T = 48, 6, 8
    attn = mb.CausalSelfAttention(d, h)
    with torch.no_grad():
        attn.qkv.bias.normal_()
        attn.proj.bias.normal_()
    mha = nn.MultiheadAttention(d, h, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.proj.weight)
        mha.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(3, T, d)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    expected, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-4)


def test_gelu_mlp_uses_tanh_gelu_and_4d():
    torch.manual_seed(0)
    mlp = mb.GeluMLP(16)
    assert mlp.fc.out_features == 64 and mlp.fc.bias is not None
    x = torch.randn(3, 16)
    h = x @ mlp.fc.weight.T + mlp.fc.bias
    gelu_tanh = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(mlp(x), gelu_tanh @ mlp.proj.weight.T + mlp.proj.bias)


def test_gpt2_parameter_count_by_hand():
    V, d, L, T = 100, 32, 2, 16
    model = GPT2LM(V, d=d, n_layers=L, n_heads=4, max_len=T)
    per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert model.num_parameters() == V * d + T * d + L * per_block + 2 * d


def test_bias_false_leaves_no_bias_anywhere_and_dropout_reaches_the_embeddings():
    """GPT-2 as nanoGPT builds it: no bias in any linear or LayerNorm, the final norm included; the dropout rate
    reaches every dropout of the model, the one after the embeddings included."""
    model = GPT2LM(V=50, d=16, n_layers=2, n_heads=2, max_len=8, bias=False, dropout=0.25)
    assert [name for name, _ in model.named_parameters() if name.endswith("bias")] == []
    assert model.norm.bias is None
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert model.drop in drops and {m.p for m in drops} == {0.25}
    assert [name for name, _ in GPT2LM(V=50, d=16, n_layers=2, n_heads=2, max_len=8).named_parameters()
            if name.endswith("bias")]  # the default keeps GPT-2's biases


GPT2_SIZES = dict(V=50, d=16, n_layers=1, n_heads=2, max_len=8)


@pytest.mark.parametrize("name", list(GPT2_SIZES))
@pytest.mark.parametrize("bad,error,rule", [(0, ValueError, "must be positive, got 0"),
                                            (-2, ValueError, "must be positive, got -2"),
                                            (2.0, TypeError, "must be an int, got float")])
def test_gpt2_sizes_are_checked_by_name(name, bad, error, rule):
    """Each size of GPT2LM, zero, negative or a float, is refused naming it (not by torch deep inside)."""
    GPT2LM(**GPT2_SIZES)
    with pytest.raises(error, match=rf"^{name} {rule}$"):
        GPT2LM(**{**GPT2_SIZES, name: bad})


@pytest.mark.parametrize("build,name", [(lambda: mb.CausalSelfAttention(0, 2), "d"),
                                        (lambda: mb.CausalSelfAttention(16, 0), "n_heads"),
                                        (lambda: mb.CausalSelfAttention(16, -2), "n_heads"),
                                        (lambda: mb.GeluMLP(0), "d"),
                                        (lambda: mb.GeluMLP(16, d_ff=0), "d_ff"),
                                        (lambda: mb.GeluMLP(16, d_ff=-2), "d_ff")])
def test_gpt2_parts_refuse_sizes_by_name(build, name):
    with pytest.raises(ValueError, match=rf"^{name} must be positive, got -?\d+$"):
        build()


def test_gpt2_defaults_are_the_chapter_models_shape():
    """GPT2LM(V) has the shape of the chapter's LlamaStyleLM(V) (d 256, 4 layers, 8 heads, 1024 positions), with
    GPT-2's tied head and biases: lesson 08 compares the two at the same size."""
    gpt2, llama = GPT2LM(V=50), LlamaStyleLM(V=50)
    for model in (gpt2, llama):
        assert (model.emb.embedding_dim, len(model.blocks), model.blocks[0].attn.h, model.max_len) == (256, 4, 8, 1024)
    assert gpt2.wpe.num_embeddings == 1024 and gpt2.tied and gpt2.norm.bias is not None


@pytest.mark.parametrize("build", [lambda **kw: mb.CausalSelfAttention(16, 2, **kw), lambda **kw: mb.GeluMLP(16, **kw),
                                   lambda **kw: mb.GPT2Block(16, 2, **kw),
                                   lambda **kw: GPT2LM(50, d=16, n_layers=2, n_heads=2, max_len=8, **kw)],
                         ids=["attention", "mlp", "block", "lm"])
def test_bias_false_reaches_every_part(build):
    """bias=False leaves no bias in any linear or LayerNorm of the part; the default (GPT-2's) has one in each."""
    def biases(module):
        return [m for m in module.modules() if isinstance(m, (nn.Linear, nn.LayerNorm)) and m.bias is not None]

    assert biases(build(bias=False)) == []
    with_bias = build()
    assert biases(with_bias) == [m for m in with_bias.modules() if isinstance(m, nn.LayerNorm)
                                 or (isinstance(m, nn.Linear) and m is not getattr(with_bias, "head", None))]


def test_dropout_reaches_every_place_it_applies():
    """In each block: the attention weights and the two residual branches (one module, used twice); in the LM
    also after the embeddings. dropout=0 leaves no dropout anywhere."""
    assert dropout_rates(mb.GPT2Block(16, 2, dropout=0.25)) == [0.25, 0.25]
    assert dropout_rates(GPT2LM(50, d=16, n_layers=3, n_heads=2, max_len=8, dropout=0.25)) == [0.25] * (1 + 3 + 3)
    assert dropout_rates(GPT2LM(50, d=16, n_layers=3, n_heads=2, max_len=8)) == [0.0] * 3


def test_attention_dropout_applies_in_training_only():
    torch.manual_seed(0)
    attn = mb.CausalSelfAttention(16, 2, dropout=0.5)
    plain = mb.CausalSelfAttention(16, 2)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn.eval()(x), plain.eval()(x), rtol=0, atol=0)  # eval: no dropout
        assert (attn.train()(x) - plain(x)).abs().max() > 0.1  # training: attention weights dropped
