"""Lesson 08: the learning-rate schedule, FLOPs per token, a fair-comparison check and a training budget."""

from __future__ import annotations

import math
from functools import partial

import torch

from .core import Case, CheckRun, Mistake, as_number, exercise_check
from .diagnosis import shown

# ---- exercise 1: the learning-rate schedule ---------------------------------------------------------------


def _lr64(step, lr, min_lr, warmup, total, *, warm="plus_one", decay="cosine", floor=True, span="after_warmup",
          clamp=True) -> float:
    """The lesson's schedule (linear warmup to ``lr``, half a cosine down to ``min_lr`` at ``total``, then
    ``min_lr``), with knobs for the common mistakes."""
    if step < warmup:
        return {"plus_one": lr * (step + 1) / (warmup + 1), "plain": lr * step / warmup, "none": lr}[warm]
    if clamp and step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup) if span == "after_warmup" else step / total
    low = min_lr if floor else 0.0
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - progress
    return low + shape * (lr - low)


def _curve(lr, min_lr, warmup, total, steps, **knobs) -> torch.Tensor:
    return torch.tensor([_lr64(s, lr, min_lr, warmup, total, **knobs) for s in steps], dtype=torch.float64)


LR_MISTAKES = [
    Mistake("the warmup is lr·step/warmup_steps: the lesson's starts at lr/(warmup_steps+1) on step 0, so no update "
            "is wasted at a zero learning rate: lr·(step+1)/(warmup_steps+1).", dict(warm="plain"),
            when=lambda c: c.warmup > 0),
    Mistake("no warmup: the first warmup_steps steps ramp up linearly.", dict(warm="none"),
            when=lambda c: c.warmup > 0),
    Mistake("a linear decay; the schedule decays along half a cosine.", dict(decay="linear")),
    Mistake("the cosine goes down to 0: it ends at min_lr (min_lr + ½(1 + cos(...))·(lr - min_lr)).",
            dict(floor=False), when=lambda c: c.min_lr > 0),
    Mistake("the cosine was measured from step 0: its progress is (step - warmup_steps)/(max_steps - warmup_steps).",
            dict(span="from_zero"), when=lambda c: c.warmup > 0),
    Mistake("after max_steps the cosine climbs back up: from max_steps on the rate stays at min_lr.",
            dict(clamp=False)),
]


def _lr_case(lr: float, min_lr: float, warmup: int, total: int) -> Case:
    steps = sorted({0, 1, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1, total, total + 7} - {-1})
    text = f"lr_at(step, lr={lr:g}, min_lr={min_lr:g}, warmup_steps={warmup}, max_steps={total}) at steps {steps}"
    return Case(text, partial(_curve, lr, min_lr, warmup, total, steps), (lr, min_lr, warmup, total), steps=steps,
                warmup=warmup, min_lr=min_lr)


@exercise_check
def check_lr_schedule(run: CheckRun, lr_at) -> str:
    """``lr_at(step, lr, min_lr, warmup_steps, max_steps)``: lr·(step+1)/(warmup_steps+1) during the warmup, then
    min_lr + ½(1 + cos(π·(step - warmup_steps)/(max_steps - warmup_steps)))·(lr - min_lr), and min_lr from
    max_steps on."""
    public = [_lr_case(*s) for s in [(3e-3, 3e-4, 20, 300), (1e-3, 1e-4, 100, 5000), (6e-4, 0.0, 0, 50),
                                     (1.0, 0.25, 10, 12)]]

    def secret(g):
        warmup = run.randint(g, 1, 50)
        return [_lr_case(run.pick(g, [1e-3, 2e-3, 5e-4]), run.pick(g, [0.0, 1e-5, 1e-4]), warmup,
                         warmup + run.randint(g, 5, 500))]

    for case in run.cases(public, secret, seed=27):
        values = []
        for step in case.steps:
            call = f"lr_at({step}, {', '.join(f'{a:g}' for a in case.args)})"
            got = run.call(call, lr_at, step, *case.args)
            number = as_number(got)
            if number is None or not math.isfinite(number):
                run.fail(f"{call} returned {type(got).__name__} {shown(got)}; expected a float.")
            values.append(float(number))
        run.judge(case, torch.tensor(values, dtype=torch.float64), LR_MISTAKES, rtol=1e-9, atol=1e-12,
                  hint="compare with the formula: the ramp lr·(step+1)/(warmup_steps+1), then the half cosine from lr "
                       "to min_lr, min_lr after.")
    return "4 schedules incl. no warmup, the ends of both phases and steps past max_steps"


# ---- exercise 2: FLOPs per token -------------------------------------------------------------------------


def _flops(N, L, H, Q, T, *, weights=6, attention=12, heads=True, head_size=True) -> int:
    return weights * N + attention * L * (H if heads else 1) * (Q if head_size else 1) * T


FLOPS_MISTAKES = [
    Mistake("the forward pass only (2·N and 4·L·H·Q·T): training adds the backward pass, twice the forward: 6·N + "
            "12·L·H·Q·T.", dict(weights=2, attention=4)),
    Mistake("the attention term is missing: every query scores every key (2·Q·T) and mixes the values (2·Q·T), per "
            "head and layer, three times for training: 12·L·H·Q·T.", dict(attention=0)),
    Mistake("2·N: each weight costs a multiply and an add in the forward pass, and twice that backward: 6·N.",
            dict(weights=2)),
    Mistake("the attention term counts the scores only (6·L·H·Q·T); the weighted sum of values costs as much again.",
            dict(attention=6)),
    Mistake("the attention term misses the number of heads: 12·L·H·Q·T.", dict(heads=False)),
    Mistake("the attention term misses the head size: 12·L·H·Q·T.", dict(head_size=False)),
]


@exercise_check
def check_flops_per_token(run: CheckRun, flops_per_token) -> str:
    """``flops_per_token(n_matmul_params, n_layers, n_heads, head_dim, seq_len)``: training FLOPs per token,
    6·N + 12·L·H·Q·T."""

    def case(*args):
        return Case(f"flops_per_token({args[0]:_}, {', '.join(map(str, args[1:]))})", partial(_flops, *args), args)

    public = [case(*c) for c in [(10_616_832, 6, 6, 64, 256), (124_000_000, 12, 12, 64, 1024), (1_000, 1, 1, 1, 1),
                                 (5_000_000, 4, 8, 32, 64)]]

    def secret(g):
        return [case(run.randint(g, 10_000, 10**9), run.pick(g, [2, 6, 12, 24]), run.pick(g, [4, 8, 16]),
                     run.pick(g, [32, 64, 128]), run.pick(g, [128, 512, 2048])) for _ in range(3)]

    run.judge_each(flops_per_token, run.cases(public, secret, seed=28), run.judge_int, FLOPS_MISTAKES)
    return "4 cases incl. the GPU-scale model's size"


# ---- exercise 3: is the comparison fair? ------------------------------------------------------------------


def _unfair(a: dict, b: dict, compared, tolerance, *, skip_compared=True, one_sided=True, keys_of_a=False,
            exact_size=False, size_of="a") -> list[str]:
    out = []
    for key in sorted(set(a) if keys_of_a else set(a) | set(b)):
        if skip_compared and key in compared:
            continue
        if key not in a or key not in b:
            if one_sided:
                out.append(key)
        elif key == "n_params" and not exact_size:
            if abs(b[key] - a[key]) > tolerance * abs(a[key] if size_of == "a" else b[key]):
                out.append(key)
        elif a[key] != b[key]:
            out.append(key)
    return out


UNSORTED = "the keys are right but not sorted (a set's order is arbitrary): return sorted(...)."
FAIR_MISTAKES = [
    Mistake("the compared settings were reported: leave out the keys in `compared` (what the comparison is about).",
            dict(skip_compared=False)),
    Mistake("a setting only one run has was not reported: a key missing on one side is a difference too.",
            dict(one_sided=False)),
    Mistake("only a's keys were looked at: a setting only b has is a difference too.", dict(keys_of_a=True)),
    Mistake("n_params was compared exactly: sizes may differ by size_tolerance (relative to a's size).",
            dict(exact_size=True)),
    Mistake("the size tolerance was taken relative to b's size; the lesson measures it against a's.",
            dict(size_of="b")),
    Mistake(UNSORTED, lambda c: c.facts.get("permuted")),
]
_BASE = dict(arch="gpt2", n_params=10_795_776, tokens=4_915_200, steps=300, batch=64, block=256, lr=3e-3, min_lr=3e-4,
             warmup=20, seed=0, dropout=0.0, data="tinyshakespeare")
_LLAMA = dict(_BASE, arch="llama", n_params=10_816_512)
_OTHER_STUDY = dict(arch="llama", n_params=25_000_000, tokens=9_830_400, steps=600, batch=32, block=512, lr=1e-3,
                    min_lr=1e-4, warmup=100, seed=7, dropout=0.1, data="fineweb")


def _fair_case(desc: str, a: dict, b: dict, compared: tuple, tolerance: float) -> Case:
    return Case(f"unfair_differences(a, b, compared={compared}, size_tolerance={tolerance:g}) for {desc}",
                partial(_unfair, a, b, compared, tolerance), (a, b, compared, tolerance))


@exercise_check
def check_fair_comparison(run: CheckRun, unfair_differences) -> str:
    """``unfair_differences(a, b, compared=("arch",), size_tolerance=0.02)``: the sorted keys of two runs' settings
    that make comparing them unfair: every key not in ``compared`` whose value differs or that only one run has;
    "n_params" may differ by ``size_tolerance`` of a's value."""
    public = [
        _fair_case("two runs that differ only in the architecture", _BASE, _LLAMA, ("arch",), 0.02),
        _fair_case("each at its own learning rate, compared=('arch', 'lr')", _BASE, dict(_LLAMA, lr=1e-3, min_lr=1e-4),
                   ("arch", "lr", "min_lr"), 0.02),
        _fair_case("the same learning rates but other seeds and step counts", _BASE, dict(_LLAMA, seed=1, steps=200),
                   ("arch",), 0.02),
        _fair_case("a run 3% larger, with 2% allowed", _BASE, dict(_LLAMA, n_params=11_119_649), ("arch",), 0.02),
        _fair_case("a setting only the first run has (dropout) and one only the second has (grad_clip)", _BASE,
                   dict({k: v for k, v in _LLAMA.items() if k != "dropout"}, grad_clip=1.0), ("arch",), 0.02),
        _fair_case("the size 2.5% apart with 5% allowed; 300 and 300.0 steps are the same", _BASE,
                   dict(_LLAMA, n_params=11_065_670, steps=300.0), ("arch",), 0.05),
        _fair_case("sizes 2.45% apart: within 2.5% of a's size, not of b's", dict(_BASE, n_params=1_000_000),
                   dict(_LLAMA, n_params=975_500), ("arch",), 0.025),
        _fair_case("runs of two different studies: almost every setting differs", _BASE, _OTHER_STUDY, (), 0.02),
    ]

    def secret(g):
        changed = {k: v for k, v in _OTHER_STUDY.items() if run.randint(g, 0, 4) > 0 or k == "n_params"}
        tolerance = run.pick(g, [0.01, 0.02, 0.05])
        b = dict(_BASE, **changed)
        b["n_params"] = 10_000_000 + run.randint(g, 0, 600_000)
        return [_fair_case("two drawn runs", dict(_BASE, n_params=10_000_000), b,
                           run.pick(g, [("arch",), ("arch", "lr")]), tolerance)]

    for case in run.cases(public, secret, seed=29):
        got = run.call(case.text, unfair_differences, dict(case.args[0]), dict(case.args[1]), *case.args[2:])
        if not isinstance(got, list) or not all(isinstance(k, str) for k in got):
            if isinstance(got, (set, tuple, frozenset)) and sorted(got) == case.want:
                run.fail(f"{case.text}: the keys are right; return them as a sorted list.")
            run.fail(f"{case.text}: expected a list of setting names, got {type(got).__name__} {got!r}.")
        case.facts["permuted"] = got if got != case.want and sorted(got) == case.want else None
        run.judge_equal(case, got, FAIR_MISTAKES)
    return "8 cases: one architecture apart, tuned learning rates, seeds, sizes, one-sided settings, another study"


# ---- exercise 4: a training budget, by value ---------------------------------------------------------------


def _train_flops(N=8.03e9, D=15e12, *, per=6, scale=1.0) -> float:
    return per * N * D * scale


TRAIN_MISTAKES = [
    Mistake("2·N·D is the forward pass only: training costs 6·N·D.", dict(per=2)),
    Mistake("N·D: each token costs 6 FLOPs per parameter in training (2 forward, 4 backward).", dict(per=1)),
    Mistake("a factor of 1,000 too small: Llama 3 was trained on 15 trillion tokens (15e12), and the model has 8.03 "
            "billion parameters (8.03e9).", dict(scale=1e-3)),
    Mistake("a factor of 1,000 too large: a trillion is 1e12 and a billion 1e9.", dict(scale=1e3)),
]


@exercise_check(value="llama3_8b_train_flops")
def check_llama3_8b_train_flops(run: CheckRun, flops) -> str:
    """``llama3_8b_train_flops``: the compute of training Llama 3 8B (8.03 billion parameters) on 15 trillion
    tokens, by the 6·N·D rule (within 3%)."""
    run.judge_number(Case("llama3_8b_train_flops", _train_flops), flops, TRAIN_MISTAKES, rel=0.03)
    return f"{_train_flops():.3g} FLOPs"
