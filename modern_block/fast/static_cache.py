"""Step 2 of the fast layer: a static cache, behind the interface the plain attention already calls.

``kv_cache.KVCache`` returns views of the tokens held so far, so their length grows by one every step, and it
counts tokens in a Python int. Both change the step from one token to the next: a compiler would see a new
shape and a new number each time. ``StaticKVCache`` (gpt-fast's recipe) keeps the same interface (``length``,
``cache[i].append(k, v) -> (k_all, v_all, past)``) with two differences:

* ``append`` returns the whole buffers, [..., capacity, dim], always the same shape; ``past`` tells the
  attention which slots are written (``causal.causal_attention`` masks every slot after a query's position);
* the position is a tensor on the model's device, advanced in place, so no number leaves the device.

Every decoding step then runs the same code on the same shapes, which is what lets ``torch.compile`` turn it
into one fixed graph (step 3, ``decoding``). Any attention that calls ``cache.append`` works with it: GQA (fused
or not), GPT-2's, MLA's latents.
"""

import torch

from ..kv_cache import KVCache, LayerCache
from ..validate import positive_int


class StaticLayerCache(LayerCache):
    """One layer's cache of ``capacity`` slots; the buffers are allocated by the first ``append`` (in the shape,
    dtype and device of what it stores) and written in place; ``length`` is a 0-dim tensor on ``device``."""

    def __init__(self, capacity: int, device=None):
        super().__init__(capacity)
        self.length: torch.Tensor = torch.zeros((), dtype=torch.long, device=device)  # tokens held so far

    def append(self, *new: torch.Tensor):
        """Write T new entries at slots length .. length + T - 1; return the whole buffers and the old length."""
        T = new[0].shape[-2]
        slots = self.length + torch.arange(T, device=self.length.device)  # [T]
        for buf, x in zip(self.buffers_for(new), new, strict=True):  # allocated and checked as the plain cache's
            buf.index_copy_(-2, slots, x)
        self.length += T  # in place: the same tensor, one step further
        return (*self.buffers, self.length - T)


class StaticKVCache(KVCache):
    """One ``StaticLayerCache`` per layer: ``model(idx, cache)`` reads and extends it, as a ``KVCache``."""

    def __init__(self, n_layers: int, capacity: int, device=None):
        positive_int("n_layers", n_layers)
        self.layers: list[StaticLayerCache] = [StaticLayerCache(capacity, device) for _ in range(n_layers)]

    @torch.inference_mode()  # its tensors are inference tensors (FastLM makes them so), changed only in that mode
    def reset(self) -> None:
        """Forget the tokens held (the buffers stay allocated, to be overwritten)."""
        for layer in self.layers:
            layer.length.zero_()

    def fits(self, batch: int, capacity: int, dtype: torch.dtype, device) -> bool:
        """Whether this cache can hold a new request as it is: the same capacity and, once allocated, buffers of
        this batch size, dtype and device."""
        if capacity != self.capacity or self.layers[0].length.device != torch.device(device):
            return False
        buffers = self.layers[0].buffers
        return not buffers or (buffers[0].shape[0], buffers[0].dtype) == (batch, dtype)
