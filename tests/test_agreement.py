"""The margin rule for greedy tokens across numerics (modern_block/fast/agreement.py): agreement is required
where the reference's margin exceeds twice the logit error, a flip under it is reported, not failed."""

import pytest
import torch

from modern_block.fast.agreement import Agreement, check_agreement, greedy_agreement, logit_error


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
