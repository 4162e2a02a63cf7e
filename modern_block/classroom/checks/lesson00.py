"""Lesson 00: the GPT-2 block's parameter count, causal attention, GPT-2's fused attention and the size of
GPT-2 small."""

from __future__ import annotations

import math
from functools import partial

import torch

from .core import Case, CheckRun, Mistake, exercise_check

# ---- exercise 1: the parameters of one block -------------------------------------------------------------


def _block_params(d: int, d_ff: int, *, biases=True, vectors=2, norms=2, qkv=3, qkv_bias=3, proj=True,
                  mlp=2) -> int:
    """GPT-2 block parameters with knobs: ``norms`` LayerNorms of ``vectors`` d-vectors each, ``qkv`` of the fused
    projection's d×d parts and ``qkv_bias`` d-vectors of its bias, the output projection or not, ``mlp``
    matrices of d×d_ff."""
    attention = qkv * d * d + (d * d if proj else 0) + ((qkv_bias * d + (d if proj else 0)) if biases else 0)
    feed_forward = mlp * d * d_ff + ((d_ff + d) if biases else 0)
    return norms * vectors * d + attention + feed_forward


BLOCK_MISTAKES = [
    Mistake("the biases were not counted: GPT-2 has a bias in every linear layer (3d + d in attention, d_ff + d "
            "in the MLP).", dict(biases=False)),
    Mistake("the LayerNorms were not counted: each has a scale and a shift of d entries (4d per block).",
            dict(norms=0)),
    Mistake("each LayerNorm was counted with one vector: it has two, the scale γ and the shift β.",
            dict(vectors=1)),
    Mistake("one LayerNorm was counted: the block has two, one before the attention and one before the MLP.",
            dict(norms=1)),
    Mistake("the q/k/v bias was counted with d entries: the fused projection has 3d outputs, so its bias has 3d.",
            dict(qkv_bias=1)),
    Mistake("the output projection (d·d + d) was not counted.", dict(proj=False)),
    Mistake("the fused q/k/v projection was counted as one d×d matrix: it maps d to 3d.", dict(qkv=1, qkv_bias=1)),
    Mistake("the MLP was counted with one matrix: it has two, d → d_ff and d_ff → d.", dict(mlp=1)),
    Mistake("d_ff was ignored and 4d used: count with the d_ff you are given.",
            lambda c: _block_params(c.d, 4 * c.d), when=lambda c: c.d_ff is not None),
    Mistake("no biases and no LayerNorms: 12d² is the matrices only; the block has 12d² + 13d.",
            dict(biases=False, norms=0)),
]


def _block_case(d: int, d_ff: int | None) -> Case:
    args, kwargs = (d,), ({} if d_ff is None else {"d_ff": d_ff})
    text = f"gpt2_block_params({d})" if d_ff is None else f"gpt2_block_params({d}, d_ff={d_ff})"
    return Case(text, partial(_block_params, d, 4 * d if d_ff is None else d_ff), args, kwargs, d=d, d_ff=d_ff)


@exercise_check
def check_gpt2_block_params(run: CheckRun, gpt2_block_params) -> str:
    """``gpt2_block_params(d, d_ff=None)``: the parameters of one GPT-2 block (two LayerNorms, the fused q/k/v
    projection, the output projection and the MLP, all with biases); ``d_ff`` defaults to 4d."""
    public = [_block_case(d, d_ff) for d, d_ff in [(768, None), (1600, None), (64, None), (128, 256), (48, 100)]]
    cases = run.cases(public, lambda g: [_block_case(64 * run.randint(g, 1, 40), run.pick(g, [None, 100, 3000]))
                                         for _ in range(3)], seed=24)
    run.judge_each(gpt2_block_params, cases, run.judge_int, BLOCK_MISTAKES)
    return "5 cases incl. GPT-2 small's 7,087,872 per block and a custom d_ff"


# ---- exercise 2: causal attention ---------------------------------------------------------------------


def _attend64(q, k, v, *, mask="causal", scale="dh", softmax_dim=-1, fill="inf", swap_qk=False, weights=False):
    """Scaled dot-product causal attention in float64, with knobs for the common mistakes."""
    q, k, v = q.double(), k.double(), v.double()
    T, dh = q.shape[-2], q.shape[-1]
    scores = (k @ q.transpose(-1, -2)) if swap_qk else (q @ k.transpose(-1, -2))  # [B, h, T, T]
    scores = scores * {"dh": dh ** -0.5, "none": 1.0, "dh_lin": 1.0 / dh}[scale]
    keep = {"causal": torch.ones(T, T, dtype=torch.bool).tril(), "anti": torch.ones(T, T, dtype=torch.bool).triu(),
            "strict": torch.ones(T, T, dtype=torch.bool).tril(-1), "none": None}[mask]
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf") if fill == "inf" else 0.0)
    p = scores.softmax(softmax_dim)
    return p if weights else p @ v


ATTENTION_MISTAKES = [
    Mistake("no causal mask: every token also attends to later tokens. Fill the scores above the diagonal with "
            "-inf before the softmax.", dict(mask="none")),
    Mistake("the mask is upside down (triu instead of tril): it hides the past and shows the future.",
            dict(mask="anti")),
    Mistake("the mask also hides the diagonal: a token may attend to itself (tril, not tril(-1)).",
            dict(mask="strict"), when=lambda c: c.T > 1),
    Mistake("masked scores were set to 0 instead of -inf: exp(0) = 1 still gives the future a share of the "
            "softmax.", dict(fill="zero")),
    Mistake("the scores are not scaled: divide q·kᵀ by sqrt(dh).", dict(scale="none")),
    Mistake("the scores were divided by dh; divide by sqrt(dh).", dict(scale="dh_lin")),
    Mistake("softmax over the wrong axis (over the queries): normalise each query's row over the keys (dim=-1).",
            dict(softmax_dim=-2)),
    Mistake("k·qᵀ instead of q·kᵀ: row i must hold query i's scores against every key.", dict(swap_qk=True)),
    Mistake("the attention weights were returned: multiply them by v.", dict(weights=True),
            when=lambda c: c.T == c.dh),
]


def _attention_case(g, shape, scale: float, text: str) -> Case:
    q, k, v = (torch.randn(*shape, generator=g) * s for s in (scale, scale, 1.0))
    if scale != 1.0:  # every score shifted by 10·40/sqrt(16) = 100: the softmax does not change, exp(100) = inf
        q[..., 0], k[..., 0] = 10.0, 40.0
    return Case(f"causal_attention on {text}", partial(_attend64, q, k, v), (q, k, v), T=shape[2], dh=shape[3],
                large=scale != 1.0)


@exercise_check
def check_causal_attention(run: CheckRun, causal_attention) -> str:
    """``causal_attention(q, k, v)`` with q, k, v of shape [B, heads, T, dh] → [B, heads, T, dh]:
    softmax(q·kᵀ / sqrt(dh), keys after the query masked out) · v, written by hand (not PyTorch's fused one)."""
    g = run.rng(25)
    public = [_attention_case(g, (2, 3, 5, 8), 1.0, "q, k, v of shape [2, 3, 5, 8]"),
              _attention_case(g, (1, 1, 1, 4), 1.0, "one token: q, k, v of shape [1, 1, 1, 4]"),
              _attention_case(g, (1, 2, 7, 16), 3.0, "q, k, v of shape [1, 2, 7, 16] with scores near 100 (exp "
                                                     "overflows: the softmax must subtract its maximum, as "
                                                     "torch.softmax does)"),
              _attention_case(g, (1, 2, 6, 6), 1.0, "q, k, v of shape [1, 2, 6, 6]")]

    def secret(g):
        shape = (run.randint(g, 1, 3), run.randint(g, 1, 4), run.randint(g, 2, 10), 2 * run.randint(g, 2, 9))
        return [_attention_case(g, shape, 1.0, f"q, k, v of shape {list(shape)}")]

    for case in run.cases(public, secret, seed=125):
        got = run.call(case.text, causal_attention, *case.args)
        run.judge(case, got, ATTENTION_MISTAKES, rtol=1e-4, atol=1e-4 if case.large else 1e-5,
                  hint="compare with the formula: scores scaled by 1/sqrt(dh), -inf above the diagonal, softmax over "
                       "the keys, times v.")
        run.require(not isinstance(got, torch.Tensor) or got.dtype == case.args[0].dtype, case.text,
                    f"the values are right but the dtype is {getattr(got, 'dtype', None)}; keep q's dtype.")
    return "4 cases: several heads, one token, large scores, T = dh"


# ---- exercise 3: GPT-2's fused attention -----------------------------------------------------------------


def _gpt2_attention64(x, w_qkv, b_qkv, w_proj, b_proj, n_heads, *, order="qkv", split="ok", merge="ok",
                      mask="causal", scale="dh", bias_qkv=True, bias_proj=True, fused="blocks"):
    """GPT-2's attention in float64: one projection to 3d features (q, then k, then v), heads, causal
    attention, heads merged, output projection; knobs for the common mistakes."""
    B, T, d = x.shape
    dh = d // n_heads
    qkv = x.double() @ w_qkv.double().T + (b_qkv.double() if bias_qkv else 0)  # [B, T, 3d]
    if fused == "blocks":
        parts = dict(zip("qkv", qkv.split(d, dim=-1), strict=True))
    else:  # per head: [q_h, k_h, v_h] next to each other
        per_head = qkv.view(B, T, n_heads, 3 * dh)
        parts = {key: t.reshape(B, T, d) for key, t in zip("qkv", per_head.split(dh, dim=-1), strict=True)}
    q, k, v = (parts[c] for c in order)

    def heads(t):
        return t.view(B, T, n_heads, dh).transpose(1, 2) if split == "ok" else t.reshape(B, n_heads, T, dh)

    out = _attend64(heads(q), heads(k), heads(v), mask=mask, scale=scale)  # [B, h, T, dh]
    merged = out.transpose(1, 2).reshape(B, T, d) if merge == "ok" else out.reshape(B, T, d)
    return merged @ w_proj.double().T + (b_proj.double() if bias_proj else 0)


GPT2_MISTAKES = [
    Mistake("q, k and v taken in the wrong order: the first d features of the projection are q, then k, then v.",
            dict(order="kqv")),
    Mistake("v and k swapped: the projection's features are q, k, v in this order.", dict(order="qvk")),
    Mistake("the fused projection was split per head ([q_h, k_h, v_h] side by side): GPT-2's is three blocks of d "
            "features, q then k then v (split(d, dim=-1)).", dict(fused="per_head"), when=lambda c: c.h > 1),
    Mistake("the heads were split with view(B, n_heads, T, dh), which mixes tokens and features; use "
            "view(B, T, n_heads, dh).transpose(1, 2).", dict(split="bad"), when=lambda c: c.h > 1 and c.T > 1),
    Mistake("the heads were merged without transposing back: out.transpose(1, 2).reshape(B, T, d).",
            dict(merge="bad"), when=lambda c: c.h > 1 and c.T > 1),
    Mistake("no causal mask: a token must not attend to later tokens.", dict(mask="none"), when=lambda c: c.T > 1),
    Mistake("the scores are not scaled by 1/sqrt(dh) (dh = d / n_heads, the head size).", dict(scale="none")),
    Mistake("the bias of the q/k/v projection (b_qkv) is missing.", dict(bias_qkv=False)),
    Mistake("the bias of the output projection (b_proj) is missing.", dict(bias_proj=False)),
]


def _gpt2_case(g, d: int, h: int, B: int, T: int, text: str) -> Case:
    x = torch.randn(B, T, d, generator=g)
    w_qkv, b_qkv = torch.randn(3 * d, d, generator=g) / math.sqrt(d), torch.randn(3 * d, generator=g) * 0.5
    w_proj, b_proj = torch.randn(d, d, generator=g) / math.sqrt(d), torch.randn(d, generator=g) * 0.5
    args = (x, w_qkv, b_qkv, w_proj, b_proj, h)
    return Case(f"gpt2_attention with {text}", partial(_gpt2_attention64, *args), args, h=h, T=T)


@exercise_check
def check_gpt2_attention(run: CheckRun, gpt2_attention) -> str:
    """``gpt2_attention(x, w_qkv, b_qkv, w_proj, b_proj, n_heads)``: x [B, T, d]; w_qkv [3d, d] and b_qkv [3d]
    make q, k and v (in that order along the features), w_proj [d, d] and b_proj [d] the output; causal."""
    g = run.rng(26)
    public = [_gpt2_case(g, 32, 4, 2, 6, "d=32, 4 heads, x of shape [2, 6, 32]"),
              _gpt2_case(g, 24, 3, 1, 1, "d=24, 3 heads, one token"),
              _gpt2_case(g, 16, 1, 1, 5, "d=16, one head, x of shape [1, 5, 16]"),
              _gpt2_case(g, 32, 8, 2, 3, "d=32, 8 heads, x of shape [2, 3, 32]")]

    def secret(g):
        h, T = run.pick(g, [2, 3, 4]), run.randint(g, 2, 8)
        d = h * 2 * run.randint(g, 2, 6)
        return [_gpt2_case(g, d, h, 2, T, f"d={d}, {h} heads, x of shape [2, {T}, {d}]")]

    run.judge_each(gpt2_attention, run.cases(public, secret, seed=126), run.judge, GPT2_MISTAKES,
                   dims=("batch", "position", ""), hint="compare with the formula: q, k, v from one projection, heads, "
                                                        "causal attention, merge, output projection.")
    return "4 cases: several heads, one token, one head, head size 4"


# ---- exercise 4: GPT-2 small, by value -------------------------------------------------------------------


def _gpt2_params(V=50257, T=1024, d=768, L=12, *, tied=True, positions=True, final_vectors=2, embeddings=True,
                 **block) -> int:
    return (V * d if embeddings else 0) + (T * d if positions and embeddings else 0) + \
        L * _block_params(d, 4 * d, **block) + final_vectors * d + (0 if tied else V * d)


GPT2_SMALL_MISTAKES = [
    Mistake("the output layer was counted as its own matrix: GPT-2 ties it to the token embedding, so it adds "
            "nothing.", dict(tied=False)),
    Mistake("the position table (1,024 positions of d numbers) was not counted.", dict(positions=False)),
    Mistake("the final LayerNorm was not counted: a scale and a shift of d entries.", dict(final_vectors=0)),
    Mistake("the final LayerNorm was counted with one vector: it has a scale and a shift.", dict(final_vectors=1)),
    Mistake("the blocks were counted without biases and LayerNorms (12d² each); each has 12d² + 13d.",
            dict(biases=False, norms=0)),
    Mistake("only the 12 blocks were counted: add the token and position tables and the final LayerNorm.",
            dict(embeddings=False, final_vectors=0)),
    *[Mistake(f"in every block: {m.diagnosis}", m.ways[0]) for m in BLOCK_MISTAKES[:8]],
]


@exercise_check(value="gpt2_small_params")
def check_gpt2_small_params(run: CheckRun, n_params) -> str:
    """``gpt2_small_params``: GPT-2 small's parameter count (V = 50,257, 1,024 positions, d = 768, 12 layers,
    output layer tied to the token embedding)."""
    run.judge_int(Case("gpt2_small_params", _gpt2_params), n_params, GPT2_SMALL_MISTAKES)
    return "124,439,808"
