"""The checks in the grader's mode (``Mode.graded``): inputs and grader-only cases drawn from a secret, no success
line; a table of answers harvested from the notebook's runs fails every exercise in the grader; and the pieces
each check hides (``checks.hiding``)."""

import secrets

import pytest
import torch
import torch.nn as nn
from test_exercises import RIGHT

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks import CheckFailed, Mode, graded
from modern_block.classroom.checks.core import CheckRun
from modern_block.classroom.checks.hiding import HIDES, SDPA, USES

CODE = [(check, impl) for check, impl in RIGHT if callable(impl)]
VALUES = [(check, value) for check, value in RIGHT if not callable(value)]


@pytest.mark.parametrize("check, impl", RIGHT, ids=[c.__name__ for c, _ in RIGHT])
def test_the_right_implementations_pass_under_any_secret(check, impl, capsys):
    for _ in range(2):
        check(impl, mode=Mode.graded(secrets.randbits(62)))
    assert capsys.readouterr().out == ""  # the grader writes the report, not the check


def test_rope_tables_are_judged_within_float32_angle_error_at_every_drawn_position():
    """The secret draws positions up to about 1,000, where a right float32 table is 2e-5 off float64: the
    tolerance grows with the largest position (this secret drew 894 and failed the right answer before)."""
    impl = next(i for c, i in RIGHT if c is checks.check_rope_cache)
    for secret in (1894029364758459316, *range(40)):
        checks.check_rope_cache(impl, mode=Mode.graded(secret))


def test_the_graders_older_interface_still_sets_the_mode(capsys):
    """``graded(secret)`` and ``answer_sources(cells)``, as the grader's session calls them: the checks inside the
    block run in the grader's mode and read those cells."""
    from modern_block.classroom.checks.in_notebook import answer_sources

    with graded(5), answer_sources(["kimi_k2_cache_bytes = 70_272"]), pytest.raises(CheckFailed, match="typed in"):
        checks.check_kimi_k2_cache_bytes(70_272)
    with graded(5):
        checks.check_rms(RIGHT[4][1])
    assert capsys.readouterr().out == ""


def test_the_inputs_depend_on_the_secret_and_only_in_graded_mode():
    seen = []

    def rms(x, eps=1e-6):
        seen.append(x.clone())
        return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()

    checks.check_rms(rms, mode=Mode.script())
    checks.check_rms(rms, mode=Mode.script())
    notebook_a, notebook_b = seen[0], seen[len(seen) // 2]
    assert torch.equal(notebook_a, notebook_b)  # a notebook always sees the same inputs
    seen.clear()
    checks.check_rms(rms, mode=Mode.graded(1))
    checks.check_rms(rms, mode=Mode.graded(2))
    first, second = seen[0], seen[len(seen) // 2]
    assert first.shape == second.shape == notebook_a.shape
    assert not torch.equal(first, second) and not torch.equal(first, notebook_a)


@pytest.mark.parametrize("check, impl", CODE, ids=[c.__name__ for c, _ in CODE])
def test_every_exercise_has_grader_only_cases(check, impl):
    drawn = []

    def observer(case, *_):
        drawn.append(case.secret)

    check(impl, mode=Mode("graded", secret=3, observer=observer))
    assert any(drawn), f"{check.__name__} judges no case drawn from the grader's secret"
    public = []
    check(impl, mode=Mode("script", observer=lambda case, *_: public.append(case.secret)))
    assert public and not any(public)


# ---- a table of answers harvested from the notebook's runs ------------------------------------------------


def key(value):
    """A value as a hashable key: the numbers of tensors, the state of modules, containers item by item."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), tuple(value.detach().contiguous().view(-1).tolist()))
    if isinstance(value, nn.Module):
        return ("module", key(value.state_dict()))
    if isinstance(value, dict):
        return ("dict", tuple((k, key(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(key(v) for v in value))
    return ("value", repr(value))


def harvest(check, impl) -> dict:
    """Every call the notebook's run of ``check`` makes, its answer and what it left in its dict arguments."""
    table: dict = {}

    def answer(call, *args, **kwargs):
        k = key((args, kwargs))
        out = call(*args, **kwargs)
        table[k] = (out, [dict(a) if isinstance(a, dict) else None for a in args])
        return out

    if isinstance(impl, type):
        class Recording(impl):
            def forward(self, *args, **kwargs):
                return answer(super().forward, *args, **kwargs)
        check(Recording, mode=Mode.script())
    else:
        check(lambda *args, **kwargs: answer(impl, *args, **kwargs), mode=Mode.script())
    return table


def looked_up(table: dict, impl):
    """An answer that only looks the call up in the table (dict arguments left as the table says)."""
    def lookup(fallback, *args, **kwargs):
        found = table.get(key((args, kwargs)))
        if found is None:
            return fallback(*args)
        out, after = found
        for arg, state in zip(args, after, strict=True):
            if isinstance(arg, dict) and state is not None:
                arg.clear()
                arg.update(state)
        return out

    if isinstance(impl, type):
        class Table(impl):
            def forward(self, *args, **kwargs):
                return lookup(lambda x, *rest: torch.zeros_like(x), *args, **kwargs)
        return Table
    return lambda *args, **kwargs: lookup(lambda *a: 0, *args, **kwargs)


@pytest.mark.parametrize("check, impl", CODE, ids=[c.__name__ for c, _ in CODE])
def test_a_harvested_table_of_answers_passes_the_notebook_and_fails_the_grader(check, impl):
    table = harvest(check, impl)
    cheat = looked_up(table, impl)
    check(cheat, mode=Mode.script())  # the notebook's own cases: the table has them all
    for secret in (1, 2, 3):
        with pytest.raises(CheckFailed):
            check(cheat, mode=Mode.graded(secret))


@pytest.mark.parametrize("check, value", VALUES, ids=[c.__name__ for c, _ in VALUES])
def test_a_harvested_value_is_typed_in(check, value):
    for source in (f"{check.value} = {value!r}", f"{check.value} = {value!r} * 1", f"{check.value} = int('{value}')"
                   if isinstance(value, int) else f"{check.value} = float('{value!r}')"):
        with pytest.raises(CheckFailed, match="typed in"):
            check(value, mode=Mode.graded(7, sources=["import math", source]))


def test_the_table_of_public_swiglu_answers_fails_under_every_secret():
    """1.5 × 8d/3 rounds to 4d: a table falling back to GPT-2's 4d must still fail under every secret."""
    table = {}

    def record(d, multiple_of=256, ffn_dim_multiplier=None):
        table[(d, multiple_of, ffn_dim_multiplier)] = mb.swiglu_hidden_dim(d, multiple_of, ffn_dim_multiplier)
        return table[(d, multiple_of, ffn_dim_multiplier)]

    checks.check_swiglu_hidden_dim(record, mode=Mode.script())

    def looked(d, multiple_of=256, ffn_dim_multiplier=None):
        return table.get((d, multiple_of, ffn_dim_multiplier), 4 * d)

    checks.check_swiglu_hidden_dim(looked, mode=Mode.script())
    for secret in range(300):
        with pytest.raises(CheckFailed, match="got"):
            checks.check_swiglu_hidden_dim(looked, mode=Mode.graded(secret))


# ---- what each check hides ---------------------------------------------------------------------------------


def test_every_check_has_its_row_in_the_table_and_names_only_real_pieces():
    from modern_block.fast import profiling, weights
    from modern_block.interop import config_card, gguf_quants
    from modern_block.training import config, device, statistics

    names = set(dir(mb)) | set(dir(config)) | set(dir(device)) | set(dir(gguf_quants)) | set(dir(profiling))
    names |= set(dir(weights)) | set(dir(config_card)) | set(dir(statistics)) | {"config_card"}
    names |= {"GQAttention.forward", "_broadcast_tables", SDPA}
    check_names = {n for n in checks.__all__ if n.startswith("check_")}
    assert set(HIDES) == check_names and set(USES) <= check_names
    for name in check_names:
        check = getattr(checks, name)
        assert check.components == HIDES[name] and check.uses == USES.get(name, ())
        assert set(check.components) <= names, (name, set(check.components) - names)
        assert not set(check.components) & set(check.uses), name
        assert check.components or name == "check_fair_comparison", name  # the one with nothing to hide
    assert CheckRun("check_rms", Mode.script()).hidden == ("RMSNorm",)


def _moe_ffn_by_the_card(L, d, d_ff, first_k_dense, n_routed, top_k, d_expert, n_shared):
    """11 ex4 answered by the config card: a DeepSeek-V3 config of these sizes, its FFN components read back."""
    from modern_block.interop.config_card import config_card

    card = config_card({"model_type": "deepseek_v3", "hidden_size": d, "num_hidden_layers": L,
                        "intermediate_size": d_ff or 1, "first_k_dense_replace": first_k_dense,
                        "n_routed_experts": n_routed, "num_experts_per_tok": top_k, "moe_intermediate_size": d_expert,
                        "n_shared_experts": n_shared, "num_attention_heads": 1, "num_key_value_heads": 1,
                        "vocab_size": 1})
    held = sum(card.params[k] for k in ("ffn", "router", "experts", "shared_experts"))
    return held, held - (card.total - card.active)


def _kv_cache_at_by_the_card(cfg, context):
    from modern_block.interop.config_card import config_card

    return config_card(cfg).cache_bytes(context)


@pytest.mark.parametrize("check, oracle", [
    (checks.check_moe_ffn_parameters, _moe_ffn_by_the_card), (checks.check_kv_cache_at, _kv_cache_at_by_the_card),
    (checks.check_rope_cache, lambda positions, dh, base=10000.0: mb.RotaryEmbedding(dh, 4096, base, scaling={
        "rope_type": "linear", "factor": 1.0})(positions)),
    (checks.check_llama_param_count, lambda V, d, L, h, kv, d_ff, tie=False, qk_norm=True, qkv_bias=False:
     mb.ModelPreset("x", L, h, kv, d // h, d_model=d, d_ff=d_ff, vocab_size=V, tied=tie,
                    qk_norm=qk_norm).parameters()),
    (checks.check_mla_cache_bytes, lambda L, dc, dr, b=2: mb.kv_cache_bytes_per_token(L, 1, dc + dr, b) // 2),
], ids=["config_card for 11 ex4", "config_card for 11 ex5", "RotaryEmbedding for 03 ex1", "ModelPreset for 07 ex3",
         "kv_cache_bytes_per_token for 05 ex1"])
def test_the_packages_oracles_are_hidden_for_their_exercise(check, oracle):
    """The issue's oracles: each answers the exercise (in a script nothing is hidden; its row in the table lists
    it), and in a notebook the check refuses it."""
    from modern_block.classroom.checks import in_notebook

    name = check.__name__
    assert any(h in HIDES[name] for h in ("RotaryEmbedding", "ModelPreset", "kv_cache_bytes_per_token", "config_card"))
    if name != "check_llama_param_count":  # (the preset counts no biases: it answers the bias-free cases only)
        check(oracle, mode=Mode.script())
    in_notebook.reset()
    check(oracle, mode=Mode.notebook([], {}))
    status, message = in_notebook.results()[name]
    assert status == "failed" and "is not available while this notebook is graded" in message, message
    in_notebook.reset()
