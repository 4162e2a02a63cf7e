"""Feedback a student can trust (``checks.verdict``): every mistake a check can name is named for that mistake and
for no other, a coincidence in one case names nothing, value items never print their answer, and the message
without a named mistake says where the output differs.

The audit generates the wrong implementations: for each function check, a first run with the right answer records
every judged case with what each candidate mistake computes there; then, for each mistake, an implementation
that returns exactly what that mistake computes (in every case where it makes a difference) is graded, and the
message must name that mistake and only it. The hand-written wrong implementations of test_exercises.py show that
the candidates model real code; this shows that the verdict turns each of them into the right words."""

import pytest
import torch
from check_helpers import named
from test_exercises import FUNCTIONS, RIGHT, SandwichBlockOk, llama_param_count_ok

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks import CheckFailed, verdict
from modern_block.classroom.checks.verdict import how_off, where_differs

VALUES = [(check, value) for check, value in RIGHT if not callable(value)]


def record(check, impl):
    """Run ``check`` on the right ``impl``; return the student's call results and the judged cases."""
    calls = []

    def recording(*args, **kwargs):
        out = impl(*args, **kwargs)
        calls.append(out)
        return out

    with verdict.observing() as seen:
        check(recording)
    return calls, seen


def mapping(calls, seen):
    """For each judged case, (call number, position in a returned tuple or None); None when the judged output is
    not one of the values the student's function returned (the check compares something it assembled)."""
    where, start = [], 0
    for got, _, _ in seen:
        spot = None
        for k in range(start, len(calls)):
            out = calls[k]
            if out is got:
                spot = (k, None)
            elif isinstance(out, tuple):
                spot = next(((k, i) for i, o in enumerate(out) if o is got), None)
            if spot:
                break
        if spot is None:
            if len(calls) == len(seen) and all(not isinstance(c, (tuple, list, dict)) for c in calls):
                return [(k, None) for k in range(len(calls))]  # one call per judged number, in order
            return None
        start = spot[0]
        where.append(spot)
    return where


def replaying(impl, substitutes):
    """``impl`` with the outputs of some calls replaced: {(call, position): value}."""
    count = [0]

    def wrong(*args, **kwargs):
        out = impl(*args, **kwargs)
        k = count[0]
        count[0] += 1
        if (k, None) in substitutes:
            return substitutes[(k, None)]
        if isinstance(out, tuple) and any((k, i) in substitutes for i in range(len(out))):
            return tuple(substitutes.get((k, i), o) for i, o in enumerate(out))
        return out

    return wrong


def differs(wrong, want) -> bool:
    if isinstance(want, torch.Tensor):
        return not (isinstance(wrong, torch.Tensor) and wrong.shape == want.shape and torch.equal(
            wrong.double(), want.double()))
    return wrong != want


REPLAYABLE = {"check_gpt2_block_params", "check_causal_attention", "check_gpt2_attention", "check_rms",
              "check_swiglu_hidden_dim", "check_ffn_weight_count", "check_rope_cache", "check_apply_rope",
              "check_apply_rope_interleaved", "check_repeat_kv", "check_mla_cache_bytes", "check_absorb_query",
              "check_absorbed_scores", "check_mla_absorption", "check_qk_norm_rope", "check_llama_param_count",
              "check_flops_per_token", "check_llama3_rope_scaling", "check_ntk_scaled_base",
              "check_unpermute_qk", "check_fair_comparison", "check_dequantize_q4_0", "check_bytes_per_token",
              "check_floor_ms", "check_kv_bytes_per_token", "check_smallest_multiple_of", "check_active_parameters",
              "check_verdict"}


@pytest.mark.parametrize("check, impl", FUNCTIONS, ids=[c.__name__ for c, _ in FUNCTIONS])
def test_every_known_mistake_is_named_and_nothing_else(check, impl):
    if isinstance(impl, type):
        pytest.skip("a class: the module audits below and test_exercises.py generate its mistakes")
    calls, seen = record(check, impl)
    where = mapping(calls, seen)
    if where is None:
        assert check.__name__ not in REPLAYABLE
        pytest.skip("the check judges outputs it assembles from several calls: the lr-schedule audit below, and "
                    "test_exercises.py for the KV cache")
    assert check.__name__ in REPLAYABLE, "add it to REPLAYABLE"
    diagnoses = list(dict.fromkeys(d for _, _, cands in seen for d, _ in cands))
    problems = []
    for diagnosis in diagnoses:
        substitutes = {}
        for spot, (_, want, cands) in zip(where, seen, strict=True):
            wrong = next((w for d, w in cands if d == diagnosis and w is not None), None)
            if wrong is not None and differs(wrong, want):
                substitutes[spot] = wrong.float() if isinstance(wrong, torch.Tensor) and \
                    wrong.dtype == torch.float64 else wrong
        if not substitutes:
            continue  # gives the right answer in every notebook case (a graded-only or degenerate candidate)
        try:
            check(replaying(impl, substitutes))
        except CheckFailed as err:
            names = named(str(err))
            if names != [diagnosis]:
                problems.append(f"{diagnosis!r}: named {names}\n{err}")
        else:
            problems.append(f"{diagnosis!r}: passed")
    assert not problems, "\n\n".join(problems)


def test_the_replay_covers_the_function_checks():
    replayed = set()
    for check, impl in FUNCTIONS:
        if not isinstance(impl, type) and mapping(*record(check, impl)) is not None:
            replayed.add(check.__name__)
    assert replayed == REPLAYABLE


@pytest.mark.parametrize("check, value", VALUES, ids=[c.__name__ for c, _ in VALUES])
def test_a_value_item_names_each_mistake_and_never_prints_its_answer(check, value):
    with verdict.observing() as seen:
        check(value)
    ((_, want, cands),) = seen
    targets = {f"{value:,}", f"{value}", f"{value:.4g}", f"{value:.3g}", f"{value:.2e}"}
    wrongs = [(d, w) for d, w in cands if w is not None and w != value] + [(None, value * 1.37)]
    wrongs += [(None, value + 1)] if isinstance(value, int) else []
    for diagnosis, wrong in wrongs:
        wrong = int(wrong) if isinstance(value, int) and float(wrong).is_integer() else wrong
        with pytest.raises(CheckFailed) as info:
            check(wrong)
        message = str(info.value)
        assert not any(t in message for t in targets), message
        if diagnosis is not None:
            assert named(message) == [diagnosis], message
        else:
            assert named(message) == [] and "too large" in message, message


def test_how_off_says_the_factor_or_the_direction():
    assert how_off(35_136, 70_272) == "it is exactly half the right value"
    assert how_off(140_544, 70_272) == "it is exactly twice the right value"
    assert how_off(3 * 23_040, 23_040) == "it is exactly 3× the right value"
    assert how_off(1.5 * 28672, 28672) == "it is exactly 3/2× the right value"
    assert how_off(30_000, 28_672) == "it is too large by roughly 5%"
    assert how_off(100, 28_672) == "it is too small by roughly 100%"
    assert how_off(28_673, 28_672) == "it is too large by less than 1%"


# ---- lesson 07, exercise 3: two mistakes that coincide at the chapter's size -----------------------------


def test_the_final_norm_is_told_apart_from_the_qk_norm():
    def no_final_norm(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True):
        return llama_param_count_ok(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, qk_norm) - d

    def no_qk_norm(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True):
        return llama_param_count_ok(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, qk_norm=False)

    assert no_final_norm(1000, 256, 4, 8, 2, 688) == no_qk_norm(1000, 256, 4, 8, 2, 688) == 3_283_200
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(no_final_norm)
    assert named(str(info.value)) == ["the final norm (d) was not counted."]
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(no_qk_norm)
    assert len(named(str(info.value))) == 1 and "QK-norm scales were not counted" in named(str(info.value))[0]


def test_a_hard_coded_count_is_not_a_tied_head_counted_twice():
    with pytest.raises(CheckFailed) as info:
        checks.check_llama_param_count(lambda *args, **kwargs: 3_283_456)
    message = str(info.value)
    assert named(message) == [] and "counted a second time" not in message
    assert "cases fail" in message


# ---- the message without a named mistake ----------------------------------------------------------------


def test_where_differs_names_the_half_the_positions_the_heads_and_a_factor():
    want = torch.randn(1, 3, 5, 8)
    got = want.clone()
    got[:, 1, 2:, 4:] += 1.0
    bad = (got - want).abs() > 1e-6
    text = where_differs(got, want, bad, ("head", "position", ""))
    assert "only the second half of the last dimension differs" in text
    assert "head 0, 2 are right, head 1 differs" in text and "position 0-1 are right, position 2-4 differ" in text
    text = where_differs(2.5 * want, want, torch.ones_like(want, dtype=torch.bool), ("head", "position", ""))
    assert text == "everywhere it is 2.5 × the correct output (a constant factor)"


def test_the_halves_swapped_rope_is_not_answered_with_the_formula():
    def swapped(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)
        return torch.cat([x1 * sin + x2 * cos, x1 * cos - x2 * sin], dim=-1)

    with pytest.raises(CheckFailed) as info:
        checks.check_apply_rope(swapped)
    message = str(info.value)
    assert named(message) and "halves of the result were swapped" in named(message)[0]
    assert "x1·cos" not in message and "cat(" not in message


def test_an_unexplained_rope_names_where_it_differs():
    def one_head_wrong(x, cos, sin):
        out = checks_apply_rope_ok(x, cos, sin)
        if out.shape[1] > 1:
            out[:, 1] = -out[:, 1]
        return out

    with pytest.raises(CheckFailed) as info:
        checks.check_apply_rope(one_head_wrong)
    message = str(info.value)
    assert named(message) == [] and "head 1 differs" in message and "head 0, 2 are right" in message


def checks_apply_rope_ok(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# ---- the module checks: each mistake generated as a module that computes it -------------------------------


def test_every_block_mistake_is_named_alone():
    from modern_block.classroom.checks.lesson07 import _block_candidates

    diagnoses = [d for d, _ in _block_candidates(SandwichBlockOk(8, 2, 1, 8), None, None, None)]
    problems = []
    for i, diagnosis in enumerate(diagnoses):
        class Wrong(SandwichBlockOk):
            def forward(self, x, cos, sin, i=i):  # the mistake's formula, with this module's own weights
                return _block_candidates(self, x, cos, sin)[i][1]().float()

        with pytest.raises(CheckFailed) as info:
            checks.check_block(Wrong)
        if named(str(info.value)) != [diagnosis]:
            problems.append(f"{diagnosis!r}: named {named(str(info.value))}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("check", [checks.check_gqattention, checks.check_qk_norm_attention],
                         ids=lambda c: c.__name__)
def test_every_attention_mistake_is_named_alone(check):
    from modern_block.classroom.checks.lesson04 import _ATTENTION_MISTAKES, _attention64, _attention_params

    problems = []
    for diagnosis, knobs, applies in _ATTENTION_MISTAKES:
        class Wrong(mb.GQAttention):
            def __init__(self, d, n_heads, n_kv_heads, qk_norm=True, knobs=knobs, applies=applies):
                super().__init__(d, n_heads, n_kv_heads, qk_norm=qk_norm)
                self.knobs, self.applies, self.qk_norm_on = knobs, applies, qk_norm

            def forward(self, x, cos, sin):  # the mistake's formula where it makes a difference, else the right one
                on = self.applies(self.h, self.kv, self.qk_norm_on)
                return _attention64(_attention_params(self), x, cos, sin, h=self.h, kv=self.kv, dh=self.dh, eps=1e-6,
                                    qk_norm=self.qk_norm_on, **(self.knobs if on else {})).to(x.dtype)

        with pytest.raises(CheckFailed) as info:
            check(Wrong)
        if named(str(info.value)) != [diagnosis]:
            problems.append(f"{diagnosis!r}: named {named(str(info.value))}")
    assert not problems, "\n".join(problems)


def test_every_rmsnorm_mistake_is_named_alone():
    from modern_block.classroom.checks.lesson01 import _rms_candidates

    x0 = torch.randn(2, 16)
    diagnoses = list(dict.fromkeys(d for d, _ in _rms_candidates(x0, 1e-6, torch.ones(16))))
    problems = []
    for diagnosis in diagnoses:
        class Wrong(mb.RMSNorm):
            def forward(self, x, diagnosis=diagnosis):  # the mistake's formula, in float32, back in x's dtype
                for d, make in _rms_candidates(x.float(), self.eps, self.weight.float()):
                    wrong = make() if d == diagnosis else None
                    if wrong is not None:
                        return wrong.to(x.dtype)
                return super().forward(x)

        try:
            checks.check_rmsnorm(Wrong)
        except CheckFailed as err:
            if named(str(err)) != [diagnosis]:
                problems.append(f"{diagnosis!r}: named {named(str(err))}\n{err}")
        else:
            problems.append(f"{diagnosis!r}: passed")
    assert not problems, "\n\n".join(problems)


def knobs_of(check_module, check, impl, monkeypatch) -> dict:
    """diagnosis -> the keyword knobs of the check's own candidate formula (its partial), as a right ``impl``'s
    run offers them."""
    offered: dict = {}
    judge = check_module.judge

    def spy(name, got, want, candidates, *args, **kwargs):
        for diagnosis, make in candidates:
            if hasattr(make, "keywords") and diagnosis not in offered:
                offered[diagnosis] = dict(make.keywords)
        return judge(name, got, want, candidates, *args, **kwargs)

    monkeypatch.setattr(check_module, "judge", spy)
    check(impl)
    monkeypatch.setattr(check_module, "judge", judge)
    assert len(offered) >= 4, offered  # the spy saw the check's candidates
    return offered


def test_every_lr_schedule_mistake_is_named_alone(monkeypatch):
    from test_exercises import lr_at_ok

    from modern_block.classroom.checks import lesson08

    problems = []
    for diagnosis, knobs in knobs_of(lesson08, checks.check_lr_schedule, lr_at_ok, monkeypatch).items():
        knobs = {k: v for k, v in knobs.items() if k not in ("lr", "min_lr", "warmup", "total", "steps")}

        def wrong(step, lr, min_lr, warmup_steps, max_steps, knobs=knobs):
            return lesson08._lr64(step, lr, min_lr, warmup_steps, max_steps, **knobs)

        with pytest.raises(CheckFailed) as info:
            checks.check_lr_schedule(wrong)
        if named(str(info.value)) != [diagnosis]:
            problems.append(f"{diagnosis!r}: named {named(str(info.value))}")
    assert not problems, "\n".join(problems)


def test_every_swiglu_mistake_is_named_alone(monkeypatch):
    from modern_block.classroom.checks import lesson02

    problems = []
    for diagnosis, knobs in knobs_of(lesson02, checks.check_swiglu, mb.SwiGLU, monkeypatch).items():
        class Wrong(mb.SwiGLU):
            def forward(self, x, knobs=knobs):
                return lesson02._swiglu64(x, self.w_gate.weight, self.w_up.weight, self.w_down.weight,
                                          **knobs).to(x.dtype)

        with pytest.raises(CheckFailed) as info:
            checks.check_swiglu(Wrong)
        if named(str(info.value)) != [diagnosis]:
            problems.append(f"{diagnosis!r}: named {named(str(info.value))}")
    assert not problems, "\n".join(problems)
