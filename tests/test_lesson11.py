"""Lesson 11's checks (modern_block/classroom/checks/lesson11.py): the right answers pass, a stub is not attempted,
and each typical mistake gets its diagnosis. The right implementations are shared with test_exercises.py's RIGHT."""

import pytest
from check_helpers import rejects

from modern_block.classroom import checks
from modern_block.classroom.checks import NotAttempted
from modern_block.classroom.checks.lesson11 import MOE_CASES, TOTALS
from modern_block.interop.config_card import config_card, load_config


def kv_bytes_per_token_ok(cfg, *, mistake=None):
    L = cfg["num_hidden_layers"]
    if "kv_lora_rank" in cfg:
        rope = 0 if mistake == "no_rope" else cfg["qk_rope_head_dim"]
        return L * (cfg["kv_lora_rank"] + rope) * 2
    h = cfg["num_attention_heads"]
    kv = h if mistake == "query_heads" else cfg.get("num_key_value_heads", h)
    dh = cfg["hidden_size"] // h if mistake == "d_over_h" else cfg.get("head_dim") or cfg["hidden_size"] // h
    return (1 if mistake == "no_two" else 2) * L * kv * dh * 2


def smallest_multiple_of_ok(d, d_ff, ffn_dim_multiplier=None, *, mistake=None):
    powers = [2**k for k in range(4, 13)]
    for m in reversed(powers) if mistake == "largest" else powers:
        hidden = int(8 * d / 3)
        if ffn_dim_multiplier is not None:
            hidden = int(ffn_dim_multiplier * hidden)
        rounded = hidden // m * m if mistake == "round_down" else -(-hidden // m) * m
        if rounded == d_ff:
            return m
    return None


def active_parameters_ok(total, moe_layers, n_experts, top_k, d, d_expert, *, mistake=None):
    per_expert = (2 if mistake == "two_matrices" else 3) * d * d_expert
    idle = top_k if mistake == "picked" else n_experts - top_k
    return total - (1 if mistake == "one_layer" else moe_layers) * idle * per_expert


@pytest.mark.parametrize("check, impl", [(checks.check_kv_bytes_per_token, kv_bytes_per_token_ok),
                                         (checks.check_smallest_multiple_of, smallest_multiple_of_ok),
                                         (checks.check_active_parameters, active_parameters_ok)])
def test_the_right_answer_passes_and_a_stub_is_not_attempted(check, impl, capsys):
    check(impl)
    assert capsys.readouterr().out.startswith(f"✓ {check.__name__} passed")

    def stub(*args, **kwargs):
        raise NotImplementedError("write this")

    with pytest.raises(NotAttempted, match="write this"):
        check(stub)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("no_two", "the 2 for K and V is missing"), ("query_heads", "counts every query head"),
    ("no_rope", "decoupled RoPE key")])
def test_check_kv_bytes_per_token_diagnoses(mistake, diagnosis):
    rejects(checks.check_kv_bytes_per_token, lambda cfg: kv_bytes_per_token_ok(cfg, mistake=mistake), diagnosis)


def test_head_dim_from_d_over_h_is_named():
    message = rejects(checks.check_kv_bytes_per_token, lambda cfg: kv_bytes_per_token_ok(cfg, mistake="d_over_h"))
    assert "Qwen3-0.6B" in message  # the one config whose head_dim is not hidden_size / heads


@pytest.mark.parametrize("mistake, diagnosis", [("largest", "the largest power of two"),
                                                ("round_down", "rounded down")])
def test_check_smallest_multiple_of_diagnoses(mistake, diagnosis):
    rejects(checks.check_smallest_multiple_of, lambda *a: smallest_multiple_of_ok(*a, mistake=mistake), diagnosis)


@pytest.mark.parametrize("mistake, diagnosis", [
    ("two_matrices", "three matrices"), ("picked", "the picked experts were subtracted"),
    ("one_layer", "one layer's idle experts")])
def test_check_active_parameters_diagnoses(mistake, diagnosis):
    rejects(checks.check_active_parameters, lambda *a: active_parameters_ok(*a, mistake=mistake), diagnosis)


def test_the_checks_figures_are_the_config_cards():
    for name, (L, E, k, d, f) in MOE_CASES.items():
        card = config_card(name)
        assert TOTALS[name] == card.total and (card.arch.moe_layers, card.arch.n_experts) == (L, E)
        assert active_parameters_ok(card.total, L, E, k, d, f) == card.active
    for name in ("Llama 3.1 8B", "Qwen3-0.6B", "DeepSeek-V3"):
        assert kv_bytes_per_token_ok(load_config(name)) == config_card(name).kv_bytes_per_token()
