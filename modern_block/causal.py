"""Causal attention, the one attention every model of the course ends in (GPT-2's, GQA, MLA, the fast layer's
static cache): each new token sees itself and the tokens before it, never the ones after (lesson 00; lesson 04 adds
the KV cache's past and grouped K/V heads)."""

import torch
import torch.nn.functional as F


def causal_attention(q, k, v, past_len=0, dropout_p: float = 0.0, scale: float | None = None):
    """softmax(q·kᵀ · scale + causal mask) · v, fused (``F.scaled_dot_product_attention``).

    q: [B, h, T, dq] for T new tokens at positions past_len .. past_len + T - 1; k: [B, n_kv, S, dq] and
    v: [B, n_kv, S, dv] for the keys at positions 0 .. S - 1: usually S = past_len + T (past_len > 0 when earlier
    tokens come from a KV cache, lesson 04). New token i sees keys 0 .. past_len + i. Fewer K/V heads than query
    heads (GQA, lesson 04) are shared by groups of h / n_kv query heads. The scale defaults to 1/sqrt(dq).
    The fast layer's static cache hands over all its S slots (the unwritten ones masked) and past_len as a
    tensor, so that every decoding step runs the same code.
    """
    T, S = q.shape[-2], k.shape[-2]
    grouped = q.shape[1] != k.shape[1]
    if isinstance(past_len, int) and past_len + T == S:  # the keys are exactly the past and the new tokens
        if past_len == 0:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                                  enable_gqa=grouped)  # [B, h, T, dv]
        if T == 1:  # one new token (a decoding step) sees every key: nothing to mask
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=grouped)
    mask = torch.arange(S, device=q.device) <= past_len + torch.arange(T, device=q.device).unsqueeze(-1)  # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=grouped)  # [B, h, T, dv]
