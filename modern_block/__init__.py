"""modern_block: the components of the modern transformer block, from the GPT-2 baseline to Llama.

Modules in course order: gpt2 (the 2019 baseline), rmsnorm, ffn (SwiGLU), rope, attention
(MHA/MQA/GQA), kv_cache, mla (multi-head latent attention), llama (Block, LlamaStyleLM), generate,
presets, compare (layer-by-layer comparison of two models). ``modern_block.hf`` converts to and
from Hugging Face models (imports transformers lazily); ``modern_block.data`` and ``modern_block.train``
load the text and train the models; ``modern_block.checks``, ``exercises`` and ``grade`` serve the
classroom assignments.
"""

from .attention import GQAttention, causal_attention
from .compare import compare_layers
from .ffn import GeluMLP, SwiGLU, swiglu_hidden_dim
from .generate import generate
from .gpt2 import GPT2LM, CausalSelfAttention, GPT2Block
from .kv_cache import KVCache, LayerCache, kv_cache_bytes_per_token, mla_cache_bytes_per_token
from .llama import Block, LlamaStyleLM
from .mla import MLAConfig, MLAttention
from .params import count_parameters, parameter_breakdown
from .presets import PRESETS, ModelPreset, cache_size
from .rmsnorm import RMSNorm
from .rope import (
    apply_rope,
    apply_rope_interleaved,
    interleaved_to_half_split,
    permute_qk_weight,
    rope_cache,
    rope_frequencies,
)

__all__ = [
    "RMSNorm", "SwiGLU", "GeluMLP", "swiglu_hidden_dim",
    "rope_cache", "rope_frequencies", "apply_rope", "apply_rope_interleaved", "interleaved_to_half_split",
    "permute_qk_weight",
    "GQAttention", "causal_attention", "MLAttention", "MLAConfig", "Block", "LlamaStyleLM",
    "GPT2LM", "GPT2Block", "CausalSelfAttention",
    "KVCache", "LayerCache", "kv_cache_bytes_per_token", "mla_cache_bytes_per_token",
    "PRESETS", "ModelPreset", "cache_size",
    "generate", "count_parameters", "parameter_breakdown", "compare_layers",
]
__version__ = "0.1.0"
