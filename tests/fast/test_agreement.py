"""The margin rule for greedy tokens across numerics (modern_block/fast/agreement.py): agreement is required
where the reference's margin exceeds twice the logit error, a flip under it is reported, not failed."""

import pytest
import torch

from modern_block import LlamaStyleLM, generate
from modern_block.fast.agreement import (
    Agreement,
    cached_logits,
    check_agreement,
    compare_decodes,
    greedy_agreement,
    logit_error,
    new_token_logits,
)


def test_logit_error_is_the_largest_absolute_difference():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert logit_error(a, a + torch.tensor([[0.0, -0.25], [0.125, 0.0]])) == 0.25
    with pytest.raises(ValueError, match="same shape"):
        logit_error(a, a[0])


def test_identical_tokens_agree():
    logits = torch.randn(5, 7)
    tokens = logits.argmax(-1)
    a = greedy_agreement(logits, tokens, tokens.clone(), err=0.0)
    assert a.same and a.explained and a.flip is None and str(a) == "the same 5 tokens"


def test_a_flip_under_the_bound_is_explained_and_one_above_is_not():
    logits = torch.zeros(4, 3)
    logits[:, 0] = 1.0
    logits[2, 1] = 0.9  # step 2: token 0 leads token 1 by 0.1
    ref = logits.argmax(-1)  # [0, 0, 0, 0]
    other = torch.tensor([0, 0, 1, 2])  # flips at step 2 (then the contexts differ: step 3 is not compared)
    close = greedy_agreement(logits, ref, other, err=0.06)
    assert close.flip == 2 and close.margin == pytest.approx(0.1) and close.bound == pytest.approx(0.12)
    assert close.explained and not close.same and "within" in str(close)
    far = greedy_agreement(logits, ref, other, err=0.04)
    assert not far.explained and "NOT explained" in str(far)
    with pytest.raises(AssertionError, match="sequence 1: .*NOT explained"):
        check_agreement(torch.stack([logits, logits]), torch.stack([ref, ref]), torch.stack([ref, other]), 0.04,
                        what="bf16 against fp32")
    outcomes = check_agreement(torch.stack([logits, logits]), torch.stack([ref, ref]), torch.stack([ref, other]),
                               0.06)
    assert [o.flip for o in outcomes] == [None, 2]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"ref_logits must be \[n, V\]"):
        greedy_agreement(torch.zeros(3), torch.zeros(3), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="err must be"):
        greedy_agreement(torch.zeros(3, 2), torch.zeros(3), torch.zeros(3), float("nan"))
    assert Agreement(3, None, None, 0.0).explained


def test_compare_decodes_measures_the_error_on_the_references_tokens():
    """Two 'numerics' as functions of the tokens: the other's logits are the reference's plus a known offset, so the
    measured error is that offset; a flip under twice it is explained, one above it is not."""
    V = 5
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))

    def ref(seq):  # [B, T] -> [B, T, V]: the next token's logits depend on the current token only
        return table[seq]

    def other(seq):
        return table[seq] + 0.01 * (seq[..., None] == 0)  # every logit after token 0 moved by 0.01

    prompt = torch.tensor([[0, 1]])
    seq = prompt.clone()
    for _ in range(4):  # the reference's greedy decode
        seq = torch.cat([seq, ref(seq)[:, -1:].argmax(-1)], 1)
    cmp = compare_decodes(ref, other, seq, seq.clone(), 2)
    assert cmp.same and cmp.err == pytest.approx(0.01 if (seq[0, 1:-1] == 0).any() else 0.0)
    assert str(cmp).startswith("largest logit difference") and "the same tokens in all 1 sequences" in str(cmp)
    logits = new_token_logits(ref, seq, 2)  # [1, 4, V]
    assert torch.equal(logits.argmax(-1), seq[:, 2:])
    flipped = seq.clone()
    flipped[0, 3] = logits[0, 1].argsort()[-2]  # the reference's runner-up at new token 1
    margin = (logits[0, 1].max() - logits[0, 1].sort().values[-2]).item()
    with pytest.raises(AssertionError, match="sequence 0: the same up to new token 1 of 4"):
        compare_decodes(ref, lambda s: table[s] + margin / 4, seq, flipped, 2)  # bound margin / 2: not explained
    outcome = compare_decodes(ref, lambda s: table[s] + margin * (s[..., None] == s[0, 2]), seq, flipped, 2)
    assert outcome.outcomes[0].flip == 1 and outcome.outcomes[0].explained and not outcome.same


def test_compare_decodes_refuses_decodes_of_other_prompts_or_shapes():
    seq = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="same 2-token prompts"):
        compare_decodes(lambda s: s, lambda s: s, seq, torch.tensor([[1, 0, 3, 4]]), 2)
    with pytest.raises(ValueError, match=r"\[B, prompt_len \+ n\]"):
        compare_decodes(lambda s: s, lambda s: s, seq, seq[:, :3], 2)
    with pytest.raises(ValueError, match=r"\[B, prompt_len \+ n\]"):
        compare_decodes(lambda s: s, lambda s: s, seq, seq, 4)


def test_cached_logits_are_what_generate_computed():
    """Through the plain KV cache with the prompt as prefill and the same capacity, cached_logits runs generate's
    own kernels on the same shapes: its argmax is generate's token, exactly, and its logits are the whole-sequence
    forward's up to rounding."""
    torch.manual_seed(0)
    model = LlamaStyleLM(V=50, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=32).eval()
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    seq = generate(model, prompt, 8)  # [2, 13]
    through_cache = cached_logits(model, seq[:, :-1], 5)  # [2, 12, V]
    assert through_cache.shape == (2, 12, 50)
    assert torch.equal(through_cache[:, 4:].argmax(-1), seq[:, 5:])
    with torch.no_grad():
        torch.testing.assert_close(through_cache, model(seq[:, :-1]), atol=1e-5, rtol=0)
    cmp = compare_decodes(model, lambda s: cached_logits(model, s, 5), seq, seq, 5)
    assert cmp.same and cmp.err < 1e-5
