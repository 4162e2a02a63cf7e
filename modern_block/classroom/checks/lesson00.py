"""Lesson 00: the GPT-2 block's parameter count, causal attention, GPT-2's fused attention and the size of
GPT-2 small."""

from __future__ import annotations

import math
from functools import partial

import torch

from .core import call_student, exercise_check, fail, generator, is_graded, judge, judge_int, pick

# ---- exercise 1: the parameters of one block -------------------------------------------------------------


def _block_params(d: int, d_ff: int, *, biases=True, norms=2, qkv=3, proj=True, mlp=2) -> int:
    """GPT-2 block parameters with knobs: ``norms`` vectors per LayerNorm (2: scale and shift), ``qkv`` of the
    fused projection's d×d parts, the output projection or not, ``mlp`` matrices of d×d_ff."""
    attention = qkv * d * d + (d * d if proj else 0) + ((qkv * d + (d if proj else 0)) if biases else 0)
    feed_forward = mlp * d * d_ff + ((d_ff + d) if biases else 0)
    return 2 * norms * d + attention + feed_forward


@exercise_check(components=("GPT2Block", "CausalSelfAttention", "GeluMLP", "count_parameters", "parameter_breakdown"))
def check_gpt2_block_params(gpt2_block_params) -> str:
    """``gpt2_block_params(d, d_ff=None)``: the parameters of one GPT-2 block (two LayerNorms, the fused q/k/v
    projection, the output projection and the MLP, all with biases); ``d_ff`` defaults to 4d."""
    __tracebackhide__ = True
    name = "check_gpt2_block_params"
    cases = [(768, None), (1600, None), (64, None), (128, 256), (48, 100)]
    if is_graded():  # hidden cases drawn from the grader's secret
        g = generator(24)
        cases += [(64 * int(torch.randint(1, 40, (1,), generator=g)), pick(g, [None, 100, 3000])) for _ in range(3)]
    for d, d_ff in cases:
        call = f"gpt2_block_params({d})" if d_ff is None else f"gpt2_block_params({d}, d_ff={d_ff})"
        got = call_student(name, call, gpt2_block_params, d) if d_ff is None else \
            call_student(name, call, gpt2_block_params, d, d_ff=d_ff)
        h = 4 * d if d_ff is None else d_ff
        count = partial(_block_params, d, h)
        cands = [
            ("the biases were not counted: GPT-2 has a bias in every linear layer (3d + d in attention, d_ff + d in "
             "the MLP).", count(biases=False)),
            ("the LayerNorms were not counted: each has a scale and a shift of d entries (4d per block).",
             count(norms=0)),
            ("each LayerNorm was counted with one vector: it has two, the scale γ and the shift β.", count(norms=1)),
            ("the output projection (d·d + d) was not counted.", count(proj=False)),
            ("the fused q/k/v projection was counted as one d×d matrix: it maps d to 3d.", count(qkv=1)),
            ("the MLP was counted with one matrix: it has two, d → d_ff and d_ff → d.", count(mlp=1)),
            ("d_ff was ignored and 4d used: count with the d_ff you are given.",
             _block_params(d, 4 * d) if d_ff is not None else None),
            ("no biases and no LayerNorms: 12d² is the matrices only; the block has 12d² + 13d.",
             count(biases=False, norms=0)),
        ]
        judge_int(name, got, count(), cands, call,
                  hint="two LayerNorms (2·2d), q/k/v (3d² + 3d), output projection (d² + d), MLP (2·d·d_ff + "
                       "d_ff + d).")
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


@exercise_check(components=("causal_attention", "CausalSelfAttention", "GQAttention", "GPT2Block"))
def check_causal_attention(causal_attention) -> str:
    """``causal_attention(q, k, v)`` with q, k, v of shape [B, heads, T, dh] → [B, heads, T, dh]:
    softmax(q·kᵀ / sqrt(dh), keys after the query masked out) · v."""
    __tracebackhide__ = True
    name = "check_causal_attention"
    g = generator(25)
    cases = [("q, k, v of shape [2, 3, 5, 8]", (2, 3, 5, 8), 1.0),
             ("one token: q, k, v of shape [1, 1, 1, 4]", (1, 1, 1, 4), 1.0),
             ("q, k, v of shape [1, 2, 7, 16] with scores near 100 (exp overflows: the softmax must subtract its "
              "maximum, as torch.softmax does)", (1, 2, 7, 16), 3.0)]
    for desc, shape, scale in cases:
        q, k, v = (torch.randn(*shape, generator=g) * s for s in (scale, scale, 1.0))
        if scale != 1.0:  # every score shifted by 10·40/sqrt(16) = 100: the softmax does not change, exp(100) = inf
            q[..., 0], k[..., 0] = 10.0, 40.0
        got = call_student(name, f"causal_attention on {desc}", causal_attention, q.clone(), k.clone(), v.clone())
        run = partial(_attend64, q, k, v)
        cands = [
            ("no causal mask: every token also attends to later tokens. Fill the scores above the diagonal with "
             "-inf before the softmax.", partial(run, mask="none")),
            ("the mask is upside down (triu instead of tril): it hides the past and shows the future.",
             partial(run, mask="anti")),
            ("the mask also hides the diagonal: a token may attend to itself (tril, not tril(-1)).",
             partial(run, mask="strict") if shape[2] > 1 else None),
            ("masked scores were set to 0 instead of -inf: exp(0) = 1 still gives the future a share of the softmax.",
             partial(run, fill="zero")),
            ("the scores are not scaled: divide q·kᵀ by sqrt(dh).", partial(run, scale="none")),
            ("the scores were divided by dh; divide by sqrt(dh).", partial(run, scale="dh_lin")),
            ("softmax over the wrong axis (over the queries): normalise each query's row over the keys (dim=-1).",
             partial(run, softmax_dim=-2)),
            ("k·qᵀ instead of q·kᵀ: row i must hold query i's scores against every key.", partial(run, swap_qk=True)),
            ("the attention weights were returned: multiply them by v.",
             partial(run, weights=True) if shape[2] == shape[3] else None),
        ]
        judge(name, got, run(), cands, f"on {desc}", rtol=1e-4, atol=1e-5 if scale == 1.0 else 1e-4,
              hint="scores = q @ k.transpose(-1, -2) / sqrt(dh); mask with -inf above the diagonal; "
                   "softmax(dim=-1) @ v.")
        if got.dtype != q.dtype:
            fail(name, f"on {desc}: the values are right but the dtype is {got.dtype}; keep q's dtype.")
    return "3 cases: several heads, one token, large scores"


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
        parts = dict(zip("qkv", per_head.split(dh, dim=-1), strict=True))
        parts = {key: t.reshape(B, T, d) for key, t in parts.items()}
    q, k, v = (parts[c] for c in order)

    def heads(t):
        return t.view(B, T, n_heads, dh).transpose(1, 2) if split == "ok" else t.reshape(B, n_heads, T, dh)

    out = _attend64(heads(q), heads(k), heads(v), mask=mask, scale=scale)  # [B, h, T, dh]
    merged = out.transpose(1, 2).reshape(B, T, d) if merge == "ok" else out.reshape(B, T, d)
    return merged @ w_proj.double().T + (b_proj.double() if bias_proj else 0)


@exercise_check(components=("CausalSelfAttention", "causal_attention", "GPT2Block", "GPT2LM"))
def check_gpt2_attention(gpt2_attention) -> str:
    """``gpt2_attention(x, w_qkv, b_qkv, w_proj, b_proj, n_heads)``: x [B, T, d]; w_qkv [3d, d] and b_qkv [3d]
    make q, k and v (in that order along the features), w_proj [d, d] and b_proj [d] the output; causal."""
    __tracebackhide__ = True
    name = "check_gpt2_attention"
    g = generator(26)
    cases = [("d=32, 4 heads, x of shape [2, 6, 32]", 32, 4, 2, 6), ("d=24, 3 heads, one token", 24, 3, 1, 1),
             ("d=16, one head, x of shape [1, 5, 16]", 16, 1, 1, 5),
             ("d=32, 8 heads, x of shape [2, 3, 32]", 32, 8, 2, 3)]
    for desc, d, h, B, T in cases:
        x = torch.randn(B, T, d, generator=g)
        w_qkv, b_qkv = torch.randn(3 * d, d, generator=g) / math.sqrt(d), torch.randn(3 * d, generator=g) * 0.5
        w_proj, b_proj = torch.randn(d, d, generator=g) / math.sqrt(d), torch.randn(d, generator=g) * 0.5
        args = (x, w_qkv, b_qkv, w_proj, b_proj)
        got = call_student(name, f"gpt2_attention with {desc}", gpt2_attention, *(a.clone() for a in args), h)
        run = partial(_gpt2_attention64, *args, h)
        cands = [
            ("q, k and v taken in the wrong order: the first d features of the projection are q, then k, then v.",
             partial(run, order="kqv")),
            ("v and k swapped: the projection's features are q, k, v in this order.", partial(run, order="qvk")),
            ("the fused projection was split per head ([q_h, k_h, v_h] side by side): GPT-2's is three blocks of d "
             "features, q then k then v (split(d, dim=-1)).", partial(run, fused="per_head") if h > 1 else None),
            ("the heads were split with view(B, n_heads, T, dh), which mixes tokens and features; use "
             "view(B, T, n_heads, dh).transpose(1, 2).", partial(run, split="bad") if h > 1 and T > 1 else None),
            ("the heads were merged without transposing back: out.transpose(1, 2).reshape(B, T, d).",
             partial(run, merge="bad") if h > 1 and T > 1 else None),
            ("no causal mask: a token must not attend to later tokens.", partial(run, mask="none") if T > 1 else None),
            ("the scores are not scaled by 1/sqrt(dh) (dh = d / n_heads, the head size).", partial(run, scale="none")),
            ("the bias of the q/k/v projection (b_qkv) is missing.", partial(run, bias_qkv=False)),
            ("the bias of the output projection (b_proj) is missing.", partial(run, bias_proj=False)),
        ]
        judge(name, got, run(), cands, f"with {desc}", rtol=1e-4, atol=1e-5,
              hint="qkv = x @ w_qkv.T + b_qkv; q, k, v = qkv.split(d, dim=-1); heads; causal attention; "
                   "merge; @ w_proj.T + b_proj.")
    return "4 cases: several heads, one token, one head, head size 4"


# ---- exercise 4: GPT-2 small, by value -------------------------------------------------------------------

_GPT2_SMALL = dict(V=50257, T=1024, d=768, L=12)


def _gpt2_params(V, T, d, L, *, tied=True, positions=True, final_norm=True, block=None) -> int:
    block = _block_params(d, 4 * d) if block is None else block
    return V * d + (T * d if positions else 0) + L * block + (2 * d if final_norm else 0) + (0 if tied else V * d)


@exercise_check(value="gpt2_small_params")
def check_gpt2_small_params(n_params) -> str:
    """``gpt2_small_params``: GPT-2 small's parameter count (V = 50,257, 1,024 positions, d = 768, 12 layers,
    output layer tied to the token embedding)."""
    __tracebackhide__ = True
    name = "check_gpt2_small_params"
    V, T, d, L = _GPT2_SMALL.values()
    want = _gpt2_params(V, T, d, L)
    cands = [
        (f"the output layer was counted as its own matrix: GPT-2 ties it to the token embedding (+V·d = "
         f"{V * d:,}).", _gpt2_params(V, T, d, L, tied=False)),
        ("the position table (1,024 × 768) was not counted.", _gpt2_params(V, T, d, L, positions=False)),
        ("the final LayerNorm (2d) was not counted.", _gpt2_params(V, T, d, L, final_norm=False)),
        ("the blocks were counted without biases and LayerNorms (12d² each); each has 12d² + 13d.",
         _gpt2_params(V, T, d, L, block=12 * d * d)),
        ("only the 12 blocks were counted: add the token and position embeddings and the final LayerNorm.",
         L * _block_params(d, 4 * d)),
    ]
    judge_int(name, n_params, want, cands, "gpt2_small_params",
              reveal=False)
    return "124,439,808"
