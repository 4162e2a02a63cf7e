"""Lesson 10: what a weight format costs per decoded token, the floor a measured bandwidth sets, and int8 rows with
one scale each."""

from __future__ import annotations

from functools import partial

import torch

from .core import Case, CheckRun, Mistake, exercise_check

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


def _fmt(*formats):
    return lambda c: c.fmt in formats


BYTES_MISTAKES = [
    Mistake("bf16 is 2 bytes per weight (16 bits), not 4.", dict(mistake="bf16_as_fp32"), when=_fmt("bf16")),
    Mistake("the int8 scales were left out: every row carries one (2 bytes in bf16), read with its row.",
            dict(mistake="no_scales"), when=_fmt("int8")),
    Mistake("the scales were counted as fp32 (4 bytes); here they are bf16 (2 bytes).", dict(mistake="fp32_scales"),
            when=_fmt("int8")),
    Mistake("Q4_1 counted as half a byte per weight: each block of 32 also stores a 2-byte scale and a 2-byte "
            "minimum, 20 bytes in all (5 bits per weight).", dict(mistake="half_byte"), when=_fmt("q4_1")),
    Mistake("the Q4_1 block's minimum (2 bytes) was left out: 16 bytes of codes + scale + minimum = 20.",
            dict(mistake="no_minimum"), when=_fmt("q4_1")),
    Mistake("that is bits, not bytes: divide by 8.", dict(mistake="bits")),
]


def _bytes_case(shapes, fmt: str, name: str | None = None) -> Case:
    return Case(f"bytes_per_token({name or shapes}, {fmt!r})", partial(_bytes, shapes, fmt), (list(shapes), fmt),
                fmt=fmt)


@exercise_check
def check_bytes_per_token(run: CheckRun, bytes_per_token) -> str:
    """``bytes_per_token(shapes, fmt)``: the bytes of weights one decoded token reads when every matrix in ``shapes``
    (a list of (n_out, n_in)) is stored in ``fmt``: "fp32", "bf16", "int8" (one bf16 scale per row) or "q4_1" (20
    bytes per block of 32 weights along a row)."""
    public = [_bytes_case([(4, 64)], "fp32"), _bytes_case([(4, 64)], "bf16"), _bytes_case([(4, 64), (3, 32)], "int8"),
              _bytes_case([(2, 64)], "q4_1"), _bytes_case(SMOLLM2, "fp32", "SmolLM2-135M"),
              _bytes_case(SMOLLM2, "int8", "SmolLM2-135M"), _bytes_case(SMOLLM2, "q4_1", "SmolLM2-135M")]

    def secret(g):
        shapes = [(run.randint(g, 1, 600), 32 * run.randint(g, 1, 40)) for _ in range(run.randint(g, 1, 4))]
        return [_bytes_case(shapes, fmt) for fmt in ("fp32", "bf16", "int8", "q4_1")]

    run.judge_each(bytes_per_token, run.cases(public, secret, seed=110), run.judge_int, BYTES_MISTAKES)
    return f"{len(public)} cases; SmolLM2-135M: {_bytes(SMOLLM2, 'fp32') / 1e6:.0f} MB in fp32, " \
           f"{_bytes(SMOLLM2, 'int8') / 1e6:.0f} MB in int8, {_bytes(SMOLLM2, 'q4_1') / 1e6:.1f} MB in Q4_1"


def _floor(weight_bytes, copy_bytes, seconds, *, moved=2, unit=1e3, inverted=False, rate=False) -> float:
    bandwidth = moved * copy_bytes / seconds  # bytes read + bytes written, per second
    if rate:
        return bandwidth / weight_bytes
    return unit * (bandwidth / weight_bytes if inverted else weight_bytes / bandwidth)


FLOOR_MISTAKES = [
    Mistake("the copy's bandwidth counted only the bytes read: a copy reads and writes each byte, so the memory moved "
            "2 · copy_bytes.", dict(moved=1)),
    Mistake("that is seconds: the answer is in milliseconds (times 1000).", dict(unit=1.0)),
    Mistake("the ratio is upside down: time = bytes / (bytes per second).", dict(inverted=True)),
    Mistake("that is tokens per second (the ceiling), not the step's milliseconds.", dict(rate=True)),
]


@exercise_check
def check_floor_ms(run: CheckRun, floor_ms) -> str:
    """``floor_ms(weight_bytes, copy_bytes, copy_seconds)``: the least time (ms) of one decoding step at batch 1, given
    a copy of ``copy_bytes`` bytes that took ``copy_seconds`` (a copy reads its bytes and writes them)."""

    def case(weight_bytes, copy_bytes, seconds):
        return Case(f"floor_ms({weight_bytes:.4g}, {copy_bytes}, {seconds})",
                    partial(_floor, weight_bytes, copy_bytes, seconds), (weight_bytes, copy_bytes, seconds))

    public = [case(538e6, 256 * 2**20, 0.05), case(135e6, 2**30, 0.2), case(96.6e6, 64 * 2**20, 0.004)]

    def secret(g):
        return [case(float(run.randint(g, 10, 2000)) * 1e6, run.pick(g, [64, 128, 256, 512]) * 2**20,
                     run.pick(g, [0.003, 0.01, 0.05, 0.2]))]

    run.judge_each(floor_ms, run.cases(public, secret, seed=111), run.judge_number, FLOOR_MISTAKES, rel=1e-6,
                   kind=float)
    bandwidth = 2 * 256 * 2**20 / 0.05
    return f"3 cases: SmolLM2 fp32 at a {bandwidth / 1e9:.1f} GB/s copy: {1e3 * 538e6 / bandwidth:.1f} ms"


def _int8_row(w: torch.Tensor, mistake: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    amax = w.max() if mistake == "max_not_abs" else w.abs().max()
    s = amax / (128 if mistake == "128" else 255 if mistake == "255" else 127)
    r = w / s
    q = r.trunc() if mistake == "trunc" else r.round()
    return q.to(torch.int8), s  # no clamp: a wrong scale's out-of-range q converts as a student's would


def _part(c: Case, mistake: str | None = None):
    """The scale (a float) or q (as floats) of a row, right or with one mistake."""
    q, s = _int8_row(c.w, mistake)
    return s.item() if c.part == "scale" else q.float()


SCALE_MISTAKES = [  # each also gives its own q: both the scale and q cases are explained by it
    Mistake("the scale used 128: +max|w| / (max|w| / 128) = 128 does not fit in int8 (at most 127).",
            lambda c: _part(c, "128")),
    Mistake("the scale used 255 (the unsigned range): symmetric int8 spans -127 .. 127, so max|w| / 127.",
            lambda c: _part(c, "255")),
    Mistake("the scale came from max(w), not max(|w|): a row whose largest weights are negative clips.",
            lambda c: _part(c, "max_not_abs")),
]
Q_MISTAKES = SCALE_MISTAKES + [
    Mistake("q was truncated toward zero (int(), .to(torch.int8) alone): round to the nearest, or the error reaches a "
            "whole scale step, not half.", lambda c: _part(c, "trunc")),
]


def _kind(s) -> str:
    return f"a {list(s.shape)} {str(s.dtype).removeprefix('torch.')} tensor" if isinstance(s, torch.Tensor) else \
        f"a {type(s).__name__}"


@exercise_check
def check_quantize_row_int8(run: CheckRun, quantize_row_int8) -> str:
    """``quantize_row_int8(w)``: one row of fp32 weights [n] -> (q int8 [n], scale, a 0-dim fp32 tensor) with
    scale = max|w| / 127 and q = round(w / scale), so that |w - q · scale| <= scale / 2."""
    g = run.rng(101)

    def row(w):
        what = f"quantize_row_int8(w) on a row of {w.numel()} weights, max|w| = {w.abs().max():.3g}"
        parts = {part: Case(f"{what}, {name}", lambda: None, w=w, part=part) for part, name in (("scale", "the scale"),
                                                                                              ("q", "q"))}
        for part in parts.values():
            part.expect = partial(_part, part)
        return Case(what, lambda: None, (w,), w=w, **parts)

    public = [row(torch.randn(64, generator=g)), row(-torch.rand(32, generator=g) * 3 - 0.1),  # all negative
              row(torch.randn(576, generator=g) * 0.02), row(torch.tensor([1.0, -1.0, 0.5, 0.25, -0.126]))]

    def secret(g):
        return [row(torch.randn(run.randint(g, 2, 300), generator=g) * run.pick(g, [0.01, 1.0, 30.0]))]

    for c in run.cases(public, secret, seed=201):
        got = run.call(c.text, quantize_row_int8, *c.args)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], torch.Tensor)):
            run.fail(f"{c.text}: return (q, scale), q an int8 tensor the shape of w; got {type(got).__name__}.")
        q, s = got
        run.judge_number(c.scale, s, SCALE_MISTAKES, rel=1e-6)
        run.judge(c.q, q.float(), Q_MISTAKES, rtol=0, atol=0)
        run.require(isinstance(s, torch.Tensor) and s.dim() == 0 and s.dtype == torch.float32, c.scale.text,
                    f"the value is right but it is {_kind(s)}; return a 0-dim float32 tensor (w.abs().max() / 127 is "
                    "one).")
        run.require(q.dtype == torch.int8, c.q.text, f"q holds the right numbers but as {q.dtype}; store it as "
                                                     "torch.int8 (1 byte each).")
        err = (c.w - q.float() * float(s)).abs().max().item()
        run.require(err <= float(s) / 2 * (1 + 1e-6), c.text, f"|w - q · scale| reaches {err:.3g}, over half a step.")
    return f"{len(public)} rows, the error within half a step each"
