"""Where a call's time goes: ``torch.profiler`` summarised, and the floor a decoding step cannot beat.

    p = profile_ops(lambda: generate(model, prompt, 32))
    p.ops                 # PyTorch operators the call dispatched (not counting ops run inside other ops)
    p.seconds             # its wall time under the profiler
    p.by_kind             # seconds in matrix multiplications, in attention, in all other PyTorch ops,
                          # and outside PyTorch ops (Python, and the kernels torch.compile generates)

Each microsecond is counted once, in the operator that spent it (the profiler's "self" time). The
profiler adds a few microseconds to every operator, so compare summaries taken the same way.

The floor: a decoding step (batch 1) reads every weight once, so it takes at least
``decode_weight_bytes(model) / memory_bandwidth()`` seconds.
"""

import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from ..decoder import DecoderLM

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mv", "aten::dot")


@dataclass
class OpProfile:
    ops: float  # outermost PyTorch operators dispatched (a mean after ``per``)
    seconds: float  # wall time of the profiled call
    by_kind: dict[str, float]  # seconds per kind of work; they add up to ``seconds``

    def per(self, n: int) -> "OpProfile":
        """The same profile divided by n (for example per generated token)."""
        return OpProfile(self.ops / n, self.seconds / n, {k: v / n for k, v in self.by_kind.items()})

    def __str__(self) -> str:
        shares = ", ".join(f"{k} {100 * v / self.seconds:.0f}%" for k, v in self.by_kind.items())
        return f"{self.ops:.0f} ops, {1e3 * self.seconds:.2f} ms ({shares})"


@contextmanager
def _without_stderr():
    """Send file descriptor 2 to /dev/null: the profiler's C++ library announces every start and stop
    there, which a notebook would show as an error stream."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_ops(fn) -> OpProfile:
    """Run ``fn()`` once under ``torch.profiler`` (CPU activity) and summarise it."""
    prof = profile(activities=[ProfilerActivity.CPU])
    with _without_stderr():
        prof.start()
    try:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    finally:
        with _without_stderr():
            prof.stop()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    outermost = [e for e in aten if not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    by_kind = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
    for e in aten:
        kind = "matmul" if e.name in MATMULS else "attention" if "attention" in e.name else "other ops"
        by_kind[kind] += e.self_cpu_time_total / 1e6
    by_kind["outside ops"] = max(0.0, seconds - sum(by_kind.values()))
    return OpProfile(len(outermost), seconds, by_kind)


def decode_weight_bytes(model: DecoderLM) -> int:
    """Bytes of weights one decoding step of a ``DecoderLM`` (``LlamaStyleLM``, ``GPT2LM``) reads: every
    parameter once, except the token embedding, of which it reads one row (a tied output head still reads
    the whole matrix)."""
    if not isinstance(model, DecoderLM):
        raise TypeError(f"model must be a DecoderLM (LlamaStyleLM, GPT2LM, ...), not {type(model).__name__}")
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix counted once
    table = model.emb.weight  # [V, d]
    row = table.shape[1] * table.element_size()
    return total - (0 if model.tied else table.numel() * table.element_size()) + row


def memory_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5, device=None, clock=time.perf_counter) -> dict:
    """Bytes per second of a copy of ``nbytes`` (bytes read plus bytes written): what memory delivers
    when the data does not fit the caches. Returns the best and the median of ``repeats`` copies.
    ``clock``: the wall clock, or ``time.process_time`` (this process's CPU time: on one thread, what other
    programs on a shared machine do not inflate)."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages once
    times = []
    for _ in range(repeats):
        if src.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = clock()
        dst.copy_(src)
        if src.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(clock() - t0)
    return {"best": 2 * nbytes / min(times), "median": 2 * nbytes / statistics.median(times), "bytes": nbytes}


def decode_step_seconds(decoders: dict, rounds: int, short: int = 8, long: int = 40,
                        clock=time.process_time) -> tuple[dict[str, list[float]], dict]:
    """Seconds per decoded token of each decoder, measured in interleaved rounds (a, b, c, a, b, c, ...).

    ``decoders``: name -> ``decode(n)``, a function that generates n new tokens after a fixed prompt and returns
    them. Each round times every decoder at ``short`` and at ``long`` new tokens; (t_long - t_short) /
    (long - short) is the time of one decoding step, without the prompt's prefill and the call's fixed costs,
    which both lengths pay alike. Returns ({name: one step's seconds per round}, {name: the tokens of its last
    long call}) so that the caller can check that every decoder gave the same tokens."""
    if long <= short:
        raise ValueError(f"long ({long}) must exceed short ({short})")
    seconds: dict[str, list[float]] = {name: [] for name in decoders}
    tokens = {}
    for _ in range(rounds):
        for name, decode in decoders.items():
            t0 = clock()
            decode(short)
            t1 = clock()
            tokens[name] = decode(long)
            t2 = clock()
            seconds[name].append(((t2 - t1) - (t1 - t0)) / (long - short))
    return seconds, tokens


def step_table_lines(step_s: dict[str, list[float]], floor_ms: float, baseline: str = "plain",
                     same_tokens: dict[str, bool] | None = None) -> list[str]:
    """The lines of a table of decoding paths, from ``decode_step_seconds``' rounds: each path's median ms per
    token, how many times as fast as ``baseline`` it is (the median of the per-round ratios, and their range:
    the spread the rounds show) and the share of the floor (``floor_ms``) it reaches; with ``same_tokens``
    (name -> bool), whether it gave the baseline's tokens. One layout, so every benchmark reads alike."""
    if baseline not in step_s:
        raise ValueError(f"baseline {baseline!r} must be one of the paths in step_s: {sorted(step_s)}")
    extra = "" if same_tokens is None else " same tokens"
    lines = [f"{'path':36s} {'ms/token':>8s} {'x ' + baseline:>8s} "
             f"{'rounds':>11s} {'of floor':>8s}{extra}"]
    for name, s in step_s.items():
        x = [b / t for b, t in zip(step_s[baseline], s, strict=True)]  # > 1: faster than the baseline
        ms = 1e3 * statistics.median(s)
        same = "" if same_tokens is None else f" {same_tokens[name]}"
        lines.append(f"{name:36s} {ms:8.1f} {statistics.median(x):7.2f}x {min(x):5.2f}-{max(x):<5.2f} "
                     f"{100 * floor_ms / ms:7.0f}%{same}")
    return lines
