"""Hugging Face <-> course: the weight-name tables and the module pairs, one line per tensor.

``WEIGHTS[family]`` maps each course parameter to the Hugging Face parameter holding the same numbers
("{i}" stands for the layer index); ``MODULES[family]`` pairs modules whose outputs must agree (for
``compare_layers``). ``HF_CLASSES`` names the transformers class of each family, ``UNSUPPORTED`` the families
that look close but are not the course model, with the reason.
"""

# ---------------------------------------------------------------------------------------------
# Weight names: course parameter -> Hugging Face parameter ("{i}": layer index)
# ---------------------------------------------------------------------------------------------
_LLAMA_COMMON = {
    "emb.weight": "model.embed_tokens.weight",
    "blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.ffn.w_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blocks.{i}.ffn.w_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blocks.{i}.ffn.w_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}

LLAMA_WEIGHTS = {
    **_LLAMA_COMMON,
    "blocks.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.attn.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.attn.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
}

QWEN2_WEIGHTS = {  # Llama's, plus biases on q, k and v (not on o)
    **LLAMA_WEIGHTS,
    "blocks.{i}.attn.wq.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blocks.{i}.attn.wk.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blocks.{i}.attn.wv.bias": "model.layers.{i}.self_attn.v_proj.bias",
}

QWEN3_WEIGHTS = {
    **LLAMA_WEIGHTS,
    "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blocks.{i}.attn.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
}

GPT2_WEIGHTS = {
    "emb.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "blocks.{i}.ln1.weight": "transformer.h.{i}.ln_1.weight",
    "blocks.{i}.ln1.bias": "transformer.h.{i}.ln_1.bias",
    "blocks.{i}.attn.qkv.weight": "transformer.h.{i}.attn.c_attn.weight",  # Conv1D: transposed
    "blocks.{i}.attn.qkv.bias": "transformer.h.{i}.attn.c_attn.bias",
    "blocks.{i}.attn.proj.weight": "transformer.h.{i}.attn.c_proj.weight",  # Conv1D: transposed
    "blocks.{i}.attn.proj.bias": "transformer.h.{i}.attn.c_proj.bias",
    "blocks.{i}.ln2.weight": "transformer.h.{i}.ln_2.weight",
    "blocks.{i}.ln2.bias": "transformer.h.{i}.ln_2.bias",
    "blocks.{i}.mlp.fc.weight": "transformer.h.{i}.mlp.c_fc.weight",  # Conv1D: transposed
    "blocks.{i}.mlp.fc.bias": "transformer.h.{i}.mlp.c_fc.bias",
    "blocks.{i}.mlp.proj.weight": "transformer.h.{i}.mlp.c_proj.weight",  # Conv1D: transposed
    "blocks.{i}.mlp.proj.bias": "transformer.h.{i}.mlp.c_proj.bias",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
    "head.weight": "lm_head.weight",
}
GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # [in, out]

DEEPSEEK_V3_WEIGHTS = {
    **_LLAMA_COMMON,
    "blocks.{i}.attn.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",  # without q-LoRA; RoPE rows*
    "blocks.{i}.attn.wq_down.weight": "model.layers.{i}.self_attn.q_a_proj.weight",  # with q-LoRA
    "blocks.{i}.attn.q_norm.weight": "model.layers.{i}.self_attn.q_a_layernorm.weight",
    "blocks.{i}.attn.wq_up.weight": "model.layers.{i}.self_attn.q_b_proj.weight",  # RoPE rows*
    "blocks.{i}.attn.kv_norm.weight": "model.layers.{i}.self_attn.kv_a_layernorm.weight",
    "blocks.{i}.attn.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
}  # * permuted when config.rope_interleave

# Hugging Face tensor -> the course tensors stacked in it, in order (rows)
DEEPSEEK_V3_FUSED = {
    # [W_DKV (d_c rows) ; W_KR (d_R rows, RoPE rows*)]
    "model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight": ("blocks.{i}.attn.w_dkv.weight",
                                                             "blocks.{i}.attn.w_kr.weight"),
    # for each head m: [W_UK,m (d_nope rows) ; W_UV,m (d_v rows)]
    "model.layers.{i}.self_attn.kv_b_proj.weight": ("blocks.{i}.attn.w_uk.weight", "blocks.{i}.attn.w_uv.weight"),
}

WEIGHTS = {"llama": LLAMA_WEIGHTS, "mistral": LLAMA_WEIGHTS, "qwen2": QWEN2_WEIGHTS, "qwen3": QWEN3_WEIGHTS,
           "gpt2": GPT2_WEIGHTS, "deepseek_v3": DEEPSEEK_V3_WEIGHTS}
HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "gpt2": "GPT2LMHeadModel", "deepseek_v3": "DeepseekV3ForCausalLM"}
# Families that look close but are not the course model, and why (refused by config.model_type)
UNSUPPORTED = {
    "gemma": "Gemma's RMSNorm multiplies by (1 + weight) and its embeddings are scaled by sqrt(d)",
    "gemma2": "Gemma 2 adds post-norms, logit soft-capping and sliding-window layers",
    "gemma3": "Gemma 3 adds post-norms, sliding-window layers and (1 + weight) norms",
    "gemma3_text": "Gemma 3 adds post-norms, sliding-window layers and (1 + weight) norms",
    "mixtral": "its FFN is a mixture of experts",
    "qwen2_moe": "its FFN is a mixture of experts",
    "qwen3_moe": "its FFN is a mixture of experts",
    "gpt_oss": "its FFN is a mixture of experts, with sliding-window layers and attention sinks",
    "phi3": "its q/k/v and gate/up projections are fused, and it uses longrope scaling",
}

# ---------------------------------------------------------------------------------------------
# Modules whose outputs must agree: course module -> Hugging Face module (for compare_layers).
# Only pairs whose outputs have the same layout are listed (Qwen3's q_norm, for one, is applied
# to [B, T, h, dh] there and to [B, h, T, dh] here).
# ---------------------------------------------------------------------------------------------
_LLAMA_COMMON_MODULES = {
    "emb": "model.embed_tokens",
    "blocks.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blocks.{i}.attn.wo": "model.layers.{i}.self_attn.o_proj",
    "blocks.{i}.attn": "model.layers.{i}.self_attn",
    "blocks.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blocks.{i}.ffn.w_gate": "model.layers.{i}.mlp.gate_proj",
    "blocks.{i}.ffn.w_up": "model.layers.{i}.mlp.up_proj",
    "blocks.{i}.ffn.w_down": "model.layers.{i}.mlp.down_proj",
    "blocks.{i}.ffn": "model.layers.{i}.mlp",
    "blocks.{i}": "model.layers.{i}",
    "norm": "model.norm",
    "head": "lm_head",
}
LLAMA_MODULES = {
    **_LLAMA_COMMON_MODULES,
    "blocks.{i}.attn.wq": "model.layers.{i}.self_attn.q_proj",
    "blocks.{i}.attn.wk": "model.layers.{i}.self_attn.k_proj",
    "blocks.{i}.attn.wv": "model.layers.{i}.self_attn.v_proj",
}
DEEPSEEK_V3_MODULES = {
    **_LLAMA_COMMON_MODULES,
    "blocks.{i}.attn.wq_down": "model.layers.{i}.self_attn.q_a_proj",
    "blocks.{i}.attn.q_norm": "model.layers.{i}.self_attn.q_a_layernorm",
    "blocks.{i}.attn.kv_norm": "model.layers.{i}.self_attn.kv_a_layernorm",
}
GPT2_MODULES = {
    "emb": "transformer.wte",
    "wpe": "transformer.wpe",
    "blocks.{i}.ln1": "transformer.h.{i}.ln_1",
    "blocks.{i}.attn.qkv": "transformer.h.{i}.attn.c_attn",
    "blocks.{i}.attn.proj": "transformer.h.{i}.attn.c_proj",
    "blocks.{i}.attn": "transformer.h.{i}.attn",
    "blocks.{i}.ln2": "transformer.h.{i}.ln_2",
    "blocks.{i}.mlp.fc": "transformer.h.{i}.mlp.c_fc",
    "blocks.{i}.mlp.proj": "transformer.h.{i}.mlp.c_proj",
    "blocks.{i}.mlp": "transformer.h.{i}.mlp",
    "blocks.{i}": "transformer.h.{i}",
    "norm": "transformer.ln_f",
    "head": "lm_head",
}
MODULES = {"llama": LLAMA_MODULES, "mistral": LLAMA_MODULES, "qwen2": LLAMA_MODULES, "qwen3": LLAMA_MODULES,
           "gpt2": GPT2_MODULES, "deepseek_v3": DEEPSEEK_V3_MODULES}


def _expand(table: dict, n_layers: int) -> list[tuple[str, str]]:
    """Table entries with "{i}" repeated for every layer, in order."""
    pairs = []
    for ours, theirs in table.items():
        if "{i}" in ours:
            pairs += [(ours.format(i=i), theirs.format(i=i)) for i in range(n_layers)]
        else:
            pairs.append((ours, theirs))
    return pairs

