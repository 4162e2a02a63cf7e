"""Lesson 09: a real checkpoint's bytes (Q4_0 blocks, llama.cpp's query/key rows) and a real model's cache."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ...kv_cache import kv_cache_bytes_per_token
from ...rope import permute_qk_weight
from .core import Case, CheckRun, Mistake, Output, exercise_check

# ---- the cache of the real model, by value ----------------------------------------------------------------


def _cache_bytes(L=30, kv=3, dh=64, b=2, *, tensors=2, heads=None) -> int:
    return tensors * L * (kv if heads is None else heads) * dh * b


SMOLLM2_MISTAKES = [
    Mistake("half the answer: both K and V are cached, so count the head vectors twice.", dict(tensors=1)),
    Mistake("the cache of MHA (9 K/V heads, or the model width 576 = 9 × 64): with GQA only the 3 K/V heads are "
            "cached.", dict(heads=9)),
    Mistake("4 bytes per number: bf16 takes 2.", dict(b=4)),
    Mistake("one layer only: each of the 30 layers caches its own K and V.", dict(L=1)),
    Mistake("bits, not bytes: a bf16 number is 2 bytes.", dict(b=16)),
]


@exercise_check(value="smollm2_cache_bytes")
def check_smollm2_cache_bytes(run: CheckRun, n_bytes) -> str:
    """``smollm2_cache_bytes``: SmolLM2-135M's KV cache per token in bf16 (30 layers, 9 query heads over 3 K/V heads
    of 64)."""
    run.judge_int(Case("smollm2_cache_bytes", _cache_bytes), n_bytes, SMOLLM2_MISTAKES)
    return f"{kv_cache_bytes_per_token(30, 3, 64, 2):,} bytes per token, a third of MHA's"


# ---- Q4_0 blocks ----------------------------------------------------------------------------------------


def _q4_0_bytes(g: torch.Generator, rows: int, blocks_per_row: int) -> torch.Tensor:
    """Random Q4_0 data, uint8 [rows, 18 · blocks_per_row]: an fp16 step d > 0 and 32 random codes per block."""
    n = rows * blocks_per_row
    d = (0.002 + 0.1 * torch.rand(n, 1, generator=g)).half()  # [n, 1]
    codes = torch.randint(0, 16, (n, 32), generator=g, dtype=torch.uint8)  # q_0 .. q_31
    packed = codes[:, :16] | (codes[:, 16:] << 4)  # byte k: q_k low, q_{k+16} high
    blocks = torch.cat([d.view(torch.uint8), packed], dim=1)  # [n, 18]
    return blocks.reshape(rows, blocks_per_row * 18)


def _q4_0_64(raw: torch.Tensor, *, mistake=None) -> torch.Tensor:
    """Q4_0 bytes -> weights in float64, with one knob per common mistake."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, 0:2].contiguous().view(torch.float16).double()
    lo, hi = (blocks[:, 2:] & 0x0F).double(), (blocks[:, 2:] >> 4).double()
    if mistake == "nibbles_swapped":
        q = torch.cat([hi, lo], 1)  # [blocks, 32]
    elif mistake == "nibbles_interleaved":
        q = torch.stack([lo, hi], 2).reshape(-1, 32)
    else:
        q = torch.cat([lo, hi], 1)
    w = {"not_centred": lambda: d * q, "centred_after": lambda: d * q - 8,
         "twos_complement": lambda: d * torch.where(q >= 8, q - 16, q)}.get(mistake, lambda: d * (q - 8))()
    return w.reshape(raw.shape[0], -1)


Q4_0_MISTAKES = [
    Mistake("the two codes of each byte are swapped: the LOW 4 bits (byte & 0x0F) hold q_k, the HIGH 4 bits "
            "(byte >> 4) hold q_(k+16).", dict(mistake="nibbles_swapped")),
    Mistake("the codes are interleaved (low, high, low, high, ...): byte k holds q_k and q_(k+16), so the 16 low "
            "nibbles are weights 0-15 and the 16 high nibbles weights 16-31.", dict(mistake="nibbles_interleaved")),
    Mistake("the codes were not centred: Q4_0 stores q + 8 so that the weights are d·(q - 8), from -8d to 7d (Q4_1 "
            "adds a minimum instead).", dict(mistake="not_centred")),
    Mistake("8 was subtracted after the scaling: the weight is d·(q - 8), not d·q - 8.", dict(mistake="centred_after")),
    Mistake("the codes were read as signed 4-bit numbers (two's complement): Q4_0's codes are unsigned 0..15 with an "
            "offset of 8, w = d·(q - 8).", dict(mistake="twos_complement")),
]


def _q4_case(raw: torch.Tensor, what: str) -> Case:
    return Case(f"dequantize_q4_0(raw) on {what}: raw uint8 {list(raw.shape)}", partial(_q4_0_64, raw), (raw,))


@exercise_check
def check_dequantize_q4_0(run: CheckRun, dequantize_q4_0_fn) -> str:
    """``dequantize_q4_0(raw)``: Q4_0 bytes uint8 [rows, 18·n] -> float32 weights [rows, 32·n]."""
    g = run.rng(91)
    public = [_q4_case(_q4_0_bytes(g, 1, 1), "one block"),
              _q4_case(_q4_0_bytes(g, 1, 18), "a row of 18 blocks (576 weights, one row of SmolLM2's W_q)"),
              _q4_case(_q4_0_bytes(g, 6, 4), "6 rows of 4 blocks")]

    def secret(g):
        rows, n = run.randint(g, 1, 5), run.randint(g, 1, 6)
        return [_q4_case(_q4_0_bytes(g, rows, n), f"{rows} drawn rows of {n} blocks")]

    for case in run.cases(public, secret, seed=191):
        raw = case.args[0]
        after = Output(raw)  # what the function leaves in its copy of raw
        got = run.call(case.text, dequantize_q4_0_fn, after)
        if not (isinstance(after.value, torch.Tensor) and torch.equal(after.value, raw)):
            run.fail(f"{case.text}: your function changed raw in place; read the bytes, do not write them.")
        run.judge(case, got.double() if isinstance(got, torch.Tensor) else got, Q4_0_MISTAKES, rtol=1e-6, atol=1e-6,
                  dims=("row", ""))
        run.require(getattr(got, "dtype", None) == torch.float32, case.text,
                    "the values are right but the output is not float32: return float32 weights (.float()).")
    return "3 inputs, up to 24 blocks; nibble order and offset right"


# ---- llama.cpp's query/key rows -----------------------------------------------------------------------------


def _rows(w, heads, *, how="half_split"):
    """``w``'s rows put back per head (``how``: the right way, the other way, twice, or the whole matrix as one
    head), or left as they are."""
    return {"half_split": lambda: permute_qk_weight(w, heads, "half_split"),
            "interleaved": lambda: permute_qk_weight(w, heads, "interleaved"),
            "twice": lambda: permute_qk_weight(permute_qk_weight(w, heads, "half_split"), heads, "half_split"),
            "one_head": lambda: permute_qk_weight(w, 1, "half_split"), "none": lambda: w}[how]()


QK_ROW_MISTAKES = [
    Mistake("the permutation was not applied: llama.cpp stores each head's rows interleaved (2i, 2i+1); the course's "
            "RoPE needs them half-split (i, i + d_h/2).", dict(how="none")),
    Mistake("the permutation went the wrong way (half-split -> interleaved, what llama.cpp's converter did): row "
            "2i + s of a head moves to s·d_h/2 + i.", dict(how="interleaved")),
    Mistake("the permutation was applied twice: once puts the rows back, a second time scrambles them again.",
            dict(how="twice")),
    Mistake("the matrix was permuted as one head: the reordering happens inside each head's block of d_h rows.",
            dict(how="one_head")),
    Mistake("wk was split into n_heads heads: the key matrix has n_kv_heads heads (its rows are n_kv_heads·d_h).",
            lambda c: permute_qk_weight(c.args[0], c.h, "half_split"),
            when=lambda c: c.part == "wk" and (c.kv * c.dh) % c.h == 0 and c.h != c.kv),
]
V_ROW_MISTAKES = [
    Mistake("the values were permuted too: RoPE rotates only q and k, so llama.cpp left W_v as it was; return it "
            "unchanged.", lambda c: permute_qk_weight(c.args[0], c.kv, "half_split"),
            lambda c: permute_qk_weight(c.args[0], c.kv, "interleaved")),
]


def _unpermute_case(g, what: str, h: int, kv: int, dh: int, d: int) -> Case:
    """One call, its three outputs judged as the cases ``wq``, ``wk`` and ``wv``."""
    wq, wk, wv = (torch.randn(n * dh, d, generator=g) for n in (h, kv, kv))  # as stored in the file
    call = f"unpermute_qk(wq {list(wq.shape)}, wk {list(wk.shape)}, wv {list(wv.shape)}, {h}, {kv}) ({what})"
    facts: dict[str, Any] = dict(h=h, kv=kv, dh=dh)
    return Case(call, lambda: None, (wq, wk, wv, h, kv),
                wq=Case(f"{call}: the query weight wq", partial(_rows, wq, h), (wq,), part="wq", **facts),
                wk=Case(f"{call}: the key weight wk", partial(_rows, wk, kv), (wk,), part="wk", **facts),
                wv=Case(f"{call}: the value weight wv", partial(_rows, wv, kv, how="none"), (wv,), part="wv", **facts))


@exercise_check
def check_unpermute_qk(run: CheckRun, unpermute_fn) -> str:
    """``unpermute_qk(wq, wk, wv, n_heads, n_kv_heads)`` -> (wq, wk, wv) in the half-split RoPE layout: llama.cpp's
    interleaved rows of each query and key head put back, the values untouched."""
    g = run.rng(92)
    public = [_unpermute_case(g, *c) for c in [("GQA: 4 query heads, 2 K/V heads of 12", 4, 2, 12, 16),
                                                ("SmolLM2-135M's shapes: 9 / 3 heads of 64", 9, 3, 64, 576),
                                                ("MHA: 3 heads of 12", 3, 3, 12, 20),
                                                ("MQA: 4 query heads, 1 K/V head of 16", 4, 1, 16, 24)]]

    def secret(g):
        kv = run.randint(g, 1, 4)
        return [_unpermute_case(g, "drawn heads", kv * run.randint(g, 1, 4), kv, 2 * run.randint(g, 2, 9), 8)]

    for call in run.cases(public, secret, seed=192):
        got = run.call(call.text, unpermute_fn, *call.args)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            run.fail(f"{call.text}: return the three matrices (wq, wk, wv), got {type(got).__name__}.")
        for case, value in zip((call.wq, call.wk, call.wv), got, strict=True):
            run.judge(case, value, V_ROW_MISTAKES if case.part == "wv" else QK_ROW_MISTAKES, rtol=0, atol=0,
                      hint="per head: rows (2i, 2i+1) of the file are rows (i, i + d_h/2) of the course's layout.")
    return "4 layouts (GQA, SmolLM2's 9/3 heads of 64, MHA, MQA): q and k un-permuted per head, v untouched"
