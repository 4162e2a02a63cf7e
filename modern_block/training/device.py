"""Where a run trains and in which precision: bf16 autocast on CUDA capability 8.0+, fp16 with a GradScaler
below (the capability decides: emulated bf16 is slow), fp32 on the CPU; the GPU's peak FLOP/s and memory, and
model FLOPs utilisation (nanoGPT's 6·N + 12·L·H·Q·T FLOPs per token against that peak); the CPU's name, for the
records of timings."""

import contextlib
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from .config import ConfigError

# Peak dense bf16 FLOP/s (fp16 for the T4 and V100) from NVIDIA's data sheets, matched in order (first wins).
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
    (r"V100", "V100 (fp16)", 125e12),  # no bf16 on a V100 (compute capability 7.0): fp16 with a GradScaler
    (r"\bT4\b", "T4 (fp16)", 65e12),  # no bf16 on a T4 either (7.5; it emulates it, slowly)
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
        if self.device.type != "cuda" or self.capability is None:
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
        raise ConfigError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", index)
        name = torch.cuda.get_device_name(index)
        cap = torch.cuda.get_device_capability(index)
        return DeviceSetup(dev, name, autocast_dtype(cap), cap, peak_flops(name))
    if dev.type != "cpu":
        raise ConfigError(f"device must be 'cpu' or 'cuda[:i]', got {device!r}")
    return DeviceSetup(dev, "cpu", None)


def memory_bytes(setup: DeviceSetup) -> int | None:
    """Memory of the device that trains (the GPU's, or the machine's RAM); None if the system does not say."""
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
    """Training FLOPs per token, 6·N + 12·L·H·Q·T (forward and backward; attention over the full T × T square)."""
    return 6 * n_matmul_params + 12 * n_layers * n_heads * head_dim * seq_len


def mfu(flops_per_tok: float, tokens_per_s: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]; None when the peak or the rate is unknown (CPU, unlisted GPU)."""
    if peak is None or tokens_per_s is None:
        return None
    return flops_per_tok * tokens_per_s / peak


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it (``model name`` in /proc/cpuinfo), else what ``platform`` knows:
    the machine a timing was measured on, in benchmark and lesson-time records."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
