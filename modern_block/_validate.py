"""Argument checks shared by the modules: cheap, and the error names the argument and the rule."""

import torch


def positive_int(name: str, value) -> int:
    """Return ``value`` if it is a positive int, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def divisible(name: str, value: int, by_name: str, by: int) -> None:
    """Raise unless ``value`` is a multiple of ``by``."""
    if value % by != 0:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")


def even(name: str, value: int, why: str) -> None:
    if value % 2 != 0:
        raise ValueError(f"{name} must be even {why}, got {value}")


def token_ids(idx, vocab_size: int, max_len: int | None, offset: int = 0) -> None:
    """Check a ``[B, T]`` batch of token ids: integer dtype, 2-D, fits ``max_len``, ids in ``[0, V)``.

    The range check runs only for CPU tensors in eager mode: on a GPU it would force a
    synchronisation on every step, and under ``torch.compile`` it would split the graph in two
    (the embedding lookup still fails there, with a less friendly message).
    """
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"idx must be a torch.Tensor of token ids, got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.dtype.is_complex:
        raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape [batch, seq_len], got {list(idx.shape)}")
    T = idx.shape[1]
    if T == 0:
        raise ValueError("idx must hold at least one token per sequence")
    if max_len is not None and offset + T > max_len:
        raise ValueError(
            f"sequence length {offset + T} (idx.shape[1]={T}, cache offset {offset}) exceeds max_len={max_len}"
        )
    if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
        lo, hi = (int(t) for t in torch.aminmax(idx))
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token ids must lie in [0, V={vocab_size}), got min {lo}, max {hi}")
