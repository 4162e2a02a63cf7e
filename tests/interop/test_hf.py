"""The course models against Hugging Face transformers: same weights, same logits, same tokens.

Every Hugging Face model here is random-initialised from a tiny config (nothing is downloaded).
The weights are redrawn at unit scale and every norm weight and bias is randomised, so that a
missing norm, a swapped projection or a wrong RoPE layout changes the logits far beyond the
tolerance (fp32, atol 1e-4).
"""

import ast
import os
from pathlib import Path

import pytest
import torch
from decodes import assert_decodes_agree, cached_logits

import modern_block
from modern_block import GPT2LM, LlamaStyleLM, generate
from modern_block.interop import load_pretrained
from modern_block.interop.compare_layers import compare_layers
from modern_block.interop.hf import from_hf, module_pairs, to_hf
from modern_block.mla import MLAConfig, MLAttention
from modern_block.rmsnorm import RMSNorm

if os.environ.get("CI", "").lower() not in ("", "0", "false"):
    import transformers  # in CI a missing transformers must fail the run, never skip it
else:
    transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()
ATOL = 1e-4
V, T, MAX_POS = 97, 12, 48

TINY = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, max_position_embeddings=MAX_POS)
MLA_TINY = dict(TINY, first_k_dense_replace=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12)

CASES = {  # name: (config class, keywords)
    "llama-gqa": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2)),
    "llama-mqa-base5e5": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=1,
                                              rope_theta=500000.0)),
    "llama-mha-tied": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=4,
                                           tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "llama-head_dim12": ("LlamaConfig", dict(TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=12)),
    "qwen3-gqa-tied": ("Qwen3Config", dict(TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                           tie_word_embeddings=True, rope_theta=1e6)),  # 4 × 12 = 48 != 32
    "qwen3-mha": ("Qwen3Config", dict(TINY, num_attention_heads=2, num_key_value_heads=2, head_dim=16)),
    "qwen3-mqa": ("Qwen3Config", dict(TINY, num_attention_heads=6, num_key_value_heads=1, head_dim=8,
                                      rope_theta=5e4)),  # 6 × 8 = 48 != 32
    "gpt2-odd-untied": ("GPT2Config", dict(vocab_size=V, n_embd=36, n_layer=2, n_head=3, n_positions=MAX_POS,
                                           n_inner=50, tie_word_embeddings=False)),
    "gpt2-tied": ("GPT2Config", dict(vocab_size=V, n_embd=20, n_layer=3, n_head=5, n_positions=MAX_POS,
                                     layer_norm_epsilon=1e-3, activation_function="gelu_pytorch_tanh")),
    "deepseek-direct-q": ("DeepseekV3Config", dict(MLA_TINY, num_attention_heads=4, num_key_value_heads=4,
                                                   q_lora_rank=None, v_head_dim=12)),
    "deepseek-qlora-v10": ("DeepseekV3Config", dict(MLA_TINY, num_attention_heads=4, num_key_value_heads=4,
                                                    q_lora_rank=24, v_head_dim=10, rope_theta=5e5)),
    "deepseek-half-split-tied": ("DeepseekV3Config", dict(MLA_TINY, num_attention_heads=3, num_key_value_heads=3,
                                                          q_lora_rank=20, v_head_dim=14, rope_interleave=False,
                                                          tie_word_embeddings=True)),
}


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Unit-scale weights (N(0, 1/fan_in)), norm weights around 1 and biases around 0, all random."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            fan_in = p.shape[0] if "transformer.h." in name else p.shape[1]  # GPT-2 Conv1D is [in, out]
            p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        elif name.endswith("bias"):
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
        else:  # norm weights
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))


def hf_model(case: str, seed: int = 0, **overrides):
    cls_name, kwargs = CASES[case]
    torch.manual_seed(seed)
    config = getattr(transformers, cls_name)(**{**kwargs, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomise(model, seed)
    return model


def tokens(seed: int = 1, batch: int = 2, length: int = T) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(model, idx):
    return model(idx).logits


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_logits_equal_hugging_face(case):
    hf = hf_model(case)
    model = from_hf(hf)
    idx = tokens()
    ref, ours = hf_logits(hf, idx), model(idx)
    assert ref.abs().max() > 1.0  # logits of unit scale: a small absolute tolerance is a real test
    diff = (ours - ref).abs().max().item()
    print(f"{case}: max |logit diff| = {diff:.2e}")  # shown with pytest -s
    assert diff <= ATOL
    tied = hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    emb = model.emb
    assert (model.head.weight is emb.weight) == tied  # one storage when tied, two when not
    assert not model.training


def test_converted_models_have_the_configured_shape():
    qwen = from_hf(hf_model("qwen3-mqa"))
    attn = qwen.blocks[0].attn
    assert (attn.h, attn.kv, attn.dh) == (6, 1, 8) and isinstance(attn.q_norm, RMSNorm)
    llama = from_hf(hf_model("llama-mha-tied"))
    assert not llama.blocks[0].attn.qk_norm and llama.norm.eps == 1e-5
    deepseek = from_hf(hf_model("deepseek-qlora-v10"))
    mla = deepseek.blocks[1].attn
    assert isinstance(mla, MLAttention)
    assert (mla.d_c, mla.rope_dim, mla.d_nope, mla.d_v, mla.q_lora_rank) == (16, 8, 12, 10, 24)
    assert deepseek.rope_base == 5e5 and deepseek.max_len == MAX_POS


def test_interleaved_rope_is_converted_by_permutation():
    """DeepSeek's checkpoints rotate interleaved pairs; the conversion permutes rows. Without it the
    logits differ: the permutation is what makes them equal."""
    hf = hf_model("deepseek-qlora-v10")
    assert hf.config.rope_interleave
    model, idx = from_hf(hf), tokens()
    torch.testing.assert_close(model(idx).detach(), hf_logits(hf, idx), atol=ATOL, rtol=0)
    hf.config.rope_interleave = False  # same weights read in the other layout
    assert (model(idx).detach() - hf_logits(hf, idx)).abs().max() > 100 * ATOL


@pytest.mark.parametrize("case", ["llama-mha-tied", "qwen3-gqa-tied", "gpt2-odd-untied", "deepseek-half-split-tied"])
@torch.no_grad()
def test_round_trip_to_hf_reproduces_logits(case):
    hf = hf_model(case)
    back = to_hf(from_hf(hf))
    assert type(back) is type(hf)
    idx = tokens()
    torch.testing.assert_close(hf_logits(back, idx), hf_logits(hf, idx), atol=ATOL, rtol=0)
    assert (back.get_output_embeddings().weight is back.get_input_embeddings().weight) == \
        (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight)


@pytest.mark.parametrize("make", [
    lambda: LlamaStyleLM(V, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=40, max_len=MAX_POS),  # -> Qwen3
    lambda: LlamaStyleLM(V, d=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=40, max_len=MAX_POS, qk_norm=False,
                         tie=True, rope_base=2e4),  # -> Llama
    lambda: GPT2LM(V, d=24, n_layers=2, n_heads=4, max_len=MAX_POS, tie=False),
    lambda: LlamaStyleLM(V, d=32, n_layers=2, n_heads=2, d_ff=40, max_len=MAX_POS,
                         mla=MLAConfig(kv_latent_dim=12, rope_dim=6, nope_dim=10, v_head_dim=8, q_lora_rank=16)),
], ids=["qwen3", "llama-tied", "gpt2", "deepseek"])
@torch.no_grad()
def test_course_model_to_hf_and_back(make):
    torch.manual_seed(0)
    model = make().eval()
    randomise(model)
    idx = tokens()
    hf = to_hf(model)
    torch.testing.assert_close(hf_logits(hf, idx), model(idx), atol=ATOL, rtol=0)
    again = from_hf(hf)
    torch.testing.assert_close(again(idx), model(idx), atol=ATOL, rtol=0)
    for name, p in model.state_dict().items():  # the round trip gives back the same tensors
        torch.testing.assert_close(again.state_dict()[name], p, atol=0, rtol=0)
    if isinstance(model.blocks[0].attn, MLAttention):  # DeepSeek's interleaved layout: same logits
        hf_interleaved = to_hf(model, rope_interleave=True)
        assert hf_interleaved.config.rope_interleave
        torch.testing.assert_close(hf_logits(hf_interleaved, idx), model(idx), atol=ATOL, rtol=0)
        torch.testing.assert_close(from_hf(hf_interleaved)(idx), model(idx), atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-mqa", "gpt2-odd-untied", "deepseek-qlora-v10"])
def test_greedy_decoding_matches_hugging_face_generate(case):
    hf = hf_model(case)
    hf.generation_config.eos_token_id = None  # never stop early
    hf.generation_config.pad_token_id = 0
    model = from_hf(hf)
    idx, new = tokens(batch=2, length=5), 8
    cached = generate(model, idx, new, use_cache=True)
    uncached = generate(model, idx, new, use_cache=False)
    with torch.no_grad():
        theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new, do_sample=False)
    assert cached.shape == (2, 5 + new)
    assert_decodes_agree(model, lambda s: cached_logits(model, s, 5), uncached, cached, 5, ATOL,
                         f"{case}: cached against recomputed")
    assert_decodes_agree(model, lambda s: hf_logits(hf, s), uncached, theirs, 5, ATOL, f"{case}: transformers")


# ---------------------------------------------------------------- refusals
REFUSALS = [  # (case, config overrides, the field the error must name)
    ("llama-gqa", dict(attention_bias=True), "attention_bias"),
    ("llama-gqa", dict(mlp_bias=True), "mlp_bias"),
    ("llama-gqa", dict(hidden_act="gelu"), "hidden_act"),
    ("llama-gqa", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
                                        "long_factor": [2.0] * 4, "original_max_position_embeddings": 24}),
     "rope_type"),  # scalings the course implements are tested in test_hf_families.py
    ("qwen3-mha", dict(attention_bias=True), "attention_bias"),
    ("qwen3-mha", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), "layer_types"),
    ("gpt2-tied", dict(activation_function="relu"), "activation_function"),
    ("gpt2-tied", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    ("gpt2-tied", dict(scale_attn_weights=False), "scale_attn_weights"),
    ("deepseek-direct-q", dict(first_k_dense_replace=1, n_routed_experts=4, n_group=1, topk_group=1,
                               num_experts_per_tok=2, moe_intermediate_size=8), "first_k_dense_replace"),
    ("deepseek-direct-q", dict(attention_bias=True), "attention_bias"),
    ("deepseek-direct-q", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                "original_max_position_embeddings": 12}), "rope_type"),
]


@pytest.mark.parametrize("case, overrides, field", REFUSALS,
                         ids=[f"{c.split('-')[0]}-{f}" for c, _, f in REFUSALS])
def test_unsupported_configs_are_refused_naming_the_field(case, overrides, field):
    hf = hf_model(case, **overrides)
    with pytest.raises(ValueError, match=field):
        from_hf(hf)


def test_other_inputs_are_refused():
    with pytest.raises(TypeError, match="hf_model"):
        from_hf(torch.nn.Linear(2, 2))
    mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **dict(TINY, num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)))
    with pytest.raises(ValueError, match="model_type='mixtral' is not supported: its FFN is a mixture of experts"):
        from_hf(mixtral)
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        from_hf(hf_model("llama-gqa").model)  # the body without its LM head
    with pytest.raises(ValueError, match="bias"):
        to_hf(GPT2LM(V, d=16, n_layers=1, n_heads=2, bias=False))
    with pytest.raises(ValueError, match="eps"):
        to_hf(LlamaStyleLM(V, d=16, n_layers=1, n_heads=2, d_ff=8, mla=MLAConfig(8, 4, 4, 4, norm_eps=1e-5)))
    with pytest.raises(ValueError, match="rope_interleave"):
        to_hf(LlamaStyleLM(V, d=16, n_layers=1, n_heads=2, d_ff=8), rope_interleave=True)
    with pytest.raises(TypeError, match="model"):
        to_hf(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- layer-by-layer comparison
@pytest.mark.parametrize("case, broken, expected", [
    ("llama-gqa", "blocks.1.ffn.w_up.weight", ("blocks.1.ffn.w_up", "model.layers.1.mlp.up_proj")),
    ("gpt2-odd-untied", "blocks.0.attn.qkv.bias", ("blocks.0.attn.qkv", "transformer.h.0.attn.c_attn")),
    ("deepseek-qlora-v10", "blocks.1.attn.kv_norm.weight",
     ("blocks.1.attn.kv_norm", "model.layers.1.self_attn.kv_a_layernorm")),
    ("qwen3-gqa-tied", "blocks.0.attn.k_norm.weight", ("blocks.0.attn.wo", "model.layers.0.self_attn.o_proj")),
])
def test_compare_layers_names_the_first_broken_module(case, broken, expected):
    hf = hf_model(case)
    model = from_hf(hf)
    idx = tokens()
    clean = compare_layers(model, hf, idx, atol=ATOL)
    assert clean.first_divergence is None and clean.max_abs <= ATOL
    assert len(clean.rows) == len(module_pairs(model, hf)) + 1  # every pair ran, plus the logits
    with torch.no_grad():
        model.state_dict()[broken].add_(0.1)
    report = compare_layers(model, hf, idx, atol=ATOL)
    first = report.first_divergence
    assert (first.name_a, first.name_b) == expected
    assert first.max_abs > ATOL and first.mean_abs > 0
    before = report.rows[:report.rows.index(first)]
    assert before and all(row.ok for row in before)  # everything upstream of the break still agrees
    assert f"first divergence: {expected[0]}" in str(report)
    # the same report with the models swapped names the same place
    swapped = compare_layers(hf, model, idx, atol=ATOL).first_divergence
    assert (swapped.name_a, swapped.name_b) == expected[::-1]


# ---------------------------------------------------------------- real checkpoints, offline
def test_load_pretrained_from_a_saved_folder_and_generate_text(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(V)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(tmp_path)
    hf = hf_model("qwen3-gqa-tied")
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    hf.save_pretrained(tmp_path)

    model, tokenizer = load_pretrained(str(tmp_path), tokenizer=True)
    assert isinstance(model, LlamaStyleLM) and model.head.weight is model.emb.weight
    idx = tokenizer("w3 w14 w15 w92", return_tensors="pt").input_ids  # [1, 4]
    assert idx.tolist() == [[3, 14, 15, 92]]
    torch.testing.assert_close(model(idx).detach(), hf_logits(hf, idx), atol=ATOL, rtol=0)
    out = generate(model, idx, max_new_tokens=6)
    with torch.no_grad():
        theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=6, do_sample=False)
    assert_decodes_agree(model, lambda s: hf_logits(hf, s), out, theirs, 4, ATOL, "transformers against ours")
    text = tokenizer.decode(out[0])
    assert text.startswith("w3 w14 w15 w92") and len(text.split()) == 10
    assert load_pretrained(str(tmp_path), dtype=torch.bfloat16).head.weight.dtype == torch.bfloat16


def test_transformers_is_imported_lazily():
    """The core package must work without transformers: no module imports it at top level."""
    package = Path(modern_block.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.parse(path.read_text()).body:  # top-level statements only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "transformers" for n in names), f"{path.name} imports transformers"


# ---------------------------------------------------------------- load_pretrained checks what it loads
def _saved_folder(tmp_path, case="llama-gqa"):
    hf = hf_model(case)
    folder = tmp_path / "checkpoint"
    hf.save_pretrained(folder)
    return folder, hf


def _edit_config(folder, **changes):
    import json

    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _edit_tensors(folder, change):
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    change(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def _flip(path, offset, mask=0xFF):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _header_offset(folder, text: bytes) -> int:
    return (folder / "model.safetensors").read_bytes().index(text)


def _nan(state):
    state["model.norm.weight"][3] = float("nan")


HF_MALFORMED = {  # case: (how the folder is damaged, words the error must contain)
    "truncated file": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-100]),
                       ["truncated"]),
    "wrong magic": (lambda f: _flip(f / "model.safetensors", 7), ["not a safetensors file"]),
    "flipped byte: header text": (lambda f: _flip(f / "model.safetensors", _header_offset(f, b'"F32"') + 2),
                                  ["safetensors header is damaged"]),
    "flipped byte: a shape": (lambda f: _flip(f / "model.safetensors", _header_offset(f, b'"shape":[32,') + 10, 0x01),
                              ["does not fit its bytes"]),
    "missing tensor": (lambda f: _edit_tensors(f, lambda s: s.pop("model.layers.1.mlp.up_proj.weight")),
                       ["missing", "model.layers.1.mlp.up_proj.weight"]),
    "extra tensor": (lambda f: _edit_tensors(f, lambda s: s.update({"model.layers.0.mlp.extra.weight":
                                                                   torch.zeros(3)})),
                     ["unexpected", "model.layers.0.mlp.extra.weight"]),
    "wrong shape": (lambda f: _edit_tensors(f, lambda s: s.update({"model.layers.0.mlp.gate_proj.weight":
                                                                  torch.zeros(48, 32)})),
                    ["gate_proj.weight", "[48, 32]", "[40, 32]", "intermediate_size"]),
    "config with more layers": (lambda f: _edit_config(f, num_hidden_layers=3),
                                ["does not match its config.json", "missing", "model.layers.2."]),
    "config with fewer layers": (lambda f: _edit_config(f, num_hidden_layers=1),
                                 ["does not match its config.json", "unexpected", "model.layers.1."]),
    "config with more query heads": (lambda f: _edit_config(f, num_attention_heads=8),
                                     ["q_proj.weight", "[32, 32]", "[64, 32]", "num_attention_heads"]),
    "config with other K/V heads": (lambda f: _edit_config(f, num_key_value_heads=1),
                                    ["k_proj.weight", "[16, 32]", "[8, 32]", "num_key_value_heads"]),
    "NaN weight": (lambda f: _edit_tensors(f, _nan), ["model.norm.weight", "NaN"]),
    "no config.json": (lambda f: (f / "config.json").unlink(), ["not a checkpoint", "config.json"]),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), ["holds no weights"]),
}


@pytest.mark.parametrize("case", list(HF_MALFORMED))
def test_load_pretrained_refuses_a_damaged_or_inconsistent_folder(tmp_path, case):
    folder, _ = _saved_folder(tmp_path)
    damage, words = HF_MALFORMED[case]
    damage(folder)
    with pytest.raises(ValueError) as info:  # CheckpointError is a ValueError: one clear message, no traceback
        load_pretrained(folder)
    message = str(info.value)
    assert all(w in message for w in words), f"{case}: {message}"


def test_load_pretrained_errors_in_the_learners_terms(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_pretrained("./my/checkpoints/model")
    folder, _ = _saved_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_pretrained(folder, tokenizer=True)
    with pytest.raises(ValueError, match="is a file"):
        load_pretrained(folder / "config.json")


def test_load_pretrained_leaves_transformers_logging_alone(tmp_path):
    folder, hf = _saved_folder(tmp_path)
    for level in (transformers.logging.INFO, transformers.logging.ERROR):
        transformers.logging.set_verbosity(level)
        model = load_pretrained(folder)
        assert transformers.logging.get_verbosity() == level
    transformers.logging.set_verbosity_error()
    torch.testing.assert_close(model(tokens()).detach(), hf_logits(hf, tokens()), atol=ATOL, rtol=0)


def test_a_head_split_the_weights_cannot_show_is_not_detected(tmp_path):
    """The limit of checking shapes: with no head_dim in the config, 8 heads of 4 have the same projection shapes
    as 4 heads of 8, so such a config loads (and computes something else). Only a head_dim the config states is
    checked; the loader's docstring says so."""
    folder, hf = _saved_folder(tmp_path)
    _edit_config(folder, head_dim=None, num_attention_heads=8, num_key_value_heads=4)
    model = load_pretrained(folder)
    assert model.blocks[0].attn.h == 8
    assert not torch.allclose(model(tokens()).detach(), hf_logits(hf, tokens()), atol=1e-2)
    _edit_config(folder, head_dim=8)  # stated: now the shapes disagree and the load is refused
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_pretrained(folder)
