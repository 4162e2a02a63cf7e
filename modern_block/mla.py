"""Multi-head latent attention (MLA, DeepSeek-V2/V3): cache one small latent per token, not K and V.

Per token x (notation of the DeepSeek-V2 report):

    c    = RMSNorm(W_DKV x)               latent, d_c numbers          (cached)
    k_R  = RoPE(W_KR x)                   decoupled RoPE key, d_R      (cached, shared by all heads)
    k_m  = [W_UK,m c ; k_R]               head m's key: no-RoPE part rebuilt from the latent, plus k_R
    v_m  = W_UV,m c                       head m's value
    q_m  = [q_nope,m ; RoPE(q_rope,m)]    from x directly, or through a low-rank latent c_Q = RMSNorm(W_DQ x)

Scores use 1/sqrt(d_nope + d_R), the size of the key a head actually sees.

Two ways to compute the same attention:
  * naive: rebuild K and V for every cached token, then attend as usual (what training does);
  * absorbed: q_nope,m · (W_UK,m c) = (W_UK,mᵀ q_nope,m) · c, so each query is mapped into the
    latent space once and attends straight over the cached latents; the weighted sum of latents is
    mapped to head m's value space by W_UV,m afterwards (W_UV folds into the output projection).
    K and V are never built. Decoding uses this path.
Absorption works only because RoPE sits on the separate key k_R: a rotation between W_UK and the
query (RoPE applied to W_UK c) depends on the key's position and could not be folded into the query.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from .causal import causal_attention
from .rmsnorm import RMSNorm
from .rope import apply_rope
from .validate import dropout_rate, even, positive_ints


@dataclass(frozen=True)
class MLAConfig:
    """MLA's sizes, for ``LlamaStyleLM(..., mla=MLAConfig(...))``. The per-head defaults are
    DeepSeek-V3's (rope_dim d_R 64, nope_dim 128, v_head_dim 128); DeepSeek-V3 also has
    kv_latent_dim d_c = 512 and q_lora_rank 1536. ``norm_eps`` is the latent norms' epsilon."""

    kv_latent_dim: int
    rope_dim: int = 64
    nope_dim: int = 128
    v_head_dim: int = 128
    q_lora_rank: int | None = None
    norm_eps: float = 1e-6

    def build(self, d: int, n_heads: int, dropout: float = 0.0) -> "MLAttention":
        return MLAttention(d, n_heads, self.kv_latent_dim, rope_dim=self.rope_dim, nope_dim=self.nope_dim,
                           v_head_dim=self.v_head_dim, q_lora_rank=self.q_lora_rank, norm_eps=self.norm_eps,
                           dropout=dropout)


class MLAttention(nn.Module):
    """Multi-head latent attention with decoupled RoPE, a latent cache and weight absorption.

    ``absorb``: None (default) uses the naive path without a cache and the absorbed one with a
    cache; True or False forces one path (both give the same output up to float rounding).
    """

    def __init__(self, d: int, n_heads: int, kv_latent_dim: int, *, rope_dim: int = 64, nope_dim: int = 128,
                 v_head_dim: int = 128, q_lora_rank: int | None = None, norm_eps: float = 1e-6,
                 dropout: float = 0.0):
        super().__init__()
        positive_ints(d=d, n_heads=n_heads, kv_latent_dim=kv_latent_dim, rope_dim=rope_dim, nope_dim=nope_dim,
                      v_head_dim=v_head_dim)
        even("rope_dim", rope_dim, "for RoPE (dimensions are rotated in pairs)")
        if q_lora_rank is not None:
            positive_ints(q_lora_rank=q_lora_rank)
        self.h, self.d_c, self.d_nope, self.d_v = n_heads, kv_latent_dim, nope_dim, v_head_dim
        self.rope_dim = rope_dim  # d_R: only this part of each query/key is rotated
        self.q_lora_rank, self.dropout, self.absorb = q_lora_rank, dropout_rate(dropout), None
        self.scale = (nope_dim + rope_dim) ** -0.5
        q_out = n_heads * (nope_dim + rope_dim)  # per head: [no-RoPE part | RoPE part]
        if q_lora_rank is None:
            self.wq = nn.Linear(d, q_out, bias=False)
        else:  # low-rank query: down to q_lora_rank, RMSNorm, up to the heads (saves activations in training)
            self.wq_down = nn.Linear(d, q_lora_rank, bias=False)  # W_DQ
            self.q_norm = RMSNorm(q_lora_rank, norm_eps)
            self.wq_up = nn.Linear(q_lora_rank, q_out, bias=False)  # W_UQ and W_QR, head after head
        self.w_dkv = nn.Linear(d, kv_latent_dim, bias=False)  # W_DKV: down to the latent
        self.kv_norm = RMSNorm(kv_latent_dim, norm_eps)
        self.w_kr = nn.Linear(d, rope_dim, bias=False)  # W_KR: one RoPE key for all heads
        self.w_uk = nn.Linear(kv_latent_dim, n_heads * nope_dim, bias=False)  # W_UK: latent -> no-RoPE keys
        self.w_uv = nn.Linear(kv_latent_dim, n_heads * v_head_dim, bias=False)  # W_UV: latent -> values
        self.wo = nn.Linear(n_heads * v_head_dim, d, bias=False)

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.wo

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, d] -> q_nope [B, h, T, d_nope] and the rotated q_rope [B, h, T, d_R]."""
        B, T, _ = x.shape
        q = self.wq(x) if self.q_lora_rank is None else self.wq_up(self.q_norm(self.wq_down(x)))
        q = q.view(B, T, self.h, self.d_nope + self.rope_dim).transpose(1, 2)  # [B, h, T, d_nope + d_R]
        q_nope, q_rope = q.split([self.d_nope, self.rope_dim], dim=-1)
        return q_nope, apply_rope(q_rope, cos, sin)

    def latents(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """What the cache holds: latent [B, T, d_c] and the rotated shared key k_R [B, T, d_R]."""
        latent = self.kv_norm(self.w_dkv(x))  # [B, T, d_c]
        k_rope = apply_rope(self.w_kr(x).unsqueeze(1), cos, sin).squeeze(1)  # [B, T, d_R]
        return latent, k_rope

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x: [B, T, d]; cos, sin: RoPE tables [T, d_R/2] or [B, T, d_R/2]; cache: a ``kv_cache.LayerCache``
        (latents) or None."""
        B, T, _ = x.shape
        q_nope, q_rope = self.queries(x, cos, sin)  # [B, h, T, d_nope], [B, h, T, d_R]
        latent, k_rope = self.latents(x, cos, sin)  # [B, T, d_c], [B, T, d_R]
        past = 0
        if cache is not None:
            latent, k_rope, past = cache.append(latent, k_rope)  # [B, past + T, d_c], [B, past + T, d_R]
        absorb = cache is not None if self.absorb is None else self.absorb
        attend = self.attend_absorbed if absorb else self.attend_naive
        out = attend(q_nope, q_rope, latent, k_rope, past)  # [B, h, T, d_v]
        return self.wo(out.transpose(1, 2).reshape(B, T, self.h * self.d_v))  # [B, T, d]

    def attend_naive(self, q_nope, q_rope, latent, k_rope, past: int = 0) -> torch.Tensor:
        """Rebuild every head's K and V from the latents, then attend. Returns [B, h, T, d_v]."""
        B, S, _ = latent.shape
        k_nope = self.w_uk(latent).view(B, S, self.h, self.d_nope).transpose(1, 2)  # [B, h, S, d_nope]
        v = self.w_uv(latent).view(B, S, self.h, self.d_v).transpose(1, 2)  # [B, h, S, d_v]
        k_rope = k_rope.unsqueeze(1).expand(B, self.h, S, self.rope_dim)  # [B, h, S, d_R], same for all heads
        q = torch.cat([q_nope, q_rope], dim=-1)  # [B, h, T, d_nope + d_R]
        k = torch.cat([k_nope, k_rope], dim=-1)  # [B, h, S, d_nope + d_R]
        return causal_attention(q, k, v, past, self.dropout if self.training else 0.0, scale=self.scale)

    def attend_absorbed(self, q_nope, q_rope, latent, k_rope, past: int = 0) -> torch.Tensor:
        """Attend over the latents themselves: W_UK folded into the query, W_UV applied after the
        weighted sum. The keys are [latent | k_R], one "head" shared by all query heads (as in MQA),
        so the score is q_latent·c + q_rope·k_R. Returns [B, h, T, d_v]."""
        w_uk = self.w_uk.weight.view(self.h, self.d_nope, self.d_c)  # [h, d_nope, d_c], head m's W_UK,m
        w_uv = self.w_uv.weight.view(self.h, self.d_v, self.d_c)  # [h, d_v, d_c]
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # [B, h, T, d_c] = W_UK,mᵀ q_nope,m
        q = torch.cat([q_latent, q_rope], dim=-1)  # [B, h, T, d_c + d_R]
        k = torch.cat([latent, k_rope], dim=-1).unsqueeze(1)  # [B, 1, S, d_c + d_R]
        v = latent.unsqueeze(1)  # [B, 1, S, d_c]: the values are latents too
        mixed = causal_attention(q, k, v, past, self.dropout if self.training else 0.0, scale=self.scale)
        return torch.einsum("bhtc,hvc->bhtv", mixed, w_uv)  # [B, h, T, d_v] = W_UV,m · (mixed latent)

    def extra_repr(self) -> str:
        return (f"heads={self.h}, kv_latent_dim={self.d_c}, rope_dim={self.rope_dim}, nope_dim={self.d_nope}, "
                f"v_head_dim={self.d_v}, q_lora_rank={self.q_lora_rank}")
