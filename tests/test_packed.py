"""Packed q/k/v and gate/up projections: one matmul in inference, the same numbers as the named
linears, and nothing a learner does to the model (train, load, move, copy, hook) goes stale."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modern_block import GQAttention, LlamaStyleLM, SwiGLU, generate
from modern_block.packed import packed_weight


def _model(**kw):
    torch.manual_seed(0)
    return LlamaStyleLM(V=97, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=64, **kw)


def _reference_logits(model, idx):
    """The model's logits with every projection called as its own module (hooks force that path)."""
    handles = [m.register_forward_hook(lambda *a: None) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            return model(idx)
    finally:
        for h in handles:
            h.remove()


def _shares_one_block(*linears) -> bool:
    ptr = linears[0].weight.data_ptr()
    for lin in linears:
        if lin.weight.data_ptr() != ptr:
            return False
        ptr += lin.weight.numel() * lin.weight.element_size()
    return True


@pytest.mark.parametrize("qk_norm", [False, True])
def test_inference_packs_the_projections_and_gives_the_same_logits(qk_norm):
    model = _model(qk_norm=qk_norm).eval()
    idx = torch.randint(0, 97, (2, 10))
    before = _reference_logits(model, idx)
    attn, ffn = model.blocks[0].attn, model.blocks[0].ffn
    assert not _shares_one_block(attn.wq, attn.wk, attn.wv)  # nothing is packed before inference
    with torch.no_grad():
        packed = model(idx)
    assert _shares_one_block(attn.wq, attn.wk, attn.wv) and _shares_one_block(ffn.w_gate, ffn.w_up)
    torch.testing.assert_close(packed, before, rtol=0, atol=1e-6)
    with torch.enable_grad():
        trained_path = model(idx)  # autograd on: the stacked copy for q/k/v, separate gate/up
    torch.testing.assert_close(trained_path, before, rtol=0, atol=1e-6)


def test_training_after_generate_updates_what_inference_reads():
    """generate() runs in inference_mode; the packed block must stay an ordinary tensor so the model
    trains afterwards, and the optimiser's in-place updates must reach the packed matmul."""
    model = _model()
    prompt = torch.randint(0, 97, (1, 4))
    generate(model, prompt, 5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 97, (2, 12))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    opt.step()
    attn = model.blocks[0].attn
    assert _shares_one_block(attn.wq, attn.wk, attn.wv)  # still packed: the step wrote in place
    model.eval()
    with torch.no_grad():
        fast = model(idx)
    torch.testing.assert_close(fast, _reference_logits(model, idx), rtol=0, atol=1e-6)


def test_stacked_training_path_gives_each_weight_its_own_gradient():
    torch.manual_seed(1)
    attn = GQAttention(32, 4, 2, qk_norm=False)
    ref = copy.deepcopy(attn)
    x = torch.randn(2, 6, 32)
    cos, sin = torch.ones(6, 4), torch.zeros(6, 4)
    attn(x, cos, sin).square().sum().backward()
    hooks = [lin.register_forward_hook(lambda *a: None) for lin in (ref.wq, ref.wk, ref.wv)]
    ref(x, cos, sin).square().sum().backward()  # hooks: each projection called as a module
    for name in ("wq", "wk", "wv", "wo"):
        torch.testing.assert_close(getattr(attn, name).weight.grad, getattr(ref, name).weight.grad)
    for h in hooks:
        h.remove()


def test_load_state_dict_replaced_parameters_and_dtype_moves_are_seen():
    model, other = _model().eval(), _model().eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        model(idx)  # packs
    model.load_state_dict(other.state_dict())  # copies into the packed memory
    with torch.no_grad():
        torch.testing.assert_close(model(idx), other(idx), rtol=0, atol=1e-6)
    attn = model.blocks[1].attn
    attn.wk.weight = nn.Parameter(torch.randn_like(attn.wk.weight))  # a new Parameter: repacked
    ref = _reference_logits(model, idx)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), ref, rtol=0, atol=1e-6)
    assert _shares_one_block(attn.wq, attn.wk, attn.wv)
    model.double()  # new memory for every weight: packed again, in float64
    with torch.no_grad():
        out = model(idx)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref.double(), rtol=0, atol=1e-5)


def test_a_deep_copy_is_independent():
    model = _model().eval()
    idx = torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        original = model(idx)
        twin = copy.deepcopy(model)
        for p in twin.parameters():
            p.zero_()
        assert torch.equal(model(idx), original)
        assert torch.equal(twin(idx), torch.zeros_like(original))  # zero head → zero logits


def test_hooks_on_a_projection_still_fire_in_inference():
    ffn = SwiGLU(16, 32).eval()
    seen = []
    ffn.w_up.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        ffn(torch.randn(3, 16))
    assert seen == [torch.Size([3, 32])]


def test_weights_that_cannot_share_a_block_are_left_alone():
    ffn = SwiGLU(16, 32)
    ffn.w_up.to(torch.float64)
    assert packed_weight(ffn, ("w_gate", "w_up")) is None


def test_a_model_built_on_the_meta_device_runs_after_to_empty():
    """The meta-device idiom for big models: RMSNorm's constant scalars stay real CPU tensors."""
    with torch.device("meta"):
        model = _model()
    model = model.to_empty(device="cpu")
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)
    reference = _model()
    reference.load_state_dict(model.state_dict())
    model.cos.copy_(reference.cos), model.sin.copy_(reference.sin)  # buffers are empty after to_empty
    idx = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference(idx), rtol=0, atol=1e-6)
