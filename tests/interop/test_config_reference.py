"""transformers' own model of a config on the meta device (modern_block/interop/config_reference.py): parameters
classified by name, the cache widths its attention projects, the experts a token leaves idle."""

import pytest

transformers = pytest.importorskip("transformers")

from modern_block.interop.config_reference import (  # noqa: E402
    cache_layers,
    component,
    components,
    idle_expert_parameters,
    kv_widths,
    reference_config,
    reference_model,
    reference_totals,
)
from modern_block.interop.config_source import load_config  # noqa: E402

transformers.logging.set_verbosity_error()


@pytest.mark.parametrize("name, part", [
    ("model.embed_tokens.weight", "embedding"), ("lm_head.weight", "head"),
    ("model.layers.3.self_attn.q_norm.weight", "norms"), ("model.layers.0.input_layernorm.weight", "norms"),
    ("model.layers.0.self_attn.kv_a_layernorm.weight", "norms"), ("model.layers.0.self_attn.sinks", "attention"),
    ("model.layers.0.mlp.gate.weight", "router"), ("model.layers.0.mlp.router.bias", "router"),
    ("model.layers.0.mlp.gate_proj.weight", "ffn"), ("model.layers.0.mlp.experts.gate_up_proj", "experts"),
    ("model.layers.0.feed_forward.shared_expert.up_proj.weight", "shared_experts"),
    ("model.layers.0.mlp.shared_expert_gate.weight", "shared_experts"),
    ("model.layers.0.self_attn.qkv_proj.weight", "attention")])
def test_a_parameter_names_its_component(name, part):
    assert component(name) == part


def test_the_cache_widths_and_idle_experts_of_transformers_models():
    small = load_config("DeepSeek-V3") | {"num_hidden_layers": 4, "n_routed_experts": 8, "n_group": 2,
                                          "topk_group": 1, "vocab_size": 256, "num_experts_per_tok": 2}
    small.pop("quantization_config")
    model = reference_model(small)
    assert kv_widths(model) == [512 + 64] * 4  # MLA: the latent and the RoPE key, what absorption caches
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert idle_expert_parameters(model, 2) == experts * 6 // 8
    phi = load_config("Phi-4-mini") | {"num_hidden_layers": 2, "vocab_size": 256, "pad_token_id": 0}
    assert kv_widths(reference_model(phi)) == [2 * 8 * 128] * 2  # q, k, v stacked: the k and v rows
    assert set(components(reference_model(phi))) == {"embedding", "attention", "norms", "ffn"}


def test_reference_totals_and_the_cache_layers():
    want = reference_totals(load_config("Qwen3-0.6B"))
    assert want["total"] == want["active"] == 596_049_920 and want["kv_bytes_per_token"] == 114_688
    gemma = reference_config(load_config("Gemma 3 27B"))
    assert cache_layers(gemma)[:6] == [("sliding", 1024)] * 5 + [("full", None)]
    with pytest.raises(ValueError, match="not a family transformers implements"):
        reference_config({"model_type": "llama9"})
