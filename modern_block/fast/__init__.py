"""The fast layer: an explicit, opt-in step that turns a trained model into a faster one for decoding, and the
tools that measure where decoding time goes. The model files never import it.

* ``fused``: step 1, ``fused_copy`` swaps every GQAttention and SwiGLU for a fused version;
* ``static_cache``: step 2, ``StaticKVCache``, fixed-shape buffers behind the plain cache interface;
* ``decoding``: ``prepare`` (the steps together, and step 3: a compiled decode step) and ``generate``;
* ``weights``: bf16 and int8 (per-channel scales) weight-only formats, ``prepare(model, weights="int8")``;
* ``w8a8``: int8 weights and int8 activations (per token, smoothed), integer dot products,
  ``prepare(model, weights="w8a8", calibration=ids)``;
* ``int4``: 4-bit weights in groups of 32 (llama.cpp's Q4_1 blocks), the head in w8a8's 8 bits,
  ``prepare(model, weights="int4")``;
* ``agreement``: when two numerics must give the same greedy tokens (the margin rule);
* ``profiling``: operators per call and their time, the bytes of weights a decoded token reads, memory bandwidth.
"""

from .agreement import (
    Agreement,
    DecodeComparison,
    cached_logits,
    check_agreement,
    compare_decodes,
    greedy_agreement,
    logit_error,
    new_token_logits,
)
from .decoding import COMPILE_OPTIONS, FastLM, cache_capacity, generate, prepare
from .fused import FusedGQAttention, FusedSwiGLU, fuse_linears, fused_copy
from .int4 import Int4Linear, dequantize_int4, quantize_int4
from .profiling import OpProfile, decode_step_seconds, decode_weight_bytes, memory_bandwidth, profile_ops
from .static_cache import StaticKVCache, StaticLayerCache
from .w8a8 import W8A8Linear, activation_ranges, quantize_activations
from .weights import FORMATS, convert_weights, dequantize_int8, quantize_int8

__all__ = ["prepare", "generate", "FastLM", "cache_capacity", "COMPILE_OPTIONS",
           "fused_copy", "fuse_linears", "FusedGQAttention", "FusedSwiGLU", "StaticKVCache", "StaticLayerCache",
           "profile_ops", "OpProfile", "decode_weight_bytes", "memory_bandwidth",
           "decode_step_seconds", "FORMATS", "Agreement", "greedy_agreement", "check_agreement", "logit_error",
           "DecodeComparison", "compare_decodes", "new_token_logits", "cached_logits",
           "convert_weights", "quantize_int8", "dequantize_int8", "W8A8Linear", "activation_ranges",
           "quantize_activations", "Int4Linear", "quantize_int4", "dequantize_int4"]
