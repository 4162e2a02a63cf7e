"""Lesson 05: multi-head latent attention: the latent cache and weight absorption."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...kv_cache import mla_cache_bytes_per_token
from .core import (
    call_student,
    exercise_check,
    fail,
    generator,
    is_graded,
    judge,
    judge_int,
    pick,
)


@exercise_check(components=("mla_cache_bytes_per_token", "ModelPreset", "cache_size"))
def check_mla_cache_bytes(mla_cache_bytes) -> str:
    """``mla_cache_bytes(n_layers, kv_latent_dim, rope_dim, bytes_per_elem=2)``: bytes per token."""
    __tracebackhide__ = True
    name = "check_mla_cache_bytes"
    cases = [(61, 512, 64, 2), (61, 512, 64, 1), (4, 32, 8, 4), (1, 16, 2, 2)]
    if is_graded():  # hidden cases drawn from the grader's secret: a table of the public answers does not pass
        g = generator(22)
        cases += [(int(torch.randint(2, 128, (1,), generator=g)), pick(g, [96, 128, 256, 384, 512, 768]),
                   pick(g, [16, 32, 48, 64]), pick(g, [1, 2, 4])) for _ in range(3)]
    for L, dc, dr, b in cases:
        call = f"mla_cache_bytes({L}, {dc}, {dr}, {b})"
        got = call_student(name, call, mla_cache_bytes, L, dc, dr, b)
        want = mla_cache_bytes_per_token(L, dc, dr, b)
        cands = [
            ("counted two tensors (like K and V): MLA caches one latent c (d_c) and one shared RoPE key (d_R) "
             "per layer, nothing per head.", 2 * want),
            ("the decoupled RoPE key was forgotten: each layer caches d_c + d_R numbers.", L * dc * b),
            ("the latent was forgotten: each layer caches d_c + d_R numbers.", L * dr * b),
            ("the layers were not counted: every layer has its own cache.", (dc + dr) * b),
            ("bytes_per_elem was ignored: multiply the number of elements by it.", L * (dc + dr)),
            ("bits instead of bytes: multiply by bytes_per_elem, not by 8·bytes.", 8 * want),
        ]
        judge_int(name, got, want, cands, call, hint="n_layers · (kv_latent_dim + rope_dim) · bytes_per_elem.")
    return "4 cases incl. DeepSeek-V3's 70,272 bytes per token"


def _mla_inputs(g, B, h, T, S, d_nope, d_c, d_r, d_v):
    return dict(
        q_nope=torch.randn(B, h, T, d_nope, generator=g), q_rope=torch.randn(B, h, T, d_r, generator=g),
        latent=torch.randn(B, S, d_c, generator=g), k_rope=torch.randn(B, S, d_r, generator=g),
        w_uk=torch.randn(h, d_nope, d_c, generator=g) / math.sqrt(d_c),
        w_uv=torch.randn(h, d_v, d_c, generator=g) / math.sqrt(d_c))


def _fused(i) -> torch.Tensor:
    """The heads' up-projections as one matrix, DeepSeek's kv_b_proj.weight: per head m, the d_nope rows of
    W_UK,m, then the d_v rows of W_UV,m; [h·(d_nope + d_v), d_c]."""
    h, _, dc = i["w_uk"].shape
    return torch.cat([i["w_uk"], i["w_uv"]], dim=1).reshape(-1, dc)


def _split_by_blocks(i) -> dict:
    """``i`` with W_UK and W_UV read from the fused matrix the wrong way: all keys' rows first, then all values'."""
    h, dn, dc = i["w_uk"].shape
    rows = _fused(i)
    return {**i, "w_uk": rows[:h * dn].reshape(h, dn, dc), "w_uv": rows[h * dn:].reshape(h, -1, dc)}


_SPLIT = ("the fused matrix was split into one block of keys and one of values: its rows go head by head, "
          "d_nope rows of W_UK,m then d_v rows of W_UV,m for head m (view it as [h, d_nope + d_v, d_c] first).")


_MLA_CASES = [  # (description, B, h, T, S, d_nope, d_c, d_R, d_v)
    ("d_nope = d_c = 6, d_v = d_c (square per-head matrices), batch 2, 3 heads", 2, 3, 4, 4, 6, 6, 4, 6),
    ("d_nope = 4, d_c = 10, d_R = 2, d_v = 5, batch 1, 2 heads", 1, 2, 3, 5, 4, 10, 2, 5),
    ("one head, one new token over 7 cached latents", 2, 1, 1, 7, 8, 12, 4, 6),
]


def _mla_naive64(i, scale, *, rope=True, nope=True, mask="offset", w_uk_t=False, w_uv_t=False, scale_mode="given",
                 softmax_dim=-1, no_uv=False):
    """Scores and outputs the long way: rebuild every head's keys and values from the latents."""
    qn, qr, c, kr = (i[k].double() for k in ("q_nope", "q_rope", "latent", "k_rope"))
    w_uk, w_uv = i["w_uk"].double(), i["w_uv"].double()
    if w_uk_t:
        w_uk = w_uk.transpose(1, 2)
    if w_uv_t:
        w_uv = w_uv.transpose(1, 2)
    k_nope = torch.einsum("bsc,hnc->bhsn", c, w_uk)  # [B, h, S, d_nope]
    v = torch.einsum("bsc,hvc->bhsv", c, w_uv)  # [B, h, S, d_v]
    if no_uv:  # the weighted sum of latents, never mapped to values
        v = c.unsqueeze(1).expand(-1, w_uv.shape[0], -1, -1)
    s = 0
    if nope:
        s = s + qn @ k_nope.transpose(-1, -2)
    if rope:
        s = s + qr @ kr.unsqueeze(1).transpose(-1, -2)
    sc = {"given": scale, "none": 1.0, "twice": scale * scale,
          "nope": qn.shape[-1] ** -0.5, "latent": c.shape[-1] ** -0.5}[scale_mode]
    s = s * sc
    T, S = qn.shape[2], c.shape[1]
    if mask == "offset":
        keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    elif mask == "topleft":
        keep = torch.ones(T, S, dtype=torch.bool).tril()
    else:
        keep = None
    return s, v, keep, softmax_dim


def _mla_out64(s, v, keep, softmax_dim):
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(softmax_dim).nan_to_num(0.0) @ v


@exercise_check(components=("MLAttention",))
def check_absorb_query(absorb_query) -> str:
    """``absorb_query(q_nope, w_kv_b)``: q_nope [B, h, T, d_nope], w_kv_b [h·(d_nope + d_v), d_c] (DeepSeek's
    kv_b_proj.weight: per head, W_UK,m's rows then W_UV,m's) → [B, h, T, d_c] = W_UK,mᵀ q per head, so that
    (W_UK,mᵀ q)·c = q·(W_UK,m c)."""
    __tracebackhide__ = True
    name = "check_absorb_query"
    g = generator(8)
    for desc, B, h, T, S, dn, dc, dr, dv in _MLA_CASES:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        got = call_student(name, f"absorb_query with {desc}", absorb_query, i["q_nope"].clone(), _fused(i))
        qn, w = i["q_nope"].double(), i["w_uk"].double()
        want = torch.einsum("bhtn,hnc->bhtc", qn, w)
        cands = [
            (_SPLIT, torch.einsum("bhtn,hnc->bhtc", qn, _split_by_blocks(i)["w_uk"].double())),
            ("multiplied by W_UK,m instead of its transpose: the key is k = W_UK,m c, so q·k = (W_UK,mᵀ q)·c; "
             "contract q with the d_nope axis of w_uk.", torch.einsum("bhtn,hcn->bhtc", qn, w) if dn == dc else None),
            ("every head used head 0's matrix: each head m has its own W_UK,m = w_uk[m].",
             torch.einsum("bhtn,nc->bhtc", qn, w[0])),
            ("the heads were summed: keep one latent query per head, [B, h, T, d_c].",
             torch.einsum("bhtn,hnc->btc", qn, w).unsqueeze(1).expand(-1, h, -1, -1)),
        ]
        judge(name, got, want, cands, f"with {desc}", dims=("head", "position", ""))
        # the property the absorption rests on, stated in the learner's terms
        lhs = got.double() @ i["latent"].double().transpose(-1, -2).unsqueeze(1)
        rhs = qn @ torch.einsum("bsc,hnc->bhsn", i["latent"].double(), w).transpose(-1, -2)
        if not torch.allclose(lhs, rhs, atol=1e-5, rtol=1e-4):
            fail(name, f"with {desc}: (absorbed q)·c differs from q·(W_UK c).")
    return "3 cases: square and rectangular W_UK, batch 1 and 2, one head"


@exercise_check(components=("MLAttention",))
def check_absorbed_scores(absorbed_scores) -> str:
    """``absorbed_scores(q_nope, q_rope, latent, k_rope, w_kv_b, scale)`` → [B, h, T, S]: the pre-softmax
    scores (W_UK,mᵀ q_nope)·c_s + q_rope·k_R,s, times scale, computed from the latents without keys."""
    __tracebackhide__ = True
    name = "check_absorbed_scores"
    g = generator(9)
    for desc, B, h, T, S, dn, dc, dr, dv in _MLA_CASES:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        scale = (dn + dr) ** -0.5
        args = [i[k].clone() for k in ("q_nope", "q_rope", "latent", "k_rope")] + [_fused(i)]
        got = call_student(name, f"absorbed_scores with {desc}", absorbed_scores, *args, scale)
        want = _mla_naive64(i, scale)[0]
        def mk(i=i, scale=scale, **kw):
            return _mla_naive64(i, scale, **kw)[0]

        cands = [
            (_SPLIT, lambda i=i, scale=scale: _mla_naive64(_split_by_blocks(i), scale)[0]),
            ("the RoPE part is missing: the score is q_nope·k_nope + q_rope·k_R (the shared, decoupled RoPE key).",
             partial(mk, rope=False)),
            ("the no-RoPE (latent) part is missing: add (W_UKᵀ q_nope)·c to q_rope·k_R.", partial(mk, nope=False)),
            ("the scale is not applied: multiply the scores by scale.", partial(mk, scale_mode="none")),
            ("the scale was applied twice.", partial(mk, scale_mode="twice")),
            ("the scale argument is ignored (1/sqrt(d_nope)): the key a head sees has d_nope + d_R dimensions; "
             "use the scale passed in.", partial(mk, scale_mode="nope")),
            ("the scale argument is ignored (1/sqrt(d_c)): use the scale passed in.", partial(mk, scale_mode="latent")),
            ("multiplied by W_UK,m instead of its transpose (absorb with W_UK,mᵀ q).", partial(mk, w_uk_t=True)
             if dn == dc else None),
        ]
        judge(name, got, want, cands, f"with {desc}", dims=("head", "position", "latent"))
    return "3 cases: square and rectangular W_UK, T < S, one head"


@exercise_check(components=("MLAttention",))
def check_mla_absorption(absorbed_attention) -> str:
    """``absorbed_attention(q_nope, q_rope, latent, k_rope, w_kv_b, scale)`` → [B, h, T, d_v]: causal
    attention of the T newest positions over all S latents, absorbed, equal to the naive computation."""
    __tracebackhide__ = True
    name = "check_mla_absorption"
    g = generator(10)
    cases = _MLA_CASES + [("a chunk of 3 new tokens over 7 latents (T < S, causal with an offset)",
                           2, 2, 3, 7, 6, 6, 4, 6)]
    for desc, B, h, T, S, dn, dc, dr, dv in cases:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        scale = (dn + dr) ** -0.5
        args = [i[k].clone() for k in ("q_nope", "q_rope", "latent", "k_rope")] + [_fused(i)]
        got = call_student(name, f"absorbed_attention with {desc}", absorbed_attention, *args, scale)
        want = _mla_out64(*_mla_naive64(i, scale))

        def mk(i=i, scale=scale, **kw):
            return _mla_out64(*_mla_naive64(i, scale, **kw))

        cands = [
            (_SPLIT, lambda i=i, scale=scale: _mla_out64(*_mla_naive64(_split_by_blocks(i), scale))),
            ("no causal mask: query t (at position S-T+t) must not see later latents.", partial(mk, mask="none")),
            ("the causal mask is aligned to the top-left (is_causal=True with T < S): the T queries are the "
             "newest positions, so query t sees latents 0 .. S-T+t (tril(diagonal=S-T)).",
             partial(mk, mask="topleft") if T < S else None),
            ("the RoPE part of the score is missing (q_rope·k_R).", partial(mk, rope=False)),
            ("the latent part of the score is missing ((W_UKᵀ q_nope)·c).", partial(mk, nope=False)),
            ("the scale is not applied to the scores.", partial(mk, scale_mode="none")),
            ("softmax over the wrong axis: normalise over the latents (last dim).", partial(mk, softmax_dim=-2)),
            ("W_UV,m was not applied: the weighted sum of latents Σ_s p_s c_s lives in the latent space; head m's "
             "output is w_uv[m] @ (Σ_s p_s c_s).", partial(mk, no_uv=True)),
            ("W_UV,m was applied transposed: head m's value is W_UV,m c = w_uv[m] @ c, so the output is "
             "w_uv[m] @ (Σ_s p_s c_s).", partial(mk, w_uv_t=True) if dv == dc else None),
            ("multiplied by W_UK,m instead of its transpose when absorbing the query.",
             partial(mk, w_uk_t=True) if dn == dc else None),
        ]
        hint = ""
        if isinstance(got, torch.Tensor) and got.shape[:-1] == want.shape[:-1] and got.shape[-1] == dc and dc != dv:
            hint = ("The last dimension is d_c: that is the weighted sum of latents; map it to the head's value "
                    "space with W_UV,m (w_uv[m] @ mixed).")
        judge(name, got, want, cands, f"with {desc}", hint=hint)
    return "4 cases: prefill, one new token, a chunk with offset mask, square and rectangular weights"


@exercise_check(value="kimi_k2_cache_bytes")
def check_kimi_k2_cache_bytes(n_bytes) -> str:
    """``kimi_k2_cache_bytes``: Kimi K2's MLA cache per token in bf16 (61 layers, latent 512, RoPE key 64, 64
    heads)."""
    __tracebackhide__ = True
    L, d_c, d_r, heads = 61, 512, 64, 64
    want = mla_cache_bytes_per_token(L, d_c, d_r, 2)
    cands = [
        ("scaled with the heads (64 against DeepSeek-V3's 128): MLA caches one latent and one RoPE key per layer, "
         "shared by all heads, so the head count does not enter.", want // 2),
        ("the cache of full multi-head attention (64 heads, 192-dim keys, 128-dim values): MLA caches the latent "
         "instead.", L * heads * (192 + 128) * 2),
        ("twice the answer: the latent and the RoPE key are cached once per layer (not as a K and a V), in 2 "
         "bytes each (bf16).", 2 * want),
        ("the RoPE key (64 numbers per layer) was left out.", L * d_c * 2),
        ("one layer only: every one of the 61 layers caches its own latent.", (d_c + d_r) * 2),
    ]
    judge_int("check_kimi_k2_cache_bytes", n_bytes, want, cands, "kimi_k2_cache_bytes",
              reveal=False)
    return "70,272 bytes per token, the same as DeepSeek-V3"
