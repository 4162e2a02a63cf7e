"""Lesson 10: what a weight format costs per decoded token, the floor a measured bandwidth sets, and int8 rows with
one scale each."""

from __future__ import annotations

import torch

from .core import call_student, exercise_check, fail, generator, judge, judge_int, judge_number

BYTES = {"fp32": 4, "bf16": 2}  # bytes per weight; int8: 1 per weight + a 2-byte (bf16) scale per row;
# q4_1: blocks of 32 weights along a row, 20 bytes each (fp16 scale, fp16 minimum, 32 four-bit codes)

# SmolLM2-135M's matrices, as one token reads them: 30 layers of q, k, v, o, gate, up, down, and the tied head
SMOLLM2 = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30 + [(49152, 576)]


def _bytes(shapes, fmt: str, mistake: str | None = None) -> int:
    """Bytes of ``shapes`` [(n_out, n_in), ...] in ``fmt``, or with one known mistake."""
    total = 0
    for n_out, n_in in shapes:
        n = n_out * n_in
        if fmt in BYTES:
            total += n * (4 if mistake == "bf16_as_fp32" else BYTES[fmt])
        elif fmt == "int8":
            total += n + (0 if mistake == "no_scales" else n_out * (4 if mistake == "fp32_scales" else 2))
        else:  # q4_1
            total += n // 2 if mistake == "half_byte" else n // 32 * (18 if mistake == "no_minimum" else 20)
    return total * (8 if mistake == "bits" else 1)


@exercise_check(components=("decode_weight_bytes",))
def check_bytes_per_token(bytes_per_token) -> str:
    """``bytes_per_token(shapes, fmt)``: the bytes of weights one decoded token reads when every matrix in
    ``shapes`` (a list of (n_out, n_in)) is stored in ``fmt``: "fp32", "bf16", "int8" (one bf16 scale per row) or
    "q4_1" (20 bytes per block of 32 weights along a row)."""
    __tracebackhide__ = True
    name = "check_bytes_per_token"
    cases = [([(4, 64)], "fp32"), ([(4, 64)], "bf16"), ([(4, 64), (3, 32)], "int8"), ([(2, 64)], "q4_1"),
             (SMOLLM2, "fp32"), (SMOLLM2, "int8"), (SMOLLM2, "q4_1")]
    for shapes, fmt in cases:
        what = f"bytes_per_token({'SmolLM2-135M' if shapes is SMOLLM2 else shapes}, {fmt!r})"
        got = call_student(name, what, bytes_per_token, list(shapes), fmt)
        cands = [
            ("bf16 is 2 bytes per weight (16 bits), not 4.", _bytes(shapes, fmt, "bf16_as_fp32") if fmt == "bf16"
             else None),
            ("the int8 scales were left out: every row carries one (2 bytes in bf16), read with its row.",
             _bytes(shapes, fmt, "no_scales") if fmt == "int8" else None),
            ("the scales were counted as fp32 (4 bytes); here they are bf16 (2 bytes).",
             _bytes(shapes, fmt, "fp32_scales") if fmt == "int8" else None),
            ("Q4_1 counted as half a byte per weight: each block of 32 also stores a 2-byte scale and a 2-byte "
             "minimum, 20 bytes in all (5 bits per weight).", _bytes(shapes, fmt, "half_byte") if fmt == "q4_1"
             else None),
            ("the Q4_1 block's minimum (2 bytes) was left out: 16 bytes of codes + scale + minimum = 20.",
             _bytes(shapes, fmt, "no_minimum") if fmt == "q4_1" else None),
            ("that is bits, not bytes: divide by 8.", _bytes(shapes, fmt, "bits")),
        ]
        judge_int(name, got, _bytes(shapes, fmt), cands, what,
                  hint="per matrix: n_out · n_in weights times the bytes per weight, plus the format's extras.")
    return f"{len(cases)} cases; SmolLM2-135M: {_bytes(SMOLLM2, 'fp32') / 1e6:.0f} MB in fp32, " \
           f"{_bytes(SMOLLM2, 'int8') / 1e6:.0f} MB in int8, {_bytes(SMOLLM2, 'q4_1') / 1e6:.1f} MB in Q4_1"


@exercise_check(components=("memory_bandwidth",))
def check_floor_ms(floor_ms) -> str:
    """``floor_ms(weight_bytes, copy_bytes, copy_seconds)``: the least time (ms) of one decoding step at batch 1,
    given a copy of ``copy_bytes`` bytes that took ``copy_seconds`` (a copy reads its bytes and writes them)."""
    __tracebackhide__ = True
    name = "check_floor_ms"
    cases = [(538e6, 256 * 2**20, 0.05), (135e6, 2**30, 0.2), (96.6e6, 64 * 2**20, 0.004)]
    for weight_bytes, copy_bytes, seconds in cases:
        what = f"floor_ms({weight_bytes:.4g}, {copy_bytes}, {seconds})"
        got = call_student(name, what, floor_ms, weight_bytes, copy_bytes, seconds)
        bandwidth = 2 * copy_bytes / seconds  # bytes read + bytes written, per second
        want = 1e3 * weight_bytes / bandwidth
        cands = [
            ("the copy's bandwidth counted only the bytes read: a copy reads and writes each byte, so the memory "
             "moved 2 · copy_bytes.", 1e3 * weight_bytes / (copy_bytes / seconds)),
            ("that is seconds: the answer is in milliseconds (times 1000).", weight_bytes / bandwidth),
            ("the ratio is upside down: time = bytes / (bytes per second).", 1e3 * bandwidth / weight_bytes),
            ("that is tokens per second (the ceiling), not the step's milliseconds.", bandwidth / weight_bytes),
        ]
        judge_number(name, got, want, cands, what, rel=1e-6,
                     hint="bandwidth = 2 · copy_bytes / copy_seconds; floor = weight_bytes / bandwidth, in ms.")
    bandwidth = 2 * cases[0][1] / cases[0][2]
    return f"{len(cases)} cases: SmolLM2 fp32 at a {bandwidth / 1e9:.1f} GB/s copy: {1e3 * 538e6 / bandwidth:.1f} ms"


def _int8_row(w: torch.Tensor, mistake: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    amax = w.max() if mistake == "max_not_abs" else w.abs().max()
    s = amax / (128 if mistake == "128" else 255 if mistake == "255" else 127)
    r = w / s
    q = r.trunc() if mistake == "trunc" else r.round()
    return q.to(torch.int8), s  # no clamp: a wrong scale's out-of-range q converts as a student's would


@exercise_check(components=("quantize_int8",))
def check_quantize_row_int8(quantize_row_int8) -> str:
    """``quantize_row_int8(w)``: one row of fp32 weights [n] -> (q int8 [n], scale, a 0-dim fp32 tensor) with
    scale = max|w| / 127 and q = round(w / scale), so that |w - q · scale| <= scale / 2."""
    __tracebackhide__ = True
    name = "check_quantize_row_int8"
    g = generator(101)
    rows = [torch.randn(64, generator=g), -torch.rand(32, generator=g) * 3 - 0.1,  # all negative
            torch.randn(576, generator=g) * 0.02, torch.tensor([1.0, -1.0, 0.5, 0.25, -0.126])]
    for w in rows:
        what = f"quantize_row_int8(w) on a row of {w.numel()} weights, max|w| = {w.abs().max():.3g}"
        got = call_student(name, what, quantize_row_int8, w.clone())
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], torch.Tensor)):
            fail(name, f"{what}: return (q, scale), q an int8 tensor the shape of w; got {type(got).__name__}.")
        q, s = got
        want_q, want_s = _int8_row(w)
        scale_mistakes = [  # each also gives its own q: both the scale and q cases are explained by it
            ("the scale used 128: +max|w| / (max|w| / 128) = 128 does not fit in int8 (at most 127).", "128"),
            ("the scale used 255 (the unsigned range): symmetric int8 spans -127 .. 127, so max|w| / 127.", "255"),
            ("the scale came from max(w), not max(|w|): a row whose largest weights are negative clips.",
             "max_not_abs"),
        ]
        judge_number(name, s, want_s.item(), [(d, _int8_row(w, how)[1].item()) for d, how in scale_mistakes],
                     f"{what}, the scale", rel=1e-6, hint="scale = w.abs().max() / 127.")
        cands = [(d, _int8_row(w, how)[0].float()) for d, how in scale_mistakes]
        cands.append(("q was truncated toward zero (int(), .to(torch.int8) alone): round to the nearest, or the "
                      "error reaches a whole scale step, not half.", _int8_row(w, "trunc")[0].float()))
        judge(name, q.float() if isinstance(q, torch.Tensor) else q, want_q.float(), cands, f"{what}, q", rtol=0,
              atol=0, hint="q = torch.round(w / scale), then .to(torch.int8).")
        if q.dtype != torch.int8:
            fail(name, f"{what}: q holds the right numbers but as {q.dtype}; store it as torch.int8 (1 byte each).")
        err = (w - q.float() * float(s)).abs().max().item()
        if err > float(s) / 2 * (1 + 1e-6):
            fail(name, f"{what}: |w - q · scale| reaches {err:.3g}, over half a step ({float(s) / 2:.3g}).")
    return f"{len(rows)} rows, the error within half a step each"
