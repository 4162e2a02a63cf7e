"""Lesson 08: the learning-rate schedule, FLOPs per token, a fair-comparison check and a training budget."""

from __future__ import annotations

import math
from functools import partial

import torch

from .core import call_student, exercise_check, fail, generator, is_graded, judge, judge_int, judge_number, pick

# ---- exercise 1: the learning-rate schedule ---------------------------------------------------------------


def _lr64(step, lr, min_lr, warmup, total, *, warm="plus_one", decay="cosine", floor=True, span="after_warmup",
          clamp=True) -> float:
    """The lesson's schedule (linear warmup to ``lr``, half a cosine down to ``min_lr`` at ``total``, then
    ``min_lr``), with knobs for the common mistakes."""
    if step < warmup:
        return {"plus_one": lr * (step + 1) / (warmup + 1), "plain": lr * step / warmup,
                "none": lr}[warm]
    if clamp and step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup) if span == "after_warmup" else step / total
    low = min_lr if floor else 0.0
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - progress
    return low + shape * (lr - low)


@exercise_check(components=("lr_at",))
def check_lr_schedule(lr_at) -> str:
    """``lr_at(step, lr, min_lr, warmup_steps, max_steps)``: lr·(step+1)/(warmup_steps+1) during the warmup,
    then min_lr + ½(1 + cos(π·(step - warmup_steps)/(max_steps - warmup_steps)))·(lr - min_lr), and min_lr
    from max_steps on."""
    __tracebackhide__ = True
    name = "check_lr_schedule"
    schedules = [(3e-3, 3e-4, 20, 300), (1e-3, 1e-4, 100, 5000), (6e-4, 0.0, 0, 50), (1.0, 0.25, 10, 12)]
    if is_graded():
        g = generator(27)
        warmup = int(torch.randint(1, 50, (1,), generator=g))
        schedules.append((pick(g, [1e-3, 2e-3, 5e-4]), pick(g, [0.0, 1e-5, 1e-4]), warmup,
                          warmup + int(torch.randint(5, 500, (1,), generator=g))))
    for lr, min_lr, warmup, total in schedules:
        steps = sorted({0, 1, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1, total, total + 7}
                       - {-1})
        case = f"lr_at(step, lr={lr:g}, min_lr={min_lr:g}, warmup_steps={warmup}, max_steps={total}) at steps {steps}"
        values = []
        for step in steps:
            got = call_student(name, f"lr_at({step}, {lr:g}, {min_lr:g}, {warmup}, {total})", lr_at, step, lr, min_lr,
                               warmup, total)
            got = got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got
            if not isinstance(got, (int, float)) or isinstance(got, bool) or not math.isfinite(got):
                fail(name, f"lr_at({step}, ...) returned {type(got).__name__} {got!r}; expected a float.")
            values.append(float(got))
        got = torch.tensor(values, dtype=torch.float64)

        def curve(lr=lr, min_lr=min_lr, warmup=warmup, total=total, steps=steps, **knobs):
            return torch.tensor([_lr64(s, lr, min_lr, warmup, total, **knobs) for s in steps], dtype=torch.float64)

        cands = [
            ("the warmup is lr·step/warmup_steps: the lesson's starts at lr/(warmup_steps+1) on step 0, so no update "
             "is wasted at a zero learning rate: lr·(step+1)/(warmup_steps+1).",
             partial(curve, warm="plain") if warmup else None),
            ("no warmup: the first warmup_steps steps ramp up linearly.",
             partial(curve, warm="none") if warmup else None),
            ("a linear decay; the schedule decays along half a cosine.", partial(curve, decay="linear")),
            ("the cosine goes down to 0: it ends at min_lr (min_lr + ½(1 + cos(...))·(lr - min_lr)).",
             partial(curve, floor=False) if min_lr else None),
            ("the cosine was measured from step 0: its progress is (step - warmup_steps)/(max_steps - warmup_steps).",
             partial(curve, span="from_zero") if warmup else None),
            ("after max_steps the cosine climbs back up: from max_steps on the rate stays at min_lr.",
             partial(curve, clamp=False)),
        ]
        judge(name, got, curve(), cands, case, rtol=1e-9, atol=1e-12,
              hint="warmup: lr·(step+1)/(warmup_steps+1); then the half cosine from lr to min_lr; min_lr after.")
    return "4 schedules incl. no warmup, the ends of both phases and steps past max_steps"


# ---- exercise 2: FLOPs per token -------------------------------------------------------------------------


@exercise_check(components=("flops_per_token", "matmul_parameters"))
def check_flops_per_token(flops_per_token) -> str:
    """``flops_per_token(n_matmul_params, n_layers, n_heads, head_dim, seq_len)``: training FLOPs per token,
    6·N + 12·L·H·Q·T."""
    __tracebackhide__ = True
    name = "check_flops_per_token"
    cases = [(10_616_832, 6, 6, 64, 256), (124_000_000, 12, 12, 64, 1024), (1_000, 1, 1, 1, 1),
             (5_000_000, 4, 8, 32, 64)]
    if is_graded():
        g = generator(28)
        cases += [(int(torch.randint(10_000, 10**9, (1,), generator=g)), pick(g, [2, 6, 12, 24]), pick(g, [4, 8, 16]),
                   pick(g, [32, 64, 128]), pick(g, [128, 512, 2048])) for _ in range(3)]
    for N, L, H, Q, T in cases:
        call = f"flops_per_token({N:_}, {L}, {H}, {Q}, {T})".replace("_", ",")
        got = call_student(name, call, flops_per_token, N, L, H, Q, T)
        attention = 12 * L * H * Q * T
        cands = [
            ("the forward pass only (2·N and 4·L·H·Q·T): training adds the backward pass, twice the forward: 6·N + "
             "12·L·H·Q·T.", 2 * N + attention // 3),
            ("the attention term is missing: every query scores every key (2·Q·T) and mixes the values (2·Q·T), "
             "per head and layer, three times for training: 12·L·H·Q·T.", 6 * N),
            ("2·N: each weight costs a multiply and an add in the forward pass, and twice that backward: 6·N.",
             2 * N + attention),
            ("the attention term counts the scores only (6·L·H·Q·T); the weighted sum of values costs as much again.",
             6 * N + attention // 2),
            ("the attention term misses the number of heads: 12·L·H·Q·T.", 6 * N + 12 * L * Q * T),
            ("the attention term misses the head size: 12·L·H·Q·T.", 6 * N + 12 * L * H * T),
        ]
        judge_int(name, got, 6 * N + attention, cands, call, hint="6·N + 12·L·H·Q·T.")
    return "4 cases incl. the GPU-scale model's size"


# ---- exercise 3: is the comparison fair? ------------------------------------------------------------------


def _unfair(a: dict, b: dict, compared, tolerance, *, skip_compared=True, one_sided=True, keys_of_a=False,
            exact_size=False, size_of="a") -> list[str]:
    keys = set(a) if keys_of_a else set(a) | set(b)
    out = []
    for key in keys:
        if skip_compared and key in compared:
            continue
        if key not in a or key not in b:
            if one_sided:
                out.append(key)
            continue
        if key == "n_params" and not exact_size:
            base = a[key] if size_of == "a" else b[key]
            if abs(b[key] - a[key]) > tolerance * abs(base):
                out.append(key)
        elif a[key] != b[key]:
            out.append(key)
    return sorted(out)


def _fair_cases():
    base = dict(arch="gpt2", n_params=10_795_776, tokens=4_915_200, steps=300, batch=64, block=256, lr=3e-3,
                min_lr=3e-4, warmup=20, seed=0, dropout=0.0, data="tinyshakespeare")
    llama = dict(base, arch="llama", n_params=10_816_512)
    return [
        ("two runs that differ only in the architecture", base, llama, ("arch",), 0.02),
        ("each at its own learning rate, compared=('arch', 'lr')", base, dict(llama, lr=1e-3, min_lr=1e-4),
         ("arch", "lr", "min_lr"), 0.02),
        ("the same learning rates but other seeds and step counts", base, dict(llama, seed=1, steps=200),
         ("arch",), 0.02),
        ("a run 3% larger, with 2% allowed", base, dict(llama, n_params=11_119_649), ("arch",), 0.02),
        ("a setting only the first run has (dropout) and one only the second has (grad_clip)", base,
         dict({k: v for k, v in llama.items() if k != "dropout"}, grad_clip=1.0), ("arch",), 0.02),
        ("the size 2.5% apart with 5% allowed; 300 and 300.0 steps are the same", base,
         dict(llama, n_params=11_065_670, steps=300.0), ("arch",), 0.05),
        ("sizes 2.45% apart: within 2.5% of a's size, not of b's", dict(base, n_params=1_000_000),
         dict(llama, n_params=975_500), ("arch",), 0.025),
    ]


@exercise_check(components=())
def check_fair_comparison(unfair_differences) -> str:
    """``unfair_differences(a, b, compared=("arch",), size_tolerance=0.02)``: the sorted keys of two runs'
    settings that make comparing them unfair: every key not in ``compared`` whose value differs or that only one
    run has; "n_params" may differ by ``size_tolerance`` of a's value."""
    __tracebackhide__ = True
    name = "check_fair_comparison"
    for desc, a, b, compared, tolerance in _fair_cases():
        call = f"unfair_differences(a, b, compared={compared}, size_tolerance={tolerance:g}) for {desc}"
        got = call_student(name, call, unfair_differences, dict(a), dict(b), compared, tolerance)
        want = _unfair(a, b, compared, tolerance)
        if not isinstance(got, list) or not all(isinstance(k, str) for k in got):
            if isinstance(got, (set, tuple)) and sorted(got) == want:
                fail(name, f"{call}: the keys are right; return them as a sorted list.")
            fail(name, f"{call}: expected a list of setting names, got {type(got).__name__} {got!r}.")
        if got == want:
            continue
        run = partial(_unfair, a, b, compared, tolerance)
        cands = [
            ("the compared settings were reported: leave out the keys in `compared` (what the comparison is about).",
             run(skip_compared=False)),
            ("a setting only one run has was not reported: a key missing on one side is a difference too.",
             run(one_sided=False)),
            ("only a's keys were looked at: a setting only b has is a difference too.", run(keys_of_a=True)),
            ("n_params was compared exactly: sizes may differ by size_tolerance (relative to a's size).",
             run(exact_size=True)),
            ("the size tolerance was taken relative to b's size; the lesson measures it against a's.",
             run(size_of="b")),
        ]
        for diagnosis, wrong in cands:
            if wrong != want and got == wrong:
                fail(name, f"{call}: got {got}, expected {want}.\nLikely mistake: {diagnosis}")
        if sorted(got) == want:
            fail(name, f"{call}: the keys are right but not sorted: return sorted(...).")
        fail(name, f"{call}: got {got}, expected {want}.")
    return "7 cases: one architecture apart, tuned learning rates, seeds, sizes, one-sided settings"


# ---- exercise 4: a training budget, by value ---------------------------------------------------------------

_LLAMA3_8B = dict(N=8.03e9, D=15e12)


@exercise_check(value="llama3_8b_train_flops")
def check_llama3_8b_train_flops(flops) -> str:
    """``llama3_8b_train_flops``: the compute of training Llama 3 8B (8.03 billion parameters) on 15 trillion
    tokens, by the 6·N·D rule (within 3%)."""
    __tracebackhide__ = True
    N, D = _LLAMA3_8B.values()
    cands = [("2·N·D is the forward pass only: training costs 6·N·D.", 2 * N * D),
             ("N·D: each token costs 6 FLOPs per parameter in training (2 forward, 4 backward).", N * D),
             ("a factor of 1,000 too small: Llama 3 was trained on 15 trillion tokens (15e12), and the model has "
              "8.03 billion parameters (8.03e9).", 6 * N * D / 1000)]
    judge_number("check_llama3_8b_train_flops", flops, 6 * N * D, cands, "llama3_8b_train_flops", rel=0.03,
                 reveal=False)
    return f"{6 * N * D:.3g} FLOPs"
