"""Lesson 11's checks (modern_block/classroom/checks/lesson11.py): the right answers pass, a stub is not attempted,
each typical mistake gets its diagnosis, and the checks' figures are the config card's (itself equal to transformers'
models). The right implementations are shared with test_exercises.py's RIGHT."""

import pytest
from check_helpers import passes_and_a_stub_is_not_attempted, rejects

from modern_block.classroom import checks
from modern_block.classroom.checks.lesson11 import (
    KV_AT_CASES,
    KV_AT_GRADER,
    MOE_CASES,
    MOE_FFN_CASES,
    MOE_FFN_GRADER,
    TOTALS,
)
from modern_block.interop.config_card import config_card, load_config
from modern_block.interop.config_source import language_model
from modern_block.presets import cache_size


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


def moe_ffn_parameters_ok(L, d, d_ff, first_k_dense, n_routed, top_k, d_expert, n_shared, *, mistake=None):
    matrices = 2 if mistake == "two_matrices" else 3  # gate, up, down
    expert = matrices * d * d_expert
    dense_layers = 0 if mistake == "all_moe" else first_k_dense
    moe_layers = L if mistake in ("all_moe", "dense_twice") else L - first_k_dense
    router = 0 if mistake == "no_router" else d * n_routed
    shared = 0 if mistake == "no_shared" else n_shared
    dense = dense_layers * matrices * d * d_ff
    held = dense + moe_layers * (router + (n_routed + shared) * expert)
    runs = (n_routed if mistake == "all_routed" else top_k) + (0 if mistake == "shared_held_only" else shared)
    active = dense + moe_layers * ((0 if mistake == "router_held_only" else router) + runs * expert)
    return held, active


def kv_cache_at_ok(cfg, context, *, mistake=None):
    L, h = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv = h if mistake == "query_heads" else cfg["num_key_value_heads"]
    d_h = cfg["hidden_size"] // h if mistake == "head_dim_ignored" else cfg.get("head_dim") or cfg["hidden_size"] // h
    window = cfg.get("sliding_window")
    sliding = [t == "sliding_attention" for t in cfg.get("layer_types") or []]
    if not sliding:
        p = cfg.get("sliding_window_pattern") if window else None
        full = {"pattern_off_by_one": lambda i: i % p == 0, "pattern_inverted": lambda i: (i + 1) % p != 0}.get(
            mistake, lambda i: (i + 1) % p == 0)
        sliding = [bool(p) and not full(i) for i in range(L)]
    if mistake == "every_layer" and window:
        sliding = [True] * L
    if mistake == "no_windows":
        sliding = [False] * L
    local = window if mistake == "no_min" else min(context, window or context)
    tokens = sum(local if s else context for s in sliding)
    return (1 if mistake == "no_two" else 2) * kv * d_h * 2 * tokens


@pytest.mark.parametrize("check, impl", [(checks.check_kv_bytes_per_token, kv_bytes_per_token_ok),
                                         (checks.check_smallest_multiple_of, smallest_multiple_of_ok),
                                         (checks.check_active_parameters, active_parameters_ok),
                                         (checks.check_moe_ffn_parameters, moe_ffn_parameters_ok),
                                         (checks.check_kv_cache_at, kv_cache_at_ok)])
def test_the_right_answer_passes_and_a_stub_is_not_attempted(check, impl, capsys):
    passes_and_a_stub_is_not_attempted(check, impl, capsys)


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


@pytest.mark.parametrize("mistake, diagnosis", [
    ("all_moe", "every layer was counted as MoE"), ("dense_twice", "counted twice, dense and MoE"),
    ("no_router", "the router was left out: each MoE layer's router is d x E"),
    ("router_held_only", "the router was left out of active"), ("shared_held_only", "the shared expert runs for every"),
    ("no_shared", "the shared experts were left out"), ("all_routed", "active counts every routed expert"),
    ("two_matrices", "three matrices (gate, up, down)")])
def test_check_moe_ffn_parameters_diagnoses(mistake, diagnosis):
    rejects(checks.check_moe_ffn_parameters, lambda *a: moe_ffn_parameters_ok(*a, mistake=mistake), diagnosis)


def test_moe_ffn_parameters_wants_a_pair_of_ints():
    rejects(checks.check_moe_ffn_parameters, lambda *a: moe_ffn_parameters_ok(*a)[0], "expected a tuple (held, active)")
    rejects(checks.check_moe_ffn_parameters, lambda *a: tuple(float(x) for x in moe_ffn_parameters_ok(*a)),
            "return a plain int")


@pytest.mark.parametrize("mistake, diagnosis", [
    ("every_layer", "the window was applied to every layer"), ("no_windows", "every layer holds the whole context"),
    ("no_min", "min(context, sliding_window)"), ("pattern_off_by_one", "sliding_window_pattern read off by one"),
    ("pattern_inverted", "sliding_window_pattern read inverted"), ("head_dim_ignored", "this config gives head_dim"),
    ("no_two", "the 2 for K and V is missing"), ("query_heads", "counts every query head")])
def test_check_kv_cache_at_diagnoses(mistake, diagnosis):
    rejects(checks.check_kv_cache_at, lambda cfg, context: kv_cache_at_ok(cfg, context, mistake=mistake), diagnosis)


def test_the_moe_ffn_figures_are_the_config_cards():
    """The sizes the check gives are what config_card reads from each published config, and the right answer is
    the card's FFN components (dense FFN, router, routed and shared experts), held and active per token."""
    for name, sizes in {**MOE_FFN_CASES, **MOE_FFN_GRADER}.items():
        card = config_card(name)
        a, p = card.arch, card.params
        L, d, d_ff, first_k, E, k, f, shared = sizes
        assert (L, d, first_k, E, k, f, shared) == (a.n_layers, a.d, a.n_layers - a.moe_layers, a.n_experts,
                                                     a.top_k, a.d_expert, a.n_shared), name
        assert [layer.moe for layer in a.layers] == [i >= first_k for i in range(L)], name
        assert a.d_ff in (d_ff, None) and a.experts is not None and not a.experts.router_bias
        held = p["ffn"] + p["router"] + p["experts"] + p["shared_experts"]
        idle = (card.total - card.active)  # the routed experts a token does not run
        assert moe_ffn_parameters_ok(*sizes) == (held, held - idle), name
    assert moe_ffn_parameters_ok(*MOE_FFN_CASES["DeepSeek-V3"]) == (657_758_617_600, 24_284_495_872)


def test_the_kv_cache_at_figures_are_the_config_cards():
    """The card's cache at a context (its layer kinds checked against transformers' cache in
    test_config_families.py) and lesson 04's presets give the right answers of the public and grader cases."""
    for name, context in KV_AT_CASES + [(n, c) for n in KV_AT_GRADER for c in (100, 65_536)]:
        cfg = language_model(load_config(name))[0]
        assert kv_cache_at_ok(cfg, context) == config_card(name).cache_bytes(context), (name, context)
    gemma, oss = (language_model(load_config(n))[0] for n in ("Gemma 3 27B", "gpt-oss-120b"))
    assert kv_cache_at_ok(gemma, 32_768) == cache_size("Gemma 3 27B", 32_768) == 3_120_562_176
    assert kv_cache_at_ok(oss, 131_072) == cache_size("gpt-oss-120b", 131_072) == 4_836_556_800
    assert kv_cache_at_ok(load_config("Mistral Small 3"), 32_768) == 5_368_709_120
