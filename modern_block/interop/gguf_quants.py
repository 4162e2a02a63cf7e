"""GGUF's tensor formats, dequantized by hand: the bytes of a block -> float32 weights.

A quantized row is cut into blocks of 32 consecutive weights; each block is stored as a few bytes of scale
(and minimum) followed by the weights' integer codes. Two of llama.cpp's formats, byte by byte:

    Q8_0  34 bytes per block   [ d: fp16 (2 B) | q_0 ... q_31: int8 (32 B) ]            w_j = d · q_j
    Q4_1  20 bytes per block   [ d: fp16 (2 B) | m: fp16 (2 B) | 16 B of 4-bit codes ]  w_j = d · q_j + m
          byte k (k = 0..15) holds two codes: its low nibble is q_k, its high nibble is q_{k+16}

So Q8_0 costs 8.5 bits per weight and Q4_1 5 bits (a float32 weight costs 32). F32 and F16 tensors are
stored as they are. The arithmetic is done in float32, in the order written above (d · q first, then + m),
which is also what ``gguf.quants.dequantize`` does: the two agree bit for bit. Other types (the K-quants
Q4_K, Q6_K, ..., the I-quants) are refused with their name.
"""

import numpy as np
import torch

BLOCK = 32  # weights per block, for both formats
Q8_0_BYTES = 2 + BLOCK  # fp16 scale + 32 int8 codes
Q4_1_BYTES = 2 + 2 + BLOCK // 2  # fp16 scale + fp16 minimum + 32 codes of 4 bits
SUPPORTED_TYPES = ("F32", "F16", "Q8_0", "Q4_1")


def _blocks(raw: torch.Tensor, block_bytes: int, what: str) -> torch.Tensor:
    """raw: uint8 [..., bytes] -> [n_blocks, block_bytes]."""
    if raw.dtype != torch.uint8:
        raise TypeError(f"{what}: raw must be a uint8 tensor of the stored bytes, got {raw.dtype}")
    if raw.shape[-1] % block_bytes:
        raise ValueError(f"{what}: a row of {raw.shape[-1]} bytes is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes)


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 bytes uint8 [rows, 34·n] -> float32 [rows, 32·n]: w = d · q."""
    blocks = _blocks(raw, Q8_0_BYTES, "Q8_0")  # [n_blocks, 34]
    d = blocks[:, :2].contiguous().view(torch.float16).float()  # [n_blocks, 1]: the block's scale
    q = blocks[:, 2:].contiguous().view(torch.int8).float()  # [n_blocks, 32]: signed codes -128..127
    return (d * q).reshape(*raw.shape[:-1], -1)


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 bytes uint8 [rows, 20·n] -> float32 [rows, 32·n]: w = d · q + m."""
    blocks = _blocks(raw, Q4_1_BYTES, "Q4_1")  # [n_blocks, 20]
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # [n_blocks, 1]: scale
    m = blocks[:, 2:4].contiguous().view(torch.float16).float()  # [n_blocks, 1]: minimum
    packed = blocks[:, 4:]  # [n_blocks, 16]: two codes per byte
    q = torch.cat([packed & 0x0F, packed >> 4], dim=1).float()  # [n_blocks, 32]: low nibbles are q_0..q_15
    return (d * q + m).reshape(*raw.shape[:-1], -1)


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...], name: str = "tensor") -> torch.Tensor:
    """A GGUF tensor's stored data (as ``gguf.GGUFReader`` maps it) -> float32 torch tensor of ``shape``.

    ``shape`` is in PyTorch's order ([out, in] for a matrix); ``name`` only goes into error messages.
    """
    if type_name not in SUPPORTED_TYPES:
        raise ValueError(f"{name} is stored as {type_name}: the course reads {', '.join(SUPPORTED_TYPES)} "
                         "(re-quantize the file to Q8_0 or Q4_1 with llama.cpp's llama-quantize, or load it with "
                         "transformers' GGUF support, which dequantizes more types)")
    raw = torch.from_numpy(np.array(data))  # a copy: the reader's arrays are read-only views of the file
    if type_name == "F32":
        out = raw.float()
    elif type_name == "F16":
        out = raw.float()  # fp16 -> fp32 is exact
    elif type_name == "Q8_0":
        out = dequantize_q8_0(raw)
    else:
        out = dequantize_q4_1(raw)
    needed = int(np.prod(shape))
    if out.numel() != needed:
        raise ValueError(f"{name}: {out.numel():,} weights stored, its shape {list(shape)} needs {needed:,}")
    return out.reshape(shape)
