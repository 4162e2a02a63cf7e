"""Lesson 09: a real checkpoint's bytes (Q4_0 blocks, llama.cpp's query/key rows) and a real model's cache."""

from __future__ import annotations

from functools import partial

import torch

from ...kv_cache import kv_cache_bytes_per_token
from ...rope import permute_qk_weight
from .core import (
    Output,
    call_student,
    exercise_check,
    fail,
    generator,
    judge,
    judge_int,
    require_dtype,
)

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


_Q4_0_MISTAKES = [
    ("nibbles_swapped", "the two codes of each byte are swapped: the LOW 4 bits (byte & 0x0F) hold q_k, the HIGH 4 "
                        "bits (byte >> 4) hold q_(k+16)."),
    ("nibbles_interleaved", "the codes are interleaved (low, high, low, high, ...): byte k holds q_k and q_(k+16), so "
                            "the 16 low nibbles are weights 0-15 and the 16 high nibbles weights 16-31."),
    ("not_centred", "the codes were not centred: Q4_0 stores q + 8 so that the weights are d·(q - 8), from -8d to 7d "
                    "(Q4_1 adds a minimum instead)."),
    ("centred_after", "8 was subtracted after the scaling: the weight is d·(q - 8), not d·q - 8."),
    ("twos_complement", "the codes were read as signed 4-bit numbers (two's complement): Q4_0's codes are unsigned "
                        "0..15 with an offset of 8, w = d·(q - 8)."),
]


@exercise_check(components=("dequantize",))
def check_dequantize_q4_0(dequantize_q4_0_fn) -> str:
    """``dequantize_q4_0(raw)``: Q4_0 bytes uint8 [rows, 18·n] -> float32 weights [rows, 32·n]."""
    __tracebackhide__ = True
    name = "check_dequantize_q4_0"
    g = generator(91)
    cases = [("one block", 1, 1), ("a row of 18 blocks (576 weights, one row of SmolLM2's W_q)", 1, 18),
             ("6 rows of 4 blocks", 6, 4)]
    for what, rows, n in cases:
        raw = _q4_0_bytes(g, rows, n)
        after = Output(raw)  # what the function leaves in its copy of raw
        call = f"dequantize_q4_0(raw) on {what}: raw uint8 {list(raw.shape)}"
        got = call_student(name, call, dequantize_q4_0_fn, after)
        if not (isinstance(after.value, torch.Tensor) and torch.equal(after.value, raw)):
            fail(name, f"{call}: your function changed raw in place; read the bytes, do not write them.")
        want = _q4_0_64(raw)
        cands = [(diag, partial(_q4_0_64, raw, mistake=m)) for m, diag in _Q4_0_MISTAKES]
        judge(name, got.double() if isinstance(got, torch.Tensor) else got, want, cands, call, rtol=1e-6, atol=1e-6,
              dims=("row", ""))
        require_dtype(name, got, torch.float32, call, "the output", "return float32 weights (.float()).")
    return f"{len(cases)} inputs, up to {max(r * n for _, r, n in cases)} blocks; nibble order and offset right"


# ---- llama.cpp's query/key rows -----------------------------------------------------------------------------


def _twice(w, heads):
    return permute_qk_weight(permute_qk_weight(w, heads, "half_split"), heads, "half_split")


@exercise_check(components=("permute_qk_weight",))
def check_unpermute_qk(unpermute_fn) -> str:
    """``unpermute_qk(wq, wk, wv, n_heads, n_kv_heads)`` -> (wq, wk, wv) in the half-split RoPE layout: llama.cpp's
    interleaved rows of each query and key head put back, the values untouched."""
    __tracebackhide__ = True
    name = "check_unpermute_qk"
    g = generator(92)
    cases = [("GQA: 4 query heads, 2 K/V heads of 12", 4, 2, 12, 16),  # d_h = 12: twice != the inverse (as at 8)
             ("SmolLM2-135M's shapes: 9 / 3 heads of 64", 9, 3, 64, 576),
             ("MHA: 3 heads of 12", 3, 3, 12, 20),
             ("MQA: 4 query heads, 1 K/V head of 16", 4, 1, 16, 24)]
    for what, h, kv, dh, d in cases:
        wq, wk, wv = (torch.randn(n * dh, d, generator=g) for n in (h, kv, kv))  # as stored in the file
        call = f"unpermute_qk(wq {list(wq.shape)}, wk {list(wk.shape)}, wv {list(wv.shape)}, {h}, {kv}) ({what})"
        got = call_student(name, call, unpermute_fn, wq, wk, wv, h, kv)  # fresh copies: the check's stay intact
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            fail(name, f"{call}: return the three matrices (wq, wk, wv), got {type(got).__name__}.")
        common = lambda w, n: [  # noqa: E731 - the mistakes a query or key matrix can show
            ("the permutation was not applied: llama.cpp stores each head's rows interleaved (2i, 2i+1); the "
             "course's RoPE needs them half-split (i, i + d_h/2).", w),
            ("the permutation went the wrong way (half-split -> interleaved, what llama.cpp's converter did): row "
             "2i + s of a head moves to s·d_h/2 + i.", permute_qk_weight(w, n, "interleaved")),
            ("the permutation was applied twice: once puts the rows back, a second time scrambles them again.",
             _twice(w, n)),
            ("the matrix was permuted as one head: the reordering happens inside each head's block of d_h rows.",
             permute_qk_weight(w, 1, "half_split")),
        ]
        parts = [
            ("the query weight wq", got[0], permute_qk_weight(wq, h, "half_split"), common(wq, h)),
            ("the key weight wk", got[1], permute_qk_weight(wk, kv, "half_split"), common(wk, kv) + [
                ("wk was split into n_heads heads: the key matrix has n_kv_heads heads (its rows are n_kv_heads·d_h).",
                 permute_qk_weight(wk, h, "half_split") if (kv * dh) % h == 0 and h != kv else None)]),
            ("the value weight wv", got[2], wv, [
                ("the values were permuted too: RoPE rotates only q and k, so llama.cpp left W_v as it was; return "
                 "it unchanged.", permute_qk_weight(wv, kv, "half_split")),
                ("the values were permuted (the wrong way): RoPE never touches values; return W_v unchanged.",
                 permute_qk_weight(wv, kv, "interleaved"))]),
        ]
        for part, value, want, cands in parts:
            judge(name, value, want, cands, f"{call}: {part}", rtol=0, atol=0,
                  hint="per head: rows (2i, 2i+1) of the file are rows (i, i + d_h/2) of the course's layout.")
    return f"{len(cases)} layouts (GQA, SmolLM2's 9/3 heads of 64, MHA, MQA): q and k un-permuted per head, v untouched"


@exercise_check(value="smollm2_cache_bytes")
def check_smollm2_cache_bytes(n_bytes) -> str:
    """``smollm2_cache_bytes``: SmolLM2-135M's KV cache per token in bf16 (30 layers, 9 query heads over 3 K/V
    heads of 64)."""
    __tracebackhide__ = True
    L, h, kv, dh = 30, 9, 3, 64
    want = kv_cache_bytes_per_token(L, kv, dh, 2)
    cands = [
        ("half the answer: both K and V are cached, so count the head vectors twice.", want // 2),
        ("the cache of MHA (9 K/V heads, or the model width 576 = 9 × 64): with GQA only the 3 K/V heads are "
         "cached.", kv_cache_bytes_per_token(L, h, dh, 2)),
        ("4 bytes per number: bf16 takes 2.", kv_cache_bytes_per_token(L, kv, dh, 4)),
        ("one layer only: each of the 30 layers caches its own K and V.", kv_cache_bytes_per_token(1, kv, dh, 2)),
    ]
    judge_int("check_smollm2_cache_bytes", n_bytes, want, cands, "smollm2_cache_bytes",
              reveal=False)
    return f"{want:,} bytes per token, a third of MHA's"
