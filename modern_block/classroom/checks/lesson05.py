"""Lesson 05: multi-head latent attention: the latent cache and weight absorption."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...kv_cache import mla_cache_bytes_per_token
from .core import Case, CheckRun, Mistake, exercise_check

# ---- exercise 1: the latent cache's size ---------------------------------------------------------------------


def _mla_bytes(L: int, dc: int, dr: int, b: int = 2, *, tensors=1, latent=True, rope=True, layers=True,
               bytes_per=True, bits=False) -> int:
    per_layer = (dc if latent else 0) + (dr if rope else 0)
    return tensors * (L if layers else 1) * per_layer * (b if bytes_per else 1) * (8 if bits else 1)


MLA_BYTES_MISTAKES = [
    Mistake("counted two tensors (like K and V): MLA caches one latent c (d_c) and one shared RoPE key (d_R) per "
            "layer, nothing per head.", dict(tensors=2)),
    Mistake("the decoupled RoPE key was forgotten: each layer caches d_c + d_R numbers.", dict(rope=False)),
    Mistake("the latent was forgotten: each layer caches d_c + d_R numbers.", dict(latent=False)),
    Mistake("the layers were not counted: every layer has its own cache.", dict(layers=False)),
    Mistake("bytes_per_elem was ignored: multiply the number of elements by it.", dict(bytes_per=False)),
    Mistake("bits instead of bytes: multiply by bytes_per_elem, not by 8·bytes.", dict(bits=True)),
]


def _bytes_case(L: int, dc: int, dr: int, b: int) -> Case:
    return Case(f"mla_cache_bytes({L}, {dc}, {dr}, {b})", partial(_mla_bytes, L, dc, dr, b), (L, dc, dr, b))


@exercise_check
def check_mla_cache_bytes(run: CheckRun, mla_cache_bytes) -> str:
    """``mla_cache_bytes(n_layers, kv_latent_dim, rope_dim, bytes_per_elem=2)``: bytes per token."""
    public = [_bytes_case(*c) for c in [(61, 512, 64, 2), (61, 512, 64, 1), (4, 32, 8, 4), (1, 16, 2, 2)]]

    def secret(g):
        return [_bytes_case(run.randint(g, 2, 128), run.pick(g, [96, 128, 256, 384, 512, 768]),
                            run.pick(g, [16, 32, 48, 64]), run.pick(g, [1, 2, 4])) for _ in range(3)]

    run.judge_each(mla_cache_bytes, run.cases(public, secret, seed=22), run.judge_int, MLA_BYTES_MISTAKES)
    return "4 cases incl. DeepSeek-V3's 70,272 bytes per token"


# ---- exercises 2-4: absorption ----------------------------------------------------------------------------


def _mla_inputs(g, B, h, T, S, d_nope, d_c, d_r, d_v) -> dict:
    return dict(
        q_nope=torch.randn(B, h, T, d_nope, generator=g), q_rope=torch.randn(B, h, T, d_r, generator=g),
        latent=torch.randn(B, S, d_c, generator=g), k_rope=torch.randn(B, S, d_r, generator=g),
        w_uk=torch.randn(h, d_nope, d_c, generator=g) / math.sqrt(d_c),
        w_uv=torch.randn(h, d_v, d_c, generator=g) / math.sqrt(d_c))


def _fused(i) -> torch.Tensor:
    """The heads' up-projections as one matrix, DeepSeek's kv_b_proj.weight: per head m, the d_nope rows of
    W_UK,m, then the d_v rows of W_UV,m; [h·(d_nope + d_v), d_c]."""
    return torch.cat([i["w_uk"], i["w_uv"]], dim=1).reshape(-1, i["w_uk"].shape[-1])


def _split_by_blocks(i) -> dict:
    """``i`` with W_UK and W_UV read from the fused matrix the wrong way: all keys' rows first, then all values'."""
    h, dn, dc = i["w_uk"].shape
    rows = _fused(i)
    return {**i, "w_uk": rows[:h * dn].reshape(h, dn, dc), "w_uv": rows[h * dn:].reshape(h, -1, dc)}


_SPLIT = ("the fused matrix was split into one block of keys and one of values: its rows go head by head, d_nope "
          "rows of W_UK,m then d_v rows of W_UV,m for head m (view it as [h, d_nope + d_v, d_c] first).")


def _absorb64(i, *, split="heads", transposed=False, one_head=False, summed=False):
    i = _split_by_blocks(i) if split == "blocks" else i
    qn, w = i["q_nope"].double(), i["w_uk"].double()
    if transposed:
        return torch.einsum("bhtn,hcn->bhtc", qn, w)
    if one_head:
        return torch.einsum("bhtn,nc->bhtc", qn, w[0])
    out = torch.einsum("bhtn,hnc->bhtc", qn, w)
    return out.sum(1, keepdim=True).expand_as(out) if summed else out


def _mla64(i, scale, *, split="heads", rope=True, nope=True, mask="offset", w_uk_t=False, w_uv_t=False,
           scale_mode="given", softmax_dim=-1, no_uv=False, scores=False):
    """Scores (``scores=True``) or outputs the long way: rebuild every head's keys and values from the latents."""
    i = _split_by_blocks(i) if split == "blocks" else i
    qn, qr, c, kr = (i[k].double() for k in ("q_nope", "q_rope", "latent", "k_rope"))
    w_uk, w_uv = i["w_uk"].double(), i["w_uv"].double()
    w_uk, w_uv = (w_uk.transpose(1, 2) if w_uk_t else w_uk), (w_uv.transpose(1, 2) if w_uv_t else w_uv)
    k_nope = torch.einsum("bsc,hnc->bhsn", c, w_uk)  # [B, h, S, d_nope]
    v = c.unsqueeze(1).expand(-1, w_uv.shape[0], -1, -1) if no_uv else torch.einsum("bsc,hvc->bhsv", c, w_uv)
    s = (qn @ k_nope.transpose(-1, -2) if nope else 0) + (qr @ kr.unsqueeze(1).transpose(-1, -2) if rope else 0)
    s = s * {"given": scale, "none": 1.0, "twice": scale * scale, "nope": qn.shape[-1] ** -0.5,
             "latent": c.shape[-1] ** -0.5}[scale_mode]
    if scores:
        return s
    T, S = qn.shape[2], c.shape[1]
    keep = {"offset": torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T),
            "topleft": torch.ones(T, S, dtype=torch.bool).tril()}.get(mask)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(softmax_dim).nan_to_num(0.0) @ v


def _square_nope(c: Case) -> bool:
    return c.dn == c.dc


ABSORB_MISTAKES = [
    Mistake(_SPLIT, dict(split="blocks")),
    Mistake("multiplied by W_UK,m instead of its transpose: the key is k = W_UK,m c, so q·k = (W_UK,mᵀ q)·c; "
            "contract q with the d_nope axis of w_uk.", dict(transposed=True), when=_square_nope),
    Mistake("every head used head 0's matrix: each head m has its own W_UK,m = w_uk[m].", dict(one_head=True)),
    Mistake("the heads were summed: keep one latent query per head, [B, h, T, d_c].", dict(summed=True)),
]
SCORE_MISTAKES = [
    Mistake(_SPLIT, dict(split="blocks")),
    Mistake("the RoPE part is missing: the score is q_nope·k_nope + q_rope·k_R (the shared, decoupled RoPE key).",
            dict(rope=False)),
    Mistake("the no-RoPE (latent) part is missing: add (W_UKᵀ q_nope)·c to q_rope·k_R.", dict(nope=False)),
    Mistake("the scale is not applied: multiply the scores by scale.", dict(scale_mode="none")),
    Mistake("the scale was applied twice.", dict(scale_mode="twice")),
    Mistake("the scale argument is ignored (1/sqrt(d_nope)): the key a head sees has d_nope + d_R dimensions; use "
            "the scale passed in.", dict(scale_mode="nope")),
    Mistake("the scale argument is ignored (1/sqrt(d_c)): use the scale passed in.", dict(scale_mode="latent")),
    Mistake("multiplied by W_UK,m instead of its transpose (absorb with W_UK,mᵀ q).", dict(w_uk_t=True),
            when=_square_nope),
]
ATTEND_MISTAKES = [
    Mistake(_SPLIT, dict(split="blocks")),
    Mistake("no causal mask: query t (at position S-T+t) must not see later latents.", dict(mask="none")),
    Mistake("the causal mask is aligned to the top-left (is_causal=True with T < S): the T queries are the newest "
            "positions, so query t sees latents 0 .. S-T+t (tril(diagonal=S-T)).", dict(mask="topleft"),
            when=lambda c: c.T < c.S),
    Mistake("the RoPE part of the score is missing (q_rope·k_R).", dict(rope=False)),
    Mistake("the latent part of the score is missing ((W_UKᵀ q_nope)·c).", dict(nope=False)),
    Mistake("the scale is not applied to the scores.", dict(scale_mode="none")),
    Mistake("softmax over the wrong axis: normalise over the latents (last dim).", dict(softmax_dim=-2)),
    Mistake("W_UV,m was not applied: the weighted sum of latents Σ_s p_s c_s lives in the latent space; head m's "
            "output is w_uv[m] @ (Σ_s p_s c_s).", dict(no_uv=True)),
    Mistake("W_UV,m was applied transposed: head m's value is W_UV,m c = w_uv[m] @ c, so the output is "
            "w_uv[m] @ (Σ_s p_s c_s).", dict(w_uv_t=True), when=lambda c: c.dv == c.dc),
    Mistake("multiplied by W_UK,m instead of its transpose when absorbing the query.", dict(w_uk_t=True),
            when=_square_nope),
]

_MLA_CASES = [  # (description, B, h, T, S, d_nope, d_c, d_R, d_v)
    ("d_nope = d_c = 6, d_v = d_c (square per-head matrices), batch 2, 3 heads", 2, 3, 4, 4, 6, 6, 4, 6),
    ("d_nope = 4, d_c = 10, d_R = 2, d_v = 5, batch 1, 2 heads", 1, 2, 3, 5, 4, 10, 2, 5),
    ("one head, one new token over 7 cached latents", 2, 1, 1, 7, 8, 12, 4, 6),
]
_CHUNK = ("a chunk of 3 new tokens over 7 latents (T < S, causal with an offset)", 2, 2, 3, 7, 6, 6, 4, 6)


def _mla_case(what: str, g, desc, B, h, T, S, dn, dc, dr, dv) -> Case:
    i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
    scale = (dn + dr) ** -0.5
    if what == "absorb_query":
        return Case(f"absorb_query with {desc}", partial(_absorb64, i), (i["q_nope"], _fused(i)), i=i, dn=dn, dc=dc)
    args = (*(i[k] for k in ("q_nope", "q_rope", "latent", "k_rope")), _fused(i), scale)
    return Case(f"{what} with {desc}", partial(_mla64, i, scale, scores=what == "absorbed_scores"), args, i=i, T=T,
                S=S, dn=dn, dc=dc, dv=dv)


def _mla_secret(run: CheckRun, what: str):
    def secret(g):
        h, S, dn, dv = run.randint(g, 1, 4), run.randint(g, 2, 8), 2 * run.randint(g, 1, 5), run.randint(g, 2, 9)
        T, dc = run.randint(g, 1, S + 1), run.pick(g, [dn, 2 * dn + 2])
        return [_mla_case(what, g, f"{h} heads, T = {T}, S = {S}, d_nope = {dn}, d_c = {dc}, d_v = {dv}", 2, h, T, S,
                          dn, dc, 2, dv)]
    return secret


def _check_mla(run: CheckRun, fn, what: str, mistakes, seed: int, public: list) -> None:
    g = run.rng(seed)
    cases = [_mla_case(what, g, *c) for c in public]
    for case in run.cases(cases, _mla_secret(run, what), seed=seed + 100):
        got = run.call(case.text, fn, *case.args)
        hint = ""
        if what == "absorbed_attention" and isinstance(got, torch.Tensor) and got.shape[:-1] == case.want.shape[:-1] \
                and got.shape[-1] == case.dc != case.dv:
            hint = ("The last dimension is d_c: that is the weighted sum of latents; map it to the head's value space "
                    "with W_UV,m (w_uv[m] @ mixed).")
        run.judge(case, got, mistakes, hint=hint, dims=("head", "position", "latent" if what == "absorbed_scores"
                                                       else ""))
        if what == "absorb_query" and isinstance(got, torch.Tensor) and got.shape == case.want.shape:
            latent = case.i["latent"].double()  # the property the absorption rests on, in the learner's terms
            lhs = got.double() @ latent.transpose(-1, -2).unsqueeze(1)
            rhs = case.i["q_nope"].double() @ torch.einsum("bsc,hnc->bhsn", latent,
                                                           case.i["w_uk"].double()).transpose(-1, -2)
            run.require(bool(torch.allclose(lhs, rhs, atol=1e-5, rtol=1e-4)), case.text,
                        "(absorbed q)·c differs from q·(W_UK c).")


@exercise_check
def check_absorb_query(run: CheckRun, absorb_query) -> str:
    """``absorb_query(q_nope, w_kv_b)``: q_nope [B, h, T, d_nope], w_kv_b [h·(d_nope + d_v), d_c] (DeepSeek's
    kv_b_proj.weight: per head, W_UK,m's rows then W_UV,m's) → [B, h, T, d_c] = W_UK,mᵀ q per head, so that
    (W_UK,mᵀ q)·c = q·(W_UK,m c)."""
    _check_mla(run, absorb_query, "absorb_query", ABSORB_MISTAKES, 8, _MLA_CASES)
    return "3 cases: square and rectangular W_UK, batch 1 and 2, one head"


@exercise_check
def check_absorbed_scores(run: CheckRun, absorbed_scores) -> str:
    """``absorbed_scores(q_nope, q_rope, latent, k_rope, w_kv_b, scale)`` → [B, h, T, S]: the pre-softmax scores
    (W_UK,mᵀ q_nope)·c_s + q_rope·k_R,s, times scale, computed from the latents without keys."""
    _check_mla(run, absorbed_scores, "absorbed_scores", SCORE_MISTAKES, 9, _MLA_CASES)
    return "3 cases: square and rectangular W_UK, T < S, one head"


@exercise_check
def check_mla_absorption(run: CheckRun, absorbed_attention) -> str:
    """``absorbed_attention(q_nope, q_rope, latent, k_rope, w_kv_b, scale)`` → [B, h, T, d_v]: causal attention of
    the T newest positions over all S latents, absorbed, equal to the naive computation."""
    _check_mla(run, absorbed_attention, "absorbed_attention", ATTEND_MISTAKES, 10, _MLA_CASES + [_CHUNK])
    return "4 cases: prefill, one new token, a chunk with offset mask, square and rectangular weights"


# ---- exercise 5: Kimi K2's cache, by value ------------------------------------------------------------------

KIMI_MISTAKES = [
    Mistake("scaled with the heads (64 against DeepSeek-V3's 128): MLA caches one latent and one RoPE key per layer, "
            "shared by all heads, so the head count does not enter.", lambda c: c.want * 64 // 128),
    Mistake("the cache of full multi-head attention (64 heads, 192-dim keys, 128-dim values): MLA caches the latent "
            "instead.", lambda c: 61 * 64 * (192 + 128) * 2),
    Mistake("twice the answer: the latent and the RoPE key are cached once per layer (not as a K and a V).",
            dict(tensors=2)),
    Mistake("the RoPE key (64 numbers per layer) was left out.", dict(rope=False)),
    Mistake("one layer only: every one of the 61 layers caches its own latent and RoPE key.", dict(layers=False)),
    Mistake("one byte per number: bf16 takes 2.", dict(b=1)),
    Mistake("bits, not bytes: a bf16 number is 2 bytes.", dict(bits=True)),
]


@exercise_check(value="kimi_k2_cache_bytes")
def check_kimi_k2_cache_bytes(run: CheckRun, n_bytes) -> str:
    """``kimi_k2_cache_bytes``: Kimi K2's MLA cache per token in bf16 (61 layers, latent 512, RoPE key 64, 64
    heads)."""
    run.judge_int(Case("kimi_k2_cache_bytes", partial(_mla_bytes, 61, 512, 64)), n_bytes, KIMI_MISTAKES)
    return f"{mla_cache_bytes_per_token(61, 512, 64):,} bytes per token, the same as DeepSeek-V3"
