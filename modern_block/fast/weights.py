"""Weight formats for decoding: fewer bytes per weight, by swapping modules.

    fast_model = fast.prepare(model, weights="int8")   # or "bf16"; "fp32" (the default) keeps the weights as they are
    q, scale = quantize_int8(w)                        # w [n_out, n_in] -> int8 [n_out, n_in], scales [n_out]

At batch 1 a decoding step reads every weight once, so its floor is the weights' bytes over the memory bandwidth
(lesson 10): bf16 halves the fp32 bytes, int8 quarters them. Both are **weight-only** formats: the residual stream,
the norms, attention and the KV cache stay in the model's own dtype; only the matrices (and the embedding table,
which a tied head shares) are stored smaller, and each matrix multiplication widens them inside its kernel.

* ``bf16``: every weight matrix rounded to bfloat16 (8 significant bits); the multiplication's input is rounded to
  bf16 too, the output returns to the model's dtype.
* ``int8`` (gpt-fast's recipe): every row (output channel) of a matrix gets one scale, ``s = max|w_row| / 127``,
  rounded up to a bf16 number so that the kernel uses exactly it; the row is stored as ``q = round(w / s)`` in
  [-127, 127], and read back as ``q · s``, so ``|w - q·s| <= s/2`` for every weight. In the compiled decode step
  (one row) the product is a multiply-and-sum that inductor fuses into one pass over the int8 weights; eager, it is
  PyTorch's CPU weight-only int8 kernel (``aten._weight_int8pack_mm``, on a bf16 input) where it exists, else the
  widened matrix times the scales.

The rule: ``convert_weights`` replaces every ``nn.Linear`` without a bias, and the token embedding, by its
format's version (a tied head stays tied: head and embedding share one stored matrix and its scales). A linear
with a bias (Qwen2's q/k/v, GPT-2's) keeps its own format, as do MLA's W_UK and W_UV (its absorbed decoding reads
their matrices directly) and every other module.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..mla import MLAttention
from ..validate import finite_matrix
from .int4 import GROUP, Int4Linear, round_up_bf16
from .w8a8 import W8A8Linear, smoothing_factors

FORMATS = ("fp32", "bf16", "int8", "w8a8", "int4")  # "fp32": the weights as loaded (no conversion); w8a8.py, int4.py
INT8_MAX = 127  # symmetric: -127 .. 127 (-128 unused, so that q and -q are both representable)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: w [n_out, n_in] -> (q int8 [n_out, n_in], scales bf16 [n_out]) with
    ``|w - q · s| <= s / 2``. An all-zero row gets scale 1 (its q are zeros)."""
    finite_matrix("w", w)
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # [n_out]
    s = round_up_bf16(torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax)))  # [n_out]
    q = torch.round(w / s.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)  # [n_out, n_in]
    return q, s


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """q int8 [n_out, n_in] and scales [n_out] -> the fp32 matrix q · s [n_out, n_in]."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"q must be a 2-D int8 tensor, got {q.dtype} of shape {tuple(q.shape)}")
    if scales.shape != (q.shape[0],):
        raise ValueError(f"scales must have one entry per row of q ({q.shape[0]}), got shape {tuple(scales.shape)}")
    return q.float() * scales.float()[:, None]  # [n_out, n_in]


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)  # a parameter, so that decode_weight_bytes and .to() see it


KERNEL_MULTIPLE = 16  # torch 2.13's CPU int8 kernel crashes (segfault) for n_in not a multiple of 16 and > 1 row


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., n_in] times (q · s)ᵀ -> [..., n_out] in x's dtype. One row under ``torch.compile`` (the decode
    step): a multiply-and-sum, which inductor turns into one loop over the int8 weights (1.8x the kernel's speed on
    91 matrices alone; in SmolLM2's whole compiled step the two measured alike, 41.8 vs 40.6 ms median of 5
    interleaved rounds); otherwise the CPU int8 weight-only kernel where it exists and takes the shape (input
    rounded to bf16), else the widened matrix."""
    if torch.compiler.is_compiling() and x.numel() == x.shape[-1]:
        y = (x.reshape(1, -1).float() * q.float()).sum(-1) * scales.float()  # [n_out]: fused, nothing materialised
        return y.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])
    kernel = hasattr(torch.ops.aten, "_weight_int8pack_mm") and q.shape[1] % KERNEL_MULTIPLE == 0
    if x.device.type == "cpu" and kernel:
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # [M, n_in]
        y = torch.ops.aten._weight_int8pack_mm(x2, q, scales)  # [M, n_out], bf16
        return y.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])
    return F.linear(x, q.to(x.dtype)) * scales.to(x.dtype)  # fallback: [..., n_out]


class Int8Linear(nn.Module):
    """A bias-free ``nn.Linear`` stored as int8 rows with one bf16 scale each (``weight``, ``scales``)."""

    def __init__(self, weight: nn.Parameter, scales: nn.Parameter):
        super().__init__()
        self.weight, self.scales = weight, scales  # int8 [n_out, n_in], bf16 [n_out]
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_weight(cls, w: torch.Tensor) -> "Int8Linear":
        """From an fp matrix w [n_out, n_in] (an ``nn.Linear``'s or an embedding's weight)."""
        q, s = quantize_int8(w)
        return cls(_frozen(q.to(w.device)), _frozen(s.to(w.device)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., n_in] -> [..., n_out]
        return int8_matmul(x, self.weight, self.scales)


class BF16Linear(nn.Module):
    """A bias-free ``nn.Linear`` stored in bf16; the product is computed in bf16 and returned in x's dtype."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight  # bf16 [n_out, n_in]
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_weight(cls, w: torch.Tensor) -> "BF16Linear":
        """From an fp matrix w [n_out, n_in] (an ``nn.Linear``'s or an embedding's weight)."""
        finite_matrix("w", w)
        return cls(_frozen(w.detach().to(torch.bfloat16)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., n_in] -> [..., n_out]
        return F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)


class StoredEmbedding(nn.Module):
    """The token embedding in a smaller format: ``weight`` (bf16, or int8 with per-row ``scales``); a lookup
    widens the rows it reads to ``dtype`` (the model's own)."""

    def __init__(self, weight: nn.Parameter, scales: nn.Parameter | None, dtype: torch.dtype):
        super().__init__()
        self.weight, self.scales, self.dtype = weight, scales, dtype
        self.num_embeddings, self.embedding_dim = weight.shape

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: [B, T] -> [B, T, d]
        rows = self.weight[idx].to(self.dtype)  # [B, T, d]
        return rows if self.scales is None else rows * self.scales[idx].to(self.dtype).unsqueeze(-1)


def _w8a8(w: torch.Tensor, amax: torch.Tensor | None) -> W8A8Linear:
    """The int8 format's rows and scales of w [n_out, n_in] (smoothed by ``amax`` [n_in] when given), multiplied by
    int8 activations (``w8a8.py``)."""
    c = None if amax is None else smoothing_factors(amax, w)  # [n_in]
    q, s = quantize_int8(w if c is None else w * c)
    smooth = None if c is None else _frozen((1 / c).to(w.device))
    return W8A8Linear(_frozen(q.to(w.device)), _frozen(s.to(w.device)), smooth)


def convert_weights(model: nn.Module, fmt: str, ranges: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Swap, in place, every bias-free ``nn.Linear`` of ``model`` and its token embedding ``model.emb`` for the
    ``fmt`` version ("bf16", "int8", "w8a8" or "int4"; "fp32" changes nothing); a tied head keeps sharing the
    embedding's storage. ``ranges`` (w8a8 only, from ``w8a8.activation_ranges``): each linear's largest |input|
    per channel on calibration text, which sets its smoothing (a smoothed head gets its own matrix: the embedding
    keeps the unsmoothed rows); without them the activations are rounded as they come. int4's rule: ``int4.py``.
    Returns ``model`` (call it on a copy: ``fast.prepare(model, weights=fmt)`` does)."""
    if fmt not in FORMATS:
        raise ValueError(f"weights must be one of {FORMATS}, got {fmt!r}")
    if ranges is not None and fmt != "w8a8":
        raise ValueError(f"ranges (activation ranges for smoothing) apply to weights='w8a8' only, not {fmt!r}")
    if fmt == "fp32":
        return model
    emb = getattr(model, "emb", None)
    head = getattr(model, "head", None)
    tied = isinstance(emb, nn.Embedding) and head is not None and head.weight is emb.weight
    smoothed = fmt == "w8a8" and ranges is not None
    absorbed = {id(getattr(m, n)) for m in model.modules() if isinstance(m, MLAttention) for n in ("w_uk", "w_uv")}
    swaps: list[tuple[nn.Module, str, nn.Linear, str]] = []
    for prefix, parent in model.named_modules():
        for name, child in parent.named_children():
            if (isinstance(child, nn.Linear) and type(child) is nn.Linear and child.bias is None
                    and id(child) not in absorbed and not (tied and child is head and not smoothed)):
                swaps.append((parent, name, child, f"{prefix}.{name}" if prefix else name))
    for parent, name, lin, full in swaps:
        if fmt == "int4" and lin is not head and lin.in_features % GROUP == 0:
            setattr(parent, name, Int4Linear.from_weight(lin.weight))
        elif fmt in ("w8a8", "int4"):  # int4's head and any matrix whose rows do not split into groups: 8 bits
            setattr(parent, name, _w8a8(lin.weight, None if ranges is None else _range(ranges, full, lin)))
        else:
            setattr(parent, name, (BF16Linear if fmt == "bf16" else Int8Linear).from_weight(lin.weight))
    if isinstance(emb, nn.Embedding):
        table: nn.Module = BF16Linear.from_weight(emb.weight) if fmt == "bf16" else (
            Int8Linear.from_weight(emb.weight) if smoothed or fmt == "int8" else _w8a8(emb.weight, None))
        scales = getattr(table, "scales", None)  # [V]: int8 rows' scales (bf16 has none)
        model.emb = StoredEmbedding(table.weight, scales, emb.weight.dtype)  # type: ignore[arg-type]
        if tied and not smoothed:
            model.head = table  # the same stored matrix (and scales) as the embedding
    return model.requires_grad_(False)


def _range(ranges: dict[str, torch.Tensor], name: str, lin: nn.Linear) -> torch.Tensor:
    amax = ranges.get(name)
    if amax is None or amax.shape != (lin.in_features,):
        raise ValueError(f"ranges must hold {name!r} with one entry per input channel ({lin.in_features}), got "
                         f"{None if amax is None else tuple(amax.shape)}: compute them on this model "
                         "(w8a8.activation_ranges)")
    return amax
