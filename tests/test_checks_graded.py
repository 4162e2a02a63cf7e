"""The checks in the grader's mode (``checks.core.graded``): inputs drawn from a secret, hidden integer
cases, no success line; and the components each check names as the package's own implementation."""

import secrets

import pytest
import torch
from test_exercises import RIGHT

import modern_block as mb
from modern_block.classroom import checks
from modern_block.classroom.checks.core import graded


@pytest.mark.parametrize("check, impl", RIGHT, ids=[c.__name__ for c, _ in RIGHT])
def test_the_right_implementations_pass_under_any_secret(check, impl, capsys):
    for _ in range(2):
        with graded(secrets.randbits(62)):
            check(impl)
    assert capsys.readouterr().out == ""  # the grader writes the report, not the check


def test_the_inputs_depend_on_the_secret_and_only_in_graded_mode():
    seen = []

    def rms(x, eps=1e-6):
        seen.append(x.clone())
        return (x.float().pow(2).mean(-1, keepdim=True) + eps).sqrt()

    checks.check_rms(rms)
    checks.check_rms(rms)
    notebook_a, notebook_b = seen[0], seen[len(seen) // 2]
    assert torch.equal(notebook_a, notebook_b)  # a notebook always sees the same inputs
    seen.clear()
    with graded(1):
        checks.check_rms(rms)
    with graded(2):
        checks.check_rms(rms)
    first, second = seen[0], seen[len(seen) // 2]
    assert first.shape == second.shape == notebook_a.shape
    assert not torch.equal(first, second) and not torch.equal(first, notebook_a)


def test_a_table_of_the_public_answers_fails_only_in_graded_mode():
    table = {}

    def record(d, multiple_of=256, ffn_dim_multiplier=None):
        table[(d, multiple_of, ffn_dim_multiplier)] = mb.swiglu_hidden_dim(d, multiple_of, ffn_dim_multiplier)
        return table[(d, multiple_of, ffn_dim_multiplier)]

    checks.check_swiglu_hidden_dim(record)

    def looked_up(d, multiple_of=256, ffn_dim_multiplier=None):
        return table.get((d, multiple_of, ffn_dim_multiplier), 4 * d)

    checks.check_swiglu_hidden_dim(looked_up)  # the notebook's fixed cases: the table passes
    for secret in range(300):  # under every secret, not most: 1.5 x 8d/3 rounds to 4d, a draw must avoid it
        with graded(secret), pytest.raises(checks.CheckFailed, match="got"):
            checks.check_swiglu_hidden_dim(looked_up)


def test_every_check_of_code_names_the_components_it_exercises():
    from modern_block import statistics
    from modern_block.fast import profiling, weights
    from modern_block.interop import config_card, gguf_quants
    from modern_block.training import config, device

    names = set(dir(mb)) | set(dir(config)) | set(dir(device)) | set(dir(gguf_quants)) | set(dir(profiling))
    names |= set(dir(weights)) | set(dir(config_card)) | set(dir(statistics))
    names |= {"GQAttention.forward", "_broadcast_tables"}
    values = {c.__name__ for c, impl in RIGHT if not callable(impl)} | {"check_fair_comparison"}
    for name in checks.__all__:
        if name.startswith("check_"):
            components = getattr(checks, name).components
            assert bool(components) == (name not in values), name
            assert set(components) <= names, (name, set(components) - names)
