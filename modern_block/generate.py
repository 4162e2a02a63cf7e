"""Autoregressive decoding, with or without the KV cache; both give the same tokens.

Without a cache every step runs the whole sequence again: O(T²) work for T tokens. With it the
prompt is run once (prefill) and each later step runs one token against the cached keys/values.
"""

import math

import torch

from .kv_cache import KVCache
from .validate import positive_int


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: [B, V] -> [B, 1]. Greedy at temperature 0, else sample (optionally from the top k)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # shift so the largest logit is 0 before dividing: a tiny temperature then gives -inf, not inf - inf
    logits = (logits.float() - logits.float().amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1], the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [B, V]
    return torch.multinomial(probs, 1, generator=generator)  # [B, 1]


def check_request(model, idx, max_new_tokens: int, temperature: float, top_k: int | None) -> int:
    """Check a decoding request; return the positions the cache must hold (the last new token is never fed back)."""
    positive_int("max_new_tokens", max_new_tokens)
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        positive_int("top_k", top_k)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise ValueError(f"idx must be a [batch, seq_len] tensor of token ids, got {getattr(idx, 'shape', idx)}")
    needed = idx.shape[1] + max_new_tokens - 1
    if needed > model.max_len:
        raise ValueError(f"prompt length ({idx.shape[1]}) + max_new_tokens ({max_new_tokens}) - 1 = {needed} "
                         f"exceeds the model's max_len ({model.max_len})")
    return needed


@torch.inference_mode()
def generate(model, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to each prompt in ``idx`` [B, T0]; returns [B, T0 + new].

    Runs the model in eval mode (restoring its mode afterwards). ``generator`` seeds sampling.
    """
    needed = check_request(model, idx, max_new_tokens, temperature, top_k)
    was_training = model.training
    model.eval()
    try:
        out = [idx]
        if use_cache:
            cache = KVCache(len(model.blocks), capacity=needed)
            logits = model(idx, cache)[:, -1]  # prefill: [B, V]
        else:
            logits = model(idx)[:, -1]
        for step in range(max_new_tokens):
            nxt = next_token(logits, temperature, top_k, generator)  # [B, 1]
            out.append(nxt)
            if step == max_new_tokens - 1:
                break
            if use_cache:
                logits = model(nxt, cache)[:, -1]  # one token against the cache
            else:
                logits = model(torch.cat(out, dim=1))[:, -1]  # recompute everything
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
