"""The classroom assignments: solutions, generated exercises and the diagnosing checks.

* exercises/ is what ``python -m modern_block exercises build`` makes from solutions/ (CI fails if stale);
* every solution notebook has its exercises, answers and check outputs (the grader's own tests, in
  test_grade.py, grade them: every solution passes, every untouched exercise is "not attempted");
* each check accepts the package's own implementation and rejects realistic wrong ones with the right
  diagnosis (the wrong implementations are written out below, one mistake each);
"""

import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from check_helpers import named, rejects
from test_lesson10 import bytes_per_token_ok, floor_ms_ok, quantize_row_int8_ok
from test_lesson11 import (
    active_parameters_ok,
    kv_bytes_per_token_ok,
    kv_cache_at_ok,
    moe_ffn_parameters_ok,
    smallest_multiple_of_ok,
)

import modern_block as mb
from modern_block.classroom import checks, exercises
from modern_block.classroom.checks import CheckFailed, NotAttempted
from modern_block.classroom.grading.notebook import CHECK_CALL, read_notebook, reference_from, sections
from modern_block.training.statistics import holm
from modern_block.training.statistics import verdict as verdict_text

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
LESSONS = ["00_gpt2_block", "01_rmsnorm", "02_swiglu", "03_rope", "04_gqa_kv_cache", "05_mla", "06_qk_norm",
           "07_llama_block", "08_train_llama_vs_gpt2", "08b_ladder_and_ablations", "09_real_model", "09b_rope_scaling",
           "10_fast_decoding", "11_read_any_config"]


# ---- the right implementations (the package's own, or thin wrappers) pass -----------------------------


def rms_ok(x, eps=1e-6):
    return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()


def ffn_weight_count_ok(d, d_ff, gated):
    return (3 if gated else 2) * d * d_ff


def repeat_kv_ok(k, n_rep):
    return k.repeat_interleave(n_rep, dim=1)


def attend_cached_ok(attn, x, cos, sin, cache, *, positions="offset", store="rotated", mask="offset", heads="kv"):
    """The right cached attention; the keyword knobs switch in one mistake each for the tests below."""
    B, T, _ = x.shape
    q = attn.wq(x).view(B, T, attn.h, attn.dh).transpose(1, 2)
    k = attn.wk(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
    v = attn.wv(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
    q, k = attn.q_norm(q), attn.k_norm(k)
    past = 0 if cache["k"] is None else cache["k"].shape[2]
    start = past if positions == "offset" else 0
    c, s = cos[start:start + T], sin[start:start + T]
    q, k = mb.apply_rope(q, c, s), mb.apply_rope(k, c, s)
    if heads == "h":
        k, v = k.repeat_interleave(attn.h // attn.kv, 1), v.repeat_interleave(attn.h // attn.kv, 1)
    if cache["k"] is not None:
        k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
    cache["k"], cache["v"] = k, v
    S = k.shape[2]
    if mask == "offset":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, S, dtype=torch.bool).tril(S - T),
                                             enable_gqa=True)
    else:  # is_causal=True whatever the cache holds
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return attn.wo(out.transpose(1, 2).reshape(B, T, -1))


def mla_cache_bytes_ok(n_layers, d_c, d_r, bytes_per_elem=2):
    return n_layers * (d_c + d_r) * bytes_per_elem


def split_kv_b(q_nope, w_kv_b):
    """W_UK [h, d_nope, d_c] and W_UV [h, d_v, d_c] from DeepSeek's fused kv_b_proj weight."""
    h, dn = q_nope.shape[1], q_nope.shape[-1]
    per_head = w_kv_b.view(h, -1, w_kv_b.shape[-1])  # [h, d_nope + d_v, d_c]
    return per_head[:, :dn], per_head[:, dn:]


def absorb_query_ok(q_nope, w_kv_b):
    return torch.einsum("bhtn,hnc->bhtc", q_nope, split_kv_b(q_nope, w_kv_b)[0])


def absorbed_scores_ok(q_nope, q_rope, latent, k_rope, w_kv_b, scale, *, rope=True, own_scale=False):
    s = absorb_query_ok(q_nope, w_kv_b) @ latent.unsqueeze(1).transpose(-1, -2)
    if rope:
        s = s + q_rope @ k_rope.unsqueeze(1).transpose(-1, -2)
    return s * (q_nope.shape[-1] ** -0.5 if own_scale else scale)


def absorbed_attention_ok(q_nope, q_rope, latent, k_rope, w_kv_b, scale, *, mask="offset", values=True):
    s = absorbed_scores_ok(q_nope, q_rope, latent, k_rope, w_kv_b, scale)
    T, S = s.shape[-2:]
    if mask != "none":
        keep = torch.ones(T, S, dtype=torch.bool).tril(S - T if mask == "offset" else 0)
        s = s.masked_fill(~keep, float("-inf"))
    mixed = s.softmax(-1) @ latent.unsqueeze(1)  # [B, h, T, d_c]
    return torch.einsum("bhtc,hvc->bhtv", mixed, split_kv_b(q_nope, w_kv_b)[1]) if values else mixed


def qk_norm_rope_ok(q, k, q_norm, k_norm, cos, sin):
    return mb.apply_rope(q_norm(q), cos, sin), mb.apply_rope(k_norm(k), cos, sin)


class QKNormAttentionOk(mb.GQAttention):
    def __init__(self, d, n_heads, n_kv_heads):
        super().__init__(d, n_heads, n_kv_heads, qk_norm=True)


def llama_param_count_ok(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True, qkv_bias=False, *,
                         kv_full=False, norms=True, head_if_tied=False, biases=True):
    """By formula (the keyword knobs switch in one mistake each); test_param_formula checks it on real models."""
    dh = d // n_heads
    kv = n_heads if kv_full else n_kv_heads
    layer = 2 * d * n_heads * dh + 2 * d * kv * dh + 3 * d * d_ff
    layer += (n_heads * dh + 2 * kv * dh) if qkv_bias and biases else 0
    layer += (2 * d + (2 * dh if qk_norm else 0)) if norms else 0
    return V * d + n_layers * layer + (d if norms else 0) + (V * d if not tie or head_if_tied else 0)


@pytest.mark.parametrize("config", [(1000, 256, 4, 8, 2, 688), (500, 64, 3, 4, 1, 160), (300, 48, 2, 6, 3, 128)])
@pytest.mark.parametrize("tie, qk_norm", [(False, True), (True, True), (False, False)])
def test_param_formula(config, tie, qk_norm):
    model = mb.LlamaStyleLM(*config, max_len=4, tie=tie, qk_norm=qk_norm)
    assert llama_param_count_ok(*config, tie=tie, qk_norm=qk_norm) == model.num_parameters()


@pytest.mark.parametrize("config", [(1000, 256, 4, 8, 2, 688), (500, 64, 3, 4, 1, 160)])
def test_param_formula_with_qkv_biases(config):
    model = mb.LlamaStyleLM(*config, max_len=4, qkv_bias=True)
    assert llama_param_count_ok(*config, qkv_bias=True) == model.num_parameters()


def gpt2_block_params_ok(d, d_ff=None):
    d_ff = 4 * d if d_ff is None else d_ff
    return 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (2 * d * d_ff + d_ff + d)


def causal_attention_ok(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gpt2_attention_ok(x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
    """Through the package's own GPT-2 attention, these weights loaded in its order (fused q/k/v, then output)."""
    attn = mb.CausalSelfAttention(x.shape[-1], n_heads)
    attn.load_state_dict(dict(zip(attn.state_dict(), (w_qkv, b_qkv, w_proj, b_proj), strict=True)))
    return attn(x)


def lr_at_ok(step, lr, min_lr, warmup_steps, max_steps):
    """The package's trainer's schedule, the one lesson 08 teaches."""
    from types import SimpleNamespace

    from modern_block.training.config import lr_at

    return lr_at(step, SimpleNamespace(lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, max_steps=max_steps))


def flops_per_token_ok(n_matmul_params, n_layers, n_heads, head_dim, seq_len):
    from modern_block.training.device import flops_per_token

    return flops_per_token(n_matmul_params, n_layers, n_heads, head_dim, seq_len)


def unfair_differences_ok(a, b, compared=("arch",), size_tolerance=0.02, *, mistake=None):
    keys = set(a) if mistake == "keys_of_a" else set(a) | set(b)
    bad = []
    for key in keys:
        if key in compared and mistake != "compared":
            continue
        if key not in a or key not in b:
            bad.append(key)
        elif key == "n_params" and mistake != "exact":
            if abs(b[key] - a[key]) > size_tolerance * a[key]:
                bad.append(key)
        elif a[key] != b[key]:
            bad.append(key)
    return sorted(bad, reverse=mistake == "unsorted")


with torch.device("meta"):
    GPT2_SMALL_PARAMS = mb.count_parameters(mb.GPT2LM(50257, d=768, n_layers=12, n_heads=12, max_len=1024))
LLAMA3_70B_D_FF = mb.PRESETS["Llama 3 70B"].d_ff
KIMI_K2_CACHE_BYTES = mb.PRESETS["Kimi K2"].bytes_per_token()
LLAMA3_8B_TRAIN_FLOPS = 6 * 8.03e9 * 15e12
SMOLLM2_CACHE_BYTES = mb.kv_cache_bytes_per_token(30, 3, 64)


def ntk_scaled_base_ok(base, dh, kappa):
    return base * kappa ** (dh / (dh - 2))


def dequantize_q4_0_ok(raw, *, mistake=None):
    """Q4_0 dequantization as a student writes it, or with one of the usual mistakes."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()
    lo, hi = (blocks[:, 2:] & 0x0F).float(), (blocks[:, 2:] >> 4).float()
    q = torch.cat([hi, lo], 1) if mistake == "nibbles" else torch.cat([lo, hi], 1)
    w = {"not_centred": d * q, "signed": d * torch.where(q >= 8, q - 16, q)}.get(mistake, d * (q - 8))
    return w.reshape(raw.shape[0], -1).double() if mistake == "float64" else w.reshape(raw.shape[0], -1)


def test_the_q4_0_reference_is_ggufs():
    gguf = pytest.importorskip("gguf")
    from modern_block.classroom.checks.lesson09 import _q4_0_bytes

    raw = _q4_0_bytes(torch.Generator().manual_seed(0), 3, 5)
    want = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.Q4_0)
    torch.testing.assert_close(dequantize_q4_0_ok(raw), torch.from_numpy(want).float())


def unpermute_qk_ok(wq, wk, wv, n_heads, n_kv_heads, *, mistake=None):
    half = lambda w, n: mb.permute_qk_weight(w, n, "half_split")  # noqa: E731
    if mistake == "twice":
        return half(half(wq, n_heads), n_heads), half(half(wk, n_kv_heads), n_kv_heads), wv
    if mistake == "values":
        return half(wq, n_heads), half(wk, n_kv_heads), half(wv, n_kv_heads)
    if mistake == "key_heads":
        return half(wq, n_heads), half(wk, n_heads if wk.shape[0] % n_heads == 0 else n_kv_heads), wv
    return half(wq, n_heads), half(wk, n_kv_heads), wv


def rope_tables_variant(mistake):
    def rope_tables(positions, dh, base=10000.0):
        if mistake == "base_ignored":
            base = 10000.0
        i = torch.arange(0, dh, 2).float()
        theta = base ** (-(i / 2) / dh) if mistake == "i_over_dh" else base ** (-i / dh)
        pos = positions.float() + (1 if mistake == "from_1" else 0)
        if mistake == "in_order":
            pos = torch.arange(len(positions)).float()
        ang = torch.outer(pos, theta)
        if mistake == "full_width":
            ang = torch.cat([ang, ang], -1)
        return ang.cos(), ang.sin()

    return rope_tables


@pytest.mark.parametrize("mistake, diagnosis", [
    ("i_over_dh", "the exponent is i/dh"), ("from_1", "positions are off by one"),
    ("base_ignored", "the base argument is ignored"), ("full_width", "duplicated to dh columns"),
    ("in_order", "the positions given were ignored"),
])
def test_check_rope_cache_diagnoses(mistake, diagnosis):
    rejects(checks.check_rope_cache, rope_tables_variant(mistake), diagnosis)
    checks.check_rope_cache(rope_tables_variant(None))


def rope_per_sequence(x, cos, sin):  # per-sequence tables [B, T, dh/2] in the half-split layout
    return mb.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1))


def rope_interleaved_per_sequence(x, cos, sin):
    return mb.apply_rope_interleaved(x, cos.unsqueeze(1), sin.unsqueeze(1))


class SandwichBlockOk(nn.Module):
    """Exercise 07.1: the pre-norm block with a norm on each sub-layer's output (Gemma 2 and 3); ``mistake``
    switches in one mistake."""

    mistake = None

    def __init__(self, d, n_heads, n_kv_heads, d_ff):
        super().__init__()
        self.attn_norm, self.attn, self.attn_post_norm = mb.RMSNorm(d), mb.GQAttention(d, n_heads, n_kv_heads), \
            mb.RMSNorm(d)
        self.ffn_norm, self.ffn, self.ffn_post_norm = mb.RMSNorm(d), mb.SwiGLU(d, d_ff), mb.RMSNorm(d)

    def forward(self, x, cos, sin):
        m = self.mistake
        if m == "plain":  # lesson 07's block, copied
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.ffn(self.ffn_norm(x))
        if m == "on_sum":
            x = self.attn_post_norm(x + self.attn(self.attn_norm(x), cos, sin))
            return self.ffn_post_norm(x + self.ffn(self.ffn_norm(x)))
        if m == "parallel":
            return x + self.attn_post_norm(self.attn(self.attn_norm(x), cos, sin)) + \
                self.ffn_post_norm(self.ffn(self.ffn_norm(x)))
        x = x + self.attn_post_norm(self.attn(self.attn_norm(x), cos, sin))
        if m == "no_ffn_residual":
            return self.ffn_post_norm(self.ffn(self.ffn_norm(x)))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))


class LMVariant(mb.LlamaStyleLM):
    mistake = None

    def __init__(self, V, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, max_len=1024, rope_base=10000.0,
                 tie=False, scale_emb=False):
        super().__init__(V, d, n_layers, n_heads, n_kv_heads, d_ff, max_len, rope_base, tie=False)
        self.factor = math.sqrt(d) if scale_emb and self.mistake != "not_scaled" else 1.0
        if self.mistake == "no_final_norm":
            self.norm = nn.Identity()
        if tie:
            if self.mistake == "tie_by_copy":
                self.head.weight = nn.Parameter(self.emb.weight.detach().clone())
            else:
                self.head.weight = self.emb.weight
        if self.mistake == "persistent_tables":
            self.register_buffer("cos", self.rope.cos.clone(), persistent=True)
        if self.mistake == "base_ignored":
            self.rope = mb.RotaryEmbedding(d // n_heads, max_len)  # the default base, whatever rope_base says

    def forward(self, idx):  # the package's forward, with Gemma's embedding scale
        cos, sin = self.rope(torch.arange(idx.shape[1]))
        x = self.emb(idx) * self.factor
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


RIGHT = [
    (checks.check_gpt2_block_params, gpt2_block_params_ok), (checks.check_causal_attention, causal_attention_ok),
    (checks.check_gpt2_attention, gpt2_attention_ok), (checks.check_gpt2_small_params, GPT2_SMALL_PARAMS),
    (checks.check_rms, rms_ok), (checks.check_rmsnorm, mb.RMSNorm),
    (checks.check_swiglu_hidden_dim, mb.swiglu_hidden_dim), (checks.check_swiglu, mb.SwiGLU),
    (checks.check_ffn_weight_count, ffn_weight_count_ok), (checks.check_llama3_70b_d_ff, LLAMA3_70B_D_FF),
    (checks.check_rope_cache, rope_tables_variant(None)), (checks.check_apply_rope, rope_per_sequence),
    (checks.check_apply_rope_interleaved, rope_interleaved_per_sequence),
    (checks.check_repeat_kv, repeat_kv_ok), (checks.check_gqattention, mb.GQAttention),
    (checks.check_kv_cache, attend_cached_ok),
    (checks.check_mla_cache_bytes, mla_cache_bytes_ok), (checks.check_absorb_query, absorb_query_ok),
    (checks.check_absorbed_scores, absorbed_scores_ok), (checks.check_mla_absorption, absorbed_attention_ok),
    (checks.check_kimi_k2_cache_bytes, KIMI_K2_CACHE_BYTES),
    (checks.check_qk_norm_rope, qk_norm_rope_ok), (checks.check_qk_norm_attention, QKNormAttentionOk),
    (checks.check_block, SandwichBlockOk), (checks.check_llama_lm, LMVariant),
    (checks.check_llama_param_count, llama_param_count_ok),
    (checks.check_lr_schedule, lr_at_ok), (checks.check_flops_per_token, flops_per_token_ok),
    (checks.check_fair_comparison, unfair_differences_ok), (checks.check_llama3_8b_train_flops, LLAMA3_8B_TRAIN_FLOPS),
    (checks.check_verdict, verdict_text), (checks.check_holm, holm),
    (checks.check_llama3_rope_scaling, lambda dh, base, *rule: mb.llama3_frequencies(mb.rope_frequencies(dh, base),
                                                                                       *rule)),
    (checks.check_ntk_scaled_base, ntk_scaled_base_ok),
    (checks.check_smollm2_cache_bytes, SMOLLM2_CACHE_BYTES),
    (checks.check_dequantize_q4_0, dequantize_q4_0_ok), (checks.check_unpermute_qk, unpermute_qk_ok),
    (checks.check_bytes_per_token, bytes_per_token_ok), (checks.check_floor_ms, floor_ms_ok),
    (checks.check_quantize_row_int8, quantize_row_int8_ok),  # lesson 10's: the mistakes in test_lesson10.py
    (checks.check_kv_bytes_per_token, kv_bytes_per_token_ok), (checks.check_active_parameters, active_parameters_ok),
    (checks.check_smallest_multiple_of, smallest_multiple_of_ok),
    (checks.check_moe_ffn_parameters, moe_ffn_parameters_ok),
    (checks.check_kv_cache_at, kv_cache_at_ok),  # lesson 11's: the mistakes in test_lesson11.py
]
FUNCTIONS = [(check, impl) for check, impl in RIGHT if callable(impl)]  # the rest are numbers, graded by value


@pytest.mark.parametrize("check, impl", RIGHT, ids=[c.__name__ for c, _ in RIGHT])
def test_check_accepts_the_reference(check, impl, capsys):
    check(impl)
    assert capsys.readouterr().out.startswith(f"✓ {check.__name__} passed")


def test_every_check_is_covered_here():
    assert {c.__name__ for c, _ in RIGHT} == {n for n in checks.__all__ if n.startswith("check_")}


@pytest.mark.parametrize("check, impl", FUNCTIONS, ids=[c.__name__ for c, _ in FUNCTIONS])
def test_a_stub_is_not_attempted(check, impl):
    def stub(*args, **kwargs):
        raise NotImplementedError("write this")

    stub_class = type("Stub", (nn.Module,), {"__init__": stub})
    with pytest.raises(NotAttempted, match="not implemented yet.*write this"):
        check(stub_class if isinstance(impl, type) else stub)


def test_checks_leave_the_global_random_state_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    checks.check_rmsnorm(mb.RMSNorm)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_crash_in_student_code_is_reported_with_the_call():
    def crashes(x, eps=1e-6):
        return x @ x  # shapes do not fit

    message = rejects(checks.check_rms, crashes, "rms on x of shape [2, 3, 16] raised RuntimeError")
    assert "Likely mistake" not in message


# ---- lesson 00: the GPT-2 block -------------------------------------------------------------------------


def test_the_gpt2_figures_agree_with_the_package():
    for d, d_ff in [(768, None), (64, 100)]:
        assert gpt2_block_params_ok(d, d_ff) == mb.count_parameters(mb.GPT2Block(d, n_heads=4, d_ff=d_ff))
    assert GPT2_SMALL_PARAMS == 124_439_808


def test_check_gpt2_block_params_diagnoses():
    rejects(checks.check_gpt2_block_params, lambda d, d_ff=None: 4 * d * d + 2 * d * (d_ff or 4 * d),
            "no biases and no LayerNorms")
    with pytest.raises(CheckFailed) as info:  # 2d short: three slips give it for every d, so all three are named
        checks.check_gpt2_block_params(lambda d, d_ff=None: gpt2_block_params_ok(d, d_ff) - 2 * d)
    assert [n.split(":")[0] for n in named(str(info.value))] == [
        "each LayerNorm was counted with one vector", "one LayerNorm was counted", "the q/k/v bias was counted with d "
                                                                                   "entries"]
    rejects(checks.check_gpt2_block_params, lambda d, d_ff=None: gpt2_block_params_ok(d), "d_ff was ignored")


def test_check_causal_attention_diagnoses():
    rejects(checks.check_causal_attention, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "no causal mask")
    rejects(checks.check_causal_attention, lambda q, k, v: (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(
        torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).triu(1), 0.0).softmax(-1) @ v,
        "set to 0 instead of -inf")
    rejects(checks.check_causal_attention, lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=1 / q.shape[-1]), "divided by dh")

    def naive_softmax(q, k, v):  # exp without subtracting the maximum overflows on large scores
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return (s.exp() / s.exp().sum(-1, keepdim=True)) @ v

    rejects(checks.check_causal_attention, naive_softmax, "exp overflows", "inf or NaN")


def test_check_gpt2_attention_diagnoses():
    def variant(order="qkv", merge="ok", bias=True):
        def gpt2_attention(x, w_qkv, b_qkv, w_proj, b_proj, n_heads):
            B, T, d = x.shape
            parts = dict(zip("qkv", (x @ w_qkv.T + (b_qkv if bias else 0)).split(d, -1), strict=True))
            q, k, v = (parts[c].view(B, T, n_heads, d // n_heads).transpose(1, 2) for c in order)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out = out.transpose(1, 2).reshape(B, T, d) if merge == "ok" else out.reshape(B, T, d)
            return out @ w_proj.T + b_proj

        return gpt2_attention

    checks.check_gpt2_attention(variant())
    rejects(checks.check_gpt2_attention, variant(order="kqv"), "the wrong order")
    rejects(checks.check_gpt2_attention, variant(merge="bad"), "without transposing back")
    rejects(checks.check_gpt2_attention, variant(bias=False), "b_qkv")


def test_check_gpt2_small_params_diagnoses():
    rejects(checks.check_gpt2_small_params, GPT2_SMALL_PARAMS + 50257 * 768, "ties it to the token embedding")
    rejects(checks.check_gpt2_small_params, GPT2_SMALL_PARAMS - 1024 * 768, "position table")
    rejects(checks.check_gpt2_small_params, float(GPT2_SMALL_PARAMS), "return a plain int")


# ---- lesson 01: RMSNorm ------------------------------------------------------------------------------


def test_right_values_in_the_wrong_dtype_are_named_as_such():
    def rms_float64(x, eps=1e-6):
        return (x.double().pow(2).mean(-1, keepdim=True) + eps).sqrt()

    def rope_cache_float64(positions, dh, base=10000.0):
        cos, sin = rope_tables_variant(None)(positions, dh, base)
        return cos.double(), sin.double()

    with pytest.raises(CheckFailed, match="values are right but the dtype is float64; return the float32"):
        checks.check_rms(rms_float64)
    with pytest.raises(CheckFailed, match="values are right but it is not float32; return float32 tables"):
        checks.check_rope_cache(rope_cache_float64)


def test_check_rms_rejects_wrong_statistics():
    rejects(checks.check_rms, lambda x, eps=1e-6: (x.float().var(-1, unbiased=False, keepdim=True) + eps).sqrt(),
            "the mean was subtracted")
    rejects(checks.check_rms, lambda x, eps=1e-6: x.float().pow(2).mean(-1, keepdim=True).sqrt() + eps,
            "eps was added outside the square root")
    rejects(checks.check_rms, lambda x, eps=1e-6: (x.pow(2).mean(-1, keepdim=True) + eps).sqrt(),
            "no float32 upcast", "float16")
    rejects(checks.check_rms, lambda x, eps=1e-6: (x.float().pow(2).mean(-1) + eps).sqrt(), "keepdim=True")


class RMSNormVariant(nn.Module):
    """RMSNorm with one switchable mistake."""

    mistake = None

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        m = self.mistake
        x32 = x if m == "no_upcast" else x.float()
        if m == "layernorm":
            x32 = x32 - x32.mean(-1, keepdim=True)
        ms = x32.pow(2).mean(-1, keepdim=True)
        y = x32 / (ms.sqrt() + self.eps) if m == "eps_outside" else x32 * torch.rsqrt(ms + self.eps)
        if m == "no_weight":
            return y.type_as(x)
        if m == "no_cast_back":
            return y * self.weight.float()
        return y.type_as(x) * self.weight


def variant(base, mistake):
    return type(f"{base.__name__}_{mistake}", (base,), {"mistake": mistake})


@pytest.mark.parametrize("mistake, diagnosis", [
    ("layernorm", "the mean was subtracted: that is LayerNorm"),
    ("eps_outside", "eps was added outside the square root"),
    ("no_upcast", "no float32 upcast"),
    ("no_weight", "self.weight is not applied"),
    ("no_cast_back", "the output dtype is float32"),
])
def test_check_rmsnorm_diagnoses(mistake, diagnosis):
    rejects(checks.check_rmsnorm, variant(RMSNormVariant, mistake), diagnosis)
    checks.check_rmsnorm(variant(RMSNormVariant, None))  # the switchable class itself is right


def test_check_rmsnorm_wants_the_weight_parameter():
    class NoWeight(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps, self.gamma = eps, nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x

    rejects(checks.check_rmsnorm, NoWeight, "self.weight = nn.Parameter(torch.ones(16))")
    rejects(checks.check_rmsnorm, lambda d, eps=1e-6: nn.LayerNorm(d, eps=eps), "no bias")


# ---- lesson 02: SwiGLU -------------------------------------------------------------------------------


def hidden_variant(mistake):
    def hidden(d, multiple_of=256, ffn_dim_multiplier=None):
        h = 4 * d if mistake == "4d" else int(2 * 4 * d / 3)
        if ffn_dim_multiplier is not None and mistake != "mult_after":
            h = int(ffn_dim_multiplier * h)
        if mistake == "floor":
            return multiple_of * (h // multiple_of)
        if mistake == "no_round":
            return h
        h = multiple_of * math.ceil(h / multiple_of)
        if mistake == "mult_after" and ffn_dim_multiplier is not None:
            h = int(ffn_dim_multiplier * h)
        return float(h) if mistake == "float" else h

    return hidden


@pytest.mark.parametrize("mistake, diagnosis", [
    ("4d", "used GPT-2's d_ff = 4d"), ("floor", "rounded down"), ("no_round", "not rounded up"),
    ("mult_after", "the multiplier was applied after rounding"), ("float", "return a plain int"),
])
def test_check_swiglu_hidden_dim_diagnoses(mistake, diagnosis):
    rejects(checks.check_swiglu_hidden_dim, hidden_variant(mistake), diagnosis)
    checks.check_swiglu_hidden_dim(hidden_variant(None))


class SwiGLUVariant(mb.SwiGLU):
    mistake = None

    def forward(self, x):
        g, u = self.w_gate(x), self.w_up(x)
        if self.mistake == "swapped":
            return self.w_down(F.silu(u) * g)
        if self.mistake == "gelu":
            return self.w_down(F.gelu(g) * u)
        if self.mistake == "silu_after":
            return self.w_down(F.silu(g * u))
        return self.w_down(F.silu(g) * u)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("swapped", "gate and up swapped"), ("gelu", "GELU instead of SiLU"), ("silu_after", "applied to the product"),
])
def test_check_swiglu_diagnoses(mistake, diagnosis):
    rejects(checks.check_swiglu, variant(SwiGLUVariant, mistake), diagnosis)


def test_check_swiglu_explains_a_layout_mismatch():
    class WithBiases(nn.Module):
        def __init__(self, d, d_ff):
            super().__init__()
            self.w_gate, self.w_up, self.w_down = nn.Linear(d, d_ff), nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    rejects(checks.check_swiglu, WithBiases, "unexpected w_gate.bias", "no biases")


def test_check_ffn_weight_count_diagnoses():
    rejects(checks.check_ffn_weight_count, lambda d, d_ff, gated: 3 * d * d_ff, "a GELU MLP has two matrices")
    rejects(checks.check_ffn_weight_count,
            lambda d, d_ff, gated: (3 if gated else 2) * d * d_ff + (2 if gated else 1) * d_ff + d,
            "biases were counted")


# ---- lesson 03: RoPE ---------------------------------------------------------------------------------


def rope_wrong_direction(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def rope_keeps_float32(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def test_check_apply_rope_diagnoses():
    rejects(checks.check_apply_rope, rope_interleaved_per_sequence, "the other RoPE layout", "interleaved")

    def lessons_cell(x, cos, sin):  # lesson 03's my_apply_rope, written for tables of shape [T, dh/2]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    rejects(checks.check_apply_rope, lessons_cell, "raised RuntimeError", "size of tensor")
    rejects(checks.check_apply_rope, rope_wrong_direction, "rotation in the wrong direction")
    rejects(checks.check_apply_rope, rope_keeps_float32, "keep x's dtype")


def test_check_apply_rope_interleaved_diagnoses():
    def written_back_split(x, cos, sin):
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    rejects(checks.check_apply_rope_interleaved, rope_per_sequence, "the other RoPE layout", "half-split")
    rejects(checks.check_apply_rope_interleaved, written_back_split, "written back half-split")


# ---- lesson 04: GQA and the KV cache ------------------------------------------------------------------


def test_check_repeat_kv_diagnoses():
    rejects(checks.check_repeat_kv, lambda k, n: k.repeat(1, n, 1, 1), "KV heads tiled (k.repeat)")
    rejects(checks.check_repeat_kv, lambda k, n: k.repeat_interleave(n, dim=2), "along the sequence")


class GQAVariant(nn.Module):
    """The chapter's GQAttention with one switchable mistake."""

    mistake = None

    def __init__(self, d, n_heads, n_kv_heads, qk_norm=True):
        super().__init__()
        self.h, self.kv, self.dh = n_heads, n_kv_heads, d // n_heads
        kv_out = d if self.mistake == "full_kv" else n_kv_heads * self.dh
        self.wq = nn.Linear(d, d, bias=False)
        self.wk, self.wv = nn.Linear(d, kv_out, bias=False), nn.Linear(d, kv_out, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.q_norm = mb.RMSNorm(self.dh) if qk_norm else nn.Identity()
        self.k_norm = mb.RMSNorm(self.dh) if qk_norm else nn.Identity()

    def forward(self, x, cos, sin):
        m = self.mistake or ""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.h, self.dh).transpose(1, 2)
        k = self.wk(x).view(B, T, self.kv, self.dh).transpose(1, 2)
        v = self.wv(x).view(B, T, self.kv, self.dh).transpose(1, 2)
        if "norm_after" not in m:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = mb.apply_rope(q, cos, sin), mb.apply_rope(k, cos, sin)
        if "norm_after" in m:
            q, k = self.q_norm(q), self.k_norm(k)
        rep = self.h // self.kv
        if "tiled" in m:
            k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
        else:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scale = 1 / self.dh if "scale_dh" in m else None
        out = F.scaled_dot_product_attention(q, k, v, is_causal="no_mask" not in m, scale=scale)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("mistake, diagnosis", [
    ("tiled", "KV heads tiled instead of grouped"), ("no_mask", "no causal mask"),
    ("scale_dh", "divided by head_dim"), ("norm_after", "QK-norm after RoPE"),
    ("tiled+no_mask", "two at once"), ("full_kv", "wk.weight has shape [32, 32], expected [16, 32]"),
])
def test_check_gqattention_diagnoses(mistake, diagnosis):
    message = rejects(checks.check_gqattention, variant(GQAVariant, mistake), diagnosis)
    if mistake == "tiled+no_mask":
        assert "tiled" in message and "no causal mask" in message
    checks.check_gqattention(variant(GQAVariant, None))


def test_check_kv_cache_notices_a_cache_that_is_never_filled():
    def rebinds_the_cache(attn, x, cos, sin, cache):
        return attend_cached_ok(attn, x, cos, sin, {"k": None, "v": None})

    rejects(checks.check_kv_cache, rebinds_the_cache, "attend only to themselves", "in place, not a new dict")


@pytest.mark.parametrize("knob, diagnosis", [
    (dict(positions="zero"), "as if they started at position 0"),
    (dict(mask="is_causal"), "aligns that mask to the top-left"),
    (dict(heads="h"), "the cache holds 4 heads"),
])
def test_check_kv_cache_diagnoses(knob, diagnosis):
    rejects(checks.check_kv_cache, lambda *a: attend_cached_ok(*a, **knob), diagnosis)


def test_check_kv_cache_wants_rotated_keys_in_the_cache():
    def rotates_the_whole_cache_every_step(attn, x, cos, sin, cache):
        B, T, _ = x.shape
        q = attn.q_norm(attn.wq(x).view(B, T, attn.h, attn.dh).transpose(1, 2))
        k = attn.k_norm(attn.wk(x).view(B, T, attn.kv, attn.dh).transpose(1, 2))
        v = attn.wv(x).view(B, T, attn.kv, attn.dh).transpose(1, 2)
        if cache["k"] is not None:
            k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
        cache["k"], cache["v"] = k, v  # raw keys
        S = k.shape[2]
        q = mb.apply_rope(q, cos[S - T:S], sin[S - T:S])
        k = mb.apply_rope(k, cos[:S], sin[:S])
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return attn.wo(out.transpose(1, 2).reshape(B, T, -1))

    rejects(checks.check_kv_cache, rotates_the_whole_cache_every_step, "holds the keys before RoPE")


# ---- lesson 05: MLA ----------------------------------------------------------------------------------


def test_check_mla_cache_bytes_diagnoses():
    rejects(checks.check_mla_cache_bytes, lambda L, c, r, b=2: 2 * L * (c + r) * b, "counted two tensors")
    rejects(checks.check_mla_cache_bytes, lambda L, c, r, b=2: L * c * b, "decoupled RoPE key was forgotten")


def test_check_absorb_query_diagnoses():
    rejects(checks.check_absorb_query, lambda q, w: torch.einsum("bhtn,hcn->bhtc", q, split_kv_b(q, w)[0]),
            "instead of its transpose")
    rejects(checks.check_absorb_query, lambda q, w: torch.einsum("bhtn,nc->bhtc", q, split_kv_b(q, w)[0][0]),
            "head 0's matrix")

    def split_by_blocks(q, w):  # the lesson's w_uk.weight.view(h, d_nope, d_c), on the fused matrix
        h, dn = q.shape[1], q.shape[-1]
        return torch.einsum("bhtn,hnc->bhtc", q, w[:h * dn].view(h, dn, -1))

    rejects(checks.check_absorb_query, split_by_blocks, "its rows go head by head")


def test_check_absorbed_scores_diagnoses():
    rejects(checks.check_absorbed_scores, lambda *a: absorbed_scores_ok(*a, rope=False), "the RoPE part is missing")
    rejects(checks.check_absorbed_scores, lambda *a: absorbed_scores_ok(*a, own_scale=True),
            "the scale argument is ignored (1/sqrt(d_nope))")


def test_check_mla_absorption_diagnoses():
    rejects(checks.check_mla_absorption, lambda *a: absorbed_attention_ok(*a, mask="none"), "no causal mask")
    rejects(checks.check_mla_absorption, lambda *a: absorbed_attention_ok(*a, mask="topleft"), "top-left")
    rejects(checks.check_mla_absorption, lambda *a: absorbed_attention_ok(*a, values=False), "W_UV,m")


# ---- lesson 06: QK-norm ------------------------------------------------------------------------------


def test_check_qk_norm_rope_diagnoses():
    def norm_after_rope(q, k, qn, kn, cos, sin):
        return qn(mb.apply_rope(q, cos, sin)), kn(mb.apply_rope(k, cos, sin))

    def swapped(q, k, qn, kn, cos, sin):
        return mb.apply_rope(kn(q), cos, sin), mb.apply_rope(qn(k), cos, sin)

    rejects(checks.check_qk_norm_rope, norm_after_rope, "QK-norm after RoPE")
    rejects(checks.check_qk_norm_rope, swapped, "q_norm and k_norm were swapped")


def test_check_qk_norm_attention_diagnoses():
    class NormOverD(GQAVariant):
        def __init__(self, d, n_heads, n_kv_heads):
            super().__init__(d, n_heads, n_kv_heads, qk_norm=True)
            self.q_norm, self.k_norm = mb.RMSNorm(d), mb.RMSNorm(n_kv_heads * self.dh)

    class LayerNormQK(GQAVariant):
        def __init__(self, d, n_heads, n_kv_heads):
            super().__init__(d, n_heads, n_kv_heads, qk_norm=True)
            self.q_norm, self.k_norm = nn.LayerNorm(self.dh), nn.LayerNorm(self.dh)

    class AfterRope(GQAVariant):
        mistake = "norm_after"

        def __init__(self, d, n_heads, n_kv_heads):
            super().__init__(d, n_heads, n_kv_heads, qk_norm=True)

    rejects(checks.check_qk_norm_attention, NormOverD, "q_norm.weight has shape [32]", "RMSNorm(head_dim)")
    rejects(checks.check_qk_norm_attention, LayerNormQK, "unexpected q_norm.bias", "LayerNorm")
    rejects(checks.check_qk_norm_attention, AfterRope, "QK-norm after RoPE")


# ---- lesson 07: the block and the model ---------------------------------------------------------------


@pytest.mark.parametrize("mistake, diagnosis", [
    ("plain", "the post-norms are not applied"), ("on_sum", "applied to the residual sum"),
    ("no_ffn_residual", "the FFN residual is missing"), ("parallel", "a parallel block"),
])
def test_check_block_diagnoses(mistake, diagnosis):
    rejects(checks.check_block, variant(SandwichBlockOk, mistake), diagnosis)
    checks.check_block(variant(SandwichBlockOk, None))


@pytest.mark.parametrize("mistake, diagnosis", [
    ("no_final_norm", "the final RMSNorm (self.norm, before the head) is missing"),
    ("tie_by_copy", "not a copy"), ("persistent_tables", "persistent=False"),
    ("base_ignored", "rope_base is ignored"), ("not_scaled", "the embeddings were not scaled"),
])
def test_check_llama_lm_diagnoses(mistake, diagnosis):
    rejects(checks.check_llama_lm, variant(LMVariant, mistake), diagnosis)
    checks.check_llama_lm(variant(LMVariant, None))


def test_check_llama_param_count_diagnoses():
    count = llama_param_count_ok
    rejects(checks.check_llama_param_count, lambda *a, **k: count(*a, **k, kv_full=True), "counted at full size")
    rejects(checks.check_llama_param_count, lambda *a, **k: count(*a, **k, norms=False),
            "the RMSNorm scales were not counted")
    rejects(checks.check_llama_param_count, lambda *a, **k: count(*a, **k, head_if_tied=True),
            "counted a second time")
    rejects(checks.check_llama_param_count, lambda *a, **k: count(*a, **k, biases=False), "biases of wq, wk and wv")
    rejects(checks.check_llama_param_count, lambda *a, **k: count(*a, **{**k, "qkv_bias": False}),
            "biases of wq, wk and wv")  # the lesson's formula, without the new argument


# ---- the notebooks: solutions are the source, exercises are generated ----------------------------------


def test_one_solution_and_one_exercise_notebook_per_lesson():
    assert [p.stem for p in SOLUTIONS] == LESSONS
    assert [p.stem for p in EXERCISES] == LESSONS


def test_exercises_are_up_to_date_with_the_solutions(capsys):
    assert exercises.build(ROOT, check=True) == [], "run `python -m modern_block exercises build`"
    assert exercises.main(["build", "--check", "--root", str(ROOT)]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_structure(path):
    nb = nbformat.read(path, as_version=4)
    cells = read_notebook(path.read_bytes())
    reference = reference_from(cells, path.name)
    assert 2 <= len(reference.exercises) <= 5, f"{path.name}: {len(reference.exercises)} exercises"
    assert [e.number for e in reference.exercises] == list(range(1, len(reference.exercises) + 1))
    assert not reference.unchecked
    for (number, _, section), ex in zip(sections(cells), reference.exercises, strict=True):
        code = [nb.cells[c.index] for c in section if c.kind == "code"]
        assert any(exercises.has_solution(c.source) for c in code), f"{path.name} exercise {number}: no solution"
        assert len(ex.calls) == 1 and ex.calls[0].check in checks.__all__, f"{path.name} exercise {number}"
        for c in code:  # solutions are saved with the outputs of a clean run: every check printed its ✓ line
            if CHECK_CALL.search(c.source):
                text = "".join(o.get("text", "") for o in c.outputs)
                assert f"✓ {ex.calls[0].check} passed" in text, f"{path.name} exercise {number}: run the notebook"
            if exercises.has_solution(c.source):
                assert c.metadata["nbgrader"]["solution"] is True  # ready for nbgrader's generate_assignment
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.source.startswith("# Setup:")


def _in_words(text: str) -> bool:
    """No code: code spans hold only a bare name (a parameter, say), and nothing reads like a call."""
    spans = re.findall(r"`([^`]*)`", text)
    return all(re.fullmatch(r"[A-Za-z_]\w*", s) for s in spans) and not re.search(
        r"[A-Za-z0-9_]\(", re.sub(r"`[^`]*`", "", text))


HINT = re.compile(r"<details><summary>Hint (\d): ([^<]*)</summary>\n\n(.*?)\n\n</details>", re.S)


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_hints_come_in_tiers_collapsed_and_the_first_gives_no_code_away(path):
    nb = nbformat.read(path, as_version=4)
    specs = [c.id for c in nb.cells if re.fullmatch(r"ex\d+-spec", c.id or "")]
    assert specs
    for spec in specs:
        n = spec.split("-")[0]
        (hints,) = [c for c in nb.cells if c.id == f"{n}-hints"]
        tiers = HINT.findall(hints.source)
        assert [t[0] for t in tiers] == ["1", "2", "3"], f"{path.name} {n}"
        assert hints.source.count("<details>") == 3 and "<details open" not in hints.source  # collapsed
        assert _in_words(tiers[0][2]), f"{path.name} {n}: hint 1 shows code: {tiers[0][2]}"
        assert tiers[2][2] != tiers[0][2]
        (answer,) = [c for c in nb.cells if c.id == f"{n}-solution"]
        stubs = re.findall(r'raise NotImplementedError\("([^"]*)"\)', answer.source)
        stubs += re.findall(r"^\w+ = None  # your answer: (.*)$", answer.source, re.M)  # a value item
        assert stubs and all(_in_words(s) for s in stubs), f"{path.name} {n}: {stubs}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_the_last_hint_gives_the_formula_never_the_code(path):
    """Hint 3 may state the formula (in math) and name a parameter, never show code: no call, no code span beyond a
    bare name, and no line of the answer."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if not re.fullmatch(r"ex\d+-hints", cell.get("id") or ""):
            continue
        (third,) = [text for n, _, text in HINT.findall(cell.source) if n == "3"]
        assert _in_words(re.sub(r"\$[^$]*\$", "", third)), f"{path.name} {cell.id}: {third}"
        (answer,) = [c for c in nb.cells if c.get("id") == cell.id.replace("hints", "solution")]
        code = [line.split("#")[0].strip() for line in answer.source.split("\n") if len(line.strip()) > 12]
        assert not [line for line in code if line and line in third], f"{path.name} {cell.id}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_the_exercises_stay_independent(path):
    """No hint sends a student to another exercise's function: with that exercise still a stub, Run All would stop
    (or its check would call the stub)."""
    nb = nbformat.read(path, as_version=4)
    defined: dict[str, set[str]] = {}
    for cell in nb.cells:
        if re.fullmatch(r"ex\d+-solution", cell.get("id") or ""):
            tree = __import__("ast").parse(cell.source)
            names = {n.name for n in tree.body if hasattr(n, "name")}  # its functions and classes
            assigned = [t.id for n in tree.body for t in getattr(n, "targets", []) if hasattr(t, "id")]
            defined[cell.id.split("-")[0]] = names or set(assigned[-1:])  # or a value item's answer
    for cell in nb.cells:
        if re.fullmatch(r"ex\d+-hints", cell.get("id") or ""):
            mine = cell.id.split("-")[0]
            assert not re.search(r"[Yy]our `?\w+`? of exercise \d", cell.source), f"{path.name} {cell.id}"
            spans = " ".join(re.findall(r"`([^`]*)`", cell.source))
            others = {name for ex, names in defined.items() if ex != mine for name in names} - defined.get(mine, set())
            used = {name for name in others if re.search(rf"\b{re.escape(name)}\b", spans)}
            assert not used, f"{path.name} {cell.id} calls {used}, another exercise's answer"


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_exercise_notebook_has_stubs_and_no_answers(path):
    nb = nbformat.read(path, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / path.name, as_version=4)
    blocks = sum(c.source.count(exercises.BEGIN) for c in solution.cells)
    stubs = sum(c.source.count("raise NotImplementedError(") + len(re.findall(r"^\w+ = None  # your answer: ",
                                                                               c.source, re.M))
                for c in nb.cells if c.cell_type == "code")
    assert stubs == blocks > 0
    for cell in nb.cells:
        assert "SOLUTION" not in cell.source
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert f"blob/main/exercises/{path.name})" in nb.cells[0].source


def test_strip_solutions_keeps_the_code_around_the_block():
    source = (
        "class RMSNorm(nn.Module):\n"
        "    def forward(self, x):\n"
        "        ### BEGIN SOLUTION\n"
        "        # HINT: divide by the \"RMS\"\n"
        "        return x / x.pow(2).mean(-1, keepdim=True).sqrt()\n"
        "        ### END SOLUTION\n"
        "\n"
        "def f():\n"
        "    ### BEGIN SOLUTION\n"
        "    return 1\n"
        "    ### END SOLUTION\n"
        "print('kept')")
    assert exercises.strip_solutions(source) == (
        "class RMSNorm(nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise NotImplementedError(\"divide by the \\\"RMS\\\"\")\n"
        "\n"
        "def f():\n"
        f"    raise NotImplementedError(\"{exercises.DEFAULT_HINT}\")\n"
        "print('kept')")


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside the block"),
    ("## BEGIN SOLUTION\nx = 1\n### END SOLUTION", "malformed marker"),
])
def test_strip_solutions_rejects_bad_markers(source, problem):
    with pytest.raises(exercises.SolutionMarkerError, match=problem):
        exercises.strip_solutions(source)


def test_build_check_reports_stale_and_orphan_files(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    src = tmp_path / "solutions" / "01_rmsnorm.ipynb"
    src.write_bytes((ROOT / "solutions" / "01_rmsnorm.ipynb").read_bytes())
    assert exercises.main(["build", "--check", "--root", str(tmp_path)]) == 1
    assert "exercises/01_rmsnorm.ipynb: missing" in capsys.readouterr().out
    assert exercises.main(["build", "--root", str(tmp_path)]) == 0
    first = (tmp_path / "exercises" / "01_rmsnorm.ipynb").read_bytes()
    assert first == (ROOT / "exercises" / "01_rmsnorm.ipynb").read_bytes()  # deterministic, location-free
    assert exercises.build(tmp_path, check=True) == []
    reformatted = json.dumps(json.loads(first), indent=2)  # another JSON layout, same notebook: not stale
    (tmp_path / "exercises" / "01_rmsnorm.ipynb").write_text(reformatted, encoding="utf-8")
    assert exercises.build(tmp_path, check=True) == []
    assert exercises.build(tmp_path) == [] and (tmp_path / "exercises" / "01_rmsnorm.ipynb").read_bytes() == first

    nb = nbformat.read(src, as_version=4)
    [c for c in nb.cells if c.cell_type == "markdown"][-1].source += "\n\nOne more sentence."
    nbformat.write(nb, src)
    assert exercises.build(tmp_path, check=True) == [
        "exercises/01_rmsnorm.ipynb: out of date (from solutions/01_rmsnorm.ipynb)"]
    assert (tmp_path / "exercises" / "01_rmsnorm.ipynb").read_bytes() == first  # --check writes nothing

    src.rename(tmp_path / "solutions" / "09_renamed.ipynb")
    changes = exercises.build(tmp_path)
    assert "exercises/01_rmsnorm.ipynb: generated from a solution that no longer exists" in changes
    assert sorted(p.name for p in (tmp_path / "exercises").iterdir()) == ["09_renamed.ipynb"]


def test_a_stub_that_breaks_the_syntax_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def f():\n    x = [\n    ### BEGIN SOLUTION\n    1,\n    ### END SOLUTION\n    ]")])
    with pytest.raises(exercises.SolutionMarkerError, match="not valid Python"):
        exercises.exercise_notebook(nb, "solutions/x.ipynb", "exercises/x.ipynb")


def test_a_value_item_becomes_none_so_the_cell_runs():
    source = ("### BEGIN SOLUTION\n# HINT: layers times the latent and RoPE sizes, two bytes each\n"
              "n_layers = 61\nkimi_k2_cache_bytes = n_layers * (512 + 64) * 2\nprint(kimi_k2_cache_bytes)\n"
              "### END SOLUTION")
    assert exercises.strip_solutions(source) == (
        "kimi_k2_cache_bytes = None  # your answer: layers times the latent and RoPE sizes, two bytes each")
    with pytest.raises(exercises.SolutionMarkerError, match="must assign the answer"):
        exercises.strip_solutions("### BEGIN SOLUTION\nprint(1)\n### END SOLUTION")


# ---- value items of lessons 02 and 05 -------------------------------------------------------------------


def test_the_value_checks_diagnose():
    assert LLAMA3_70B_D_FF == 28672 == mb.swiglu_hidden_dim(8192, 4096, 1.3)
    with pytest.raises(CheckFailed) as info:  # 4d = 32,768 is also the multiplier applied after rounding
        checks.check_llama3_70b_d_ff(4 * 8192)
    assert "4d is GPT-2's width: SwiGLU starts from 8/3·d." in named(str(info.value))
    with pytest.raises(CheckFailed) as info:  # left out or rounded down: the same 24,576, so both are named
        checks.check_llama3_70b_d_ff(mb.swiglu_hidden_dim(8192, 4096))
    assert {"ffn_dim_multiplier is ignored: multiply the hidden size by it before rounding.",
            "rounded down instead of up (floor); Llama rounds up: multiple_of·ceil(h / multiple_of)."} == set(
                named(str(info.value)))
    assert KIMI_K2_CACHE_BYTES == mb.mla_cache_bytes_per_token(61, 512, 64)  # the figure: test_kv_cache
    with pytest.raises(CheckFailed) as info:  # half: the heads halved with the cache, or one byte per number
        checks.check_kimi_k2_cache_bytes(KIMI_K2_CACHE_BYTES // 2)
    assert len(named(str(info.value))) == 2 and "the head count does not enter" in str(info.value)
    rejects(checks.check_kimi_k2_cache_bytes, 61 * 64 * (192 + 128) * 2, "full multi-head attention")


# ---- lesson 08: training ---------------------------------------------------------------------------------


def test_check_lr_schedule_diagnoses():
    def variant(mistake):
        def lr_at(step, lr, min_lr, warmup_steps, max_steps):
            if step < warmup_steps:
                return lr * step / warmup_steps if mistake == "plain" else lr * (step + 1) / (warmup_steps + 1)
            if step >= max_steps and mistake != "no_clamp":
                return min_lr
            progress = (step - warmup_steps) / (max_steps - warmup_steps)
            floor = 0.0 if mistake == "to_zero" else min_lr
            return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - floor)

        return lr_at

    checks.check_lr_schedule(variant(None))
    rejects(checks.check_lr_schedule, variant("plain"), "lr·(step+1)/(warmup_steps+1)")
    rejects(checks.check_lr_schedule, variant("to_zero"), "goes down to 0")
    rejects(checks.check_lr_schedule, variant("no_clamp"), "climbs back up")


def test_check_flops_per_token_diagnoses():
    rejects(checks.check_flops_per_token, lambda N, L, H, Q, T: 6 * N, "the attention term is missing")
    rejects(checks.check_flops_per_token, lambda N, L, H, Q, T: 2 * N + 4 * L * H * Q * T, "forward pass only")


def test_check_fair_comparison_diagnoses():
    def variant(mistake):
        return lambda a, b, compared=("arch",), size_tolerance=0.02: unfair_differences_ok(
            a, b, compared, size_tolerance, mistake=mistake)

    rejects(checks.check_fair_comparison, variant("compared"), "leave out the keys in `compared`")
    rejects(checks.check_fair_comparison, variant("exact"), "n_params was compared exactly")
    rejects(checks.check_fair_comparison, variant("keys_of_a"), "only a's keys")
    rejects(checks.check_fair_comparison, variant("unsorted"), "not sorted")


def test_check_llama3_8b_train_flops_diagnoses():
    checks.check_llama3_8b_train_flops(6 * 8e9 * 15e12)  # 8B rounded: within 3%
    rejects(checks.check_llama3_8b_train_flops, 2 * 8.03e9 * 15e12, "forward pass only")
    rejects(checks.check_llama3_8b_train_flops, 6 * 8.03e9 * 15e9, "15 trillion")


# ---- lesson 08b: verdict words and Holm's adjustment --------------------------------------------------------


def test_check_verdict_diagnoses():
    def variant(**knobs):
        def verdict(low, high):
            if (high <= 0) if knobs.get("closed") else (high < 0):
                return "lower"
            if (low >= 0) if knobs.get("closed") else (low > 0):
                return "higher"
            if knobs.get("words"):
                return "no difference at this scale"
            h = (high - low) / 2 if knobs.get("half") else max(-low, high)
            return f"inconclusive at this scale (the interval holds 0; it could hide an effect of up to ±{h:.4f})"

        return verdict

    checks.check_verdict(variant())
    rejects(checks.check_verdict, variant(words=True), "is inconclusive")
    rejects(checks.check_verdict, variant(half=True), "farther end")
    rejects(checks.check_verdict, variant(closed=True), "touches 0")
    rejects(checks.check_verdict, lambda low, high: {"lower": "higher", "higher": "lower"}.get(
        verdict_text(low, high), verdict_text(low, high)), "swapped")


def test_check_holm_diagnoses():
    rejects(checks.check_holm, lambda ps: [min(1.0, len(ps) * p) for p in ps], "Bonferroni")
    rejects(checks.check_holm, lambda ps: sorted(holm(ps)), "sorted order")

    def no_running_max(ps):
        order = sorted(range(len(ps)), key=lambda i: ps[i])
        out = [0.0] * len(ps)
        for k, i in enumerate(order):
            out[i] = min(1.0, (len(ps) - k) * ps[i])
        return out

    rejects(checks.check_holm, no_running_max, "running maximum")


# ---- lesson 09: RoPE scaling and a real model's cache ----------------------------------------------------


def llama3_variant(mistake):
    """Llama 3's rule as a student might write it, with one mistake (None: right)."""
    def llama3_frequencies(dh, base, factor, low_freq_factor, high_freq_factor, original_len):
        theta = base ** (-torch.arange(0, dh, 2, dtype=torch.float32) / dh)  # [dh/2]
        if mistake == "unscaled":
            return theta
        if mistake == "every_frequency":
            return theta / factor
        wavelength = {"frequency": theta, "no_2pi": 1 / theta}.get(mistake, 2 * math.pi / theta)
        short, long = original_len / high_freq_factor, original_len / low_freq_factor
        if mistake == "band":
            short, long = long, short
        a = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        if mistake == "reversed":
            a = 1 - a
        blended = (1 - a) * theta / factor + a * theta
        out = torch.where(wavelength < short, theta, torch.where(wavelength > long, theta / factor, blended))
        return out.double() if mistake == "float64" else out

    return llama3_frequencies


def test_the_llama3_cases_populate_every_band():
    from modern_block.classroom.checks.lesson09b import _LLAMA3_CASES

    for _, dh, base, s, low, high, L0 in _LLAMA3_CASES:
        theta = mb.rope_frequencies(dh, base)
        out = mb.llama3_frequencies(theta, s, low, high, L0)
        kept, divided = torch.isclose(out, theta), torch.isclose(out, theta / s)
        assert kept.any() and divided.any() and (~kept & ~divided).any()


@pytest.mark.parametrize("mistake, diagnosis", [
    ("every_frequency", "position interpolation"), ("band", "the wrong smoothing band"),
    ("frequency", "wavelength vs frequency"), ("no_2pi", "2π / θ"), ("reversed", "the blend is reversed"),
    ("unscaled", "the frequencies came back unscaled"), ("float64", "return float32 frequencies"),
])
def test_check_llama3_rope_scaling_diagnoses(mistake, diagnosis):
    rejects(checks.check_llama3_rope_scaling, llama3_variant(mistake), diagnosis)
    checks.check_llama3_rope_scaling(llama3_variant(None))


def test_the_ntk_base_is_the_one_the_package_uses():
    for base, dh, kappa in [(1e4, 128, 4.0), (5e5, 64, 2.0), (1e4, 16, 8.0)]:
        want = mb.rope_frequencies(dh, ntk_scaled_base_ok(base, dh, kappa))
        torch.testing.assert_close(mb.dynamic_ntk_frequencies(dh, base, 1.0, round(kappa * 1000), 1000), want)


def test_check_ntk_scaled_base_diagnoses():
    rejects(checks.check_ntk_scaled_base, lambda base, dh, kappa: base * kappa, "the exponent d_h/(d_h - 2) is missing")
    rejects(checks.check_ntk_scaled_base, lambda base, dh, kappa: base * kappa ** ((dh - 2) / dh), "upside down")
    rejects(checks.check_ntk_scaled_base, lambda base, dh, kappa: base / kappa ** (dh / (dh - 2)), "must grow")


def test_check_smollm2_cache_bytes_diagnoses():
    assert SMOLLM2_CACHE_BYTES == 23_040
    rejects(checks.check_smollm2_cache_bytes, 11_520, "both K and V are cached")
    rejects(checks.check_smollm2_cache_bytes, 69_120, "the cache of MHA")
    rejects(checks.check_smollm2_cache_bytes, 46_080, "bf16 takes 2")
    rejects(checks.check_smollm2_cache_bytes, 23_040.0, "return a plain int")


@pytest.mark.parametrize("mistake, diagnosis", [
    ("nibbles", "the two codes of each byte are swapped"), ("not_centred", "the codes were not centred"),
    ("signed", "two's complement"), ("float64", "return float32"),
])
def test_check_dequantize_q4_0_diagnoses(mistake, diagnosis):
    rejects(checks.check_dequantize_q4_0, lambda raw: dequantize_q4_0_ok(raw, mistake=mistake), diagnosis)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("twice", "applied twice"), ("values", "the values were permuted"), ("key_heads", "split into n_heads heads"),
])
def test_check_unpermute_qk_diagnoses(mistake, diagnosis):
    rejects(checks.check_unpermute_qk, lambda *a: unpermute_qk_ok(*a, mistake=mistake), diagnosis)


def test_a_huge_return_value_is_refused_at_once():
    """A call that returns far more numbers than its small case asks for fails at that call (so the grader
    never holds two such replies), and says how many it returned."""
    with pytest.raises(checks.CheckFailed, match="returned 5,000,000 numbers, far more"):
        checks.check_rms(lambda x, eps=1e-6: torch.zeros(5_000_000))


# ---- the cases of issue 42: each named right, or among the named possibilities, and each wrong answer failing ----


def test_a_multiplier_applied_to_d_is_caught_with_a_small_multiple_of():
    def multiplier_on_d(d, multiple_of=256, ffn_dim_multiplier=None):
        d = int(ffn_dim_multiplier * d) if ffn_dim_multiplier else d
        return multiple_of * math.ceil(int(2 * 4 * d / 3) / multiple_of)

    assert multiplier_on_d(4096, 1, 1.3) == 14_197 != mb.swiglu_hidden_dim(4096, 1, 1.3) == 14_198
    rejects(checks.check_swiglu_hidden_dim, multiplier_on_d, "the multiplier was applied to d rather than")


def test_a_size_tolerance_relative_to_b_is_named_so():
    def relative_to_b(a, b, compared=("arch",), size_tolerance=0.02):
        keys = sorted(k for k in set(a) | set(b) if k not in compared)
        return [k for k in keys if k not in a or k not in b or (
            abs(b[k] - a[k]) > size_tolerance * b[k] if k == "n_params" else a[k] != b[k])]

    message = rejects(checks.check_fair_comparison, relative_to_b)
    assert named(message) == ["the size tolerance was taken relative to b's size; the lesson measures it against "
                              "a's."], message


@pytest.mark.slow
def test_an_unsorted_set_fails_whatever_order_the_hash_seed_gives():
    """A set's order changes with the process's hash seed: the check holds a case with twelve differing settings, so
    an answer that forgets to sort fails in every order the seed can give (here: 200 shuffles, and three seeds)."""
    import random
    import subprocess
    import sys

    for seed in range(200):
        rng = random.Random(seed)

        def shuffled(a, b, compared=("arch",), size_tolerance=0.02, rng=rng):
            out = unfair_differences_ok(a, b, compared, size_tolerance)
            return rng.sample(out, len(out))

        rejects(checks.check_fair_comparison, shuffled)
    probe = ("from modern_block.classroom import checks\n"
             "def unfair(a, b, compared=('arch',), size_tolerance=0.02):\n"
             "    return list({k for k in set(a) | set(b) if k not in compared and (k not in a or k not in b or (\n"
             "        abs(b[k] - a[k]) > size_tolerance * a[k] if k == 'n_params' else a[k] != b[k]))})\n"
             "try:\n    checks.check_fair_comparison(unfair)\nexcept checks.CheckFailed as err:\n    print('failed')\n")
    for hash_seed in ("1", "2", "3"):
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                              env={**__import__("os").environ, "PYTHONHASHSEED": hash_seed})
        assert done.stdout.strip().endswith("failed"), (hash_seed, done.stdout, done.stderr[-2000:])


def test_a_search_that_stops_early_or_returns_0_for_none_fails():
    def stops_at_2048(d, d_ff, ffn_dim_multiplier=None):
        h = int(8 * d / 3)
        h = int(ffn_dim_multiplier * h) if ffn_dim_multiplier else h
        return next((2**k for k in range(4, 12) if -(-h // 2**k) * 2**k == d_ff), None)

    def zero_for_none(d, d_ff, ffn_dim_multiplier=None):
        return smallest_multiple_of_ok(d, d_ff, ffn_dim_multiplier) or 0

    rejects(checks.check_smallest_multiple_of, stops_at_2048, "the search stops too early")
    rejects(checks.check_smallest_multiple_of, zero_for_none, "0 was returned where no power of two gives d_ff")


def test_a_head_dim_read_with_a_default_fails_on_a_null_head_dim():
    def with_default(cfg):
        L, h = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        if "kv_lora_rank" in cfg:
            return L * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
        return 2 * L * cfg.get("num_key_value_heads", h) * cfg.get("head_dim", cfg["hidden_size"] // h) * 2

    rejects(checks.check_kv_bytes_per_token, with_default, "head_dim: null", "raised TypeError")


def test_a_type_the_text_does_not_ask_for_fails():
    rejects(checks.check_ntk_scaled_base, lambda base, dh, kappa: torch.tensor(base) * kappa ** (dh / (dh - 2)),
            "it is a Tensor; return a plain Python float")

    def python_float_scale(w):
        q, s = quantize_row_int8_ok(w)
        return q, s.item()

    rejects(checks.check_quantize_row_int8, python_float_scale, "it is a float; return a 0-dim float32 tensor")


def test_a_value_items_message_has_no_number_of_the_answer():
    message = rejects(checks.check_gpt2_small_params, GPT2_SMALL_PARAMS + 50257 * 768, "ties it to the token embedding")
    assert "38,597,376" not in message and "6/7" not in message and "exactly" not in message
    message = rejects(checks.check_smollm2_cache_bytes, SMOLLM2_CACHE_BYTES * 3)
    assert "a third" not in message and "exactly" not in message and "23,040" not in message


def test_eight_d_squared_for_any_gelu_width_fails_in_the_notebook_too():
    rejects(checks.check_ffn_weight_count, lambda d, d_ff, gated: 3 * d * d_ff if gated else 8 * d * d,
            "the GELU MLP was counted as 8d², which holds only when d_ff = 4d")
