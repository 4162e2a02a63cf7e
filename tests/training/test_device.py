"""Device choice, autocast dtype, peak FLOP/s and MFU arithmetic."""

import platform
import re
from pathlib import Path

import pytest
import torch
from training_setup import never_online  # noqa: F401 (an autouse fixture: keeps these tests offline)

from modern_block import GPT2LM, LlamaStyleLM
from modern_block.training.device import (
    autocast_dtype,
    choose_device,
    cpu_name,
    flops_per_token,
    matmul_parameters,
    memory_bytes,
    mfu,
    peak_flops,
)


def test_mfu_arithmetic_by_hand():
    # GPT2LM(V=65, d=32, 2 layers, 4 heads, max_len=16), counted by hand:
    # wte 65·32 = 2080, wpe 16·32 = 512, final LayerNorm 64, and per layer:
    # ln1 64 + qkv 32·96+96 = 3168 + proj 32·32+32 = 1056 + ln2 64 + fc 32·128+128 = 4224 + proj 128·32+32 = 4128
    per_layer = 64 + 3168 + 1056 + 64 + 4224 + 4128  # 12,704
    total = 2080 + 512 + 2 * per_layer + 64  # 28,064 (the head is the tied wte)
    gpt2 = GPT2LM(65, 32, 2, 4, 16)
    assert gpt2.num_parameters() == total == 28_064
    assert matmul_parameters(gpt2) == total - 512, "the position table is only looked up"
    fpt = flops_per_token(matmul_parameters(gpt2), n_layers=2, n_heads=4, head_dim=8, seq_len=16)
    assert fpt == 6 * 27_552 + 12 * 2 * 4 * 8 * 16 == 177_600
    assert mfu(fpt, 1e6, 312e12) == pytest.approx(177_600e6 / 312e12)  # 1M tokens/s on an A100: 0.0569%
    assert mfu(fpt, 1e6, None) is None
    # an untied Llama: the input embedding is only looked up, the head is a matrix multiply
    llama = LlamaStyleLM(65, 32, 2, 4, 2, d_ff=64, max_len=16, tie=False)
    # per layer: 2 norms 64 + wq 1024 + wk 512 + wv 512 + wo 1024 + QK-norm 16 + SwiGLU 3·32·64 = 6144
    assert llama.num_parameters() == 2080 + 2080 + 2 * 9296 + 32 == 22_784
    assert matmul_parameters(llama) == 22_784 - 2080
    tied = LlamaStyleLM(65, 32, 2, 4, 2, d_ff=64, max_len=16, tie=True)
    assert matmul_parameters(tied) == tied.num_parameters() == 20_704


def test_peak_flops_table_and_precision_rule():
    assert peak_flops("NVIDIA H100 80GB HBM3") == ("H100 SXM", 989e12)
    assert peak_flops("NVIDIA H100 PCIe") == ("H100 PCIe", 756e12)
    assert peak_flops("NVIDIA H200") == ("H200 SXM", 989e12)
    assert peak_flops("NVIDIA A100-SXM4-40GB") == ("A100", 312e12)
    assert peak_flops("NVIDIA L4") == ("L4", 121e12) and peak_flops("NVIDIA L40S") == ("L40S", 362e12)
    assert peak_flops("NVIDIA A10") == ("A10", 125e12)
    assert peak_flops("Tesla T4") == ("T4 (fp16)", 65e12)
    assert peak_flops("Tesla V100-SXM2-16GB") == ("V100 (fp16)", 125e12), "no bf16 on a V100: its fp16 peak"
    assert peak_flops("NVIDIA A10G") is None and peak_flops("some new GPU") is None
    assert autocast_dtype((7, 5)) == torch.float16, "T4: fp16 + GradScaler, even if bf16 is 'supported'"
    assert autocast_dtype((8, 0)) == autocast_dtype((9, 0)) == torch.bfloat16
    cpu = choose_device("cpu")
    assert cpu.amp_dtype is None and cpu.peak is None and not cpu.needs_scaler and cpu.precision == "fp32"
    with pytest.raises(ValueError, match="device must be"):
        choose_device("tpu")


@pytest.mark.gpu
def test_cuda_device_precision_and_memory():
    setup = choose_device("cuda")
    cap = torch.cuda.get_device_capability()
    assert setup.device == torch.device("cuda", torch.cuda.current_device()) and setup.capability == cap
    assert setup.amp_dtype == autocast_dtype(cap) and setup.needs_scaler == (cap < (8, 0))
    assert memory_bytes(setup) == torch.cuda.get_device_properties(setup.device).total_memory > 2**30
    print(f"{setup.describe()}; peak known: {setup.peak}")
    with setup.autocast():
        y = torch.ones(8, 8, device=setup.device) @ torch.ones(8, 8, device=setup.device)
    assert y.dtype == setup.amp_dtype, "matmuls run in the autocast dtype"


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="reads the kernel's own count (Linux)")
def test_memory_of_the_cpu_is_the_machines():
    kib = int(re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text()).group(1))
    assert memory_bytes(choose_device("cpu")) == pytest.approx(kib * 1024, rel=0.01)


def test_cpu_name_reads_the_model_name_or_falls_back(tmp_path):
    """The one CPU name of the timing records (benchmarks/, scripts/time_lessons.py): Linux's model name line,
    else what platform reports when the file is missing or has no such line."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n")
    assert cpu_name(info) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    info.write_text("processor\t: 0\n")
    fallback = platform.processor() or platform.machine()
    assert cpu_name(info) == fallback and cpu_name(tmp_path / "missing") == fallback
