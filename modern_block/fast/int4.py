"""int4: 4-bit weights in groups of 32 (llama.cpp's Q4_1 blocks), the head in 8 bits.

    fast_model = fast.prepare(model, weights="int4")
    q, scales, offsets = quantize_int4(w)   # w [n_out, n_in] -> q uint8 [n_out, n_in] in 0..15, bf16 [n_out, n_in / 32]

At batch 1 a decoding step reads every weight once, so it can go no faster than its bytes over the memory's speed
(lesson 10), whatever arithmetic the kernel does. int8 stores a weight in a byte; this format in half a byte plus
its group's share of two bf16 numbers: 20 bytes for 32 weights, the bytes of llama.cpp's Q4_1.

Every run of 32 weights along a row (a group) gets a scale s and an offset z; its 16 levels are z + (q - 8) s for
q = 0..15, with s = (max - min) / 15 rounded up to bf16 and z = min + 8 s rounded to bf16 (the kernel reads both in
bf16). So ``|w - (z + (q - 8) s)| <= s / 2 + e`` for every weight, e the group's rounding of z (``int4_error``).
Q4_1 stores the same grid as w = d q + m per block of 32 (d = s, m = z - 8 s, both fp16): a Q4_1 checkpoint's
weights (the SmolLM2 GGUF's layers) come back on their own grid, up to the bf16 rounding of d and m.

The kernel is PyTorch's CPU int4 weight-only kernel (``torch._weight_int4pack_mm_for_cpu``, on a bf16 input, rows
packed by ``torch._convert_weight_to_int4pack_for_cpu``): the activations stay floating point. PyTorch has no x86
kernel multiplying 4-bit weights by 8-bit activations (torchao's CPU kernels are not in its PyPI wheel); on this
format the bytes, not the arithmetic, set the step's time (``benchmarks/llama_cpp_bench.py``). Where the kernel is
missing or a shape does not fit it (n_out a multiple of 16), the product widens the matrix.

The rule: every bias-free ``nn.Linear`` whose input splits into groups of 32 (as the other formats: not MLA's
absorbed W_UK and W_UV); the output head (tied or not), the token embedding and a linear whose n_in is not a
multiple of 32 keep 8 bits, as w8a8's unsmoothed int8 rows multiplied by int8 activations (``w8a8.py``; llama.cpp's
file keeps its head in Q8_0 too: the logits are where rounding shows most).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validate import finite_matrix

GROUP = 32  # weights per scale and offset, as Q4_1's blocks
LEVELS = 15  # q in 0..15
MID = 8  # q - 8: the kernel's signed levels -8..7
KERNEL_N = 16  # the CPU kernel packs rows in multiples of 16


def round_up_bf16(x: torch.Tensor) -> torch.Tensor:
    """x (fp32, >= 0) rounded to a bf16 number >= x, so that a scale stored in bf16 still covers its range."""
    b = x.to(torch.bfloat16)
    return torch.where(b.float() < x, torch.nextafter(b, torch.full_like(b, float("inf"))), b)


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups of 32 along each row: w [n_out, n_in] -> (q uint8 [n_out, n_in] in 0..15, scales and offsets bf16
    [n_out, n_in / 32]) with w ~ offset + (q - 8) scale. A group of equal weights gets scale 0."""
    finite_matrix("w", w)
    if w.shape[1] % GROUP:
        raise ValueError(f"w's n_in ({w.shape[1]}) must be a multiple of {GROUP} (groups of {GROUP} weights)")
    n_out, n_in = w.shape
    g = w.detach().float().reshape(n_out, n_in // GROUP, GROUP)  # [n_out, groups, 32]
    lo, hi = g.amin(-1), g.amax(-1)  # [n_out, groups]
    s = round_up_bf16((hi - lo) / LEVELS)  # [n_out, groups]
    z = (lo + MID * s.float()).to(torch.bfloat16)  # [n_out, groups]
    safe = torch.where(s > 0, s.float(), torch.ones_like(lo))[..., None]  # [n_out, groups, 1]
    q = torch.round((g - z.float()[..., None]) / safe) + MID  # [n_out, groups, 32]
    q = torch.where(s[..., None] > 0, q, torch.full_like(q, MID)).clamp(0, LEVELS)
    return q.to(torch.uint8).reshape(n_out, n_in), s, z


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """q uint8 [n_out, n_in] and scales, offsets [n_out, n_in / 32] -> the fp32 matrix offset + (q - 8) scale."""
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % GROUP:
        raise ValueError(f"q must be a uint8 [n_out, n_in] tensor with n_in a multiple of {GROUP}, got {q.dtype} "
                         f"of shape {tuple(q.shape)}")
    want = (q.shape[0], q.shape[1] // GROUP)
    if scales.shape != want or offsets.shape != want:
        raise ValueError(f"scales and offsets must be [n_out, n_in / {GROUP}] = {list(want)}, got "
                         f"{list(scales.shape)} and {list(offsets.shape)}")
    g = (q.float() - MID).reshape(*want, GROUP)  # [n_out, groups, 32]
    return (offsets.float()[..., None] + g * scales.float()[..., None]).reshape(q.shape)


def int4_error(w: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The most any weight of each group of w [n_out, n_in] may be off in the format: s / 2 plus the rounding of
    the group's offset to bf16, [n_out, n_in / 32]."""
    lo = w.detach().float().reshape(*scales.shape, GROUP).amin(-1)  # [n_out, groups]
    return scales.float() / 2 + (offsets.float() - (lo + MID * scales.float())).abs()


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [n_out, n_in] in 0..15 -> [n_out, n_in / 2], two levels a byte (the even column in the low half)."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(p: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: [n_out, n_in / 2] -> q uint8 [n_out, n_in]."""
    return torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)


def int4_kernel_fits(n_out: int, device: torch.device) -> bool:
    """Whether PyTorch's CPU int4 kernel takes a matrix of n_out rows on ``device``."""
    return (device.type == "cpu" and n_out % KERNEL_N == 0
            and hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu"))


class Int4Linear(nn.Module):
    """A bias-free ``nn.Linear`` as 4-bit levels in groups of 32 with a bf16 scale and offset each.

    ``weight`` uint8 [n_out, n_in / 2]: two levels a byte, in the CPU kernel's packed order where it fits
    (``kernel``), else in ``pack_nibbles``' order; ``scales_offsets`` bf16 [n_in / 32, n_out, 2], the kernel's
    layout. Build it with ``from_weight``."""

    def __init__(self, weight: nn.Parameter, scales_offsets: nn.Parameter, kernel: bool):
        super().__init__()
        self.weight, self.scales_offsets, self.kernel = weight, scales_offsets, kernel
        self.out_features, self.in_features = weight.shape[0], 2 * weight.shape[1]

    @classmethod
    def from_weight(cls, w: torch.Tensor) -> "Int4Linear":
        """From an fp matrix w [n_out, n_in] (n_in a multiple of 32)."""
        q, s, z = quantize_int4(w)
        kernel = int4_kernel_fits(w.shape[0], w.device)
        packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1) if kernel else pack_nibbles(q)
        so = torch.stack([s.t(), z.t()], -1).contiguous()  # [groups, n_out, 2]
        return cls(nn.Parameter(packed, requires_grad=False), nn.Parameter(so, requires_grad=False), kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., n_in] -> [..., n_out]
        x2 = x.reshape(-1, self.in_features)  # [M, n_in]
        if self.kernel:
            if x.device.type != "cpu":
                raise ValueError(f"these int4 weights are packed for the CPU kernel, but x is on {x.device}: "
                                 "convert the model on the device it decodes on")
            so = self.scales_offsets
            y = torch._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16), self.weight, GROUP, so)  # [M, n_out]
        else:
            s, z = self.scales_offsets[..., 0].t(), self.scales_offsets[..., 1].t()  # [n_out, groups] each
            y = F.linear(x2, dequantize_int4(unpack_nibbles(self.weight), s, z).to(x.dtype))  # [M, n_out]
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
