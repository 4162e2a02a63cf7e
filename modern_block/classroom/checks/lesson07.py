"""Lesson 07: the sandwich-norm block, the Llama-style LM and its parameter count."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
import torch.nn as nn

from ...attention import GQAttention
from ...ffn import SwiGLU
from ...llama import LlamaStyleLM
from ...params import count_parameters
from ...rmsnorm import RMSNorm
from ...rope import rope_cache
from .core import Case, CheckRun, Mistake, exercise_check

# ---- exercise 1: the sandwich-norm block --------------------------------------------------------------------


class _SandwichBlock(nn.Module):
    """The parts of exercise 1's block: the pre-norm block with an RMSNorm on each sub-layer's output as well
    (Gemma 2 and 3's "sandwich" norm); ``_sandwich`` computes it."""

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, d_ff: int):
        super().__init__()
        self.attn_norm, self.attn, self.attn_post_norm = RMSNorm(d), GQAttention(d, n_heads, n_kv_heads), RMSNorm(d)
        self.ffn_norm, self.ffn, self.ffn_post_norm = RMSNorm(d), SwiGLU(d, d_ff), RMSNorm(d)


def _sandwich(ref: _SandwichBlock, x, cos, sin, *, pre1="attn_norm", post1="attn_post_norm", pre2="ffn_norm",
              post2="ffn_post_norm", res1=True, res2=True, layout="sequential"):
    """The block: x += attn_post_norm(attn(attn_norm(x))), then x + ffn_post_norm(ffn(ffn_norm(x))); its norms
    named by knob (None: left out), its residuals, or another layout."""
    def norm(name):
        return (lambda t: t) if name is None else ref.get_submodule(name)

    n1, p1, n2, p2 = norm(pre1), norm(post1), norm(pre2), norm(post2)

    def attn(t):
        return ref.attn(t, cos, sin)

    if layout == "on_sum":
        y = p1(x + attn(n1(x)))
        return p2(y + ref.ffn(n2(y)))
    if layout == "parallel":
        return x + p1(attn(n1(x))) + p2(ref.ffn(n2(x)))
    y = (x if res1 else 0) + p1(attn(n1(x)))
    return (y if res2 else 0) + p2(ref.ffn(n2(y)))


BLOCK_MISTAKES = [
    Mistake("the post-norms are not applied: that is lesson 07's block. Here each sub-layer's output goes through its "
            "own RMSNorm (attn_post_norm, ffn_post_norm) before it is added to x.", dict(post1=None, post2=None)),
    Mistake("the post-norm was applied to the residual sum (x = attn_post_norm(x + attn(...))): it normalises the "
            "sub-layer's output only; the stream itself is never normalised.", dict(layout="on_sum")),
    Mistake("the pre-norms are missing: the sub-layers read attn_norm(x) and ffn_norm(x), then their outputs go "
            "through the post-norms.", dict(pre1=None, pre2=None)),
    Mistake("attn_post_norm and ffn_post_norm were swapped.", dict(post1="ffn_post_norm", post2="attn_post_norm")),
    Mistake("a sub-layer's two norms were swapped: attn_norm goes before the attention, attn_post_norm after it (and "
            "ffn_norm before the FFN, ffn_post_norm after it).",
            dict(pre1="attn_post_norm", post1="attn_norm", pre2="ffn_post_norm", post2="ffn_norm")),
    Mistake("the attention residual is missing: x = x + attn_post_norm(attn(attn_norm(x), cos, sin)).",
            dict(res1=False)),
    Mistake("the FFN residual is missing: return x + ffn_post_norm(ffn(ffn_norm(x))).", dict(res2=False)),
    Mistake("a parallel block (GPT-J style): the FFN reads the block's input, not x after the attention residual.",
            dict(layout="parallel")),
    Mistake("the two pre-norms were swapped: attention reads attn_norm(x), the FFN reads ffn_norm(x).",
            dict(pre1="ffn_norm", pre2="attn_norm")),
    Mistake("the post-attention norm is missing: x = x + attn_post_norm(attn(attn_norm(x), cos, sin)).",
            dict(post1=None)),
    Mistake("the post-FFN norm is missing: return x + ffn_post_norm(ffn(ffn_norm(x))).", dict(post2=None)),
]
_BLOCK_HINTS = {"_post_norm": "Name the parts attn_norm, attn, attn_post_norm, ffn_norm, ffn and ffn_post_norm "
                              "(RMSNorm, GQAttention, RMSNorm, RMSNorm, SwiGLU, RMSNorm).",
                "attn_norm": "Name the parts attn_norm, attn, attn_post_norm, ffn_norm, ffn and ffn_post_norm.",
                "ffn.": "self.ffn = SwiGLU(d, d_ff)."}


@exercise_check
def check_block(run: CheckRun, BlockClass) -> str:
    """``SandwichBlock(d, n_heads, n_kv_heads, d_ff)``: the pre-norm residual block with a norm on each sub-layer's
    output too: attn_norm, attn (GQAttention), attn_post_norm, ffn_norm, ffn (SwiGLU), ffn_post_norm;
    ``forward(x, cos, sin)``."""
    g = run.rng(12)

    def case(desc, d, h, kv, d_ff, B, T, seed):
        ref = run.randomize(_SandwichBlock(d, h, kv, d_ff), seed)
        x = torch.randn(B, T, d, generator=g) * 2
        cos, sin = rope_cache(T, d // h)
        return Case(f"forward(x, cos, sin) with {desc}", partial(_sandwich, ref, x, cos, sin), (x, cos, sin), ref=ref,
                    sizes=(d, h, kv, d_ff))

    public = [case("d=32, 4 heads over 2 KV heads, d_ff=48, x of shape [2, 6, 32]", 32, 4, 2, 48, 2, 6, 60),
              case("d=16, MQA (2 heads over 1), d_ff=40, batch 1, one token", 16, 2, 1, 40, 1, 1, 61),
              case("d=24, 3 heads, MHA, d_ff=64, x of shape [1, 7, 24]", 24, 3, 3, 64, 1, 7, 62)]

    def secret(g):
        T = run.randint(g, 2, 7)
        return [case(f"d=32, 4 heads over 2, d_ff=40, x of shape [2, {T}, 32]", 32, 4, 2, 40, 2, T, 63)]

    for c in run.cases(public, secret, seed=112):
        d, h, kv, d_ff = c.sizes
        student = run.call(f"SandwichBlock({d}, {h}, {kv}, {d_ff})", BlockClass, d, h, kv, d_ff)
        run.load_weights(student, c.ref, _BLOCK_HINTS)
        got = run.call(c.text, student, *c.args)
        run.judge(c, got, BLOCK_MISTAKES, atol=5e-5, rtol=1e-4, dims=("batch", "position", ""))
    return "3 cases: GQA, MQA with one token, MHA"


# ---- exercise 2: the language model ------------------------------------------------------------------------

_CHAPTER_PARAMS = 3_283_456
COUNT_MISTAKES = [
    Mistake("the head is tied by default: tie=False is the default (the chapter's 3,283,456 is untied).",
            lambda c: c.want - 256_000),
    Mistake("the final RMSNorm (self.norm, before the head) is missing.", lambda c: c.want - 256),
    Mistake("the output head has a bias; use nn.Linear(d, V, bias=False).", lambda c: c.want + 1000),
    Mistake("a learned position embedding (1024 × 256) was added; RoPE replaces it (no parameters).",
            lambda c: c.want + 262_144),
    Mistake("an extra V × d matrix: emb and head only (and tie=False means two of them, not three).",
            lambda c: c.want + 256_000),
]


def _lm64(ref, idx, *, factor=1.0, final=True, base=None):
    """The reference LM on idx, its embeddings times ``factor`` (knobs: no final norm, another RoPE base)."""
    c, s = ref.rope(torch.arange(idx.shape[1])) if base is None else (t[:idx.shape[1]] for t in rope_cache(16, 8, base))
    x = ref.emb(idx) * factor
    for block in ref.blocks:
        x = block(x, c, s)
    return ref.head(ref.norm(x) if final else x)


def _scaled(c: Case) -> bool:
    return c.scale_emb


LM_MISTAKES = [
    Mistake("the final RMSNorm is missing: logits = head(norm(x)).", dict(final=False)),
    Mistake("softmax was applied: forward returns logits, not probabilities.", lambda c: c.want.softmax(-1)),
    Mistake("log-softmax was applied: forward returns raw logits.", lambda c: c.want.log_softmax(-1)),
    Mistake("the embeddings were not scaled: with scale_emb=True (Gemma) x = emb(idx) · sqrt(d) before the first "
            "block.", dict(factor=1.0), when=_scaled),
    Mistake("the embeddings were scaled by d; Gemma's factor is sqrt(d).", lambda c: c.expect(factor=float(c.d)),
            when=_scaled),
    Mistake("the embeddings were scaled although scale_emb=False: only then is x = emb(idx) · sqrt(d).",
            lambda c: c.expect(factor=math.sqrt(c.d)), when=lambda c: not c.scale_emb),
    Mistake("rope_base is ignored: build the tables with rope_cache(max_len, head_dim, rope_base).",
            dict(base=10000.0), when=lambda c: c.rope_base != 10000.0),
]
_LM_HINTS = {"emb": "Name the parts emb, blocks, norm and head.",
             "blocks.": "self.blocks = nn.ModuleList(Block(...) for _ in range(n_layers)).",
             **dict.fromkeys(("unexpected cos", "unexpected sin"), "The RoPE tables are computed, not learned: "
                             "register them with persistent=False so they are not saved as weights.")}


@exercise_check
def check_llama_lm(run: CheckRun, LlamaStyleLMClass) -> str:
    """``LlamaStyleLM(V, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, max_len=1024, rope_base=10000.0,
    tie=False, scale_emb=False)``: emb, blocks, norm, head, non-persistent cos/sin buffers; ``forward(idx)`` →
    logits [B, T, V]; ``scale_emb=True`` multiplies the embeddings by sqrt(d) (Gemma)."""
    model = run.call("LlamaStyleLM(V=1000)", LlamaStyleLMClass, 1000)
    count = Case("the parameters of LlamaStyleLM(V=1000) (the chapter's model has 3,283,456)", lambda: _CHAPTER_PARAMS)
    if not run.judge_int(count, count_parameters(model), COUNT_MISTAKES):
        return ""
    tied = run.call("LlamaStyleLM(V=1000, tie=True)", LlamaStyleLMClass, 1000, tie=True)
    head, emb = getattr(tied, "head", None), getattr(tied, "emb", None)
    if head is None or emb is None or head.weight is not emb.weight:
        run.fail("with tie=True, head.weight must be the same Parameter as emb.weight (self.head.weight = "
                 "self.emb.weight), not a copy: one matrix, two uses.")
    if count_parameters(tied) != _CHAPTER_PARAMS - 256_000:
        run.fail(f"with tie=True the model has {count_parameters(tied):,} parameters: the tied head must add none "
                 "(V·d fewer than untied).")
    g = run.rng(13)

    def case(desc, kw: dict[str, Any], B, T, seed):
        cfg: dict[str, Any] = dict(V=50, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_len=16, **kw)
        scale = cfg.pop("scale_emb", False)
        ref = run.randomize(LlamaStyleLM(**cfg), seed)
        if cfg.get("tie"):
            ref.head.weight = ref.emb.weight
        idx = torch.randint(0, 50, (B, T), generator=g)
        return Case(f"forward(idx) with {desc}", partial(_lm64, ref, idx, factor=math.sqrt(32) if scale else 1.0),
                    (idx,), cfg={**cfg, "scale_emb": scale}, ref=ref, d=32, scale_emb=scale,
                    rope_base=cfg.get("rope_base", 10000.0))

    public = [case("V=50, d=32, 2 layers, 4 heads over 2 KV heads, idx of shape [2, 7]", {}, 2, 7, 70),
              case("the same model with scale_emb=True, idx of shape [2, 5]", dict(scale_emb=True), 2, 5, 71),
              case("the same model with tie=True and scale_emb=True, batch 1, one token",
                   dict(tie=True, scale_emb=True), 1, 1, 72),
              case("rope_base=500000, idx of shape [1, 16] (= max_len)", dict(rope_base=500000.0), 1, 16, 73)]

    def secret(g):
        kw = dict(tie=run.pick(g, [False, True]), scale_emb=run.pick(g, [False, True]),
                  rope_base=run.pick(g, [10000.0, 1000000.0]))
        return [case(f"drawn settings {kw}", kw, 2, run.randint(g, 2, 16), 74)]

    for c in run.cases(public, secret, seed=113):
        student = run.call(f"LlamaStyleLM({', '.join(f'{a}={b}' for a, b in c.cfg.items())})", LlamaStyleLMClass,
                           **c.cfg)
        if {key for key, _ in student.named_buffers()} & {"cos", "sin"} & set(student.state_dict()):
            run.fail("the RoPE tables are saved with the weights: register them with "
                     "self.register_buffer('cos', cos, persistent=False) (they are recomputed, not learned).")
        run.load_weights(student, c.ref, _LM_HINTS)
        if c.cfg.get("tie") and student.head.weight is not student.emb.weight:
            run.fail("after loading weights the head is no longer tied to the embedding.")
        got = run.call(c.text, student, *c.args)
        run.judge(c, got, LM_MISTAKES, atol=5e-5, rtol=1e-4, dims=("batch", "position", ""))
    return "3,283,456 parameters, tying, 4 forward cases incl. rope_base, Gemma's embedding scale and T = max_len"


# ---- exercise 3: the count by formula -------------------------------------------------------------------------


def _param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, qk_norm, qkv_bias=False, *, kv_full=False,
                 norms=True, qk=True, head=True, final=True, head_when_tied=False, bias="qkv"):
    dh = d // n_heads
    kv = n_heads if kv_full else n_kv_heads
    attn = d * n_heads * dh + 2 * d * kv * dh + n_heads * dh * d + (2 * dh if qk_norm and qk else 0)
    if qkv_bias:  # bias: "qkv" (right), "none", "full" (k and v biases of n_heads·dh), "wo" (an output bias too)
        attn += {"qkv": n_heads * dh + 2 * kv * dh, "none": 0, "full": 3 * n_heads * dh,
                 "wo": n_heads * dh + 2 * kv * dh + d}[bias]
    layer = attn + 3 * d * d_ff + (2 * d if norms else 0)
    total = V * d + n_layers * layer + (d if final and norms else 0)
    if head and (not tie or head_when_tied):
        total += V * d
    return total


PARAM_MISTAKES = [
    Mistake("wk and wv counted at full size: with GQA they have n_kv_heads·head_dim outputs, not d.",
            dict(kv_full=True)),
    Mistake("the RMSNorm scales were not counted: 2·d per block plus d for the final norm (and 2·head_dim per block "
            "for QK-norm).", dict(norms=False, qk=False)),
    Mistake("the per-block RMSNorm scales (2·d) and the final norm (d) were not counted.", dict(norms=False)),
    Mistake("the QK-norm scales were not counted: q_norm and k_norm have head_dim weights each, per block.",
            dict(qk=False)),
    Mistake("the QK-norm scales were counted although qk_norm=False.", lambda c: c.expect(qk_norm=True),
            when=lambda c: not c.qk_norm),
    Mistake("the biases of wq, wk and wv were not counted (qkv_bias=True: Qwen2's projections have them).",
            dict(bias="none"), when=lambda c: c.qkv_bias),
    Mistake("the key and value biases were counted at full size: wk and wv have n_kv_heads·head_dim outputs, so "
            "their biases have n_kv_heads·head_dim entries each.", dict(bias="full"),
            when=lambda c: c.qkv_bias and c.kv != c.h),
    Mistake("the output projection wo was given a bias too: Qwen2 has biases on wq, wk and wv only.",
            dict(bias="wo"), when=lambda c: c.qkv_bias),
    Mistake("the tied head was counted a second time: with tie=True the head is the embedding matrix.",
            dict(head_when_tied=True), when=lambda c: c.tie),
    Mistake("the output head (V·d) was not counted.", dict(head=False), when=lambda c: not c.tie),
    Mistake("the final norm (d) was not counted.", dict(final=False)),
]


def _param_case(args: tuple, kw: dict) -> Case:
    tie, qk_norm, qkv_bias = kw.get("tie", False), kw.get("qk_norm", True), kw.get("qkv_bias", False)
    text = f"llama_param_count{args}" + "".join(f", {k}={v}" for k, v in kw.items())
    V, d, n_layers, h, kv, d_ff = args
    return Case(text, partial(_param_count, V, d, n_layers, h, kv, d_ff, tie=tie, qk_norm=qk_norm, qkv_bias=qkv_bias),
                args, kw, tie=tie, qk_norm=qk_norm, qkv_bias=qkv_bias, h=h, kv=kv)


@exercise_check
def check_llama_param_count(run: CheckRun, llama_param_count) -> str:
    """``llama_param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True, qkv_bias=False)``:
    the parameters of LlamaStyleLM by formula, and of its Qwen2 variant with biases on wq, wk and wv."""
    chapter = (1000, 256, 4, 8, 2, 688)
    public = [_param_case(a, k) for a, k in [
        (chapter, {}), (chapter, dict(tie=True)), (chapter, dict(qk_norm=False)), ((500, 64, 3, 4, 1, 160), {}),
        ((32000, 4096, 32, 32, 32, 11008), dict(qk_norm=False)), ((300, 48, 2, 6, 3, 128), dict(tie=True)),
        (chapter, dict(qkv_bias=True)), ((151936, 896, 24, 14, 2, 4864), dict(tie=True, qk_norm=False, qkv_bias=True)),
        ((500, 64, 3, 4, 1, 160), dict(qkv_bias=True))]]

    def secret(g):
        out = []
        for _ in range(3):
            kv = run.pick(g, [1, 2, 4])
            h = kv * run.pick(g, [1, 2, 4])
            d = h * run.pick(g, [8, 16, 32, 64])
            args = (run.randint(g, 50, 60000), d, run.randint(g, 1, 40), h, kv, run.randint(g, 8, 4 * d))
            out.append(_param_case(args, dict(tie=run.pick(g, [False, True]), qk_norm=run.pick(g, [False, True]),
                                              qkv_bias=run.pick(g, [False, True]))))
        return out

    run.judge_each(llama_param_count, run.cases(public, secret, seed=23), run.judge_int, PARAM_MISTAKES)
    return ("9 cases incl. the chapter's 3,283,456, tied, no QK-norm, MQA, Llama 2 7B's 6,738,415,616 and "
            "Qwen2.5-0.5B's 494,032,768 (biases on q, k, v)")
