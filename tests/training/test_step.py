"""One training step as a function (modern_block/training/step.py): micro-batches give the one-pass gradient,
clipping bounds the step, the learning rate is the one asked for, a failing compiler falls back to eager once."""

import functools
import shutil
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modern_block import GPT2LM
from modern_block.training.distributed import RankFailedError
from modern_block.training.step import Forward, batch_loss, eval_loss, forward_backward, optimizer_step, train_step


def tiny(seed=0):
    torch.manual_seed(seed)
    return GPT2LM(20, d=16, n_layers=1, n_heads=2, max_len=8)


def batch(B=4, T=8):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 20, (B, T), generator=g), torch.randint(0, 20, (B, T), generator=g)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("micro", [1, 2])
def test_micro_batches_give_the_gradient_and_loss_of_one_pass(micro):
    x, y = batch()
    whole, parts = tiny(), tiny()
    loss = batch_loss(whole, x, y)  # one pass, outside forward_backward: the reference
    loss.backward()
    loss_parts = forward_backward(parts, (x, y), None, micro=micro)
    assert loss_parts.item() == pytest.approx(loss.item(), rel=1e-6)
    assert loss.item() == pytest.approx(batch_loss(tiny(), x, y).item(), rel=1e-6)
    for a, b in zip(grads(whole), grads(parts), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert eval_loss(tiny(), x, y, micro).item() == pytest.approx(loss.item(), rel=1e-6)


def test_a_step_sets_the_lr_clips_steps_and_clears_the_gradients():
    x, y = batch()
    model = tiny()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=123.0)
    loss = train_step(model, (x, y), opt, None, lr=1.0, micro=2, grad_clip=1e-3)
    assert opt.param_groups[0]["lr"] == 1.0 and not loss.requires_grad
    assert all(p.grad is None for p in model.parameters())
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert moved.norm().item() == pytest.approx(1e-3, rel=1e-3)  # SGD at lr 1: the step is the clipped gradient
    unclipped = tiny()
    forward_backward(unclipped, (x, y), None, micro=4)
    norm = torch.cat([p.grad.flatten() for p in unclipped.parameters()]).norm().item()
    optimizer_step(unclipped, torch.optim.SGD(unclipped.parameters(), lr=1.0), None, grad_clip=0)  # 0: no clip
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(unclipped.parameters(), before, strict=True)])
    assert norm > 1e-2 and moved.norm().item() == pytest.approx(norm, rel=1e-4)


def test_a_failing_compiler_falls_back_to_eager_once():
    model = nn.Linear(2, 2)
    forward = Forward(model, compiled=True)
    assert forward.train is not model
    calls, fallbacks = [], []

    def fn():
        calls.append(forward.compiled)
        if forward.compiled:
            raise RuntimeError("no compiler here")
        return "eager"

    with pytest.warns(UserWarning, match="torch.compile failed .RuntimeError: no compiler here.; training eagerly"):
        assert forward.call(fn, on_fallback=lambda: fallbacks.append(1)) == "eager"
    assert calls == [True, False] and fallbacks == [1] and forward.train is model and forward.eval is model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert forward.call(fn) == "eager"  # eager from now on, no second warning
    failing = Forward(model, compiled=True)
    with pytest.raises(RankFailedError):  # another process failed: not a compiler problem, no fallback
        failing.call(lambda: (_ for _ in ()).throw(RankFailedError("rank 1 died")))
    with pytest.raises(RuntimeError, match="gloo"):  # a peer's failure as gloo reports it: no fallback either
        failing.call(lambda: (_ for _ in ()).throw(RuntimeError("[gloo] Connection reset by peer")))
    assert failing.compiled
    wrapped = Forward(model, compiled=False)
    wrapped.distribute(lambda m: ("wrapped", m))
    assert wrapped.train == ("wrapped", model) and wrapped.eval is model


def test_a_step_under_bf16_autocast_on_the_cpu():
    """bf16 autocast (what a GPU run uses) on the CPU: the matrix products run in bf16, the loss is taken in fp32,
    the weights stay fp32 and the loss is within bf16's rounding of the fp32 step's."""
    x, y = batch()
    seen = []
    eager, mixed = tiny(), tiny()
    mixed.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    fp32_loss = train_step(eager, (x, y), torch.optim.SGD(eager.parameters(), lr=0.1), None, 0.1, 4, 1.0)
    bf16_loss = train_step(mixed, (x, y), torch.optim.SGD(mixed.parameters(), lr=0.1), None, 0.1, 4, 1.0, bf16)
    assert seen == [torch.bfloat16] and bf16_loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    assert bf16_loss.item() == pytest.approx(fp32_loss.item(), rel=2e-2) and bf16_loss.item() != fp32_loss.item()
    moved = [(a - b).abs().max().item() for a, b in zip(mixed.parameters(), eager.parameters(), strict=True)]
    assert 0 < max(moved) < 1e-2, "the same step, up to bf16 rounding"


@pytest.mark.slow  # inductor compiles forward and backward: about a minute of CPU
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler")
def test_a_compiled_training_step_on_the_cpu_matches_eager():
    """A real ``torch.compile`` (inductor, forward and backward) of two AdamW steps: no fallback to eager, and
    the same losses and weights as the eager steps, to float32 reordering. The key bias is the exception: its
    exact gradient is 0 (softmax ignores a constant added to a row of scores), so in float32 it is rounding
    noise, which Adam divides by its own size: each run moves it by up to the rate per step, in a direction the
    kernels decide (measured on an AMD EPYC: 1.0e-5 apart with ATen's AVX2 kernels, 6.8e-6 with AVX-512's)."""
    x, y = batch()
    eager, model = tiny(), tiny()
    exact = tiny().double()
    F.cross_entropy(exact(x).flatten(0, 1), y.flatten()).backward()
    noise = {n: p.grad.abs() < 1e-12 for n, p in exact.named_parameters()}  # float64: 0 in exact arithmetic
    zero = {n: z.nonzero().flatten().tolist() for n, z in noise.items() if z.any()}
    assert zero == {"blocks.0.attn.qkv.bias": list(range(16, 32))}, zero  # [q; k; v], d = 16 each: k's bias
    forward = Forward(model, compiled=True)
    lr, steps = 1e-2, 2
    opt_e, opt_c = (torch.optim.AdamW(m.parameters(), lr=lr) for m in (eager, model))
    for _ in range(steps):
        want = train_step(eager, (x, y), opt_e, None, lr, 4, 1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback to eager warns: here it fails the test
            got = forward.call(lambda: train_step(forward.train, (x, y), opt_c, None, lr, 4, 1.0), opt_c.zero_grad)
        assert got.item() == pytest.approx(want.item(), rel=1e-4)
    assert forward.compiled, "the compiler ran; no fallback to eager"
    for (name, a), b in zip(model.named_parameters(), eager.parameters(), strict=True):
        z = noise[name]
        torch.testing.assert_close(a[~z], b[~z], rtol=1e-3, atol=1e-5)
        # each run: Adam's bias-corrected step is at most the rate (1.0014 times it at step 2), weight decay aside
        assert not z.any() or (a[z] - b[z]).abs().max().item() <= 2 * steps * lr * 1.01


def test_autocast_reaches_every_micro_batch_of_a_step_and_of_an_evaluation():
    x, y = batch()
    seen = []
    model = tiny()
    model.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    train_step(model, (x, y), torch.optim.SGD(model.parameters(), lr=0.1), None, 0.1, 2, 1.0, bf16)
    assert seen == [torch.bfloat16] * 2, "two micro-batches of 2, both under autocast"
    seen.clear()
    eval_loss(model, x, y, 1, bf16)
    assert seen == [torch.bfloat16] * 4
    seen.clear()
    eval_loss(model, x, y, 4, bf16)  # one pass
    assert seen == [torch.bfloat16]


def test_a_gradient_scaler_scales_the_loss_and_unscales_before_clipping_and_stepping():
    """With a GradScaler (fp16's companion) the step is the unscaled one: the loss is multiplied by the scale for
    backward, the gradients divided by it before they are clipped, and the optimizer steps on the true gradients."""
    x, y = batch()
    for clip in (1e-3, 0.0):  # clipped (to the true norm) and unclipped (the true gradients themselves)
        plain, scaled = tiny(), tiny()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        want = train_step(plain, (x, y), torch.optim.SGD(plain.parameters(), lr=0.1), None, 0.1, 2, clip)
        got = train_step(scaled, (x, y), torch.optim.SGD(scaled.parameters(), lr=0.1), scaler, 0.1, 2, clip)
        assert got.item() == pytest.approx(want.item(), rel=1e-6), "the loss returned is the unscaled one"
        for a, b in zip(scaled.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        assert scaler.get_scale() == 2.0**10, "no inf or NaN: the scale holds (it grows after 2000 good steps)"


def test_an_evaluation_in_one_pass_is_the_batch_loss():
    x, y = batch()
    model = tiny()
    for micro in (4, 8):  # the whole batch, or more than it: one pass
        assert eval_loss(model, x, y, micro).item() == batch_loss(model, x, y).item()
