"""When two numerics of one model (weight formats, dtypes, compiled and eager, two devices) must give the same
greedy tokens, and when a flip is only the kernels' rounding.

A greedy token is the argmax of the logits. If another numeric moves every logit by at most ``err``, the top token
can change only where the reference's top logit leads the other's choice by at most ``2 * err`` (one logit down by
err, the other up by err). So agreement is required only at steps whose margin exceeds that bound; a flip under it
is reported with its margin, not failed. After the first flip the two sequences have different contexts, so only
the steps up to it are compared.
"""

from dataclasses import dataclass

import torch

from ..kv_cache import KVCache

# The largest logit error each weight format may make against fp32, as a share of fp32's largest |logit| on the
# same tokens: more is not rounding but a wrong kernel. Measured on SmolLM2 (lesson 10's prompt, 16 tokens, largest
# |logit| 37.6): bf16 1.4% (1.45% with the CPU's bf16 instructions off), int8 4.5%, w8a8 7.3% (calibrated on 1,024
# tokens of the training text; 10.5% on one sentence), int4 4.9% (its layers are the file's own Q4_1 levels), with
# torch 2.13.0 and 2.14.1; on the tests' tiny models at most 1.37%, 3.99% and 4.2% (int4 on tiny models with random
# weights, which the file's grid does not hold: 20-42%, checked against their own bound in tests/fast/test_int4.py).
# Each budget is 1.4x to 1.8x the worst measured.
LOGIT_BUDGET = {"bf16": 0.02, "int8": 0.08, "w8a8": 0.16, "int4": 0.08}


def logit_error(ref_logits: torch.Tensor, other_logits: torch.Tensor) -> float:
    """The largest absolute difference between two models' logits on the same tokens (any shape, same for both)."""
    if ref_logits.shape != other_logits.shape:
        raise ValueError(f"ref_logits {tuple(ref_logits.shape)} and other_logits {tuple(other_logits.shape)} must "
                         "have the same shape (the same tokens through both models)")
    return (other_logits.double() - ref_logits.double()).abs().max().item()


@dataclass(frozen=True)
class Agreement:
    """The outcome of comparing one greedy sequence with the reference's."""

    steps: int  # new tokens compared
    flip: int | None  # the first new token where they differ (None: all the same)
    margin: float | None  # the reference's top logit minus its logit of the other's token, at the flip
    bound: float  # the margin under which a flip is explained by the logit error (2 * err)

    @property
    def same(self) -> bool:
        return self.flip is None

    @property
    def explained(self) -> bool:
        """True when the tokens agree, or the first flip sits under the bound."""
        return self.flip is None or (self.margin is not None and self.margin <= self.bound)

    def __str__(self) -> str:
        if self.flip is None:
            return f"the same {self.steps} tokens"
        verdict = "within" if self.explained else "NOT explained by"
        return (f"the same up to new token {self.flip} of {self.steps}, where the reference leads by "
                f"{self.margin:.4f}: {verdict} the bound {self.bound:.4f} (2 x the logit error)")


def greedy_agreement(ref_logits: torch.Tensor, ref_tokens: torch.Tensor, other_tokens: torch.Tensor,
                     err: float) -> Agreement:
    """Compare the new tokens of one sequence.

    ref_logits [n, V]: the reference's logits that chose its n new tokens; ref_tokens, other_tokens [n]: the two
    greedy continuations; err: the largest logit difference between the two numerics (``logit_error``).
    """
    if ref_logits.dim() != 2 or ref_tokens.shape != (ref_logits.shape[0],) or other_tokens.shape != ref_tokens.shape:
        raise ValueError(f"ref_logits must be [n, V] and ref_tokens, other_tokens [n]; got "
                         f"{tuple(ref_logits.shape)}, {tuple(ref_tokens.shape)}, {tuple(other_tokens.shape)}")
    if not err >= 0:
        raise ValueError(f"err must be a logit difference >= 0, got {err}")
    n = ref_tokens.shape[0]
    differ = (ref_tokens != other_tokens).nonzero()
    if len(differ) == 0:
        return Agreement(n, None, None, 2 * err)
    p = int(differ[0])
    row = ref_logits[p].double()  # [V]
    return Agreement(n, p, (row.max() - row[other_tokens[p]]).item(), 2 * err)


def check_agreement(ref_logits: torch.Tensor, ref_tokens: torch.Tensor, other_tokens: torch.Tensor, err: float,
                    what: str = "the two decodes") -> list[Agreement]:
    """``greedy_agreement`` over a batch (ref_logits [B, n, V], tokens [B, n]); raises ``AssertionError`` naming
    the sequence when a flip is not explained, and returns every outcome (flips under the bound included) to
    report."""
    results = [greedy_agreement(ref_logits[b], ref_tokens[b], other_tokens[b], err)
               for b in range(ref_tokens.shape[0])]
    for b, a in enumerate(results):
        if not a.explained:
            raise AssertionError(f"{what}, sequence {b}: {a}")
    return results


@dataclass(frozen=True)
class DecodeComparison:
    """Two greedy decodes of the same prompts held to the margin rule: ``err``, the largest logit difference of
    the two numerics on the reference's tokens, and one ``Agreement`` per sequence."""

    err: float
    outcomes: list[Agreement]

    @property
    def same(self) -> bool:
        return all(a.same for a in self.outcomes)

    def __str__(self) -> str:
        parts = [f"sequence {b}: {a}" for b, a in enumerate(self.outcomes) if not a.same]
        return (f"largest logit difference {self.err:.2e}; "
                + ("; ".join(parts) if parts else f"the same tokens in all {len(self.outcomes)} sequences"))


def cached_logits(model, idx: torch.Tensor, prefill: int) -> torch.Tensor:
    """A plain model's logits at every position of idx [B, T] through its own KV cache, as ``generate`` computes
    them: the first ``prefill`` tokens at once, then one at a time (a forward for ``compare_decodes`` that holds a
    cached decode to the margin rule). [B, T, V]"""
    cache = KVCache(len(model.blocks), idx.shape[1])
    with torch.inference_mode():
        first = model(idx[:, :prefill], cache)  # [B, prefill, V]
        steps = [model(idx[:, t:t + 1], cache) for t in range(prefill, idx.shape[1])]  # [B, 1, V] each
    return torch.cat([first, *steps], 1)


def new_token_logits(forward, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The logits that chose the new tokens of seq [B, prompt_len + n], teacher-forced: ``forward`` (tokens
    [B, T] -> logits [B, T, V]) runs once over seq[:, :-1]. Returns [B, n, V]."""
    with torch.inference_mode():
        return forward(seq[:, :-1])[:, prompt_len - 1:]


def compare_decodes(ref_forward, other_forward, ref_seq: torch.Tensor, other_seq: torch.Tensor, prompt_len: int,
                    what: str = "the two decodes") -> DecodeComparison:
    """Hold the greedy decode other_seq to the reference's ref_seq (both [B, prompt_len + n], the same prompts).

    The logit error is measured on the reference's tokens, where both numerics see the same context:
    ``ref_forward`` and ``other_forward`` (tokens [B, T] -> logits [B, T, V], no cache) run teacher-forced over
    ref_seq. Raises ``AssertionError`` (``check_agreement``) at a flip the error does not explain.
    """
    if ref_seq.shape != other_seq.shape or ref_seq.dim() != 2 or not 0 < prompt_len < ref_seq.shape[1]:
        raise ValueError(f"ref_seq and other_seq must be [B, prompt_len + n] with n >= 1 and the same shape; got "
                         f"{tuple(ref_seq.shape)}, {tuple(other_seq.shape)} and prompt_len={prompt_len}")
    if not torch.equal(ref_seq[:, :prompt_len], other_seq[:, :prompt_len]):
        raise ValueError(f"ref_seq and other_seq must start with the same {prompt_len}-token prompts")
    ref_logits = new_token_logits(ref_forward, ref_seq, prompt_len)  # [B, n, V]
    err = logit_error(ref_logits, new_token_logits(other_forward, ref_seq, prompt_len))
    outcomes = check_agreement(ref_logits, ref_seq[:, prompt_len:], other_seq[:, prompt_len:], err, what)
    return DecodeComparison(err, outcomes)
