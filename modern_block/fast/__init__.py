"""The fast layer: an explicit, opt-in step that turns a trained model into a faster one for decoding, and the
tools that measure where decoding time goes. The model files never import it.

* ``decoding``: ``prepare`` (fused projections, a static cache, a compiled decode step) and ``generate``;
* ``profiling``: operators per call and their time, the bytes of weights a decoded token reads, memory bandwidth.
"""

from .decoding import COMPILE_OPTIONS, FastLM, cache_capacity, fuse_linears, generate, prepare
from .profiling import OpProfile, decode_weight_bytes, memory_bandwidth, profile_ops

__all__ = ["prepare", "generate", "FastLM", "fuse_linears", "cache_capacity", "COMPILE_OPTIONS",
           "profile_ops", "OpProfile", "decode_weight_bytes", "memory_bandwidth"]
