"""Where do two models stop agreeing? Layer-by-layer comparison with forward hooks.

When a port gives garbage, the final logits say only *that* something is wrong. Run both models on
the same tokens, record the output of every pair of modules that should agree, and look at the
first pair that does not: the bug is in that module (or in the weights it was given).

    report = compare_layers(course_model, hf_model, idx)   # pairs from modern_block.interop.hf.module_pairs
    print(report)                                          # one row per pair, in execution order
    report.first_divergence                                # the first row over the tolerance, or None

Pairs are ordered by when the first model's module *finishes*, so an inner module (a projection)
comes before the block that contains it, and the first divergence is the most specific one.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..decoder import DecoderLM


@dataclass
class LayerDiff:
    name_a: str
    name_b: str
    max_abs: float  # inf when the shapes do not match
    mean_abs: float
    ok: bool
    note: str = ""


@dataclass
class Comparison:
    rows: list[LayerDiff] = field(default_factory=list)
    atol: float = 1e-4

    @property
    def first_divergence(self) -> LayerDiff | None:
        return next((row for row in self.rows if not row.ok), None)

    @property
    def max_abs(self) -> float:
        return max((row.max_abs for row in self.rows), default=0.0)

    def __str__(self) -> str:
        first = self.first_divergence
        width = max([len(r.name_a) for r in self.rows] + [10])
        lines = [f"{'module':<{width}}  {'max |diff|':>10}  {'mean |diff|':>11}  (atol {self.atol:g})"]
        for row in self.rows:
            mark = "  <-- first divergence" if row is first else ""
            lines.append(f"{row.name_a:<{width}}  {row.max_abs:>10.3g}  {row.mean_abs:>11.3g}{mark}"
                         f"{'  ' + row.note if row.note else ''}")
        verdict = (f"first divergence: {first.name_a} (vs {first.name_b})" if first
                   else f"all {len(self.rows)} pairs agree within {self.atol:g}")
        return "\n".join(lines + [verdict])


def _tensor_of(output):
    """The tensor a module produced: itself, the first tensor of a tuple, or a model output's logits."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "keys") and "logits" in output.keys():
        return output["logits"]
    values = output.values() if hasattr(output, "values") else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def _record(model: nn.Module, names, store: dict, order: list):
    """Forward hooks that keep the first output of each named module, and the order they finish in."""
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(f"no module named {missing[0]!r} in {type(model).__name__}")

    def hook_for(name):
        def hook(_module, _args, output):
            if name not in store:
                store[name] = _tensor_of(output)
                order.append(name)
        return hook

    return [modules[n].register_forward_hook(hook_for(n)) for n in names]


def _diff(name_a: str, name_b: str, a, b, atol: float) -> LayerDiff:
    if a is None or b is None:
        return LayerDiff(name_a, name_b, math.inf, math.inf, False, "no tensor output")
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)  # [T, d] positions vs [1, T, d] is fine
    except RuntimeError:
        shape = None
    if shape is None or shape.numel() != max(a.numel(), b.numel()):
        return LayerDiff(name_a, name_b, math.inf, math.inf, False, f"shapes {list(a.shape)} vs {list(b.shape)}")
    diff = (a.detach().double() - b.detach().double().to(a.device)).abs()
    max_abs, mean_abs = diff.max().item(), diff.mean().item()
    return LayerDiff(name_a, name_b, max_abs, mean_abs, max_abs <= atol)


def _default_pairs(model_a: nn.Module, model_b: nn.Module):
    is_hf = [hasattr(getattr(m, "config", None), "model_type") for m in (model_a, model_b)]
    if is_hf == [False, True] and isinstance(model_a, DecoderLM):
        from .hf import module_pairs
        return module_pairs(model_a, model_b)
    if is_hf == [True, False] and isinstance(model_b, DecoderLM):
        from .hf import module_pairs
        return [(b, a) for a, b in module_pairs(model_b, model_a)]
    common = set(dict(model_b.named_modules()))
    return [(n, n) for n, _ in model_a.named_modules() if n and n in common]


@torch.no_grad()
def compare_layers(model_a: nn.Module, model_b: nn.Module, idx: torch.Tensor, pairs=None,
                   atol: float = 1e-4) -> Comparison:
    """Run both models on ``idx`` [B, T] and compare paired module outputs (max and mean |diff|).

    ``pairs``: (module of a, module of b) names, or a dict. By default: ``hf.module_pairs`` when one
    model is a Hugging Face model, else the modules with the same name in both. A last row compares
    the models' outputs (the logits). Both models are put in eval mode for the run and restored after.
    """
    if not atol >= 0:
        raise ValueError(f"atol must be >= 0, got {atol}")
    pairs = list(pairs.items() if isinstance(pairs, dict) else pairs or _default_pairs(model_a, model_b))
    if not pairs:
        raise ValueError("pairs is empty: no modules to compare")
    outs_a: dict[str, torch.Tensor] = {}
    outs_b: dict[str, torch.Tensor] = {}
    order: list[str] = []
    handles = _record(model_a, [a for a, _ in pairs], outs_a, order)
    handles += _record(model_b, [b for _, b in pairs], outs_b, [])
    modes = (model_a.training, model_b.training)
    try:
        model_a.eval(), model_b.eval()
        final_a, final_b = _tensor_of(model_a(idx)), _tensor_of(model_b(idx))
    finally:
        for h in handles:
            h.remove()
        model_a.train(modes[0]), model_b.train(modes[1])
    partner = dict(pairs)
    rows = [_diff(a, partner[a], outs_a[a], outs_b.get(partner[a]), atol) for a in order]
    rows.append(_diff("(output)", "(output)", final_a, final_b, atol))
    return Comparison(rows, atol)
