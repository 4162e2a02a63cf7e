"""Initialisation by role (modern_block/params.py): every model starts as GPT-2 did, the two linears per layer
that write into the residual stream at std 0.02/sqrt(2L), everything else at 0.02, in the same draws as before.

The oracle here is the test's own table of which weight writes into the residual stream (by the kind of module
holding it), not the blocks' ``residual_projections()``: dropping the 1/sqrt(2L), or scaling other layers, fails."""

import math

import pytest
import torch
import torch.nn as nn

from modern_block import (
    GPT2LM,
    CausalSelfAttention,
    GeluMLP,
    GQAttention,
    LlamaStyleLM,
    MLAConfig,
    MLAttention,
    RMSNorm,
    SwiGLU,
    count_parameters,
    parameter_breakdown,
)
from modern_block.training.ladder import MODEL_NAMES, ModelShape, ladder_model

OUTPUT_OF = {CausalSelfAttention: "proj", GeluMLP: "proj", GQAttention: "wo", MLAttention: "wo", SwiGLU: "w_down"}
L = 4
MODELS = {
    "gpt2": lambda: GPT2LM(100, d=64, n_layers=L, n_heads=4, max_len=32),
    "gpt2-untied-no-bias": lambda: GPT2LM(100, d=64, n_layers=L, n_heads=4, max_len=32, tie=False, bias=False),
    "llama": lambda: LlamaStyleLM(100, d=64, n_layers=L, n_heads=4, n_kv_heads=2, d_ff=96, max_len=32),
    "qwen2-bias-tied": lambda: LlamaStyleLM(100, d=64, n_layers=L, n_heads=4, n_kv_heads=2, d_ff=96, max_len=32,
                                            qkv_bias=True, tie=True),
    "mla": lambda: LlamaStyleLM(100, d=64, n_layers=L, n_heads=4, d_ff=96, max_len=32,
                                mla=MLAConfig(kv_latent_dim=32, rope_dim=16, nope_dim=16, v_head_dim=16,
                                              q_lora_rank=32)),
    **{f"ladder:{rung}": (lambda rung=rung: ladder_model(rung, ModelShape(64, L, 4, 2, 32), 100))
       for rung in MODEL_NAMES},
}


def residual_writers(model: nn.Module) -> set[str]:
    """Names of the weights that write into the residual stream: each sublayer's output projection."""
    return {f"{path}.{OUTPUT_OF[type(m)]}.weight" for path, m in model.named_modules() if type(m) in OUTPUT_OF}


@pytest.mark.parametrize("name", list(MODELS))
def test_each_weight_starts_at_the_std_of_its_role(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    writers = residual_writers(model)
    assert len(writers) == 2 * L  # one attention output and one FFN output per layer
    for path, p in model.named_parameters():
        leaf = path.rsplit(".", 1)[-1]
        owner = model.get_submodule(path.rsplit(".", 1)[0])
        if isinstance(owner, (nn.LayerNorm, RMSNorm)):  # norm scales at one, norm biases at zero
            assert torch.equal(p, torch.ones_like(p) if leaf == "weight" else torch.zeros_like(p)), path
        elif leaf == "bias":
            assert torch.equal(p, torch.zeros_like(p)), path
        else:
            want = 0.02 / math.sqrt(2 * L) if path in writers else 0.02
            se = want / math.sqrt(2 * p.numel())  # standard error of a sample std
            assert abs(p.std().item() - want) < 6 * se + 0.02 * want, (path, p.std().item(), want)
            assert abs(p.mean().item()) < 6 * want / math.sqrt(p.numel()), path


def test_the_draws_keep_their_order():
    """A fingerprint of the initial weights for seed 0, recorded before initialisation moved from name suffixes
    to roles: the same draws in the same order (a checksum that weighs each matrix by its place in the order),
    so trained results do not change."""
    recorded = {"gpt2": 24156.712670996672, "llama": 27302.362357059166, "ladder:swiglu": 32895.87182690537,
                "ladder:no_rope": 45223.35049009024}
    for name, fingerprint in recorded.items():
        torch.manual_seed(0)
        matrices = [p for p in MODELS[name]().parameters() if p.dim() == 2]
        got = sum((i + 1) * p.double().abs().sum().item() for i, p in enumerate(matrices))
        assert got == pytest.approx(fingerprint, rel=1e-9), name


def test_counting_counts_a_tied_matrix_once():
    tied, untied = GPT2LM(100, d=32, n_layers=1, n_heads=4), GPT2LM(100, d=32, n_layers=1, n_heads=4, tie=False)
    assert count_parameters(untied) - count_parameters(tied) == 100 * 32
    assert count_parameters(tied.requires_grad_(False), trainable_only=True) == 0


def test_the_breakdown_puts_each_parameter_under_its_component():
    model = GPT2LM(100, d=32, n_layers=1, n_heads=4, max_len=16)
    model.extra = nn.Linear(2, 3, bias=False)  # no known component in its name
    parts = parameter_breakdown(model)
    assert parts["other"] == 6
    assert parts["embedding"] == 100 * 32 and parts["positions"] == 16 * 32  # a tied head counts once, here
    assert sum(parts.values()) == count_parameters(model)
    assert set(parts) == {"embedding", "positions", "attention", "ffn", "norms", "other"}


def test_counting_everything_by_default_or_only_the_trainable():
    model = GPT2LM(100, d=32, n_layers=1, n_heads=4, max_len=16)
    total = sum(p.numel() for p in model.parameters())
    model.wpe.requires_grad_(False)  # freeze the position table only
    assert count_parameters(model) == total  # frozen parameters count by default
    assert count_parameters(model, trainable_only=True) == total - 16 * 32
