"""The fast layer: an explicit, opt-in transformation of a trained model for decoding.

    fast_model = fast.prepare(model)              # a transformed copy; model itself is not changed
    out = fast.generate(fast_model, idx, 128)     # the same tokens as modern_block.generate(model, idx, 128)

The plain model files never import this module, and ``modern_block.generate`` stays the plain loop.
``prepare`` applies, at that moment and on a copy, what production engines do at load time, in three steps
that can each be switched on alone and measured (lesson 10 measures them on SmolLM2-135M):

1. **Fused projections** (``fused``, ``fuse=True``): every ``GQAttention`` and ``SwiGLU`` module is swapped
   for a fused version whose one matrix is the stacked originals: 4 matrix multiplications per layer instead of 7.
2. **A static cache** (``static_cache``, ``static_cache=True``, the default when compiling): fixed-shape buffers
   and a position tensor, behind the cache interface the plain attention already calls, so the model's own
   forward runs every step on the same shapes. In eager mode it costs a few operators per layer (the mask over
   the whole buffer), so without a compiler the plain ``KVCache`` is the faster choice.
3. **A compiled decode step** (``compile=True``, needs the static cache): ``torch.compile`` of the one-token step
   (full graph, static shapes) fuses each layer's small element-wise ops into a few kernels and takes Python
   out of the layer loop.

Beside the steps, ``weights`` ("fp32", "bf16", "int8", "w8a8" or "int4"; ``weights.py``, ``w8a8.py``, ``int4.py``)
stores the matrices in fewer bytes, which lowers the floor itself: the residual stream and the cache stay in the
model's dtype; "w8a8" also rounds each matrix's input to int8, per token, and multiplies integers; "int4" stores the
layers' weights in half a byte each (groups of 32 with a scale and an offset, as llama.cpp's Q4_1).

The rule: any model built on ``decoder.DecoderLM`` (GPT2LM, LlamaStyleLM with GQA or MLA and any RoPE
scaling, the ladder's models) is accepted; the fast layer fuses ``GQAttention`` and ``SwiGLU`` and leaves every
other module as it is. Apart from the fused projections nothing of the model is re-implemented here, so a model
feature added to the model files works in the fast layer too. Measured gains: ``benchmarks/README.md``. The fast
model is a snapshot for inference: later changes to the original model do not reach it.
"""

import copy
import math
from collections.abc import Callable

import torch
import torch.nn as nn

from ..decoder import DecoderLM
from ..generate import check_request, next_token
from ..kv_cache import KVCache
from ..validate import positive_int, token_ids
from .fused import fused_copy
from .static_cache import StaticKVCache
from .w8a8 import activation_ranges
from .weights import FORMATS, StoredEmbedding, convert_weights


class FastLM(nn.Module):
    """What ``prepare`` returns: ``model`` (a copy of the original, fused unless ``fuse=False``), the ``cache`` it
    decodes with (a ``StaticKVCache`` when ``static_cache``, else a ``KVCache``), and ``step``, the one-token step
    (compiled by ``compile_step``).

    ``forward(idx)`` runs tokens idx [B, T] after those the cache holds and returns logits [B, T, V];
    ``step(tok)`` runs one token per sequence, tok [B, 1], and returns logits [B, V].
    """

    def __init__(self, model: DecoderLM, static_cache: bool = True):
        super().__init__()
        self.model, self.static_cache = model, static_cache
        self.cache: KVCache | None = None
        self.compiled_step: Callable[[torch.Tensor], torch.Tensor] | None = None  # set by ``compile_step``

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the residual stream and the cache (the model's own, whatever format its weights are in)."""
        emb = self.model.emb
        return emb.dtype if isinstance(emb, StoredEmbedding) else emb.weight.dtype

    @property
    def compiled(self) -> bool:
        return self.compiled_step is not None

    @property
    def V(self) -> int:
        return self.model.V

    @property
    def max_len(self) -> int:
        return self.model.max_len

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.capacity

    def setup_cache(self, batch: int, capacity: int) -> None:
        """A new, empty cache of ``capacity`` positions (its buffers are allocated by the first forward)."""
        positive_int("batch", batch)
        positive_int("capacity", capacity)
        if capacity > self.max_len:
            raise ValueError(f"capacity ({capacity}) must not exceed max_len ({self.max_len})")
        n_layers = len(self.model.blocks)
        with torch.inference_mode():  # inference tensors, as every step's: the compiled step's guards hold
            self.cache = (StaticKVCache(n_layers, capacity, self.model.emb.weight.device) if self.static_cache
                          else KVCache(n_layers, capacity))

    @torch.inference_mode()
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: [B, T] token ids after the ones already cached. Returns logits [B, T, V]."""
        if self.cache is None:
            raise ValueError("no static cache: call setup_cache(batch, capacity) first (fast.generate does)")
        if int(self.cache.length) + idx.shape[1] > self.capacity:
            raise ValueError(f"the static cache holds at most {self.capacity} tokens; {int(self.cache.length)} + "
                             f"{idx.shape[1]} new would exceed it")
        return self.model(idx, self.cache)

    def eager_step(self, tok: torch.Tensor) -> torch.Tensor:
        """The decode step: one token per sequence, tok [B, 1], after the cached ones -> logits [B, V]."""
        return self.model(tok, self.cache)[:, -1]

    @torch.inference_mode()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """``eager_step``, or the compiled step after ``compile_step``. The compiled graph is guarded on its
        input's strides and on whether it is an inference tensor, and a failed guard compiles the step again
        (seconds to minutes): so tok is first copied to a contiguous inference tensor where it is not one (a
        slice of a prompt, a tensor made outside inference mode)."""
        if self.compiled_step is None:
            return self.eager_step(tok)
        if not tok.is_inference() or tok.stride() != (1, 1):
            tok = tok.clone(memory_format=torch.contiguous_format)  # [B, 1]
        return self.compiled_step(tok)

    def compile_step(self, mode: str | None = None, options: dict | None = None) -> "FastLM":
        """Compile the one-token step with ``torch.compile`` (full graph, static shapes); ``mode`` and ``options``
        go to ``torch.compile``. The first step of each cache shape pays the compile time (tens of seconds on a
        laptop CPU). Every fast model compiles the same step function, and torch refuses to compile one function
        more than 8 times in a process: to compile a ninth model, call ``torch.compiler.reset()`` first."""
        if not self.static_cache:
            raise ValueError("compiling the decode step needs the static cache (its shapes do not change)")
        self.compiled_step = torch.compile(self.eager_step, fullgraph=True, dynamic=False, mode=mode,
                                           options=options)
        return self


# Inductor options for the decode step. cpp_wrapper: the graph's launcher is generated C++, not Python
# (measured ~8% off each CPU step, and one C++ file to build instead of one per kernel: a third less
# compile time); compile_threads 1: no pool of compile workers to start for that one file.
COMPILE_OPTIONS = {"cpp_wrapper": True, "compile_threads": 1}


def prepare(model: DecoderLM, compile: bool = True, mode: str | None = None, options: dict | None = None, *,
            fuse: bool = True, static_cache: bool | None = None, weights: str = "fp32",
            calibration: torch.Tensor | None = None) -> FastLM:
    """A fast copy of ``model`` for decoding: fused q/k/v and gate/up (unless ``fuse=False``), its matrices in the
    format ``weights`` ("fp32": as loaded, "bf16", "int8", "w8a8", "int4": ``weights.convert_weights``), a static
    cache (``static_cache``, by default when compiling) and, unless ``compile=False``, a compiled decode step
    (``mode`` and ``options`` go to ``torch.compile``; ``options`` defaults to ``COMPILE_OPTIONS``). ``model``
    itself is not changed. "w8a8" needs ``calibration``, token ids [B, T] of representative text: the activations'
    ranges on it set each matrix's smoothing (``w8a8.py``)."""
    if not isinstance(model, DecoderLM):
        raise TypeError("fast.prepare takes a model built on modern_block.decoder.DecoderLM (GPT2LM, LlamaStyleLM, "
                        f"the ladder's models), got {type(model).__name__}")
    if weights not in FORMATS:
        raise ValueError(f"weights must be one of {FORMATS}, got {weights!r}")
    if (weights == "w8a8") != (calibration is not None):
        raise ValueError("calibration (token ids [B, T] of representative text) is required with weights='w8a8' "
                         f"and used by it alone; got weights={weights!r} and "
                         f"{'no calibration' if calibration is None else 'calibration'}")
    copied = fused_copy(model) if fuse else copy.deepcopy(model).requires_grad_(False).eval()
    ranges = None
    if calibration is not None:
        try:
            token_ids(calibration, model.V, model.max_len)
        except (TypeError, ValueError) as err:
            raise type(err)(f"calibration: {err}") from None
        ranges = activation_ranges(copied, calibration)
    convert_weights(copied, weights, ranges)
    fast_model = FastLM(copied, static_cache=compile if static_cache is None else static_cache)
    return fast_model.compile_step(mode, COMPILE_OPTIONS if options is None else options) if compile else fast_model


def cache_capacity(needed: int, max_len: int, multiple: int = 64) -> int:
    """Round the positions a request needs up to a multiple of ``multiple`` (at most max_len), so that
    requests of similar lengths share one compiled step."""
    return min(max_len, multiple * math.ceil(needed / multiple))


@torch.inference_mode()
def generate(fast_model: FastLM, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``modern_block.generate`` for a ``FastLM``: the same arguments, the same tokens.

    The prompt runs once through the (uncompiled) fast model, then one ``step`` per new token.
    """
    if not isinstance(fast_model, FastLM):
        raise TypeError(f"fast.generate takes the model fast.prepare returns, got {type(fast_model).__name__}")
    needed = check_request(fast_model, idx, max_new_tokens, temperature, top_k)
    token_ids(idx, fast_model.V, fast_model.max_len)  # checked once: generated ids are always in range
    w = fast_model.model.emb.weight
    if idx.device != w.device:
        raise ValueError(f"idx is on {idx.device} but the model is on {w.device}: move one of them")
    capacity = cache_capacity(needed, fast_model.max_len)
    cache = fast_model.cache
    if isinstance(cache, StaticKVCache) and cache.fits(idx.shape[0], capacity, fast_model.dtype, w.device):
        cache.reset()  # the same buffers, overwritten: the compiled step's inputs do not change
    else:
        fast_model.setup_cache(idx.shape[0], capacity)
    logits = fast_model(idx)[:, -1]  # prefill: [B, V]
    new = [next_token(logits, temperature, top_k, generator)]  # [B, 1] per new token

    def advance():
        new.append(next_token(fast_model.step(new[-1]), temperature, top_k, generator))

    if max_new_tokens > 1:
        advance()  # the first step checks the compiled graph's guards (and compiles, once per cache shape)
    # Every later step has the same shapes, dtypes and buffers as the first, so its guards cannot fail:
    # skip them (the condition torch.compiler.set_stance documents for skip_guard_eval_unsafe).
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=fast_model.compiled):
        for _ in range(max_new_tokens - 2):
            advance()
    return torch.cat([idx, *new], dim=1)
