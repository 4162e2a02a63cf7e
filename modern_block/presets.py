"""Attention and cache facts of real models (from their published configs), cache sizes and weight sizes.

Only what the course uses is recorded. A dense model's parameter count is computed from its config
(a Llama-style block: attention, SwiGLU, two norms per layer, four in Gemma 3); for mixture-of-experts models, whose
experts the course does not record, ``n_params`` holds the published total (every expert must sit in
memory, even though only a few run per token). ``sliding_window`` layers keep at most that many tokens
(gpt-oss alternates 128-token windows with full attention; Gemma 3 has 5 local layers of 1,024
tokens per global layer); the other layers cache the whole context.
"""

from dataclasses import dataclass

from .kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from .validate import positive_int

BYTES_PER_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
GiB = 1024**3


@dataclass(frozen=True)
class ModelPreset:
    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int  # for MLA models: the number of heads (keys/values are rebuilt per head)
    head_dim: int
    d_model: int | None = None
    d_ff: int | None = None  # dense FFN hidden size (None for MoE-only models)
    vocab_size: int | None = None
    rope_base: float | None = None
    tied: bool | None = None
    qk_norm: bool = False
    norms_per_layer: int = 2  # RMSNorms of width d in each layer (Gemma 3: 4, before and after each sublayer)
    attention: str = "gqa"  # "gqa" (covers MHA and MQA) or "mla"
    kv_latent_dim: int | None = None  # MLA: d_c
    rope_dim: int | None = None  # MLA: d_R, the decoupled RoPE key
    q_lora_rank: int | None = None
    v_head_dim: int | None = None
    sliding_window: int | None = None
    n_sliding_layers: int = 0  # layers that use the sliding window
    n_params: int | None = None  # published total, for models not computed from the config (MoE)

    def parameters(self) -> int:
        """Total parameters: the published total, or counted from the config of a dense model."""
        if self.n_params is not None:
            return self.n_params
        d, L, V, d_ff = self.d_model, self.n_layers, self.vocab_size, self.d_ff
        if d is None or V is None or d_ff is None:
            raise ValueError(f"{self.name}: counting its parameters needs d_model, vocab_size and d_ff, or n_params")
        attention = d * self.n_heads * self.head_dim * 2 + d * self.n_kv_heads * self.head_dim * 2  # q, o; k, v
        per_layer = attention + 3 * d * d_ff + self.norms_per_layer * d + (2 * self.head_dim if self.qk_norm else 0)
        return V * d * (1 if self.tied else 2) + L * per_layer + d  # embeddings (and head), layers, final norm

    def weight_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of all the weights stored in ``dtype``."""
        if dtype not in BYTES_PER_ELEM:
            raise ValueError(f"dtype must be one of {sorted(BYTES_PER_ELEM)}, got {dtype!r}")
        return self.parameters() * BYTES_PER_ELEM[dtype]

    def bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """Cache bytes per token of one sequence, counting every layer as full attention."""
        if self.attention == "mla":
            if self.kv_latent_dim is None or self.rope_dim is None:
                raise ValueError(f"{self.name}: an MLA cache needs kv_latent_dim and rope_dim")
            return mla_cache_bytes_per_token(self.n_layers, self.kv_latent_dim, self.rope_dim, bytes_per_elem)
        return kv_cache_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, bytes_per_elem)

    def cache_bytes(self, context_len: int, batch: int = 1, dtype: str = "bf16") -> int:
        """Bytes the whole cache holds for ``batch`` sequences of ``context_len`` tokens."""
        positive_int("context_len", context_len)
        positive_int("batch", batch)
        if dtype not in BYTES_PER_ELEM:
            raise ValueError(f"dtype must be one of {sorted(BYTES_PER_ELEM)}, got {dtype!r}")
        per_layer_token = self.bytes_per_token(BYTES_PER_ELEM[dtype]) // self.n_layers
        full_layers = self.n_layers - self.n_sliding_layers
        tokens = full_layers * context_len + self.n_sliding_layers * min(context_len, self.sliding_window or 0)
        return per_layer_token * tokens * batch


PRESETS: dict[str, ModelPreset] = {p.name: p for p in [
    ModelPreset("Llama 2 7B", n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128, d_model=4096, d_ff=11008,
                vocab_size=32000, rope_base=10000.0, tied=False),
    ModelPreset("Llama 3 8B", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_model=4096, d_ff=14336,
                vocab_size=128256, rope_base=500000.0, tied=False),
    ModelPreset("Llama 3 70B", n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128, d_model=8192, d_ff=28672,
                vocab_size=128256, rope_base=500000.0, tied=False),
    ModelPreset("Mistral 7B", n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_model=4096, d_ff=14336,
                vocab_size=32768, rope_base=1000000.0, tied=False),  # v0.3 (v0.1: 4,096-token sliding window)
    ModelPreset("Qwen3-0.6B", n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_model=1024, d_ff=3072,
                vocab_size=151936, rope_base=1000000.0, tied=True, qk_norm=True),
    ModelPreset("Qwen3-235B-A22B", n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, d_model=4096,
                vocab_size=151936, rope_base=1000000.0, tied=False, qk_norm=True, n_params=235_000_000_000),
    ModelPreset("gpt-oss-120b", n_layers=36, n_heads=64, n_kv_heads=8, head_dim=64, d_model=2880,
                vocab_size=201088, tied=False, sliding_window=128, n_sliding_layers=18, n_params=116_800_000_000),
    ModelPreset("Gemma 3 27B", n_layers=62, n_heads=32, n_kv_heads=16, head_dim=128, d_model=5376, d_ff=21504,
                vocab_size=262208, rope_base=1000000.0, tied=True, qk_norm=True, norms_per_layer=4,
                sliding_window=1024, n_sliding_layers=52),
    ModelPreset("DeepSeek-V3", n_layers=61, n_heads=128, n_kv_heads=128, head_dim=192, d_model=7168,
                vocab_size=129280, tied=False, attention="mla", kv_latent_dim=512, rope_dim=64, q_lora_rank=1536,
                v_head_dim=128, n_params=671_000_000_000),
    ModelPreset("Kimi K2", n_layers=61, n_heads=64, n_kv_heads=64, head_dim=192, d_model=7168,
                vocab_size=163840, tied=False, attention="mla", kv_latent_dim=512, rope_dim=64, q_lora_rank=1536,
                v_head_dim=128, n_params=1_040_000_000_000),
]}


def cache_size(preset: str | ModelPreset, context_len: int, batch: int = 1, dtype: str = "bf16") -> int:
    """Cache bytes of a preset (by name or object) at a context length, batch size and dtype."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {list(PRESETS)}, got {preset!r}")
        preset = PRESETS[preset]
    return preset.cache_bytes(context_len, batch, dtype)
