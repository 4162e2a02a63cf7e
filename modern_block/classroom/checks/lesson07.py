"""Lesson 07: the pre-norm block, the Llama-style LM and its parameter count."""

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
from .core import (
    call_student,
    exercise_check,
    fail,
    generator,
    is_graded,
    judge,
    judge_int,
    load_weights,
    pick,
    randomize,
)


class _SandwichBlock(nn.Module):
    """The reference of exercise 1: the pre-norm block with an RMSNorm on each sub-layer's output as well
    (Gemma 2 and 3's "sandwich" norm)."""

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, d_ff: int):
        super().__init__()
        self.attn_norm, self.attn, self.attn_post_norm = RMSNorm(d), GQAttention(d, n_heads, n_kv_heads), RMSNorm(d)
        self.ffn_norm, self.ffn, self.ffn_post_norm = RMSNorm(d), SwiGLU(d, d_ff), RMSNorm(d)

    def forward(self, x, cos, sin):  # x: [B, T, d]
        x = x + self.attn_post_norm(self.attn(self.attn_norm(x), cos, sin))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))


def _block_candidates(ref: _SandwichBlock, x, cos, sin):
    n1, p1, n2, p2, attn, ffn = ref.attn_norm, ref.attn_post_norm, ref.ffn_norm, ref.ffn_post_norm, ref.attn, ref.ffn

    def a(t):
        return attn(t, cos, sin)

    def same(t):
        return t

    def seq(pre1=n1, post1=p1, pre2=n2, post2=p2, res1=True, res2=True):
        y = (x if res1 else 0) + post1(a(pre1(x)))
        return (y if res2 else 0) + post2(ffn(pre2(y)))

    def on_sum():
        y = p1(x + a(n1(x)))
        return p2(y + ffn(n2(y)))

    return [
        ("the post-norms are not applied: that is lesson 07's block. Here each sub-layer's output goes through its "
         "own RMSNorm (attn_post_norm, ffn_post_norm) before it is added to x.", lambda: seq(post1=same, post2=same)),
        ("the post-norm was applied to the residual sum (x = attn_post_norm(x + attn(...))): it normalises the "
         "sub-layer's output only; the stream itself is never normalised.", on_sum),
        ("the pre-norms are missing: the sub-layers read attn_norm(x) and ffn_norm(x), then their outputs go "
         "through the post-norms.", lambda: seq(pre1=same, pre2=same)),
        ("attn_post_norm and ffn_post_norm were swapped.", lambda: seq(post1=p2, post2=p1)),
        ("a sub-layer's two norms were swapped: attn_norm goes before the attention, attn_post_norm after it (and "
         "ffn_norm before the FFN, ffn_post_norm after it).", lambda: seq(pre1=p1, post1=n1, pre2=p2, post2=n2)),
        ("the attention residual is missing: x = x + attn_post_norm(attn(attn_norm(x), cos, sin)).",
         lambda: seq(res1=False)),
        ("the FFN residual is missing: return x + ffn_post_norm(ffn(ffn_norm(x))).", lambda: seq(res2=False)),
        ("a parallel block (GPT-J style): the FFN reads the block's input, not x after the attention residual.",
         lambda: x + p1(a(n1(x))) + p2(ffn(n2(x)))),
        ("the two pre-norms were swapped: attention reads attn_norm(x), the FFN reads ffn_norm(x).",
         lambda: seq(pre1=n2, pre2=n1)),
        ("the post-attention norm is missing: x = x + attn_post_norm(attn(attn_norm(x), cos, sin)).",
         lambda: seq(post1=same)),
        ("the post-FFN norm is missing: return x + ffn_post_norm(ffn(ffn_norm(x))).", lambda: seq(post2=same)),
    ]


@exercise_check(components=("Block",), uses=("RMSNorm", "GQAttention", "SwiGLU"))
def check_block(BlockClass) -> str:
    """``SandwichBlock(d, n_heads, n_kv_heads, d_ff)``: the pre-norm residual block with a norm on each
    sub-layer's output too: attn_norm, attn (GQAttention), attn_post_norm, ffn_norm, ffn (SwiGLU),
    ffn_post_norm; ``forward(x, cos, sin)``."""
    __tracebackhide__ = True
    name = "check_block"
    g = generator(12)
    hints = {"_post_norm": "Name the parts attn_norm, attn, attn_post_norm, ffn_norm, ffn and ffn_post_norm (RMSNorm, "
                      "GQAttention, RMSNorm, RMSNorm, SwiGLU, RMSNorm).",
             "attn_norm": "Name the parts attn_norm, attn, attn_post_norm, ffn_norm, ffn and ffn_post_norm.",
             "ffn.": "self.ffn = SwiGLU(d, d_ff)."}
    cases = [("d=32, 4 heads over 2 KV heads, d_ff=48, x of shape [2, 6, 32]", 32, 4, 2, 48, 2, 6),
             ("d=16, MQA (2 heads over 1), d_ff=40, batch 1, one token", 16, 2, 1, 40, 1, 1),
             ("d=24, 3 heads, MHA, d_ff=64, x of shape [1, 7, 24]", 24, 3, 3, 64, 1, 7)]
    for k, (desc, d, h, kv, d_ff, B, T) in enumerate(cases):
        ref = randomize(_SandwichBlock(d, h, kv, d_ff), 60 + k)
        student = call_student(name, f"SandwichBlock({d}, {h}, {kv}, {d_ff})", BlockClass, d, h, kv, d_ff)
        load_weights(name, student, ref, hints)
        x = torch.randn(B, T, d, generator=g) * 2
        cos, sin = rope_cache(T, d // h)
        got = call_student(name, f"forward(x, cos, sin) with {desc}", student, x.clone(), cos, sin)
        want = ref(x, cos, sin)
        judge(name, got, want, _block_candidates(ref, x, cos, sin), f"with {desc}", atol=5e-5, rtol=1e-4,
              dims=("batch", "position", ""))
    return "3 cases: GQA, MQA with one token, MHA"


_CHAPTER_PARAMS = 3_283_456


@exercise_check(components=("LlamaStyleLM",), uses=("Block", "RMSNorm", "rope_cache"))
def check_llama_lm(LlamaStyleLMClass) -> str:
    """``LlamaStyleLM(V, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, max_len=1024,
    rope_base=10000.0, tie=False, scale_emb=False)``: emb, blocks, norm, head, non-persistent cos/sin buffers;
    ``forward(idx)`` → logits [B, T, V]; ``scale_emb=True`` multiplies the embeddings by sqrt(d) (Gemma)."""
    __tracebackhide__ = True
    name = "check_llama_lm"
    model = call_student(name, "LlamaStyleLM(V=1000)", LlamaStyleLMClass, 1000)
    n = count_parameters(model)
    if n != _CHAPTER_PARAMS:
        deltas = {
            -256_000: "the head is tied by default: tie=False is the default (the chapter's 3,283,456 is untied).",
            -256: "the final RMSNorm (self.norm, before the head) is missing.",
            1000: "the output head has a bias; use nn.Linear(d, V, bias=False).",
            262_144: "a learned position embedding (1024 × 256) was added; RoPE replaces it (no parameters).",
            256_000: "an extra V × d matrix: emb and head only (and tie=False means two of them, not three).",
        }
        diag = deltas.get(n - _CHAPTER_PARAMS, "compare your modules with the chapter's: emb, 4 blocks, norm, head.")
        fail(name, f"LlamaStyleLM(V=1000) has {n:,} parameters; the chapter's model has {_CHAPTER_PARAMS:,}.\n"
                   f"Likely mistake: {diag}")
    tied = call_student(name, "LlamaStyleLM(V=1000, tie=True)", LlamaStyleLMClass, 1000, tie=True)
    head, emb = getattr(tied, "head", None), getattr(tied, "emb", None)
    if head is None or emb is None or head.weight is not emb.weight:
        fail(name, "with tie=True, head.weight must be the same Parameter as emb.weight (self.head.weight = "
                   "self.emb.weight), not a copy: one matrix, two uses.")
    if count_parameters(tied) != _CHAPTER_PARAMS - 256_000:
        fail(name, f"with tie=True the model has {count_parameters(tied):,} parameters; expected "
                   f"{_CHAPTER_PARAMS - 256_000:,} (V·d = 256,000 fewer).")
    g = generator(13)
    cases: list[tuple[str, dict[str, Any], int, int]] = [
        ("V=50, d=32, 2 layers, 4 heads over 2 KV heads, idx of shape [2, 7]", dict(), 2, 7),
        ("the same model with scale_emb=True, idx of shape [2, 5]", dict(scale_emb=True), 2, 5),
        ("the same model with tie=True and scale_emb=True, batch 1, one token", dict(tie=True, scale_emb=True), 1, 1),
        ("rope_base=500000, idx of shape [1, 16] (= max_len)", dict(rope_base=500000.0), 1, 16)]
    for k, (desc, kw, B, T) in enumerate(cases):
        cfg: dict[str, Any] = dict(V=50, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_len=16, **kw)
        scale = cfg.pop("scale_emb", False)
        ref = randomize(LlamaStyleLM(**cfg), 70 + k)
        cfg["scale_emb"] = scale
        if cfg.get("tie"):
            ref.head.weight = ref.emb.weight
        student = call_student(name, f"LlamaStyleLM({', '.join(f'{a}={b}' for a, b in cfg.items())})",
                               LlamaStyleLMClass, **cfg)
        extra = {key for key, _ in student.named_buffers()} & {"cos", "sin"}
        persistent = extra & set(student.state_dict())
        if persistent:
            fail(name, "the RoPE tables are saved with the weights: register them with "
                       "self.register_buffer('cos', cos, persistent=False) (they are recomputed, not learned).")
        load_weights(name, student, ref, {"emb": "Name the parts emb, blocks, norm and head.",
                                          "blocks.": "self.blocks = nn.ModuleList(Block(...) for _ in "
                                                     "range(n_layers)).",
                                          "unexpected cos": "The RoPE tables are computed, not learned: register them "
                                                            "with persistent=False so they are not saved as weights.",
                                          "unexpected sin": "The RoPE tables are computed, not learned: register them "
                                                            "with persistent=False so they are not saved as weights."})
        if cfg.get("tie") and student.head.weight is not student.emb.weight:
            fail(name, "after loading weights the head is no longer tied to the embedding.")
        idx = torch.randint(0, 50, (B, T), generator=g)
        got = call_student(name, f"forward(idx) with {desc}", student, idx.clone())
        d = cfg["d"]
        right_factor = math.sqrt(d) if scale else 1.0

        def run(ref=ref, idx=idx, factor=right_factor, final=True, base=None):
            """The reference LM on idx, its embeddings times ``factor`` (knobs: no final norm, another base)."""
            c, s = ref.rope(torch.arange(idx.shape[1])) if base is None else \
                (t[:idx.shape[1]] for t in rope_cache(16, 8, base))
            x = ref.emb(idx) * factor
            for blk in ref.blocks:
                x = blk(x, c, s)
            return ref.head(ref.norm(x) if final else x)

        want = run()
        cands = [("the final RMSNorm is missing: logits = head(norm(x)).", partial(run, final=False)),
                 ("softmax was applied: forward returns logits, not probabilities.", want.softmax(-1)),
                 ("log-softmax was applied: forward returns raw logits.", want.log_softmax(-1)),
                 ("the embeddings were not scaled: with scale_emb=True (Gemma) x = emb(idx) · sqrt(d) before the "
                  "first block.", partial(run, factor=1.0) if scale else None),
                 ("the embeddings were scaled by d; Gemma's factor is sqrt(d).", partial(run, factor=float(d))
                  if scale else None),
                 ("the embeddings were scaled although scale_emb=False: only then is x = emb(idx) · sqrt(d).",
                  partial(run, factor=math.sqrt(d)) if not scale else None)]
        if cfg.get("rope_base", 10000.0) != 10000.0:
            cands.append(("rope_base is ignored: build the tables with rope_cache(max_len, head_dim, rope_base).",
                          partial(run, base=10000.0)))
        judge(name, got, want, cands, f"with {desc}", atol=5e-5, rtol=1e-4, dims=("batch", "position", ""))
    return "3,283,456 parameters, tying, 4 forward cases incl. rope_base, Gemma's embedding scale and T = max_len"


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


@exercise_check(components=("LlamaStyleLM", "count_parameters", "parameter_breakdown"))
def check_llama_param_count(llama_param_count) -> str:
    """``llama_param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True, qkv_bias=False)``:
    the parameters of LlamaStyleLM by formula, and of its Qwen2 variant with biases on wq, wk and wv."""
    __tracebackhide__ = True
    name = "check_llama_param_count"
    cases = [((1000, 256, 4, 8, 2, 688), {}), ((1000, 256, 4, 8, 2, 688), dict(tie=True)),
             ((1000, 256, 4, 8, 2, 688), dict(qk_norm=False)), ((500, 64, 3, 4, 1, 160), {}),
             ((32000, 4096, 32, 32, 32, 11008), dict(qk_norm=False)), ((300, 48, 2, 6, 3, 128), dict(tie=True)),
             ((1000, 256, 4, 8, 2, 688), dict(qkv_bias=True)),
             ((151936, 896, 24, 14, 2, 4864), dict(tie=True, qk_norm=False, qkv_bias=True)),
             ((500, 64, 3, 4, 1, 160), dict(qkv_bias=True))]
    if is_graded():  # hidden cases drawn from the grader's secret: a table of the public answers does not pass
        g = generator(23)
        for _ in range(3):
            kv = pick(g, [1, 2, 4])
            h = kv * pick(g, [1, 2, 4])
            d = h * pick(g, [8, 16, 32, 64])
            args = (int(torch.randint(50, 60000, (1,), generator=g)), d, int(torch.randint(1, 40, (1,), generator=g)),
                    h, kv, int(torch.randint(8, 4 * d, (1,), generator=g)))
            cases.append((args, dict(tie=pick(g, [False, True]), qk_norm=pick(g, [False, True]),
                                     qkv_bias=pick(g, [False, True]))))
    for args, kw in cases:
        tie, qk_norm, qkv_bias = kw.get("tie", False), kw.get("qk_norm", True), kw.get("qkv_bias", False)
        n_kv = args[4]
        call = f"llama_param_count{args}" + "".join(f", {k}={v}" for k, v in kw.items())
        got = call_student(name, call, llama_param_count, *args, **kw)
        want = _param_count(*args, tie, qk_norm, qkv_bias)
        pc = partial(_param_count, *args, tie, qk_norm, qkv_bias)
        cands = [
            ("wk and wv counted at full size: with GQA they have n_kv_heads·head_dim outputs, not d.",
             pc(kv_full=True)),
            ("the RMSNorm scales were not counted: 2·d per block plus d for the final norm (and 2·head_dim per block "
             "for QK-norm).", pc(norms=False, qk=False)),
            ("the per-block RMSNorm scales (2·d) and the final norm (d) were not counted.", pc(norms=False)),
            ("the QK-norm scales were not counted: q_norm and k_norm have head_dim weights each, per block.",
             pc(qk=False)),
            ("the QK-norm scales were counted although qk_norm=False.",
             _param_count(*args, tie, True, qkv_bias) if not qk_norm else None),
            ("the biases of wq, wk and wv were not counted (qkv_bias=True: Qwen2's projections have them).",
             pc(bias="none") if qkv_bias else None),
            ("the key and value biases were counted at full size: wk and wv have n_kv_heads·head_dim outputs, so "
             "their biases have n_kv_heads·head_dim entries each.", pc(bias="full") if qkv_bias and
             n_kv != args[3] else None),
            ("the output projection wo was given a bias too: Qwen2 has biases on wq, wk and wv only.",
             pc(bias="wo") if qkv_bias else None),
            ("the tied head was counted a second time: with tie=True the head is the embedding matrix.",
             pc(head_when_tied=True) if tie else None),
            ("the output head (V·d) was not counted.", pc(head=False) if not tie else None),
            ("the final norm (d) was not counted.", pc(final=False)),
        ]
        judge_int(name, got, want, cands, call)
    return ("9 cases incl. the chapter's 3,283,456, tied, no QK-norm, MQA, Llama 2 7B's 6,738,415,616 and "
            "Qwen2.5-0.5B's 494,032,768 (biases on q, k, v)")
