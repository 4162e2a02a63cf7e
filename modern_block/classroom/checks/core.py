"""What every check is made of: known mistakes (``Mistake``), cases (``Case``), one run of a check that calls
the student's code and judges each case (``CheckRun``), and the decorator that turns its verdict into one
message reported as the ``Mode`` says (``exercise_check``; the package's docstring shows a check).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import torch
import torch.nn as nn

from . import in_notebook
from .diagnosis import Diagnosis, how_off, shown, where_differs
from .errors import CheckFailed, NotAttempted
from .hiding import HIDES, TABLES, USES, grader_view
from .mode import Mode

M = TypeVar("M", bound=nn.Module)


class Case:
    """One input of a check: ``text`` (how a message names it: the call, or the inputs' shapes), ``expect`` (the
    right output; called with a mistake's knobs, that mistake's output), the arguments the student's code gets,
    whether it was drawn from the grader's secret, and named facts the mistakes' conditions read
    (``case.h``). What its formulas read must not change once it is judged: a mistake's output is computed when it
    matters, possibly after the check has moved on (clone a module's weights the check converts later)."""

    def __init__(self, text: str, expect: Callable[..., Any], args: Sequence = (), kwargs: dict | None = None, *,
                 secret: bool = False, **facts):
        self.text, self.expect, self.args, self.kwargs = text, expect, tuple(args), dict(kwargs or {})
        self.secret, self.facts = secret, facts
        self._want: list = []

    def __getattr__(self, name: str):
        facts = self.__dict__.get("facts", {})
        if name in facts:
            return facts[name]
        raise AttributeError(name)

    @property
    def want(self):
        """The right output (computed once)."""
        if not self._want:
            self._want.append(self.expect())
        return self._want[0]


class Mistake:
    """One known mistake: what the teacher says (``diagnosis``), how it computes (each of ``ways``: the case's
    knobs, a dict for ``case.expect``, or a function of the case; several ways are variants of one mistake), and
    when it applies (``when(case)``; where it does not, it makes no difference)."""

    def __init__(self, diagnosis: str, *ways, when: Callable[[Case], bool] | None = None):
        if not ways:
            raise ValueError(f"a mistake needs a way to compute it: {diagnosis!r}")
        self.diagnosis, self.ways, self.when = diagnosis, ways, when

    def outputs(self, case: Case) -> list:
        """What the mistake computes for ``case`` (one output per variant); [] where it does not apply."""
        if self.when is not None and not self.when(case):
            return []
        out = []
        for way in self.ways:
            try:
                value = case.expect(**way) if isinstance(way, dict) else way(case)
            except Exception:  # a formula that does not fit this case
                continue
            if value is not None:
                out.append(value)
        return out

    @staticmethod
    def pairs(mistakes: Sequence[Mistake]) -> list[Mistake]:
        """Every two knob mistakes at once (two independent slips in one answer), where either applies."""
        out = []
        for i, a in enumerate(mistakes):
            for b in mistakes[i + 1:]:
                ka, kb = a.ways[0], b.ways[0]
                if isinstance(ka, dict) and isinstance(kb, dict) and not set(ka) & set(kb):
                    def both(case, a=a, b=b, ka=ka, kb=kb):
                        on_a, on_b = a.when is None or a.when(case), b.when is None or b.when(case)
                        return case.expect(**(ka if on_a else {}), **(kb if on_b else {})) if on_a or on_b else None
                    out.append(Mistake(f"two at once: (1) {a.diagnosis} (2) {b.diagnosis}", both))
        return out


# ---- comparing outputs -----------------------------------------------------------------------------------


def matches(got, want: torch.Tensor, rtol: float, atol: float, equal_nan: bool = False) -> bool:
    """Same shape and allclose in float64. NaN/inf in ``got`` never pass, except, with ``equal_nan``, where
    ``want`` (a mistake's output) has the same NaN or inf."""
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
        return False
    g, w = got.detach().double(), want.detach().double()
    if equal_nan:
        odd = ~torch.isfinite(w)
        if not torch.equal(g[odd].nan_to_num(), w[odd].nan_to_num()) or not torch.isfinite(g[~odd]).all():
            return False
        return torch.allclose(g[~odd], w[~odd], rtol=rtol, atol=atol)
    return bool(torch.isfinite(g).all()) and torch.allclose(g, w, rtol=rtol, atol=atol)


def shape_of(t) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def as_number(got):
    """A plain number from a student's answer (a one-element tensor's value), or None."""
    value = got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


MAX_RETURNED_NUMBERS = 1 << 22  # tensor elements one call of a check may return (the cases are small)


def _numbers_in(value, depth: int = 0) -> int:
    """The tensor elements in a returned value (tensors, and tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if depth < 8 and isinstance(value, (tuple, list)):
        return sum(_numbers_in(v, depth + 1) for v in value)
    if depth < 8 and isinstance(value, dict):
        return sum(_numbers_in(v, depth + 1) for v in value.values())
    return 0


class Output:
    """An argument whose contents after the call the check reads: the KV cache the student's function is to
    extend in place, or an input it must leave alone. Like every argument it gets a fresh copy; after the call
    ``value`` is what the function left in that copy (the check's own value is never touched)."""

    def __init__(self, value):
        self.value = value


def fresh(value):
    """A copy of an argument for the student's code: whatever it does to it never reaches the check's own values.
    Stand-ins for the student's objects (the grader's) are passed as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if hasattr(value, "call_with_outputs"):
        return value
    if isinstance(value, nn.Module):
        return copy.deepcopy(value)
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [fresh(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


# ---- one run of a check -----------------------------------------------------------------------------------


class CheckRun:
    """One run of a check on one answer: its name, its mode, the pieces it hides, and its verdict so far."""

    def __init__(self, name: str, mode: Mode):
        self.name, self.mode = name, mode
        self.hidden = HIDES.get(name, ())
        self.diagnosis = Diagnosis(name)

    # -- inputs --

    def rng(self, seed: int) -> torch.Generator:
        """The generator a check draws its inputs from: its fixed seed in a notebook, mixed with the secret in the
        grader (so no answer can be computed in advance)."""
        return torch.Generator().manual_seed(self.mode.seeded(seed))

    def cases(self, public: Sequence[Case], secret: Callable[[torch.Generator], Sequence[Case]], seed: int):
        """The public cases and, in the grader, the cases ``secret`` draws from the grader's secret (none of
        them known in advance: a table of the public answers does not pass)."""
        if not self.mode.is_graded:
            return list(public)
        drawn = list(secret(self.rng(seed)))
        for case in drawn:
            for part in [case, *(v for v in case.facts.values() if isinstance(v, Case))]:  # its judged parts too
                part.secret = True
        return list(public) + drawn

    @staticmethod
    def pick(g: torch.Generator, options: Sequence):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    @staticmethod
    def randint(g: torch.Generator, low: int, high: int) -> int:
        """An int in [low, high)."""
        return int(torch.randint(low, high, (1,), generator=g))

    # -- the student's code --

    def call(self, what: str, fn, *args, **kwargs):
        """Call the student's code on fresh copies of the arguments (``Output`` ones come back), with the
        package as the grader shows it (in a notebook); a crash fails the check, saying which call crashed. In
        the grader ``fn`` is a stand-in for an object in the student's process: the copies travel there as data
        and only the outputs return."""
        __tracebackhide__ = True
        outputs = [i for i, a in enumerate(args) if isinstance(a, Output)]
        copies = [fresh(a.value if isinstance(a, Output) else a) for a in args]
        keywords = {k: fresh(v) for k, v in kwargs.items()}
        try:
            if hasattr(fn, "call_with_outputs"):
                value, changed = fn.call_with_outputs(copies, keywords, outputs)
            else:
                with grader_view(self.hidden) if self.mode.hides else contextlib.nullcontext():
                    value = fn(*copies, **keywords)
                changed = {i: copies[i] for i in outputs}
        except (NotImplementedError, NotAttempted, CheckFailed):
            raise
        except Exception as err:  # the student's code crashed: say where, keep the traceback chained
            raise CheckFailed(f"{self.name}: {what} raised {type(err).__name__}: {err}") from err
        returned = _numbers_in(value) + sum(_numbers_in(v) for v in changed.values())
        if returned > MAX_RETURNED_NUMBERS:  # no case asks for this much: drop it now, whatever comes next
            self.fail(f"{what} returned {returned:,} numbers, far more than this small case asks for")
        for i in outputs:
            args[i].value = changed[i]
        return value

    def judge_each(self, fn, cases: Sequence[Case], judge: Callable, mistakes: Sequence[Mistake] = (),
                   **options) -> None:
        """The usual loop of a check: call ``fn`` on each case's arguments and judge what it returns with ``judge``
        (``self.judge``, ``self.judge_int``, ...)."""
        __tracebackhide__ = True
        for case in cases:
            judge(case, self.call(case.text, fn, *case.args, **case.kwargs), mistakes, **options)

    def randomize(self, module: M, seed: int) -> M:
        """Reference weights with structure: random Linear/Embedding weights and norm scales that are far from 1
        and differ per feature (so a forgotten or misplaced scale shows)."""
        g = self.rng(seed)
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name.endswith("norm.weight") or name == "weight" and p.dim() == 1:
                    p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
                else:
                    fan_in = p.shape[-1] if p.dim() > 1 else 1
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        return module

    def load_weights(self, student, ref: nn.Module, hints: dict[str, str] | None = None) -> None:
        """Copy the reference's weights into the student's module, explaining any naming or shape mismatch."""
        __tracebackhide__ = True
        if not isinstance(student, nn.Module):
            self.fail(f"expected an nn.Module, got {type(student).__name__}.")
        want, have = ref.state_dict(), student.state_dict()
        problems = [f"missing {k} (shape {list(v.shape)})" for k, v in want.items() if k not in have]
        problems += [f"{k} has shape {list(have[k].shape)}, expected {list(v.shape)}" for k, v in want.items()
                     if k in have and have[k].shape != v.shape]
        problems += [f"unexpected {k} (shape {list(v.shape)})" for k, v in have.items() if k not in want]
        if problems:
            hints = {**(hints or {}), ".bias": "Llama-style layers have no biases: use nn.Linear(..., bias=False) "
                                               "(and RMSNorm, which has no bias, rather than LayerNorm)."}
            advice = list(dict.fromkeys(text for part, text in hints.items() if any(part in p for p in problems)))
            self.fail("your module's parameters do not match the reference layout, so its weights cannot be "
                      "loaded:\n  " + "\n  ".join(problems) + ("\n" + " ".join(advice) if advice else ""))
        student.load_state_dict(want)

    # -- verdicts --

    def fail(self, message: str) -> NoReturn:
        """Fail now, with ``message`` (a problem before any case could be judged, or one that ends the check)."""
        __tracebackhide__ = True
        raise CheckFailed(f"{self.name}: {message}")

    def require(self, ok: bool, where: str, message: str) -> None:
        """After the values: fail with ``message`` unless ``ok`` (a dtype, a type), only if no case failed so far
        (a wrong formula is said first)."""
        __tracebackhide__ = True
        if not ok and not self.diagnosis.failures:
            self.fail(f"{where}: {message}")

    def _judge(self, case: Case, got, want, mistakes: Sequence[Mistake], same, same_wrong, detail: Callable[[], str],
               known: bool | None = None) -> bool:
        outputs: dict[str, list] = {}

        def of(diagnosis: str) -> list:  # what the mistake(s) with this diagnosis compute here, once
            if diagnosis not in outputs:
                outputs[diagnosis] = [o for m in mistakes if m.diagnosis == diagnosis for o in m.outputs(case)]
            return outputs[diagnosis]

        def explains(diagnosis: str) -> bool:
            return any(not same(o, want) and same_wrong(got, o) for o in of(diagnosis))

        diagnoses = list(dict.fromkeys(m.diagnosis for m in mistakes))
        if self.mode.observer is not None:  # the audit of the diagnoses (tests/classroom/test_diagnosis.py)
            self.mode.observer(case, got, want, [(d, of(d)) for d in diagnoses], same_wrong)
        if same(got, want):
            # a mistake is contradicted here when every way of making it would have failed this case
            self.diagnosis.passed(lambda d: bool(of(d)) and all(not same(o, want) for o in of(d)))
            return True
        self.diagnosis.failed(case.text, detail(), diagnoses, explains, bool(mistakes) if known is None else known)
        return False

    def judge(self, case: Case, got, mistakes: Sequence[Mistake] = (), *, want=None, rtol: float = 1e-4,
              atol: float = 1e-5, dims: tuple[str, ...] = (), halves: bool = False, hint: str = "") -> bool:
        """A tensor output: allclose to the right one, else which mistakes compute it (``dims`` names the trailing
        dimensions for the message without a mistake, ``halves`` says whether halves of the last one matter)."""
        __tracebackhide__ = True
        want = case.want if want is None else want
        if not isinstance(got, torch.Tensor):
            self.fail(f"{case.text}: expected a tensor, got {type(got).__name__}.")

        def same(a, b):
            return matches(a, b, rtol, atol)

        def same_wrong(g, wrong):
            if isinstance(wrong, torch.Tensor) and g.dtype in (torch.float16, torch.bfloat16):
                wrong = wrong.to(g.dtype)  # the mistake as the student's half-precision output holds it
            return matches(g, wrong, rtol, atol, equal_nan=True)

        def detail() -> str:
            if got.shape != want.shape:
                if got.numel() == want.numel() and matches(got.reshape(want.shape), want, rtol, atol):
                    return f"the numbers are right but the shape is {shape_of(got)}, expected {shape_of(want)}."
                return f"output shape {shape_of(got)}, expected {shape_of(want)}. {hint}".rstrip()
            if not torch.isfinite(got.detach()).all() and torch.isfinite(want).all():
                return f"your output contains inf or NaN where the correct output is finite. {hint}".rstrip()
            g, w = got.detach().double(), want.detach().double()
            bad = (g - w).abs() > atol + rtol * w.abs()
            where = where_differs(got, want, bad, dims, halves)
            return (f"your output differs from the correct one by up to {(g - w).abs().max().item():.3g} "
                    f"(tolerance {atol:g} + {rtol:g}·|value|)" + (f": {where}." if where else f". {hint}".rstrip()))

        return self._judge(case, got, want, mistakes, same, same_wrong, detail)

    def judge_int(self, case: Case, got, mistakes: Sequence[Mistake] = (), *, want=None, hint: str = "") -> bool:
        """An integer: the value first (never the right one in the message: how it is off), then its type."""
        __tracebackhide__ = True
        want = case.want if want is None else want
        value = as_number(got)
        if value is None:
            self.fail(f"{case.text}: expected an int, got {type(got).__name__} {shown(got)}.")

        def same(a, b):
            return a == b

        def detail() -> str:
            return f"got {shown(value)}: {how_off(value, want)}." + (f" {hint}" if hint else "")

        ok = self._judge(case, value, want, mistakes, same, same, detail)
        if ok and type(got) is not int:
            self.require(False, case.text, f"the value is right but it is a {type(got).__name__}; return a plain "
                                           "int (wrap it in int(...)).")
        return ok

    def judge_number(self, case: Case, got, mistakes: Sequence[Mistake] = (), *, rel: float, want=None,
                     hint: str = "", kind: type | None = None) -> bool:
        """A real number: within ``rel`` (relative) of the right one, else which mistakes it is near; ``kind``
        (float, say), the type the exercise asks for."""
        __tracebackhide__ = True
        want = case.want if want is None else want
        value = as_number(got)
        if value is None or not math.isfinite(value):
            self.fail(f"{case.text}: expected a number, got {type(got).__name__} {shown(got)}.")

        def near(a, b):
            return abs(a - b) <= rel * abs(b)

        def detail() -> str:
            return f"got {shown(value)}: {how_off(value, want)} (within {100 * rel:g}% passes)." + \
                (f" {hint}" if hint else "")

        ok = self._judge(case, value, want, mistakes, near, near, detail)
        if ok and kind is not None and not isinstance(got, kind):
            self.require(False, case.text, f"the value is right but it is a {type(got).__name__}; return a "
                                           f"plain Python {kind.__name__} ({kind.__name__}(...)).")
        return ok

    def judge_equal(self, case: Case, got, mistakes: Sequence[Mistake] = (), *, want=None) -> bool:
        """A value compared exactly (words, a list of names): the student's value shown, never the right one."""
        __tracebackhide__ = True
        want = case.want if want is None else want

        def same(a, b):
            return type(a) is type(b) and a == b

        return self._judge(case, got, want, mistakes, same, same, lambda: f"got {got!r}.")


def call_student(name: str, what: str, fn, *args, **kwargs):
    """Call the student's code as check ``name`` does in a script (``CheckRun.call``)."""
    __tracebackhide__ = True
    return CheckRun(name, Mode.script()).call(what, fn, *args, **kwargs)


# ---- the decorator ---------------------------------------------------------------------------------------


def exercise_check(fn=None, *, value: str | None = None):
    """Make ``fn(run, answer)`` a check: ``check_x(answer, mode=None)``. The pieces it hides and uses come from
    ``hiding``'s table by the check's name. ``value`` makes a value item: the name the notebook assigns; ``None``
    there (the exercise's stub) is "not attempted", and the cells read (the mode's sources) must compute it."""
    if fn is None:
        return functools.partial(exercise_check, value=value)
    name = fn.__name__

    @functools.wraps(fn)
    def check(answer, *args, mode: Mode | None = None, **kwargs):
        __tracebackhide__ = True
        mode = Mode.current() if mode is None else mode
        try:
            summary = _run(fn, CheckRun(name, mode), value, answer, args, kwargs)
        except (NotAttempted, CheckFailed) as err:
            if not mode.prints:
                raise
            in_notebook.report(name, err)
            return None
        if mode.prints:
            in_notebook.report(name, None, summary)
        elif not mode.is_graded:
            print(f"✓ {name} passed ({summary})")
        return None

    check.__dict__.update(components=HIDES[name], uses=USES.get(name, ()), value=value)  # read by the grader
    return check


def _run(fn, run: CheckRun, value: str | None, answer, args, kwargs) -> str:
    __tracebackhide__ = True
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tensors are tiny: one thread is fastest, and immune to a busy machine
    mode = run.mode
    try:
        if value is not None:
            if answer is None:
                raise NotImplementedError(f"{value} is still None: set it to your answer")
            if mode.sources is not None:
                why = in_notebook.not_computed(mode.sources, value, TABLES.get(run.name, ()))
                if why is not None:
                    run.fail(why)
                found = in_notebook.answer_cell(mode.sources, value)
                if mode.hides and mode.namespace is not None and found is not None:
                    why = in_notebook.rerun_hidden(found[0], value, mode.namespace, run.hidden)
                    if why is not None:
                        run.fail(why)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(mode.seeded(1234))
            try:
                summary = fn(run, answer, *args, **kwargs)
            except CheckFailed as err:
                if not run.diagnosis.failures:  # a failure before any judged case: that is the verdict,
                    raise err.with_traceback(None) from err.__cause__  # without the check's own frames
            if run.diagnosis.failures:  # the judged cases come first (see diagnosis.py)
                raise CheckFailed(run.diagnosis.message()) from None
        return summary
    except NotImplementedError as err:
        hint = f" (the stub says: {err})" if str(err) else ""
        raise NotAttempted(f"{run.name}: not implemented yet{hint}") from None
    finally:
        torch.set_num_threads(threads)
