"""The GPT-2 baseline: attention against nn.MultiheadAttention, the GELU MLP, the parameter count."""

import math

import pytest
import torch
import torch.nn as nn

import modern_block as mb
from modern_block import (
    GPT2LM,
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


def test_gpt2_sizes_are_checked_by_name():
    for kwargs, name in ((dict(n_layers=0), "n_layers"), (dict(d=0), "d"), (dict(max_len=0), "max_len")):
        with pytest.raises(ValueError, match=name):
            GPT2LM(V=50, **{"d": 16, "n_heads": 2, **kwargs})
