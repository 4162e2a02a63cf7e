"""Device, precision and the arithmetic of model FLOPs utilisation (MFU).

Precision: on CUDA, bf16 autocast when the compute capability is 8.0 or more (Ampere and later);
below that fp16 autocast with a ``GradScaler`` (fp16 has a narrow exponent range, so the loss is
scaled up before backward and the gradients unscaled before the step). The capability decides, not
``torch.cuda.is_bf16_supported()``: a T4 (7.5) answers True there through emulation, which is slow.
On the CPU the model trains in fp32.

FLOPs per token (nanoGPT's estimate, from the PaLM paper's appendix):

    6·N + 12·L·H·Q·T

N: parameters used in matrix multiplies (all parameters except embedding tables that are only looked
up: learned positions, and the input embedding when the head is untied); 6 = 2 (multiply-add)
× 3 (forward, and backward for activations and for weights). 12·L·H·Q·T: the attention scores and
the weighted sum of values, L layers, H query heads of size Q, context T (counted for the full
T × T square, as nanoGPT does; causal kernels skip about half of it). GQA does not change this term:
every query head still scores every key.

MFU = FLOPs per token × tokens per second / the GPU's peak dense 16-bit tensor-core FLOP/s.

With several devices (torchrun), FLOPs per token is unchanged (a property of the model), tokens per
second is the whole run's (all devices together), and MFU divides by the peak of all the devices,
N × one GPU's: it is the utilisation of an average device.
"""

import contextlib
import os
import re
from dataclasses import dataclass

import torch
import torch.nn as nn

# Peak dense (no sparsity) bf16 tensor-core FLOP/s from NVIDIA's data sheets; fp16 for the T4 and
# V100, which have no bf16. Matched against torch.cuda.get_device_name() in this order (first wins).
PEAK_FLOPS: tuple[tuple[str, str, float], ...] = (
    (r"H200 NVL", "H200 NVL", 835e12),
    (r"H200", "H200 SXM", 989e12),
    (r"H100 NVL", "H100 NVL", 835e12),
    (r"H100 PCIe", "H100 PCIe", 756e12),
    (r"H100", "H100 SXM", 989e12),
    (r"A100", "A100", 312e12),
    (r"L40S", "L40S", 362e12),
    (r"\bL4\b", "L4", 121e12),
    (r"\bA10\b", "A10", 125e12),
    (r"V100", "V100", 125e12),
    (r"\bT4\b", "T4 (fp16)", 65e12),
)


def peak_flops(gpu_name: str) -> tuple[str, float] | None:
    """(table label, peak FLOP/s) for a GPU name such as "NVIDIA H100 80GB HBM3"; None if unknown."""
    for pattern, label, flops in PEAK_FLOPS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return label, flops
    return None


def autocast_dtype(capability: tuple[int, int]) -> torch.dtype:
    """bf16 from compute capability 8.0 (Ampere) on, fp16 below."""
    return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16


@dataclass
class DeviceSetup:
    """Where and in what precision to train."""

    device: torch.device
    name: str  # "cpu" or the GPU's name
    amp_dtype: torch.dtype | None  # autocast dtype; None: plain fp32
    capability: tuple[int, int] | None = None
    peak: tuple[str, float] | None = None  # (label, FLOP/s) from PEAK_FLOPS

    @property
    def needs_scaler(self) -> bool:
        return self.amp_dtype == torch.float16

    @property
    def precision(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}[
            self.amp_dtype]

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def describe(self) -> str:
        if self.device.type != "cuda":
            return f"{self.name}, {self.precision}, MFU not reported (no peak FLOP/s for CPUs)"
        peak = (f"peak {self.peak[1] / 1e12:.0f} TFLOP/s ({self.peak[0]})" if self.peak
                else "peak FLOP/s unknown for this GPU: MFU not reported")
        return f"{self.name} (compute capability {self.capability[0]}.{self.capability[1]}), {self.precision}, {peak}"


def choose_device(device: str | None = None) -> DeviceSetup:
    """CUDA when available (or asked for), else the CPU; precision as in the module docstring."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", index)
        name = torch.cuda.get_device_name(index)
        cap = torch.cuda.get_device_capability(index)
        return DeviceSetup(dev, name, autocast_dtype(cap), cap, peak_flops(name))
    if dev.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")
    return DeviceSetup(dev, "cpu", None)


def memory_bytes(setup: DeviceSetup) -> int | None:
    """Memory of the device that trains: the GPU's, or the machine's RAM for the CPU; None if the
    system does not say. The trainer checks sizes against it before allocating anything."""
    if setup.device.type == "cuda":
        return torch.cuda.get_device_properties(setup.device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this system (Windows)
        return None


def matmul_parameters(model: nn.Module) -> int:
    """N in 6·N: parameters minus embedding tables used only for look-ups (a table tied to the
    output head is a matrix multiply there, so it counts)."""
    in_linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight): m.weight.numel() for m in model.modules()
               if isinstance(m, nn.Embedding) and id(m.weight) not in in_linear}
    return sum(p.numel() for p in model.parameters()) - sum(lookups.values())


def flops_per_token(n_matmul_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, 6·N + 12·L·H·Q·T (forward and backward)."""
    return 6 * n_matmul_params + 12 * n_layers * n_heads * head_dim * seq_len


def model_flops_per_token(model: nn.Module, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> int:
    return flops_per_token(matmul_parameters(model), n_layers, n_heads, head_dim, seq_len)


def mfu(flops_per_tok: float, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]; None when the peak is unknown (CPU, unlisted GPU)."""
    if peak is None:
        return None
    return flops_per_tok * tokens_per_s / peak
