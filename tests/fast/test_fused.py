"""Step 1 of the fast layer (modern_block/fast/fused.py): the fused modules hold exactly the stacked weights,
replace exactly GQAttention and SwiGLU, carry every setting of the module they replace, and run wherever the
plain modules do."""

import pytest
import torch
import torch.nn as nn
from decodes import assert_decodes_agree, cached_logits
from test_fast import model_for, prompts

from modern_block import GeluMLP, GQAttention, KVCache, MLAttention, SwiGLU, generate
from modern_block.fast.fused import FusedGQAttention, FusedSwiGLU, fuse_linears, fused_copy


@pytest.mark.parametrize("name", ["qwen3-head_dim12-tied", "qwen2-qkv_bias-yarn"])
def test_fused_weights_are_the_stacked_originals_and_the_model_is_untouched(name):
    model = model_for(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fused = fused_copy(model)
    for blk, fblk in zip(model.blocks, fused.blocks, strict=True):
        a, f = blk.attn, fblk.attn
        assert torch.equal(f.wqkv.weight, torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]))
        if a.wq.bias is not None:
            assert torch.equal(f.wqkv.bias, torch.cat([a.wq.bias, a.wk.bias, a.wv.bias]))
        assert torch.equal(fblk.ffn.w_gate_up.weight, torch.cat([blk.ffn.w_gate.weight, blk.ffn.w_up.weight]))
        assert torch.equal(f.wo.weight, a.wo.weight) and f.wo is not a.wo  # a copy: the plain model keeps its own
        assert f.wqkv.weight.data_ptr() != a.wq.weight.data_ptr()
    assert fused.tied == model.tied and (not fused.tied or fused.head.weight is fused.emb.weight)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not fused.training and not any(m.training for m in fused.modules())


@pytest.mark.parametrize("name", ["mla", "gpt2", "ladder-no_rope"])
def test_only_gqattention_and_swiglu_are_replaced(name):
    model = model_for(name)
    fused = dict(fused_copy(model).named_modules())
    for path, plain in model.named_modules():
        parent = fused.get(path.rsplit(".", 1)[0])
        if type(parent) in (FusedGQAttention, FusedSwiGLU):
            continue  # inside a fused module: its projections are fused
        expected = {GQAttention: FusedGQAttention, SwiGLU: FusedSwiGLU}.get(type(plain), type(plain))
        assert type(fused[path]) is expected, path
    kinds = {type(m) for m in fused.values()}
    assert {"mla": MLAttention, "gpt2": GeluMLP, "ladder-no_rope": FusedGQAttention}[name] in kinds


def test_the_fused_attention_carries_every_setting_of_gqattention():
    """The rule that keeps a feature added to GQAttention from being lost in the fast layer: every setting
    (a plain attribute) and every submodule but the three projections reaches the fused module."""
    attn = GQAttention(32, 4, 2, qk_norm=True, dropout=0.1, qkv_bias=True).eval()
    fused = FusedGQAttention(attn)
    settings = {k: v for k, v in vars(attn).items() if not k.startswith("_")}
    assert settings == {k: v for k, v in vars(fused).items() if not k.startswith("_")}
    children = {n for n, _ in attn.named_children()} - {"wq", "wk", "wv"} | {"wqkv"}
    assert children == {n for n, _ in fused.named_children()}


@pytest.mark.parametrize("name", ["gqa-qknorm", "mqa-tied-llama", "qwen2-qkv_bias-yarn"])
def test_the_fused_model_runs_where_the_plain_one_does(name):
    """Plain generate and the plain KVCache: the fused modules keep the interfaces."""
    model = model_for(name)
    fused = fused_copy(model)
    idx = prompts(length=12)
    with torch.no_grad():
        torch.testing.assert_close(fused(idx), model(idx), atol=1e-5, rtol=0)
        cache = KVCache(len(fused.blocks), 12)
        chunks = torch.cat([fused(idx[:, :7], cache), fused(idx[:, 7:8], cache), fused(idx[:, 8:], cache)], 1)
        torch.testing.assert_close(chunks, model(idx), atol=1e-5, rtol=0)
    assert_decodes_agree(model, lambda s: cached_logits(fused, s, 5), generate(model, idx[:, :5], 15),
                         generate(fused, idx[:, :5], 15), 5, 1e-5, f"{name}: fused against plain")


def test_fuse_linears_refuses_mixed_biases():
    with pytest.raises(ValueError, match="all have a bias or all have none"):
        fuse_linears(nn.Linear(4, 2), nn.Linear(4, 2, bias=False))
