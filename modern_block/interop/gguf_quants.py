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


def _blocks(raw: torch.Tensor, block_bytes: int, what: str) -> np.ndarray:
    """raw: uint8 [..., bytes] -> numpy [n_blocks, block_bytes] (a view of raw's memory when raw is on the CPU)."""
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8:
        got = raw.dtype if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise TypeError(f"{what}: raw must be a uint8 tensor of the stored bytes, got {got}")
    if raw.dim() == 0 or raw.shape[-1] % block_bytes:
        raise ValueError(f"{what}: a row of {raw.shape[-1] if raw.dim() else 0} bytes is not a whole number of "
                         f"{block_bytes}-byte blocks")
    return raw.detach().cpu().numpy().reshape(-1, block_bytes)


def _fp16_column(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 number in bytes start, start + 1 of every block -> float32 [n_blocks, 1]."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).astype(np.float32)


# The arithmetic runs in numpy, in place, one pass per step. On a CPU that is several times less work than the same
# formula as torch expressions (a new tensor per step and, with several threads, threads spinning while they wait).
def _q8_0(blocks: np.ndarray) -> np.ndarray:
    """uint8 [n_blocks, 34] -> float32 [n_blocks, 32]: w = d · q."""
    w = blocks[:, 2:].view(np.int8).astype(np.float32)  # [n_blocks, 32]: signed codes -128..127
    w *= _fp16_column(blocks, 0)  # times the block's scale d
    return w


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    """uint8 [n_blocks, 20] -> float32 [n_blocks, 32]: w = d · q + m."""
    packed = blocks[:, 4:]  # [n_blocks, 16]: two codes per byte
    w = np.empty((blocks.shape[0], BLOCK), np.float32)  # [n_blocks, 32]
    np.bitwise_and(packed, 0x0F, out=w[:, :16], casting="unsafe")  # low nibbles: q_0..q_15
    np.right_shift(packed, 4, out=w[:, 16:], casting="unsafe")  # high nibbles: q_16..q_31
    w *= _fp16_column(blocks, 0)  # times the step d (in float32, the product first) ...
    w += _fp16_column(blocks, 2)  # ... plus the minimum m
    return w


def dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 bytes uint8 [rows, 34·n] -> float32 [rows, 32·n]: w = d · q."""
    w = _q8_0(_blocks(raw, Q8_0_BYTES, "Q8_0"))  # [n_blocks, 32]
    return torch.from_numpy(w).reshape(*raw.shape[:-1], -1).to(raw.device)


def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """Q4_1 bytes uint8 [rows, 20·n] -> float32 [rows, 32·n]: w = d · q + m."""
    w = _q4_1(_blocks(raw, Q4_1_BYTES, "Q4_1"))  # [n_blocks, 32]
    return torch.from_numpy(w).reshape(*raw.shape[:-1], -1).to(raw.device)


QUANTIZED = {"Q8_0": (Q8_0_BYTES, _q8_0), "Q4_1": (Q4_1_BYTES, _q4_1)}  # type -> (bytes per block, dequantizer)


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...], name: str = "tensor") -> torch.Tensor:
    """A GGUF tensor's stored data (as ``gguf.GGUFReader`` maps it) -> float32 torch tensor of ``shape``.

    ``shape`` is in PyTorch's order ([out, in] for a matrix); ``name`` only goes into error messages. The
    quantized types are read straight from the reader's read-only map of the file (no copy of the bytes).
    """
    if type_name not in SUPPORTED_TYPES:
        raise ValueError(f"{name} is stored as {type_name}: the course reads {', '.join(SUPPORTED_TYPES)} "
                         "(re-quantize the file to Q8_0 or Q4_1 with llama.cpp's llama-quantize, or load it with "
                         "transformers' GGUF support, which dequantizes more types)")
    if type_name in QUANTIZED:
        block_bytes, by_hand = QUANTIZED[type_name]
        data = np.asarray(data)
        if data.dtype != np.uint8 or data.ndim == 0 or data.shape[-1] % block_bytes:
            raise ValueError(f"{name} ({type_name}): its data must be rows of whole {block_bytes}-byte blocks, got "
                             f"{data.dtype} {list(data.shape)}")
        out = torch.from_numpy(by_hand(data.reshape(-1, block_bytes)))
    else:
        out = torch.from_numpy(np.array(data, dtype=np.float32))  # a float32 copy (fp16 -> fp32 is exact)
    needed = int(np.prod(shape))
    if out.numel() != needed:
        raise ValueError(f"{name}: {out.numel():,} weights stored, its shape {list(shape)} needs {needed:,}")
    return out.reshape(shape)
