"""modern_block: the components of the modern transformer block, from the GPT-2 baseline to Llama.

The model, in course order (each file imports only torch and the files of earlier lessons):
decoder (the one skeleton every language model fills with its parts), gpt2 (the 2019 baseline, lesson 00),
rmsnorm (01), ffn (SwiGLU, 02), rope (03; its scalings, 09), attention and kv_cache (MHA/MQA/GQA and the cache,
04), mla (multi-head latent attention, 05), llama (Block, LlamaStyleLM, 07), generate; beside them validate
(argument checks), params (counting, initialisation) and presets (real models' attention facts). Around the
model, each part a subpackage that imports the ones before it:

* ``modern_block.fast``: the opt-in fast layer for decoding, and the tools that measure it;
* ``modern_block.interop``: Hugging Face models and checkpoints to and from the course's classes (transformers is
  imported lazily), and ``compare_layers`` to find where two models diverge;
* ``modern_block.training``: data, the trainer, its run folder and processes, the ladder and the experiments;
* ``modern_block.classroom``: checks, exercises, the grader, quizzes and widgets.

``python -m modern_block`` lists the command lines (train, compare, grade, exercises).
"""

from .attention import GQAttention
from .causal import causal_attention
from .decoder import DecoderLM
from .ffn import SwiGLU, swiglu_hidden_dim
from .generate import generate
from .gpt2 import GPT2LM, CausalSelfAttention, GeluMLP, GPT2Block
from .kv_cache import KVCache, LayerCache, kv_cache_bytes_per_token, mla_cache_bytes_per_token
from .llama import Block, LlamaStyleLM
from .mla import MLAConfig, MLAttention
from .params import count_parameters, parameter_breakdown
from .presets import PRESETS, ModelPreset, cache_size
from .rmsnorm import RMSNorm
from .rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_interleaved,
    dynamic_ntk_frequencies,
    interleaved_to_half_split,
    linear_frequencies,
    llama3_frequencies,
    permute_qk_weight,
    rope_cache,
    rope_frequencies,
    scaled_frequencies,
    yarn_attention_factor,
    yarn_frequencies,
)

__all__ = [
    "RMSNorm", "SwiGLU", "GeluMLP", "swiglu_hidden_dim",
    "rope_cache", "rope_frequencies", "apply_rope", "apply_rope_interleaved", "interleaved_to_half_split",
    "permute_qk_weight", "linear_frequencies", "dynamic_ntk_frequencies", "yarn_frequencies", "yarn_attention_factor",
    "llama3_frequencies", "scaled_frequencies", "RotaryEmbedding",
    "DecoderLM", "GQAttention", "causal_attention", "MLAttention", "MLAConfig", "Block", "LlamaStyleLM",
    "GPT2LM", "GPT2Block", "CausalSelfAttention",
    "KVCache", "LayerCache", "kv_cache_bytes_per_token", "mla_cache_bytes_per_token",
    "PRESETS", "ModelPreset", "cache_size",
    "generate", "count_parameters", "parameter_breakdown",
]
__version__ = "0.1.0"
