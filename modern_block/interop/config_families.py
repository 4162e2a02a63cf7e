"""The decoder families the config card reads, each described by what its block is built from.

A family is read only if its block is one the course teaches: an embedding (and GPT-2's learned positions), ``L``
layers of attention (GQA or MLA) and an FFN (dense, gated or plain, or a mixture of experts) with their norms, a
final norm and a head. Each entry
says where that family departs from Llama's block (its norms, QK-norm, biases, FFN, experts, windows), read from
transformers' modeling code; ``tests/interop/test_config_families.py`` checks every entry against the model transformers
builds. ``configs/transformers-defaults.json`` holds each family's own defaults (what transformers assumes when a
field is absent), written by ``scripts/config_family_defaults.py`` and checked against transformers by the same test.
Any other ``model_type`` is refused with the reason.
"""

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MoE:
    """Where a family keeps its experts, and what each MoE layer holds besides them."""

    experts: str  # the field giving the routed experts per MoE layer
    width: str  # the field giving one expert's hidden width
    layers: str  # which layers are MoE: all | qwen (decoder_sparse_step, mlp_only_layers) | first_k | list
    shared: str | None = None  # count: n_shared_experts of `width`; field name: one shared expert that wide
    shared_gate: bool = False  # a d -> 1 gate scales the shared expert (Qwen2-MoE)
    router_bias: bool = False  # the router has a bias per expert (gpt-oss)
    expert_bias: bool = False  # every expert's matrices carry biases (gpt-oss)
    dense_width: str = "intermediate_size"  # the field giving the dense layers' d_ff


@dataclass(frozen=True)
class Family:
    """What a family's block is made of, where it differs from Llama's."""

    title: str  # the family in words
    norm: str = "rms"  # rms (weight d) | layer (weight and bias, 2d) | layer_nobias (d) | none (no parameters)
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")  # the norms of one layer
    qk_norm: str | None = None  # head: over d_h | all_heads: h·d_h and n_kv·d_h | hidden: d and d/h·n_kv | weightless
    qk_norm_switch: str | None = None  # the field that turns QK-norm on (None: always on when qk_norm is set)
    qkv_bias: str | bool = "attention_bias"  # a field name, or the family's fixed choice
    o_bias: str | bool = "attention_bias"
    mlp: str = "gated"  # gated (gate, up, down: GLU) | plain (up, down)
    act_field: str = "hidden_act"
    mlp_bias: str | bool = False
    head_bias: str | bool = False
    o_width: str = "heads"  # heads: o maps h·d_h -> d | hidden: d -> d
    windows: str = "none"  # how local layers are found (config_arch.layer_kinds)
    rope_layers: str = "all"  # all | no_rope_layers (a per-layer 1/0 list: 0 marks a layer without RoPE)
    moe: MoE | None = None
    mla: bool = False
    sinks: bool = False  # one learned attention-sink logit per head (gpt-oss)
    head_dim_read: bool = True  # False: the family's config replaces any head_dim with hidden_size / heads
    positions: str = "rope"  # rope | learned: a table of max_position_embeddings vectors added to the embedding
    ffn_width: str = "intermediate_size"  # the field giving the dense FFN's d_ff
    ffn_null_is_4d: bool = False  # the d_ff field null means 4·d (GPT-2's n_inner)


PRE, SANDWICH = ("input_layernorm", "post_attention_layernorm"), (
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
POST = ("post_attention_layernorm", "post_feedforward_layernorm")  # OLMo 2's reordered norms: after each sublayer
DEEPSEEK_MOE = MoE("n_routed_experts", "moe_intermediate_size", "first_k", shared="count")

FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT-2", norm="layer", layer_norms=("ln_1", "ln_2"), qkv_bias=True, o_bias=True, mlp="plain",
                   act_field="activation_function", mlp_bias=True, head_dim_read=False, positions="learned",
                   ffn_width="n_inner", ffn_null_is_4d=True),
    "llama": Family("Llama", mlp_bias="mlp_bias"),
    "mistral": Family("Mistral", qkv_bias=False, o_bias=False, windows="all"),
    "ministral": Family("Ministral", qkv_bias=False, o_bias=False, windows="ministral"),
    "mixtral": Family("Mixtral", qkv_bias=False, o_bias=False, windows="all",
                      moe=MoE("num_local_experts", "intermediate_size", "all")),
    "qwen2": Family("Qwen2", qkv_bias=True, o_bias=False, windows="qwen2"),
    "qwen2_moe": Family("Qwen2-MoE", qkv_bias="qkv_bias", o_bias=False, windows="qwen2_moe",
                        moe=MoE("num_experts", "moe_intermediate_size", "qwen",
                                shared="shared_expert_intermediate_size", shared_gate=True)),
    "qwen3": Family("Qwen3", qk_norm="head", windows="qwen2"),
    "qwen3_moe": Family("Qwen3-MoE", qk_norm="head", windows="all_if_used",
                        moe=MoE("num_local_experts", "moe_intermediate_size", "qwen")),
    "gemma": Family("Gemma"),
    "gemma2": Family("Gemma 2", layer_norms=SANDWICH, act_field="hidden_activation", windows="alternate"),
    "gemma3_text": Family("Gemma 3", layer_norms=SANDWICH, qk_norm="head", act_field="hidden_activation",
                          windows="pattern6"),
    "olmo": Family("OLMo", norm="none"),
    "olmo2": Family("OLMo 2", layer_norms=POST, qk_norm="all_heads"),
    "olmo3": Family("OLMo 3", layer_norms=POST, qk_norm="all_heads", windows="every4th"),
    "olmoe": Family("OLMoE", qk_norm="hidden", moe=MoE("num_experts", "intermediate_size", "all")),
    "phi3": Family("Phi-3", qkv_bias=False, o_bias=False, windows="all"),
    "gpt_oss": Family("gpt-oss", windows="alternate", sinks=True,
                      moe=MoE("num_local_experts", "intermediate_size", "all", router_bias=True, expert_bias=True)),
    "deepseek_v2": Family("DeepSeek-V2", mla=True, mlp_bias="mlp_bias", moe=DEEPSEEK_MOE),
    "deepseek_v3": Family("DeepSeek-V3", mla=True, moe=DEEPSEEK_MOE),
    "llama4_text": Family("Llama 4", qk_norm="weightless", qk_norm_switch="use_qk_norm", windows="llama4",
                          rope_layers="no_rope_layers",
                          moe=MoE("num_local_experts", "intermediate_size", "list", shared="intermediate_size",
                                  dense_width="intermediate_size_mlp")),
    "granite": Family("Granite", mlp_bias="mlp_bias"),
    "helium": Family("Helium", o_bias=False, o_width="hidden", mlp_bias="mlp_bias"),
    "starcoder2": Family("StarCoder2", norm="layer", qkv_bias="use_bias", o_bias="use_bias", mlp="plain",
                         mlp_bias="use_bias", windows="all"),
    "smollm3": Family("SmolLM3", mlp_bias="mlp_bias", windows="smollm3", rope_layers="no_rope_layers"),
    "cohere": Family("Cohere", norm="layer_nobias", layer_norms=("input_layernorm",), qk_norm="all_heads",
                     qk_norm_switch="use_qk_norm"),
    "cohere2": Family("Cohere 2", norm="layer_nobias", layer_norms=("input_layernorm",), windows="pattern4",
                      head_dim_read=False),
    "glm4_moe": Family("GLM-4-MoE", qk_norm="head", qk_norm_switch="use_qk_norm", o_bias=False, moe=DEEPSEEK_MOE),
    "seed_oss": Family("Seed-OSS", o_bias="attention_out_bias", mlp_bias="mlp_bias"),
    "arcee": Family("Arcee", mlp="plain", mlp_bias="mlp_bias"),
    "exaone4": Family("EXAONE 4", layer_norms=POST, qk_norm="head", qkv_bias=False, o_bias=False,
                      windows="exaone4"),
    "ernie4_5": Family("ERNIE 4.5", qkv_bias="use_bias", o_bias="use_bias", mlp_bias="use_bias"),
    "phimoe": Family("Phi-3.5-MoE", norm="layer", head_bias="lm_head_bias", windows="all",
                     moe=MoE("num_local_experts", "intermediate_size", "all")),
    "granitemoe": Family("Granite-MoE", moe=MoE("num_local_experts", "intermediate_size", "all")),
    "exaone": Family("EXAONE", mlp_bias="mlp_bias"),
    "internlm3": Family("InternLM3", mlp_bias="mlp_bias"),
    "iquestcoder": Family("IQuest-Coder", mlp_bias="mlp_bias"),
    "cwm": Family("CWM", mlp_bias="mlp_bias", windows="every4th_from0"),
    "ministral3": Family("Ministral 3", qkv_bias=False, o_bias=False, windows="all"),
    "minimax_m2": Family("MiniMax-M2", qk_norm="all_heads",
                         moe=MoE("num_local_experts", "intermediate_size", "all")),
    "solar_open": Family("Solar Open", o_bias=False,
                         moe=MoE("n_routed_experts", "moe_intermediate_size", "all", shared="count")),
    "sarvam_moe": Family("Sarvam-MoE", qk_norm="head", qk_norm_switch="use_qk_norm", o_bias=False,
                         moe=DEEPSEEK_MOE),
    "param2moe": Family("Param-2-MoE", qk_norm="head", qk_norm_switch="use_qk_norm", o_bias=False,
                        moe=DEEPSEEK_MOE),
    "sarvam_mla": Family("Sarvam-MLA", mla=True, moe=DEEPSEEK_MOE),
    "youtu": Family("Youtu-LLM", mla=True),
    "glm": Family("GLM-4 (first)", o_bias=False),
    "glm4": Family("GLM-4", o_bias=False, layer_norms=("input_layernorm", "post_self_attn_layernorm",
                                                       "post_attention_layernorm", "post_mlp_layernorm")),
    "hunyuan_v1_dense": Family("Hunyuan", qk_norm="head", mlp_bias=False),
    "vaultgemma": Family("VaultGemma", layer_norms=("input_layernorm", "pre_feedforward_layernorm"),
                         act_field="hidden_activation", windows="alternate"),
}

ALIASES = {  # a model_type transformers does not know -> the family whose block its config describes
    "kimi_k2": ("deepseek_v3", "Kimi K2's config names DeepseekV3ForCausalLM: DeepSeek-V3's block, 384 experts"),
}

DEFAULTS_FILE = Path(__file__).parent / "configs" / "transformers-defaults.json"
DEFAULTS: dict[str, dict] = json.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))  # family -> defaults, aliases


def family_name(model_type: str) -> str | None:
    """The family a ``model_type`` is read as (itself, or what an alias stands for), or None if not read."""
    if model_type in FAMILIES:
        return model_type
    return ALIASES[model_type][0] if model_type in ALIASES else None
