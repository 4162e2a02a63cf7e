"""What each exercise hides, and the package as the grader shows it to a submission.

``HIDES``: per check, the pieces that compute its answer (a function or class of a model file, ``Class.method``, a
torch function the exercise forbids); ``USES``: what a right answer may build on, never hidden for it. The
grader's copy of the package is built from these (``grading.package_copy``); in a notebook ``grader_view`` makes
this process look the same while the student's code runs. A table holding a value item's answer (``TABLES``)
cannot be hidden; a value read from it is refused as looked up (``in_notebook``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import sys
import threading
import types
from pathlib import Path

SDPA = "torch.nn.functional.scaled_dot_product_attention"
_CACHE_MATH = ("kv_cache_bytes_per_token", "mla_cache_bytes_per_token", "ModelPreset", "cache_size", "KVCache",
               "LayerCache")
_ROPE_TABLES = ("rope_cache", "rope_frequencies", "RotaryEmbedding", "scaled_frequencies", "dynamic_ntk_frequencies",
                "yarn_frequencies")
_ROTATION = ("apply_rope", "apply_rope_interleaved", "_broadcast_tables", "interleaved_to_half_split",
             "permute_qk_weight")
_COUNTING = ("count_parameters", "parameter_breakdown", "ModelPreset")

HIDES: dict[str, tuple[str, ...]] = {
    "check_gpt2_block_params": ("GPT2Block", "CausalSelfAttention", "GeluMLP", "GPT2LM", *_COUNTING),
    "check_causal_attention": ("causal_attention", "CausalSelfAttention", "GQAttention", "MLAttention",
                               "GPT2Block", SDPA),
    "check_gpt2_attention": ("CausalSelfAttention", "causal_attention", "GQAttention", "MLAttention", "GPT2Block",
                             "GPT2LM"),
    "check_gpt2_small_params": ("GPT2LM", "GPT2Block", *_COUNTING),
    "check_rms": ("RMSNorm",),
    "check_rmsnorm": ("RMSNorm",),
    "check_swiglu_hidden_dim": ("swiglu_hidden_dim",),
    "check_swiglu": ("SwiGLU",),
    "check_ffn_weight_count": ("SwiGLU", "GeluMLP", *_COUNTING),
    "check_llama3_70b_d_ff": ("swiglu_hidden_dim",),
    "check_rope_cache": _ROPE_TABLES,
    "check_apply_rope": _ROTATION,
    "check_apply_rope_interleaved": _ROTATION,
    "check_repeat_kv": ("GQAttention", "causal_attention"),
    "check_gqattention": ("GQAttention", "causal_attention"),
    "check_kv_cache": ("GQAttention.forward", "causal_attention", "LayerCache", "KVCache"),
    "check_mla_cache_bytes": _CACHE_MATH,
    "check_absorb_query": ("MLAttention",),
    "check_absorbed_scores": ("MLAttention",),
    "check_mla_absorption": ("MLAttention",),
    "check_kimi_k2_cache_bytes": _CACHE_MATH,
    "check_qk_norm_rope": ("GQAttention",),
    "check_qk_norm_attention": ("GQAttention", "causal_attention"),
    "check_block": ("Block",),
    "check_llama_lm": ("LlamaStyleLM",),
    "check_llama_param_count": ("LlamaStyleLM", "Block", *_COUNTING),  # "by formula (no model built)"
    "check_lr_schedule": ("lr_at",),
    "check_flops_per_token": ("flops_per_token", "matmul_parameters"),
    "check_fair_comparison": (),
    "check_llama3_8b_train_flops": ("flops_per_token",),
    "check_verdict": ("verdict", "PairedDifference", "holm_verdicts"),
    "check_holm": ("holm", "holm_verdicts"),
    "check_smollm2_cache_bytes": _CACHE_MATH,
    "check_dequantize_q4_0": ("dequantize",),
    "check_unpermute_qk": ("permute_qk_weight", "interleaved_to_half_split"),
    "check_llama3_rope_scaling": ("llama3_frequencies", *_ROPE_TABLES),
    "check_ntk_scaled_base": ("dynamic_ntk_frequencies", "scaled_frequencies", "rope_cache", "RotaryEmbedding"),
    "check_bytes_per_token": ("decode_weight_bytes",),
    "check_floor_ms": ("memory_bandwidth",),
    "check_quantize_row_int8": ("quantize_int8",),
    "check_kv_bytes_per_token": (*_CACHE_MATH, "config_card"),
    "check_smallest_multiple_of": ("swiglu_hidden_dim", "ffn_rule"),
    "check_active_parameters": ("active_parameters", "config_card"),
    "check_moe_ffn_parameters": ("config_card", "architecture", "parameter_counts", "active_parameters",
                                 *_COUNTING),
    "check_kv_cache_at": (*_CACHE_MATH, "config_card", "architecture", "cache_bytes"),
}

TABLES: dict[str, tuple[str, ...]] = {  # a value item: the package's tables that hold its answer
    "check_llama3_70b_d_ff": ("PRESETS",),
    "check_kimi_k2_cache_bytes": ("PRESETS",),
    "check_smollm2_cache_bytes": ("PRESETS",),
}

USES: dict[str, tuple[str, ...]] = {
    "check_gpt2_attention": (SDPA,),  # exercise 2's own function, or PyTorch's
    "check_gqattention": ("RMSNorm", "apply_rope", SDPA),
    "check_kv_cache": ("RMSNorm", "apply_rope", SDPA),
    "check_qk_norm_rope": ("RMSNorm", "apply_rope"),
    "check_qk_norm_attention": ("RMSNorm", "apply_rope", SDPA),
    "check_block": ("RMSNorm", "GQAttention", "SwiGLU"),
    "check_llama_lm": ("Block", "RMSNorm", "rope_cache"),
}

PACKAGE = Path(__file__).resolve().parents[2]  # modern_block/classroom/checks/hiding.py -> modern_block


def model_files() -> list[Path]:
    """The files the grader's copy of the package holds: the model, what the lessons import."""
    return sorted(p for p in PACKAGE.glob("*.py") if p.name != "__main__.py")


def hidden_message(name: str) -> str:
    if name.startswith("torch."):
        return f"{name} is not available in this exercise: its text asks you to write it yourself"
    return (f"modern_block.{name} is not available while this notebook is graded: the exercise asks for your "
            "own implementation, written with plain PyTorch")


def absent_message(module: str) -> str:
    return (f"{module} is not available while this notebook is graded: the grader gives a submission only the "
            "package's model files (modern_block/*.py)")


_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse`` for the grader, whose threads parse model files and cells at once: one at a time,
    since CPython 3.11's AST constructor keeps its recursion count per interpreter, not per thread, and a thread
    switch inside it (a finaliser run by the collector) fails the other thread's parse with ``SystemError``
    (python/cpython#106905; seen grading a class with two jobs)."""
    with _PARSE_LOCK:
        return ast.parse(source)


def with_bases(hidden: frozenset[str], sources: list[str]) -> frozenset[str]:
    """``hidden`` and, for each class in it, the classes of ``sources`` (the model files) it derives from,
    transitively (a base named directly or as ``module.Name``)."""
    bases: dict[str, set[str]] = {}
    for source in sources:
        for node in parse_python(source).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                                    if isinstance(b, (ast.Name, ast.Attribute))}
    out, todo = set(hidden), list(hidden)
    while todo:
        for base in bases.get(todo.pop(), set()) & set(bases):
            if base not in out:
                out.add(base)
                todo.append(base)
    return frozenset(out)


@functools.lru_cache(maxsize=1)
def _model_sources() -> tuple[str, ...]:
    return tuple(p.read_text(encoding="utf-8") for p in model_files())


# ---- in a notebook: the grader's view, while the student's code runs --------------------------------------


@functools.lru_cache(maxsize=4096)
def _raiser(message: str, freevars: tuple[str, ...]) -> types.CodeType:
    """The code of a function that raises ``message``, with the given free variables (so it fits any function's
    closure)."""
    names = "".join(f"{n} = " for n in freevars)
    uses = "".join(f"        {n}\n" for n in freevars)
    namespace: dict = {}
    exec(f"def outer():\n    {names}None\n    def hidden(*args, **kwargs):\n{uses}"
         f"        raise RuntimeError({message!r})\n    return hidden\n", namespace)
    return namespace["outer"]().__code__


def _functions(owner, filename: str):
    """The functions written in ``filename`` among ``owner``'s attributes (a module's or a class's), methods,
    properties, static and class methods included; generated ones (a dataclass's ``__init__``) are not."""
    for value in list(vars(owner).values()):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        parts = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
        for part in parts:
            if isinstance(part, types.FunctionType) and part.__code__.co_filename == filename:
                yield part


_SWAPS: dict[tuple, list] = {}  # the latest run's swaps, by (hidden, how many package modules are imported)


def _swaps(hidden: tuple[str, ...]) -> list[tuple[types.FunctionType, types.CodeType]]:
    """(function, the code that raises instead) for every function the grader's copy would not run (computed
    again when more of the package has been imported)."""
    key = (hidden, sum(1 for m in sys.modules if m.startswith("modern_block")))
    if key in _SWAPS:
        return _SWAPS[key]
    names = with_bases(frozenset(n for n in hidden if not n.startswith("torch.")), list(_model_sources()))
    swaps = []
    stems = {p.stem for p in model_files()} - {"__init__"}
    models = [m for s in stems if (m := sys.modules.get(f"modern_block.{s}")) is not None]  # those imported
    for module in models:
        filename = module.__file__ or ""
        for name in sorted(names):
            top, _, method = name.partition(".")
            obj = vars(module).get(top)
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if isinstance(obj, type):
                found = [vars(obj).get(method)] if method else list(_functions(obj, filename))
                for fn in found:
                    if isinstance(fn, types.FunctionType):
                        swaps.append((fn, _raiser(hidden_message(name), fn.__code__.co_freevars)))
            elif isinstance(obj, types.FunctionType) and not method:
                swaps.append((obj, _raiser(hidden_message(name), obj.__code__.co_freevars)))
    model_names = {m.__name__ for m in models} | {"modern_block", __name__}
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("modern_block.") or module_name in model_names:
            continue
        filename = getattr(module, "__file__", None) or ""
        message = absent_message(module_name)
        for value in list(vars(module).values()):
            owners = [value] if isinstance(value, type) and value.__module__ == module_name else []
            for fn in [*_functions(module, filename), *(f for o in owners for f in _functions(o, filename))]:
                swaps.append((fn, _raiser(message, fn.__code__.co_freevars)))
    _SWAPS.clear()
    _SWAPS[key] = list({id(fn): (fn, code) for fn, code in swaps}.values())
    return _SWAPS[key]


def forbid_torch_functions(names):
    """A mode in which the torch functions ``names`` raise, however they were imported. Self-contained: the
    grader's stub of this package holds its source (``sandbox_stub``)."""
    import importlib

    from torch.overrides import TorchFunctionMode

    forbidden = {}
    for name in names:
        module_name, _, attr = name.rpartition(".")
        forbidden[getattr(importlib.import_module(module_name), attr)] = name

    class Forbidden(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in forbidden:
                raise RuntimeError(forbidden[func] + " is not available in this exercise: its text asks you to "
                                   "write it yourself")
            return func(*args, **(kwargs or {}))

    return Forbidden()


@contextlib.contextmanager
def grader_view(hidden: tuple[str, ...]):
    """Inside the block this process shows the package as the grader's copy does: ``hidden``'s pieces (and their
    classes' bases) raise, every module of ``modern_block`` outside the model files raises, and the torch
    functions in ``hidden`` raise however they were imported."""
    swaps = _swaps(hidden)
    torch_names = [n for n in hidden if n.startswith("torch.")]
    originals = [(fn, fn.__code__) for fn, _ in swaps]
    mode = forbid_torch_functions(torch_names) if torch_names else contextlib.nullcontext()
    try:
        for fn, code in swaps:
            fn.__code__ = code
        with mode:
            yield
    finally:
        for fn, code in originals:
            fn.__code__ = code


# ---- in the grader's sandbox: the checks module a submission imports ---------------------------------------

_STUB = '''"""The checks run in the grader, not in the submission's process: here every check does nothing."""

import contextlib


class CheckFailed(AssertionError):
    pass


class NotAttempted(AssertionError):
    pass


@contextlib.contextmanager
def graded(secret):
    yield


def _not_here(*args, **kwargs):
    return None


'''


def sandbox_stub(hidden: frozenset[str], public: list[str]) -> str:
    """The source of ``modern_block.classroom.checks`` in the grader's copy of the package, for a run that hides
    ``hidden``: every public name (``public``, the checks' ``__all__``) exists and does nothing, and the hidden
    torch functions raise."""
    stub = _STUB + "".join(f"{name} = _not_here\n" for name in public
                           if name not in ("CheckFailed", "NotAttempted", "graded"))
    stub += f"__all__ = {list(public)!r}\n"
    torch_names = sorted(n for n in hidden if n.startswith("torch."))
    if torch_names:  # the forbidden torch functions raise for the rest of the submission's process
        source = inspect.getsource(forbid_torch_functions)
        stub += f"\n\n{source}\n\nforbid_torch_functions({torch_names!r}).__enter__()\n"
    return stub
