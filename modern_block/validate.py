"""Argument checks shared by the modules: cheap, and the error names the argument and the rule."""

import torch


def finite_matrix(name: str, w) -> None:
    """Raise unless ``w`` is a finite 2-D floating-point tensor [n_out, n_in]: a weight a format can round."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"{name} must be a 2-D floating-point tensor [n_out, n_in], got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    if not torch.isfinite(w).all():
        raise ValueError(f"{name} must hold finite numbers only (inf or nan has no quantization scale)")


def positive_int(name: str, value) -> int:
    """Return ``value`` if it is a positive int, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def positive_number(name: str, value) -> float:
    """Return ``value`` if it is a real number > 0 (an epsilon, a factor), else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return value


def non_negative_number(name: str, value) -> float:
    """Return ``value`` if it is a real number >= 0 (a factor where 0 means "not given"), else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return value


def positive_ints(**values) -> None:
    """``positive_int`` for each keyword: ``positive_ints(V=V, d=d)``."""
    for name, value in values.items():
        positive_int(name, value)


def dropout_rate(value) -> float:
    """Return ``value`` if it is a dropout probability in [0, 1), else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {value!r}")
    return value


def divisible(name: str, value: int, by_name: str, by: int) -> None:
    """Raise unless ``value`` is a multiple of ``by``."""
    if value % by != 0:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")


def even(name: str, value: int, why: str) -> None:
    if value % 2 != 0:
        raise ValueError(f"{name} must be even {why}, got {value}")


def token_ids(idx, vocab_size: int, max_len: int | None, offset=0, cache=None, n_layers: int = 0) -> None:
    """Check a ``[B, T]`` batch of token ids: int64/int32, 2-D, fits ``max_len`` after the ``offset`` tokens a
    cache holds, ids in ``[0, V)``; and that a KV ``cache``, if given, has one layer per block (``n_layers``).

    The range check runs only for CPU tensors in eager mode: on a GPU it would force a
    synchronisation on every step, and under ``torch.compile`` it would split the graph in two
    (the embedding lookup still fails there, with a less friendly message). For the same reason an
    ``offset`` held in a tensor (the fast layer's static cache) is not checked here: its owner checks
    the whole request once.
    """
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"idx must be a torch.Tensor of token ids, got {type(idx).__name__}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"idx must hold integer token ids of dtype torch.long (int64) or int32, got {idx.dtype}")
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape [batch, seq_len], got {list(idx.shape)}")
    T = idx.shape[1]
    if T == 0:
        raise ValueError("idx must hold at least one token per sequence")
    if max_len is not None and isinstance(offset, int) and offset + T > max_len:
        raise ValueError(
            f"sequence length {offset + T} (idx.shape[1]={T}, cache offset {offset}) exceeds max_len={max_len}"
        )
    if cache is not None and len(cache) != n_layers:
        raise ValueError(f"the cache has {len(cache)} layers but the model has {n_layers}: build it with "
                         f"KVCache(n_layers={n_layers}, capacity=...)")
    if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
        lo, hi = (int(t) for t in torch.aminmax(idx))
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token ids must lie in [0, V={vocab_size}), got min {lo}, max {hi}")


def check_positions(positions: torch.Tensor, idx: torch.Tensor, max_len: int) -> None:
    """Explicit positions: integer, [T] or [B, T] like idx, each in [0, max_len) (a negative index
    would silently read the end of the RoPE table)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"positions must be an int64 or int32 tensor, got {getattr(positions, 'dtype', positions)}")
    if positions.shape not in (idx.shape[1:], idx.shape):
        raise ValueError(f"positions must have shape [T] or [B, T] = {list(idx.shape)}, got {list(positions.shape)}")
    if positions.device.type == "cpu" and not torch.compiler.is_compiling():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= max_len:
            raise ValueError(f"positions must lie in [0, max_len={max_len}), got min {lo}, max {hi}")
