"""Feedback a student can trust (``checks.diagnosis``): every known mistake a check can name is named when a student
makes it, together only with mistakes no case can tell apart from it (and where a case could, the check has one),
value items never print their answer, integer checks never print a case's right value, and a number that is off
is described by a rough band.

The audit generates the wrong answers: a first run with the right answer records every judged case and what each
known mistake computes there; then, for each mistake, an answer that returns exactly that (a function, a module
whose forward does, or a value) is checked. The message must name the mistake; any other mistake it names must
compute the same in every public case and in the grader-only cases of several secrets (else a public case that
tells them apart is missing). The hand-written wrong implementations of test_exercises.py show that the mistakes
model real code; this shows that the verdict turns each of them into the right words."""

from __future__ import annotations

import itertools

import pytest
import torch
from check_helpers import named
from test_exercises import RIGHT, gpt2_block_params_ok

from modern_block.classroom import checks
from modern_block.classroom.checks import CheckFailed, Mode
from modern_block.classroom.checks.diagnosis import how_off, rough_factor, where_differs
from modern_block.classroom.checks.lesson07 import COUNT_MISTAKES
from modern_block.training.statistics import holm

SECRETS = (11, 22, 33)
ASSEMBLED = {"check_lr_schedule", "check_kv_cache"}  # outputs assembled from several calls: audited in test_exercises


def observe(check, answer, mode_kind="script", secret=None):
    seen: list = []

    def observer(case, got, want, outputs, same):
        seen.append((case, got, want, outputs, same))

    mode = Mode(mode_kind, secret=secret, observer=observer)
    check(answer, mode=mode)
    return seen


def _as_data(value):
    """A returned value as a float64 tensor (tensors, lists of numbers and plain numbers), else None."""
    if isinstance(value, torch.Tensor):
        return value.detach().double()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
        return torch.tensor(value, dtype=torch.float64)
    return None


def _spot(calls, got, start):
    """Where a judged value came from: (call, position in a returned tuple or None), from ``start`` on: the object
    itself, else the first equal numbers (a list the check turned into a tensor, an int8 q it made float)."""
    data = _as_data(got)
    candidates = [(k, i, part) for k in range(start, len(calls)) for i, part in
                  [(None, calls[k])] + (list(enumerate(calls[k])) if isinstance(calls[k], (tuple, list)) else [])]
    for k, i, part in candidates:
        if part is got:
            return k, i
    for k, i, part in candidates:
        d = _as_data(part)
        if data is not None and d is not None and d.shape == data.shape and torch.equal(d, data):
            return k, i
    return None


def spots(calls, seen):
    """For each judged case, where the student's value came from (None: assembled by the check)."""
    out, start = [], 0
    if len(calls) == len(seen) and all(not isinstance(c, (tuple, list, dict, torch.Tensor)) for c in calls):
        return [(k, None) for k in range(len(calls))]  # one call per judged number, in order
    for _, got, *_ in seen:
        spot = _spot(calls, got, start)
        out.append(spot)
        if spot is not None:
            start = spot[0]
    return out


def _like(wrong, right):
    """A mistake's output in the type and dtype the right answer returned there."""
    if type(wrong).__name__ == "_NoneAnswer":
        return None
    if isinstance(right, torch.Tensor) and isinstance(wrong, torch.Tensor):
        return wrong.to(right.dtype)
    if isinstance(right, torch.Tensor) and isinstance(wrong, (int, float)):
        return torch.tensor(wrong, dtype=right.dtype)
    if isinstance(right, list) and isinstance(wrong, torch.Tensor):
        return wrong.tolist()
    return wrong


class Replay:
    """An answer that gives the right answer's outputs, some of them replaced: {(call, position): value}."""

    def __init__(self, right, substitutes):
        self.right, self.substitutes, self.count = right, substitutes, 0

    def __call__(self, *args, **kwargs):
        out = self.right(*args, **kwargs)
        k = self.count
        self.count += 1
        if (k, None) in self.substitutes:
            return _like(self.substitutes[(k, None)], out)
        if isinstance(out, (tuple, list)) and any((k, i) in self.substitutes for i in range(len(out))):
            return type(out)(_like(self.substitutes.get((k, i), o), o) if (k, i) in self.substitutes else o
                             for i, o in enumerate(out))
        return out


def recorded(impl):
    """``impl`` that keeps what it returns: (the answer, its calls); a class keeps what its forward returns."""
    calls: list = []
    if isinstance(impl, type):
        class Recording(impl):
            def forward(self, *args, **kwargs):
                out = super().forward(*args, **kwargs)
                calls.append(out)
                return out
        return Recording, calls

    def recording(*args, **kwargs):
        out = impl(*args, **kwargs)
        calls.append(out)
        return out
    return recording, calls


def replayed(impl, substitutes):
    if isinstance(impl, type):
        replay = Replay(lambda out: out, substitutes)

        class Wrong(impl):
            def forward(self, *args, **kwargs):
                return replay(super().forward(*args, **kwargs))
        return Wrong
    return Replay(impl, substitutes)


def differs(output, want, same) -> bool:
    return not same(output, want) if not isinstance(want, torch.Tensor) else not (
        isinstance(output, torch.Tensor) and output.shape == want.shape and same(output.to(torch.float64), want))


def behaviour(seen, diagnosis):
    """What a mistake does in each judged case: the first of its outputs that fails there, or None."""
    out = []
    for _, _, want, outputs, same in seen:
        wrong = [o for d, os in outputs if d == diagnosis for o in os if differs(o, want, same)]
        out.append(wrong[0] if wrong else None)
    return out


def alike(seen, a: str, b: str) -> bool:
    """Whether two mistakes compute the same in every judged case (no case tells them apart)."""
    for (*_, same), wa, wb in zip(seen, behaviour(seen, a), behaviour(seen, b), strict=True):
        if (wa is None) != (wb is None):
            return False
        if wa is not None and not same(wa, wb) and not same(wb, wa):
            return False
    return True


FUNCTIONS = [(c, i) for c, i in RIGHT if callable(i) and c.__name__ not in ASSEMBLED]


@pytest.mark.slow
@pytest.mark.parametrize("check, impl", FUNCTIONS, ids=[c.__name__ for c, _ in FUNCTIONS])
def test_every_known_mistake_is_named_with_only_what_no_case_tells_apart(check, impl):
    answer, calls = recorded(impl)
    seen = observe(check, answer)
    where = spots(calls, seen)
    graded: list = []  # the grader-only cases of several secrets, recorded when two mistakes are named together
    diagnoses = list(dict.fromkeys(d for *_, outputs, _ in seen for d, _ in outputs))
    pairs = [d for d in diagnoses if d.startswith("two at once: ")]
    diagnoses = [d for d in diagnoses if d not in pairs] + pairs[::12]  # every single mistake, a sample of pairs
    problems, audited, unmapped = [], 0, []
    for diagnosis in diagnoses:
        wrong = behaviour(seen, diagnosis)
        if all(w is None for w in wrong):
            continue  # makes no difference in any public case (a grader-only or degenerate mistake)
        if any(w is not None and spot is None for w, spot in zip(wrong, where, strict=True)):
            unmapped.append(diagnosis)  # it changes a value the check assembles (the LM's parameter count)
            continue
        substitutes = {spot: w for w, spot in zip(wrong, where, strict=True) if w is not None}
        audited += 1
        try:
            check(replayed(impl, substitutes), mode=Mode.script())
        except CheckFailed as err:
            names = named(str(err))
            simpler = [n for n in names if n != diagnosis and n in diagnosis and alike(seen, n, diagnosis)]
            if diagnosis not in names and not simpler:  # a pair that one of its halves explains: the simpler wins
                problems.append(f"{diagnosis!r}: named {names}\n{err}")
            for other in names:
                if other == diagnosis or other in simpler:
                    continue
                graded = graded or [observe(check, impl, "graded", s) for s in SECRETS]
                told = [s for s, g in zip(SECRETS, graded, strict=True) if not alike(g, diagnosis, other)]
                if told:
                    problems.append(f"{diagnosis!r} and {other!r} are named together, but the grader's cases of "
                                    f"secret {told[0]} tell them apart: add a public case that does\n{err}")
            for case, _, want, _, _ in seen:  # the first failing case's right value is not in the message
                if isinstance(want, int) and abs(want) >= 100 and str(err).startswith(f"{check.__name__}: "
                                                                                       f"{case.text}: "):
                    assert f"{want:,}" not in str(err) and f" {want}" not in str(err), (diagnosis, str(err))
        else:
            problems.append(f"{diagnosis!r}: passed")
    assert audited or not diagnoses
    assert not problems, "\n\n".join(problems)
    assert set(unmapped) <= {m.diagnosis for m in COUNT_MISTAKES}, unmapped  # the LM's count: test_exercises


def _pieces(check_name: str, case) -> list[tuple[int, int]]:
    """The slices of an assembled case's judged output that its calls return: a schedule's value per step, or a
    decoding step's tokens."""
    if check_name == "check_lr_schedule":
        return [(k, k + 1) for k in range(len(case.steps))]
    starts = [sum(case.schedule[:k]) for k in range(len(case.schedule))]
    return [(a, a + t) for a, t in zip(starts, case.schedule, strict=True)]


@pytest.mark.parametrize("name", sorted(ASSEMBLED))
def test_every_mistake_of_an_output_assembled_from_several_calls_is_named(name):
    """The learning-rate schedule (a value per step) and decoding with a cache (a chunk per step): each mistake's
    output, handed back one call at a time, is named (the cache itself is filled rightly)."""
    check, impl = next((c, i) for c, i in RIGHT if c.__name__ == name)
    seen = observe(check, impl)
    problems = []
    for diagnosis in dict.fromkeys(d for *_, outputs, _ in seen for d, _ in outputs):
        wrong = behaviour(seen, diagnosis)
        if all(w is None for w in wrong):
            continue
        answers = []
        for (case, _, want, _, _), w in zip(seen, wrong, strict=True):
            out = want if w is None else w
            for a, b in _pieces(name, case):
                answers.append(out[a:b].item() if name == "check_lr_schedule" else out[:, a:b].float())
        given = iter(answers)

        def wrong_answer(*args, given=given):
            impl(*args)  # the right one, for what it leaves in the cache
            return next(given)

        with pytest.raises(CheckFailed) as info:
            check(wrong_answer, mode=Mode.script())
        if diagnosis not in named(str(info.value)):
            problems.append(f"{diagnosis!r}: named {named(str(info.value))}\n{info.value}")
    assert not problems, "\n\n".join(problems)


def test_every_parameter_count_mistake_of_the_lm_is_named():
    """07 ex2 counts the chapter's model's parameters before any forward: each known count mistake, built as a
    model with those parameters, is named alone."""
    from test_exercises import LMVariant

    def extra(n):  # a model that holds n parameters more than the chapter's
        class More(LMVariant):
            def __init__(self, V, *args, **kwargs):
                super().__init__(V, *args, **kwargs)
                if V == 1000:
                    self.more = torch.nn.Parameter(torch.zeros(n))
        return More

    class TiedByDefault(LMVariant):
        def __init__(self, V, *args, tie=True, **kwargs):
            super().__init__(V, *args, tie=tie, **kwargs)

    class NoFinalNorm(LMVariant):
        def __init__(self, V, *args, **kwargs):
            super().__init__(V, *args, **kwargs)
            if V == 1000:
                self.norm = torch.nn.Identity()

    built = {-256_000: TiedByDefault, -256: NoFinalNorm, 1000: extra(1000), 262_144: extra(262_144),
             256_000: extra(256_000)}
    for mistake in COUNT_MISTAKES:
        case = checks.core.Case("count", lambda: 3_283_456)
        delta = mistake.outputs(case)[0] - 3_283_456
        with pytest.raises(CheckFailed) as info:
            checks.check_llama_lm(built[delta], mode=Mode.script())
        assert named(str(info.value)) == [mistake.diagnosis], str(info.value)


VALUES = [(check, value) for check, value in RIGHT if not callable(value)]


@pytest.mark.parametrize("check, value", VALUES, ids=[c.__name__ for c, _ in VALUES])
def test_a_value_item_names_each_mistake_and_never_prints_its_answer(check, value):
    seen = observe(check, value)
    ((_, _, want, outputs, same),) = seen
    targets = {f"{value:,}", f"{value}", f"{value:.4g}", f"{value:.3g}", f"{value:.2e}", f"{value:.10g}"}
    wrongs = [(d, w) for d, os in outputs for w in os if not same(w, want)] + [(None, value * 1.37)]
    wrongs += [(None, value + 1)] if isinstance(value, int) else []
    for diagnosis, wrong in wrongs:
        wrong = int(wrong) if isinstance(value, int) and float(wrong).is_integer() else wrong
        with pytest.raises(CheckFailed) as info:
            check(wrong, mode=Mode.script())
        message = str(info.value)
        assert not any(t in message for t in targets), message
        if diagnosis is not None:
            assert diagnosis in named(message), message
            assert all(any(same(wrong, o) for o in dict(outputs)[d]) for d in named(message)), message
        else:
            assert named(message) == [] and "too large" in message, message


def test_value_mistakes_that_coincide_are_named_together():
    """02 ex4: rounding 8/3·d·1.3 down and leaving the multiplier out both give 24,576; 00 ex1's q/k/v bias counted as
    d and a LayerNorm counted with one vector are both 2d short, whatever d is."""
    with pytest.raises(CheckFailed) as info:
        checks.check_llama3_70b_d_ff(24_576, mode=Mode.script())
    assert {"rounded down instead of up (floor); Llama rounds up: multiple_of·ceil(h / multiple_of).",
            "ffn_dim_multiplier is ignored: multiply the hidden size by it before rounding."} <= set(named(str(
                info.value)))
    with pytest.raises(CheckFailed) as info:
        checks.check_gpt2_block_params(lambda d, d_ff=None: gpt2_block_params_ok(d, d_ff) - 2 * d, mode=Mode.script())
    names = named(str(info.value))
    assert any("q/k/v bias was counted with d entries" in n for n in names), info.value
    assert any("each LayerNorm was counted with one vector" in n for n in names), info.value
    assert str(info.value).count("\n- ") == len(names) >= 2


# ---- the words for how a number is off ----------------------------------------------------------------------


def test_how_off_gives_a_direction_and_a_rough_band_only():
    assert how_off(35_136, 70_272) == "it is too small: between a tenth and a half of the right value"
    assert how_off(140_544, 70_272) == "it is too large: between 1.5 and 10 times the right value"
    assert how_off(1.5 * 28672, 28672) == "it is too large: between 1.5 and 10 times the right value"
    assert how_off(30_000, 28_672) == "it is too large by 1% to 10%"
    assert how_off(14_197, 14_198) == "it is too small by less than 1%"
    assert how_off(1.0, 1.5e13) == "it is too small by about 13 orders of magnitude"
    assert how_off(-5, 7) == "it has the wrong sign"
    for got, want in itertools.product([7, 24_576, 1e30], [28_672, 123_456, 1e-3]):
        text = how_off(got, want)
        assert str(want) not in text and f"{want:,}" not in text and f"{got / want:.3g}" not in text, text
    assert rough_factor(0.25) == "too small: between a tenth and a half of the right value"


def test_where_differs_names_the_half_the_positions_the_heads_and_a_rough_factor():
    want = torch.randn(1, 3, 5, 8)
    got = want.clone()
    got[:, 1, 2:, 4:] += 1.0
    bad = (got - want).abs() > 1e-6
    text = where_differs(got, want, bad, ("head", "position", ""), halves=True)
    assert "only the second half of the last dimension differs" in text
    assert "head 0, 2 are right, head 1 differs" in text and "position 0-1 are right, position 2-4 differ" in text
    assert "half" not in where_differs(got, want, bad, ("head", "position", ""))  # p-values have no halves
    text = where_differs(2.5 * want, want, torch.ones_like(want, dtype=torch.bool), ("head", "position", ""))
    assert text == ("everywhere it is the correct output times one constant factor (too large: between 1.5 and 10 "
                    "times the right value)")
    assert "2.5" not in text


def test_a_p_value_list_is_not_described_by_halves():
    with pytest.raises(CheckFailed) as info:
        checks.check_holm(lambda ps: holm(ps)[:-1] + [holm(ps)[-1] * 0.5], mode=Mode.script())
    assert "half of the last dimension" not in str(info.value) and "p-value" in str(info.value)


def test_the_thousands_separator_does_not_touch_a_name():
    with pytest.raises(CheckFailed) as info:
        checks.check_flops_per_token(lambda N, L, H, Q, T: 6 * N, mode=Mode.script())
    assert "flops_per_token(10_616_832, 6, 6, 64, 256)" in str(info.value)


def test_a_number_that_rounds_alike_is_shown_with_all_its_digits():
    with pytest.raises(CheckFailed) as info:
        checks.check_ntk_scaled_base(lambda base, dh, kappa: base * kappa ** (dh / (dh - 2)) * (1 + 1e-5),
                                     mode=Mode.script())
    message = str(info.value)
    assert "got 40890.35133" in message and "expected" not in message and "too large by less than 1%" in message


# ---- lesson 07: two mistakes that coincide at the chapter's size -----------------------------------------


def test_the_final_norm_is_told_apart_from_the_qk_norm():
    from test_exercises import llama_param_count_ok

    def no_final_norm(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True, qkv_bias=False):
        return llama_param_count_ok(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, qk_norm, qkv_bias) - d

    def no_qk_norm(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True, qkv_bias=False):
        return llama_param_count_ok(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, False, qkv_bias)

    assert no_final_norm(1000, 256, 4, 8, 2, 688) == no_qk_norm(1000, 256, 4, 8, 2, 688) == 3_283_200
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(no_final_norm, mode=Mode.script())
    assert named(str(info.value)) == ["the final norm (d) was not counted."]
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(no_qk_norm, mode=Mode.script())
    assert len(named(str(info.value))) == 1 and "QK-norm scales were not counted" in named(str(info.value))[0]


def test_a_hard_coded_count_names_nothing():
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(lambda *args, **kwargs: 3_283_456, mode=Mode.script())
    message = str(info.value)
    assert named(message) == [] and "cases fail" in message


def test_an_unexplained_rope_names_where_it_differs():
    def one_head_wrong(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)
        out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        if out.shape[1] > 1:
            out[:, 1] = -out[:, 1]
        return out

    with pytest.raises(CheckFailed) as info:
        checks.check_apply_rope(one_head_wrong, mode=Mode.script())
    message = str(info.value)
    assert named(message) == [] and "head 1 differs" in message and "head 0, 2 are right" in message
