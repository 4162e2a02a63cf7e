"""The KV cache: what decoding keeps per token so it never recomputes the past, and what it costs.

Per token and sequence, a GQA/MQA/MHA model caches one key and one value of size d_h per KV head
and layer:    bytes/token = 2 · L · n_kv · d_h · bytes_per_elem
An MLA model caches one latent of size d_c and one shared RoPE key of size d_R per layer:
              bytes/token = L · (d_c + d_R) · bytes_per_elem

Each layer's buffers are allocated once, for a fixed capacity, at the first append (in the shape,
dtype and device of what the attention layer hands over), and then written in place: appending
never copies the past, as ``torch.cat`` every step would.
"""

from collections.abc import Sequence

import torch

from .validate import positive_int, positive_ints


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int = 2) -> int:
    """2 (K and V) · layers · KV heads · head dim · bytes per element, for one sequence."""
    positive_ints(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, bytes_per_elem=bytes_per_elem)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem


def mla_cache_bytes_per_token(n_layers: int, kv_latent_dim: int, rope_dim: int, bytes_per_elem: int = 2) -> int:
    """layers · (latent dim d_c + RoPE key dim d_R) · bytes per element, for one sequence."""
    positive_ints(n_layers=n_layers, kv_latent_dim=kv_latent_dim, rope_dim=rope_dim, bytes_per_elem=bytes_per_elem)
    return n_layers * (kv_latent_dim + rope_dim) * bytes_per_elem


class LayerCache:
    """The cache of one attention layer: up to ``capacity`` tokens of whatever the layer stores
    (K and V of shape [B, n_kv, T, d_h]; MLA's latent [B, T, d_c] and RoPE key [B, T, d_R]).
    The sequence runs along the second-to-last dimension of every stored tensor.
    """

    def __init__(self, capacity: int):
        self.capacity = positive_int("capacity", capacity)
        self.buffers: list[torch.Tensor] = []  # one [..., capacity, dim] buffer per stored tensor
        self.length: int | torch.Tensor = 0  # tokens held so far (the fast layer's static cache: a 0-dim tensor)

    def append(self, *new: torch.Tensor):
        """Store T new entries after those held; return views of everything held and the old length."""
        start, T = self.length, new[0].shape[-2]
        if start + T > self.capacity:
            raise ValueError(f"the cache holds at most {self.capacity} tokens; {start} + {T} new would exceed it")
        for buf, x in zip(self.buffers_for(new), new, strict=True):
            buf[..., start:start + T, :] = x
        self.length = start + T
        return (*(buf[..., :self.length, :] for buf in self.buffers), start)

    def buffers_for(self, new: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """The buffers that ``new`` is written into: allocated at the first call (room for ``capacity`` tokens,
        in the shape, dtype and device of ``new``), then checked to match it tensor for tensor."""
        if not self.buffers:
            self.buffers = [x.new_zeros(*x.shape[:-2], self.capacity, x.shape[-1]) for x in new]
        if len(new) != len(self.buffers):
            raise ValueError(f"append got {len(new)} tensors but this cache stores {len(self.buffers)} per token")
        for buf, x in zip(self.buffers, new, strict=True):
            if x.shape[:-2] != buf.shape[:-2] or x.shape[-1] != buf.shape[-1]:
                raise ValueError(f"cache entries of shape {list(x.shape)} do not match the cache's "
                                 f"{list(buf.shape[:-2])} + [T, {buf.shape[-1]}] (batch size or heads changed?)")
        return self.buffers

    def nbytes(self) -> int:
        """Bytes allocated by this layer's buffers (0 before the first append)."""
        return sum(b.numel() * b.element_size() for b in self.buffers)


class KVCache:
    """One ``LayerCache`` per layer: ``model(idx, cache)`` reads and extends it."""

    def __init__(self, n_layers: int, capacity: int):
        positive_int("n_layers", n_layers)
        self.layers: Sequence[LayerCache] = [LayerCache(capacity) for _ in range(n_layers)]

    @property
    def length(self) -> int | torch.Tensor:
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
