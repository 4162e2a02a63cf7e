"""Interop: real models' weights into the course's classes and back, and a tool for when a port goes wrong.

* ``hf``: Hugging Face ``transformers`` models (Llama, Mistral, Qwen2/3, GPT-2, dense DeepSeek-V3) to and from
  the course's models with identical logits; ``load_pretrained`` (transformers is imported only when called);
* ``compare_layers``: run two models side by side and name the first module whose output differs.
"""

from .compare_layers import Comparison, LayerDiff, compare_layers
from .hf import from_hf, load_pretrained, module_pairs, to_hf

__all__ = ["from_hf", "to_hf", "load_pretrained", "module_pairs", "compare_layers", "Comparison", "LayerDiff"]
