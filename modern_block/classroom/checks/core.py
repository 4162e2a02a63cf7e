"""The machinery every check shares: the two verdict exceptions, the wrapper that gives a check its
private random state, calling the student's code, judging an output against the reference and a list of
candidate mistakes, and loading reference weights into the student's module."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import math
from typing import NoReturn, TypeVar

import torch
import torch.nn as nn

from . import in_notebook, verdict
from .verdict import how_off, where_differs

M = TypeVar("M", bound=nn.Module)


class NotAttempted(AssertionError):
    """The code under test still raises ``NotImplementedError``: the exercise has not been done yet."""


class CheckFailed(AssertionError):
    """The code runs but disagrees with the reference; the message says what is likely wrong."""


# ---- machinery ---------------------------------------------------------------------------------------


_SECRET: contextvars.ContextVar[int | None] = contextvars.ContextVar("modern_block_checks_secret", default=None)


@contextlib.contextmanager
def graded(secret: int):
    """The grader's mode (``modern_block.classroom.grade``): every input is drawn from ``secret`` as well as the
    check's own seed, so no answer can be computed in advance; the integer checks add hidden cases; no
    success line is printed (the grader writes the report). In a notebook the checks use their fixed seeds."""
    token = _SECRET.set(int(secret))
    try:
        yield
    finally:
        _SECRET.reset(token)


def is_graded() -> bool:
    return _SECRET.get() is not None


def seeded(seed: int) -> int:
    """``seed`` in a notebook; under ``graded``, ``seed`` mixed with the grader's secret."""
    secret = _SECRET.get()
    return seed if secret is None else (seed * 1_000_003 + secret) % 2**63


def generator(seed: int) -> torch.Generator:
    """The generator a check draws its inputs from."""
    return torch.Generator().manual_seed(seeded(seed))


def pick(g: torch.Generator, options):
    """One of ``options``, drawn from ``g`` (for the hidden cases of the integer checks)."""
    return options[int(torch.randint(len(options), (1,), generator=g))]


def exercise_check(fn=None, *, components: tuple[str, ...] = (), uses: tuple[str, ...] = (),
                   value: str | None = None):
    """Run a check with a private random state, without autograd, turning a stub's
    NotImplementedError into NotAttempted, and print the success line. The check's cases are judged to the
    end (``verdict``): a mistake is named only when it explains every failing case.

    ``components`` names the package's own objects that implement what the exercise asks for (a class or
    function name, ``Class.method`` for one method): while the grader grades the exercise they are not
    available to the submission, and in a notebook they raise while the student's code runs, as there.
    ``uses`` names the package objects a right answer may build on (lesson 07's LM stacks the package's
    Block): the grader never hides those while this exercise is graded. ``value`` makes a value item: the
    name the notebook assigns; ``None`` there (the exercise's stub) is "not attempted", and in a notebook a
    number typed in as a literal fails (the text asks for it computed).

    In a Jupyter notebook a failing or not-attempted check prints its message instead of raising, so Run All
    goes on to the summary (``in_notebook``); anywhere else it raises."""
    if fn is None:
        return functools.partial(exercise_check, components=components, uses=uses, value=value)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        name = fn.__name__
        notebook = in_notebook.active() and not is_graded()
        try:
            summary = _run_check(fn, name, args, kwargs, components if notebook else (), value, notebook)
        except (NotAttempted, CheckFailed) as err:
            if not notebook:
                raise
            in_notebook.report(name, err)
            return None
        if notebook:
            in_notebook.report(name, None, summary)
        elif not is_graded():
            print(f"✓ {name} passed ({summary})")
        return None

    wrapper.__dict__.update(components=tuple(components), uses=tuple(uses), value=value)  # read by the grader
    return wrapper


def _run_check(fn, name, args, kwargs, hidden, value, notebook):
    __tracebackhide__ = True
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tensors are tiny: one thread is fastest, and immune to a busy machine
    token = verdict.start(name)
    hiding = _HIDDEN.set(tuple(hidden))
    try:
        if value is not None and args and args[0] is None:
            raise NotImplementedError(f"{value} is still None: set it to your answer")
        if value is not None and (notebook or in_notebook.has_sources()) and in_notebook.typed_in(value):
            fail(name, f"{value} is typed in as a number; the exercise asks for it computed (write the arithmetic "
                       "from the model's sizes, or call your function), so the cell shows how it comes about.")
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seeded(1234))
            try:
                summary = fn(*args, **kwargs)
            except CheckFailed:
                current = verdict.current()
                if current is None or not current.failures:
                    raise  # a failure before any judged case: that is the verdict
            current = verdict.current()
            if current is not None and current.failures:  # the judged cases come first (see verdict)
                raise CheckFailed(current.message()) from None
        return summary
    except NotImplementedError as err:
        hint = f" (the stub says: {err})" if str(err) else ""
        raise NotAttempted(f"{name}: not implemented yet{hint}") from None
    finally:
        _HIDDEN.reset(hiding)
        verdict.finish(token)
        torch.set_num_threads(threads)


_HIDDEN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("modern_block_checks_hidden", default=())


def fail(name: str, message: str) -> NoReturn:
    __tracebackhide__ = True
    raise CheckFailed(f"{name}: {message}")


class Output:
    """An argument whose contents after the call the check reads: the KV cache the student's function is to
    extend in place, or an input it must leave alone. Like every argument it gets a fresh copy; after the call
    ``value`` is what the function left in that copy (the check's own value is never touched)."""

    def __init__(self, value):
        self.value = value


def fresh(value):
    """A copy of an argument for the student's code: whatever it does to it never reaches the check's own
    values, from which the expected output is computed. Stand-ins for the student's objects (the grader's)
    are passed as they are."""
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


def call_student(name: str, what: str, fn, *args, **kwargs):
    """Call the student's code on fresh copies of the arguments (``Output`` ones come back); a crash becomes
    a CheckFailed that says which call crashed. In the grader ``fn`` is a stand-in for an object in the
    student's process (``call_with_outputs``): the copies travel there as data and only the outputs return."""
    __tracebackhide__ = True
    outputs = [i for i, a in enumerate(args) if isinstance(a, Output)]
    copies = [fresh(a.value if isinstance(a, Output) else a) for a in args]
    keywords = {k: fresh(v) for k, v in kwargs.items()}
    try:
        if hasattr(fn, "call_with_outputs"):
            value, changed = fn.call_with_outputs(copies, keywords, outputs)
        else:
            with in_notebook.hiding(_HIDDEN.get()):
                value = fn(*copies, **keywords)
            changed = {i: copies[i] for i in outputs}
    except (NotImplementedError, NotAttempted, CheckFailed):
        raise
    except Exception as err:  # the student's code crashed: say where, keep the traceback chained
        raise CheckFailed(f"{name}: {what} raised {type(err).__name__}: {err}") from err
    returned = _numbers_in(value) + sum(_numbers_in(v) for v in changed.values())
    if returned > MAX_RETURNED_NUMBERS:  # no case of any check asks for this much: drop it now, whatever comes next
        raise CheckFailed(f"{name}: {what} returned {returned:,} numbers, far more than this small case asks for")
    for i in outputs:
        args[i].value = changed[i]
    return value


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


def shape_of(t) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def require_dtype(name: str, got: torch.Tensor, dtype: torch.dtype, where: str, what: str, advice: str):
    """After the values have passed: fail, saying so, when ``got`` has another dtype than ``dtype``."""
    __tracebackhide__ = True
    if got.dtype != dtype and not failed_so_far():
        fail(name, f"{where}: the values are right but {what} is {dtype_name(got)}; {advice}")


def matches(got, want: torch.Tensor, rtol: float, atol: float, equal_nan: bool = False) -> bool:
    """Same shape and allclose in float64. NaN/inf in ``got`` never pass, except, with ``equal_nan``, where
    ``want`` (a mistake's output) has the same NaN or inf."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    g, w = got.detach().double(), want.detach().double()
    if equal_nan:
        odd = ~torch.isfinite(w)
        if not torch.equal(g[odd].nan_to_num(), w[odd].nan_to_num()) or not torch.isfinite(g[~odd]).all():
            return False
        return torch.allclose(g[~odd], w[~odd], rtol=rtol, atol=atol)
    return bool(torch.isfinite(g).all()) and torch.allclose(g, w, rtol=rtol, atol=atol)


def max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().double() - want.detach().double()).abs().max().item()


def _record(name: str, case: str, detail: str, explained: list[str], known: bool = True) -> None:
    """A failing case: kept in the running check's verdict (judged when the check ends), or raised at once
    outside a check."""
    __tracebackhide__ = True
    current = verdict.current()
    if current is None:
        one = verdict.Verdict(name)
        one.add(case, detail, explained, known)
        raise CheckFailed(one.message())
    current.add(case, detail, explained, known)


def _differs(make, want: torch.Tensor, rtol: float, atol: float) -> bool:
    """Whether a candidate mistake's output is not the right one (it would fail this case)."""
    if verdict.current() is None:
        return False
    try:
        wrong = make() if callable(make) else make
    except Exception:
        return False
    return wrong is not None and not matches(wrong, want, rtol, atol, equal_nan=True)


def _passed(wrong_here: list[tuple[str, bool]]) -> None:
    """A passing case: (diagnosis, whether that candidate would fail here) per candidate. A diagnosis listed with
    several formulas (the variants of one mistake) is contradicted only when each of them would fail."""
    current = verdict.current()
    if current is not None:
        fails: dict[str, bool] = {}
        for diagnosis, wrong in wrong_here:
            fails[diagnosis] = fails.get(diagnosis, True) and wrong
        current.passed([d for d, f in fails.items() if f])


def failed_so_far() -> bool:
    """Whether a case of the running check has failed (later complaints about dtype or state then wait)."""
    current = verdict.current()
    return current is not None and bool(current.failures)


def judge(name: str, got, want: torch.Tensor, candidates, case: str, *, rtol: float = 1e-4,
          atol: float = 1e-5, hint: str = "", dims: tuple[str, ...] = ()) -> None:
    """Return if ``got`` matches ``want``. Otherwise record a failing case with the candidate mistakes whose
    output ``got`` matches (candidates are (diagnosis, tensor, zero-arg callable or None where the mistake
    makes no difference)) and, for the message without a mistake, where the output differs (``dims`` names
    the trailing dimensions, as in ``verdict.where_differs``)."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        fail(name, f"{case}: expected a tensor, got {type(got).__name__}.")
    verdict.observe(got, want, candidates)
    if matches(got, want, rtol, atol):
        _passed([(d, _differs(make, want, rtol, atol)) for d, make in candidates])
        return
    explained = []
    for diagnosis, make in candidates:
        try:
            wrong = make() if callable(make) else make
        except Exception:  # a mistake's formula that does not apply to this case
            continue
        if isinstance(wrong, torch.Tensor) and got.dtype in (torch.float16, torch.bfloat16):
            wrong = wrong.to(got.dtype)  # the mistake as the student's half-precision output holds it (inf included)
        if wrong is not None and matches(got, wrong, rtol, atol, equal_nan=True) and diagnosis not in explained:
            explained.append(diagnosis)
    if got.shape != want.shape:
        if got.numel() == want.numel() and matches(got.reshape(want.shape), want, rtol, atol):
            detail = f"the numbers are right but the shape is {shape_of(got)}, expected {shape_of(want)}."
        else:
            detail = f"output shape {shape_of(got)}, expected {shape_of(want)}. {hint}".rstrip()
    elif not torch.isfinite(got.detach()).all() and torch.isfinite(want).all():
        detail = f"your output contains inf or NaN where the correct output is finite. {hint}".rstrip()
    else:
        g, w = got.detach().double(), want.detach().double()
        bad = (g - w).abs() > atol + rtol * w.abs()
        where = where_differs(got, want, bad, dims)
        detail = (f"your output differs from the correct one by up to {max_diff(got, want):.3g} "
                  f"(tolerance {atol:g} + {rtol:g}·|value|)" + (f": {where}." if where else f". {hint}".rstrip()))
    _record(name, case, detail, explained, bool(candidates))


def judge_int(name: str, got, want: int, candidates, case: str, hint: str = "", *, reveal: bool = True) -> None:
    """The integer version of ``judge``: the value first, its type after. ``reveal=False`` (a value item, whose
    right answer is the exercise) says how the value is off instead of printing the right one."""
    __tracebackhide__ = True
    value = got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        fail(name, f"{case}: expected an int, got {type(got).__name__} {got!r}.")
    verdict.observe(got, want, candidates)
    if value == want:
        _passed([(d, wrong is not None and wrong != want) for d, wrong in candidates])
    else:
        explained = list(dict.fromkeys(d for d, wrong in candidates if wrong is not None and wrong != want and
                                       value == wrong))
        if reveal:
            detail = f"got {value:,}, expected {want:,}." + (f" {hint}" if hint and not explained else "")
        else:
            detail = f"got {value:,}: {how_off(value, want)}."
        _record(name, case, detail, explained)
        return
    if type(got) is not int:
        fail(name, f"{case}: the value is right but it is a {type(got).__name__}; return a plain int "
                   f"(wrap it in int(...)).")


def judge_number(name: str, got, want: float, candidates, case: str, *, rel: float, hint: str = "",
                 reveal: bool = True) -> None:
    """A real number (an estimate): ``want`` within ``rel`` (relative), else the candidate mistakes it is near."""
    __tracebackhide__ = True
    value = got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        fail(name, f"{case}: expected a number, got {type(got).__name__} {got!r}.")

    def near(a, b):
        return abs(a - b) <= rel * abs(b)

    verdict.observe(got, want, candidates)
    if near(value, want):
        _passed([(d, wrong is not None and not near(wrong, want)) for d, wrong in candidates])
        return
    explained = list(dict.fromkeys(d for d, wrong in candidates if wrong is not None and not near(wrong, want) and
                                   near(value, wrong)))
    if reveal:
        detail = f"got {value:.4g}, expected {want:.4g} (within {100 * rel:g}%)." + \
                 (f" {hint}" if hint and not explained else "")
    else:
        detail = f"got {value:.4g}: {how_off(value, want)} (within {100 * rel:g}% passes)."
    _record(name, case, detail, explained)


def randomize(module: M, seed: int) -> M:
    """Reference weights with structure: random Linear/Embedding weights and norm scales that are
    far from 1 and differ per feature (so a forgotten or misplaced scale shows)."""
    g = generator(seed)
    for name, p in module.named_parameters():
        if name.endswith("norm.weight") or name == "weight" and p.dim() == 1:
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in if p.dim() > 1 else 1))
    return module


_KEY_HINTS = (
    (".bias", "Llama-style layers have no biases: use nn.Linear(..., bias=False) (and RMSNorm, which has no bias, "
              "rather than LayerNorm)."),
)


def load_weights(name: str, student: nn.Module, ref: nn.Module, hints: dict[str, str] | None = None) -> None:
    """Copy the reference's weights into the student's module, explaining any naming or shape mismatch."""
    __tracebackhide__ = True
    if not isinstance(student, nn.Module):
        fail(name, f"expected an nn.Module, got {type(student).__name__}.")
    want = ref.state_dict()
    have = student.state_dict()
    problems = []
    for key in want:
        if key not in have:
            problems.append(f"missing {key} (shape {list(want[key].shape)})")
        elif have[key].shape != want[key].shape:
            problems.append(f"{key} has shape {list(have[key].shape)}, expected {list(want[key].shape)}")
    for key in have:
        if key not in want:
            problems.append(f"unexpected {key} (shape {list(have[key].shape)})")
    if problems:
        advice = []
        for key_part, text in list((hints or {}).items()) + list(_KEY_HINTS):
            if any(key_part in p for p in problems) and text not in advice:
                advice.append(text)
        fail(name, "your module's parameters do not match the reference layout, so its weights cannot be "
                   "loaded:\n  " + "\n  ".join(problems) + ("\n" + " ".join(advice) if advice else ""))
    student.load_state_dict(want)
