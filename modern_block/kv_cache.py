"""The KV cache: what decoding keeps per token so it never recomputes the past, and what it costs.

Per token and sequence, a GQA/MQA/MHA model caches one key and one value of size d_h per KV head
and layer:    bytes/token = 2 · L · n_kv · d_h · bytes_per_elem
An MLA model caches one latent of size d_c and one shared RoPE key of size d_R per layer:
              bytes/token = L · (d_c + d_R) · bytes_per_elem

The buffers are allocated once, for a fixed capacity, and written in place: appending never
copies the past (``torch.cat`` every step would copy the whole cache each token).
"""

import torch

from ._validate import positive_int


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    """2 (K and V) · layers · KV heads · head dim · bytes per element, for one sequence."""
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("bytes_per_elem", bytes_per_elem)):
        positive_int(name, value)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem


def mla_cache_bytes_per_token(n_layers: int, kv_latent_dim: int, rope_dim: int, bytes_per_elem: int = 2) -> int:
    """layers · (latent dim d_c + RoPE key dim d_R) · bytes per element, for one sequence."""
    for name, value in (("n_layers", n_layers), ("kv_latent_dim", kv_latent_dim), ("rope_dim", rope_dim),
                        ("bytes_per_elem", bytes_per_elem)):
        positive_int(name, value)
    return n_layers * (kv_latent_dim + rope_dim) * bytes_per_elem


class LayerCache:
    """Preallocated buffers of one attention layer, each [B, ..., capacity, ...] along ``seq_dim``.

    ``append`` writes the new entries after the ones already held and returns views of everything
    held so far, plus the number of tokens that were there before (the position offset).
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]], seq_dim: int, dtype=None, device=None):
        self.seq_dim = seq_dim
        self.buffers = {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}
        self.capacity = next(iter(shapes.values()))[seq_dim]
        self.length = 0

    def append(self, *new: torch.Tensor):
        start, T = self.length, new[0].shape[self.seq_dim]
        end = start + T
        if end > self.capacity:
            raise ValueError(f"the cache holds at most {self.capacity} tokens; {start} + {T} new would exceed it")
        held = []
        for buf, x in zip(self.buffers.values(), new, strict=True):
            if x.shape[0] != buf.shape[0]:
                raise ValueError(f"batch size {x.shape[0]} does not match the cache's {buf.shape[0]}")
            buf.narrow(self.seq_dim, start, T).copy_(x)
            held.append(buf.narrow(self.seq_dim, 0, end))
        self.length = end
        return (*held, start)

    def nbytes(self) -> int:
        """Bytes allocated by this layer's buffers."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


def kv_layer_cache(batch, n_kv_heads, head_dim, capacity, v_head_dim=None, dtype=None, device=None) -> LayerCache:
    """K and V buffers of shape [B, n_kv, capacity, d_h] (V may have its own head dim)."""
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    shapes = {"k": (batch, n_kv_heads, capacity, head_dim), "v": (batch, n_kv_heads, capacity, v_head_dim)}
    return LayerCache(shapes, seq_dim=2, dtype=dtype, device=device)


def mla_layer_cache(batch, kv_latent_dim, rope_dim, capacity, dtype=None, device=None) -> LayerCache:
    """MLA's buffers: latent [B, capacity, d_c] and shared RoPE key [B, capacity, d_R], nothing per head."""
    shapes = {"latent": (batch, capacity, kv_latent_dim), "k_rope": (batch, capacity, rope_dim)}
    return LayerCache(shapes, seq_dim=1, dtype=dtype, device=device)


class KVCache:
    """One ``LayerCache`` per layer. Build it with ``model.new_cache(batch, capacity)``."""

    def __init__(self, layers):
        self.layers = list(layers)

    @property
    def length(self) -> int:
        """Tokens held so far (the position of the next token)."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def nbytes(self) -> int:
        """Bytes allocated by all layers' buffers."""
        return sum(layer.nbytes() for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i) -> LayerCache:
        return self.layers[i]


def new_model_cache(model, batch: int, capacity: int, dtype=None, device=None) -> KVCache:
    """An empty cache for a model whose ``blocks`` each have an ``attn`` with ``new_cache`` (every LM
    here): ``batch`` sequences of up to ``capacity`` tokens, in the model's dtype and device by default."""
    positive_int("batch", batch)
    positive_int("capacity", capacity)
    ref = model.head.weight
    dtype, device = dtype or ref.dtype, device or ref.device
    return KVCache(blk.attn.new_cache(batch, capacity, dtype, device) for blk in model.blocks)
