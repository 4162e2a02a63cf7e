"""w8a8: int8 weights and int8 activations, multiplied as integers.

    fast_model = fast.prepare(model, weights="w8a8")
    xq, sx = quantize_activations(x)          # x [..., n] -> int8 [..., n], scales fp32 [..., 1]

The weight-only int8 format stores a quarter of fp32's bytes but still multiplies in floating point: every int8
weight is widened to a float and multiplied-and-added by float instructions, so the kernel does as much work per
weight as fp32's while reading four weights per fp32 weight's bytes. w8a8 rounds the activations to int8 as well,
**per token at run time** (one scale per token vector, ``s_x = max|x| / 127``), so that each product is an integer
dot product: int8 × int8 summed in int32 (on x86, the VNNI instructions multiply and add 64 such pairs in one), then
one float multiplication per output, ``y = (q_x · q_w) s_x s_w``.

The weights are stored exactly as in the int8 format (``weights.quantize_int8``: per output channel, ``s_w`` the
row's ``max|w| / 127`` rounded up to bf16). The kernel is ``torch._int_mm`` (oneDNN's integer matrix multiplication
on CPUs; in the compiled decode step an external call inside the generated graph), chosen by measurement among
torchao's, oneDNN's, fbgemm's and inductor-generated integer kernels: ``benchmarks/matmul_kernels.py``. The
activations are shifted by 128 to uint8 (``u8 · s8``, the operand order VNNI multiplies) and the shift's sum
``128 Σ_j q_w`` is subtracted, precomputed per output channel: the result is the exact int32 dot product. On a
CPU without VNNI, oneDNN adds each pair of u8 · s8 products in 16 bits, which saturates (2 · 255 · 127 > 32,767):
``int_mm_is_exact`` finds out once by running the worst case, and such a CPU takes the plain int32 product instead
(exact, slower).

Error: with ``|w - q_w s_w| <= s_w / 2`` and ``|x - q_x s_x| <= s_x / 2`` per element, each output moves by at most
``(s_w / 2) ||x||_1 + (s_x / 2) ||q_w s_w||_1`` (``error_bound``); no float rounding is added inside the dot product.
The rule: as the int8 format (``weights.convert_weights``), every bias-free ``nn.Linear`` and the tied head; the
embedding lookup reads int8 rows (no product, so no activation rounding). Needs nothing beyond torch.
"""

import functools

import torch
import torch.nn as nn

INT8_MAX = 127
SHIFT = 128  # int8 activations + 128 = uint8
ALPHA = 0.5  # SmoothQuant's migration strength (the paper's default; not tuned here)
TINY = 1e-5  # a floor for channels that never move, so that no factor is 0 or infinite


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8: x [..., n] -> (q int8 [..., n], s fp32 [..., 1]) with s = max|x| / 127 over the
    token's n numbers and q = round(x / s), so ``|x - q · s| <= s / 2``. An all-zero token gets s = 1."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True)  # [..., 1]
    s = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))  # [..., 1]
    return torch.round(x / s).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), s


@functools.cache
def int_mm_is_exact() -> bool:
    """Whether this CPU's ``torch._int_mm`` gives the exact u8 · s8 product where 16-bit pair sums would saturate:
    64 products of 255 and 127 (True with VNNI; False where oneDNN saturates). Asked once per process."""
    xu = torch.full((1, 64), 255, dtype=torch.uint8)  # [1, 64]
    w = torch.full((64, 8), INT8_MAX, dtype=torch.int8)  # [64, 8]
    return bool((torch._int_mm(xu, w) == 64 * 255 * INT8_MAX).all())


def int8_dot(xq: torch.Tensor, wq_t: torch.Tensor, shift_sums: torch.Tensor, kernel: bool = True) -> torch.Tensor:
    """The exact integer products xq [M, n_in] (int8) · wq_t [n_in, n_out] (int8) -> int32 [M, n_out]: through
    ``torch._int_mm`` on xq + 128 (uint8) less ``shift_sums`` [n_out] = 128 · Σ_j wq_t[j, :]; with
    ``kernel=False`` (a CPU where that kernel saturates), as a plain int32 product."""
    if not kernel:
        return xq.to(torch.int32) @ wq_t.to(torch.int32)  # [M, n_out]
    xu = (xq.to(torch.int32) + SHIFT).to(torch.uint8)  # [M, n_in]
    return torch._int_mm(xu, wq_t) - shift_sums  # [M, n_out]


def error_bound(x: torch.Tensor, wq: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    """The most a w8a8 product of x [..., n_in] can differ from x times the fp matrix that ``quantize_int8`` turned
    into (wq, w_scales): ``(s_w / 2) ||x||_1 + (s_x / 2) ||wq s_w||_1`` per output, [..., n_out]."""
    _, sx = quantize_activations(x)  # [..., 1]
    sw = w_scales.float()  # [n_out]
    w_l1 = (wq.float().abs() * sw[:, None]).sum(1)  # [n_out]
    return sw / 2 * x.float().abs().sum(-1, keepdim=True) + sx / 2 * w_l1


class W8A8Linear(nn.Module):
    """A bias-free ``nn.Linear`` as int8 rows with one bf16 scale each (``weight`` [n_out, n_in], ``scales``
    [n_out]; an unsmoothed tied head shares both with the embedding), multiplied by per-token int8 activations in
    integers. ``smooth`` [n_in] (or None) multiplies the input before it is rounded (the weights were multiplied
    by its inverse); ``shift_sums`` [n_out] is the uint8 shift's correction."""

    def __init__(self, weight: nn.Parameter, scales: nn.Parameter, smooth: nn.Parameter | None = None):
        super().__init__()
        self.weight, self.scales, self.smooth = weight, scales, smooth  # int8 [n_out, n_in], bf16 [n_out], [n_in]
        self.out_features, self.in_features = weight.shape
        sums = SHIFT * weight.detach().sum(1, dtype=torch.int32)  # [n_out]
        self.shift_sums = nn.Parameter(sums, requires_grad=False)  # read every step: counted with the weights
        self.kernel = int_mm_is_exact()  # False: this CPU's integer kernel saturates, take the plain int32 product

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., n_in] -> [..., n_out]
        x2 = x.reshape(-1, self.in_features).float()  # [M, n_in]
        xq, sx = quantize_activations(x2 if self.smooth is None else x2 * self.smooth)  # [M, n_in], [M, 1]
        y = int8_dot(xq, self.weight.t(), self.shift_sums, self.kernel).float() * sx * self.scales.float()  # [M, n_out]
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def smoothing_factors(amax: torch.Tensor, w: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors c [n_in] = amax^alpha / max_i |w_ij|^(1 - alpha) for a linear
    whose input's largest |x_j| on calibration text is amax [n_in] and whose matrix is w [n_out, n_in]: x / c
    has flatter channels to round, w · c carries the difference, and (x / c)(w · c)ᵀ = x wᵀ."""
    if amax.shape != (w.shape[1],) or not bool((amax >= 0).all()):
        raise ValueError(f"amax must hold one |x| >= 0 per input channel ({w.shape[1]}), got shape "
                         f"{tuple(amax.shape)}")
    a = amax.float().clamp(min=TINY)  # [n_in]
    wmax = w.detach().float().abs().amax(0).clamp(min=TINY)  # [n_in]
    return a ** alpha / wmax ** (1 - alpha)


@torch.no_grad()
def activation_ranges(model: nn.Module, calibration: torch.Tensor) -> dict[str, torch.Tensor]:
    """The largest |input| per channel of every ``nn.Linear`` in ``model`` (name -> [n_in]) while it reads the
    token ids ``calibration`` [B, T] (representative text; not the text a result is reported on)."""
    ranges: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(module, inputs, output):
            a = inputs[0].detach().float().abs().reshape(-1, module.in_features).amax(0)  # [n_in]
            ranges[name] = a if name not in ranges else torch.maximum(ranges[name], a)
        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        model(calibration)
    finally:
        for h in hooks:
            h.remove()
    return ranges
