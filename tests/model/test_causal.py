"""causal_attention, the one attention every model ends in: against attention written out by hand (a prompt, a
KV cache's past, a static cache's unwritten slots, grouped K/V heads), its dropout, its device."""

import math

import pytest
import torch

from modern_block.causal import causal_attention


def attention_by_hand(q, k, v, past_len):
    """softmax(q·kᵀ/sqrt(dq) + mask)·v with each K/V head repeated for its group of query heads; new token i
    (at position past_len + i) sees keys 0 .. past_len + i."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, h, T, S]
    future = torch.arange(S) > int(past_len) + torch.arange(T).unsqueeze(-1)  # [T, S]
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


CASES = [  # (T new tokens, S keys, past_len)
    (4, 4, 0),  # a prompt: causal
    (1, 1, 0),  # a one-token prompt
    (3, 4, 1),  # a cache holding one token, then three new ones
    (1, 5, 4),  # a decoding step: the new token sees every key
    (2, 5, 3),  # two new tokens after three
    (1, 5, 2),  # more keys than past + new (a static cache's unwritten slots): those after the token masked
    (2, 6, 1),
    (1, 5, torch.tensor(2)),  # the fast layer's static cache: past_len in a tensor
    (2, 6, torch.tensor(1)),
]


@pytest.mark.parametrize("n_kv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("T,S,past_len", CASES, ids=lambda x: str(int(x)) if isinstance(x, torch.Tensor) else str(x))
def test_causal_attention_matches_attention_by_hand(T, S, past_len, n_kv):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, n_kv, S, 8), torch.randn(2, n_kv, S, 6)
    want = attention_by_hand(q, k, v, past_len)
    torch.testing.assert_close(causal_attention(q, k, v, past_len), want, atol=1e-5, rtol=1e-5)
    if isinstance(past_len, int) and past_len == 0 and T == S:  # the defaults: a prompt, no dropout
        torch.testing.assert_close(causal_attention(q, k, v), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,S,past_len", [(4, 4, 0), (1, 5, 4), (2, 5, 3)], ids=["prompt", "step", "masked"])
def test_causal_attention_dropout_drops_weights_without_bias(T, S, past_len):
    """dropout_p drops attention weights (each draw differs from the plain attention) and rescales the kept ones
    by 1/(1 - p): the mean over many draws is the plain attention."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, T, 8), torch.randn(1, 2, S, 8), torch.randn(1, 2, S, 8)
    plain = causal_attention(q, k, v, past_len)
    n = 4000
    dropped = causal_attention(*(t.expand(n, -1, -1, -1) for t in (q, k, v)), past_len, dropout_p=0.5)
    assert (dropped - plain).abs().amax(dim=(1, 2, 3)).min() > 1e-3  # no draw is the plain attention
    torch.testing.assert_close(dropped.mean(0, keepdim=True), plain, atol=0.15, rtol=0)


@pytest.mark.parametrize("T,S,past_len", [(4, 4, 0), (1, 5, 4), (2, 5, 3), (1, 5, 2)])
def test_causal_attention_stays_on_the_inputs_device(T, S, past_len):
    """The mask is made on q's device (on a GPU a CPU mask fails); "meta" stands in for a device that is not the CPU."""
    q, k, v = torch.empty(1, 2, T, 8, device="meta"), torch.empty(1, 2, S, 8, device="meta"), \
        torch.empty(1, 2, S, 8, device="meta")
    assert causal_attention(q, k, v, past_len).device == q.device
