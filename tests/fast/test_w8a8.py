"""The w8a8 format (modern_block/fast/w8a8.py): activations rounded to int8 per token within half a step, the
integer dot product exact, every product within the stated error bound of the fp32 one, smoothing exact in real
arithmetic and a gain where one channel is an outlier, and decoding that gives fp32's greedy tokens wherever
fp32's margin exceeds twice the measured logit error (the margin rule), on tiny models and on SmolLM2."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from test_fast import fresh_compiler, model_for, prompts  # noqa: F401 (a fixture)

from modern_block import generate
from modern_block.fast import decoding as fast
from modern_block.fast.agreement import LOGIT_BUDGET, check_agreement, logit_error
from modern_block.fast.profiling import decode_weight_bytes
from modern_block.fast.w8a8 import (
    W8A8Linear,
    activation_ranges,
    error_bound,
    int8_dot,
    int_mm_is_exact,
    quantize_activations,
    smoothing_factors,
)
from modern_block.fast.weights import StoredEmbedding, convert_weights, dequantize_int8, quantize_int8


def test_activations_are_rounded_per_token_within_half_a_step():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 40) * torch.logspace(-3, 2, 3)[:, None, None]  # tokens of very different sizes
    x[1, 2] = 0.0  # an all-zero token
    q, s = quantize_activations(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.shape == (3, 4, 1) and s.dtype == torch.float32
    assert ((x - q.float() * s).abs() <= s / 2 * (1 + 1e-6)).all()  # the bound, token by token
    assert (q.abs().amax(-1)[torch.arange(3) != 1] == 127).all()  # each token's largest |x| maps to +-127
    assert (q[1, 2] == 0).all() and s[1, 2] == 1 and int(q.min()) >= -127


def test_the_integer_dot_product_is_exact():
    torch.manual_seed(1)
    xq = torch.randint(-127, 128, (3, 70), dtype=torch.int8)
    wq = torch.randint(-127, 128, (9, 70), dtype=torch.int8)
    sums = 128 * wq.sum(1, dtype=torch.int32)  # [9]
    exact = xq.int() @ wq.int().t()  # [3, 9]
    for kernel in (int_mm_is_exact(), False):  # this CPU's kernel where it is exact, and the plain int32 product
        got = int8_dot(xq, wq.t(), sums, kernel)
        assert got.dtype == torch.int32 and torch.equal(got, exact), kernel


def test_a_cpu_whose_integer_kernel_saturates_takes_the_plain_product():
    """Without VNNI (here: oneDNN held to AVX-512 without it), oneDNN sums u8 * s8 pairs in 16 bits and saturates:
    the probe says so, and a layer built there gives the exact product all the same."""
    code = ("import torch\nfrom modern_block.fast.w8a8 import int8_dot, int_mm_is_exact\n"
            "x = torch.full((2, 64), 127, dtype=torch.int8)\nw = torch.full((64, 3), 127, dtype=torch.int8)\n"
            "sums = 128 * w.t().sum(1, dtype=torch.int32)\nok = int_mm_is_exact()\n"
            "got = int8_dot(x, w, sums, ok)\nprint(ok, torch.equal(got, x.int() @ w.int()))")
    for isa in ("AVX512_CORE", None):
        env = dict(os.environ, **({"ONEDNN_MAX_CPU_ISA": isa} if isa else {}))
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        kernel_ok, equal = done.stdout.split()
        assert equal == "True", done  # exact whichever path the probe chose
        if isa == "AVX512_CORE":
            assert kernel_ok == "False", "oneDNN without VNNI saturates u8 * s8 pairs: the probe must see it"


def _w8a8(w, amax=None):
    c = None if amax is None else smoothing_factors(amax, w)
    q, s = quantize_int8(w if c is None else w * c)
    smooth = None if c is None else nn.Parameter(1 / c, requires_grad=False)
    return W8A8Linear(nn.Parameter(q, requires_grad=False), nn.Parameter(s, requires_grad=False), smooth)


def test_every_product_is_within_the_error_bound_and_the_bound_is_not_vacuous():
    torch.manual_seed(2)
    w, x = torch.randn(48, 64) / 8, torch.randn(2, 5, 64)
    lin = _w8a8(w)
    got, want = lin(x), x @ w.T  # [2, 5, 48]
    bound = error_bound(x, lin.weight, lin.scales)  # [2, 5, 48]
    assert bound.shape == want.shape and ((got - want).abs() <= bound * (1 + 1e-5) + 1e-6).all()
    # a worst case (every element off by half a step, all in one direction), yet a hundredth of the most the
    # product itself could be (||x||_1 times the row's largest |w|)
    assert (bound < 0.02 * x.abs().sum(-1, keepdim=True) * w.abs().amax(1)).all()
    # the activations' rounding is what w8a8 adds: weight-only int8 (the same weights, exact x) is closer
    weight_only = x @ dequantize_int8(lin.weight, lin.scales).T
    assert (got - want).abs().mean() > (weight_only - want).abs().mean()


def test_a_product_outside_the_bound_is_caught():
    """The bound is not automatic: an activation scale twice too small clips the largest entries and breaks it."""
    torch.manual_seed(3)
    w, x = torch.randn(16, 32) / 6, torch.randn(4, 32)
    lin = _w8a8(w)
    q, s = quantize_activations(x)
    s_bad = s / 2
    q_bad = torch.round(x / s_bad).clamp(-127, 127)
    bad = (q_bad @ lin.weight.float().T) * s_bad * lin.scales.float()
    assert ((bad - x @ w.T).abs() > error_bound(x, lin.weight, lin.scales)).any()


def test_smoothing_is_exact_in_real_arithmetic_and_helps_an_outlier_channel():
    torch.manual_seed(4)
    w = torch.randn(32, 64) / 8
    x = torch.randn(200, 64)
    x[:, 5] *= 60  # one channel far larger than the others, as in LLM activations
    c = smoothing_factors(x.abs().amax(0), w)  # [64]
    torch.testing.assert_close((x / c) @ (w * c).T, x @ w.T, rtol=1e-4, atol=1e-4)
    assert c[5] == c.max()  # the outlier channel is divided the most
    plain, smooth = _w8a8(w), _w8a8(w, x.abs().amax(0))
    err = {name: ((lin(x) - x @ w.T).norm() / (x @ w.T).norm()).item() for name, lin in
           (("plain", plain), ("smooth", smooth))}
    assert err["smooth"] < 0.5 * err["plain"]


def test_activation_ranges_are_each_linears_largest_input():
    model = model_for("gqa-qknorm")
    fm = fast.prepare(model, compile=False).model
    ids = prompts(batch=2, length=7)
    ranges = activation_ranges(fm, ids)
    seen = {}
    hook = fm.head.register_forward_hook(lambda m, i, o: seen.setdefault("x", i[0]))
    with torch.no_grad():
        fm(ids)
    hook.remove()
    assert set(ranges) == {n for n, m in fm.named_modules() if isinstance(m, nn.Linear)}
    torch.testing.assert_close(ranges["head"], seen["x"].abs().reshape(-1, seen["x"].shape[-1]).amax(0))
    assert all(len(h) == 0 for m in fm.modules() for h in (m._forward_hooks,))  # the hooks are gone


@pytest.mark.parametrize("name", ["gqa-qknorm", "mqa-tied-llama", "qwen3-head_dim12-tied", "gpt2", "mla"])
def test_w8a8_decodes_the_fp32_tokens_under_the_margin_rule(name):
    """Greedy tokens agree with fp32's wherever fp32's margin exceeds twice the largest logit difference the
    format makes on those tokens; the logits stay close; bytes per token are int8's (plus each row's shift sum)."""
    model = model_for(name)
    idx = prompts()
    T0, n = idx.shape[1], 12
    calibration = prompts(batch=2, length=16, seed=7)  # other tokens than the prompts'
    fm = fast.prepare(model, compile=False, weights="w8a8", calibration=calibration)
    m = fm.model
    assert isinstance(m.emb, StoredEmbedding) and fm.dtype == torch.float32
    assert any(isinstance(x, W8A8Linear) for x in m.modules()) and not m.tied  # a smoothed head is its own matrix
    kept = [n for n, x in m.named_modules() if type(x) is nn.Linear and x.bias is None]
    assert all(n.endswith(("w_uk", "w_uv")) for n in kept)  # as the int8 format: only MLA's absorbed ones stay
    want = generate(model, idx, n)  # [B, T0 + n]
    got = fast.generate(fm, idx, n)
    with torch.no_grad():
        ref, mine = model(want[:, :-1])[:, T0 - 1:], m(want[:, :-1])[:, T0 - 1:]  # [B, n, V]
    err = logit_error(ref, mine)
    assert 0 < err <= LOGIT_BUDGET["w8a8"] * ref.abs().amax().item()  # its budget (fast/agreement.py)
    check_agreement(ref, want[:, T0:], got[:, T0:], err, what=f"w8a8 against fp32 ({name})")
    int8 = decode_weight_bytes(fast.prepare(model, compile=False, weights="int8").model)
    assert decode_weight_bytes(m) <= 1.25 * int8 + 4 * model.V * model.emb.weight.shape[1] // 100


def test_unsmoothed_w8a8_keeps_a_tied_head_tied():
    model = model_for("mqa-tied-llama")
    m = convert_weights(fast.prepare(model, compile=False).model, "w8a8")
    assert m.tied and isinstance(m.head, W8A8Linear) and m.head.smooth is None


def test_bad_input_is_refused_with_the_rule():
    model = model_for("gqa-qknorm")
    ids = prompts()
    with pytest.raises(ValueError, match="calibration .* is required with weights='w8a8'"):
        fast.prepare(model, compile=False, weights="w8a8")
    with pytest.raises(ValueError, match="used by it alone"):
        fast.prepare(model, compile=False, weights="int8", calibration=ids)
    with pytest.raises(TypeError, match="calibration: idx must hold integer token ids"):
        fast.prepare(model, compile=False, weights="w8a8", calibration=ids.float())
    with pytest.raises(ValueError, match="calibration: .*shape"):
        fast.prepare(model, compile=False, weights="w8a8", calibration=ids[0])
    fm = fast.prepare(model, compile=False).model
    with pytest.raises(ValueError, match="ranges must hold 'head'"):
        convert_weights(fm, "w8a8", {"blocks.0.attn.wqkv": torch.ones(32)})
    with pytest.raises(ValueError, match="apply to weights='w8a8' only"):
        convert_weights(fm, "int8", {})
    with pytest.raises(ValueError, match="one |x| >= 0 per input channel"):
        smoothing_factors(torch.ones(3), torch.ones(4, 5))


@pytest.fixture(scope="module")
def smollm2():
    from modern_block.interop import load_gguf

    return load_gguf(tokenizer=True)


def test_smollm2_w8a8_follows_the_margin_rule_and_its_error_is_measured(smollm2):
    """The real checkpoint, lesson 10's chat prompt: 16 greedy tokens against fp32's under the margin rule (the
    calibration text apart from the prompt), and a logit error of the order of weight-only int8's: rounding the
    activations as well at most doubles it."""
    model, tok = smollm2
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    calibration = tok("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the "
                      "slings and arrows of outrageous fortune", return_tensors="pt")["input_ids"]
    fm = fast.prepare(model, compile=False, weights="w8a8", calibration=calibration)
    T0, n = chat.shape[1], 16
    want = generate(model, chat, n)
    got = fast.generate(fm, chat, n)
    with torch.no_grad():
        ref, mine = model(want[:, :-1])[:, T0 - 1:], fm.model(want[:, :-1])[:, T0 - 1:]  # [1, n, V]
        int8 = fast.prepare(model, compile=False, weights="int8").model(want[:, :-1])[:, T0 - 1:]
    err = logit_error(ref, mine)
    assert logit_error(ref, int8) < err < 2.5 * logit_error(ref, int8)
    assert err <= LOGIT_BUDGET["w8a8"] * ref.abs().amax().item()
    check_agreement(ref, want[:, T0:], got[:, T0:], err, what="SmolLM2 w8a8 against fp32")


@pytest.mark.slow
def test_the_compiled_w8a8_step_gives_the_eager_logits(fresh_compiler):  # noqa: F811
    """Under torch.compile (the decode step) the integer kernel runs inside the generated graph: the same logits
    as eager, to float rounding (the integer part is exact)."""
    model = model_for("gqa-qknorm")
    calibration = prompts(batch=2, length=16, seed=7)
    eager = fast.prepare(model, compile=False, weights="w8a8", calibration=calibration)
    compiled = fast.prepare(model, weights="w8a8", calibration=calibration)
    idx = prompts(batch=1, length=9)
    from test_fast import step_by_step

    torch.testing.assert_close(step_by_step(compiled, idx, 4), step_by_step(eager, idx, 4), atol=1e-4, rtol=1e-4)
