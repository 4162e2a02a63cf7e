"""Step 1 of the fast layer: fused projections, by swapping modules.

    fused = fused_copy(model)      # a copy; every GQAttention and SwiGLU replaced by its fused version

Grouped-query attention projects x three times (W_q, W_k, W_v) and SwiGLU twice before its gate (W_gate,
W_up). Stacking each group's weight rows into one ``nn.Linear`` (litgpt does this when it converts a
checkpoint) computes the same outputs with one matrix multiplication instead of three, and one instead of two:
a layer runs 4 instead of 7. The fused weights are exactly the stacked originals.

The rule: ``fused_copy`` replaces the modules of exactly two classes, ``GQAttention`` by ``FusedGQAttention``
and ``SwiGLU`` by ``FusedSwiGLU``, and leaves every other module as it is (GPT-2's attention, which already has
one q/k/v matrix; MLA, whose decoding path absorbs its up-projections instead; norms, embeddings, the head).
The fused modules keep the originals' interfaces (``FusedGQAttention`` is a ``GQAttention`` with another
``project``), so the fused model runs wherever the plain one does: ``modern_block.generate``, a ``KVCache``,
the static cache of ``static_cache``.
"""

import copy
from typing import TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import GQAttention
from ..ffn import SwiGLU


def fuse_linears(*linears: nn.Linear) -> nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of ``linears``, stacked (rows of the weights, and
    of the biases when they have them, as Qwen2's q/k/v do, in order)."""
    biased = {lin.bias is not None for lin in linears}
    if len(biased) > 1:
        raise ValueError("fuse_linears: the projections must all have a bias or all have none")
    w = torch.cat([lin.weight.detach() for lin in linears], dim=0)  # [sum of out_features, in_features]
    fused = nn.Linear(w.shape[1], w.shape[0], bias=biased == {True}, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(w)
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))  # [sum of out_features]
    return fused.requires_grad_(False)


class FusedGQAttention(GQAttention):
    """``GQAttention`` whose q, k and v come from one matrix, ``wqkv`` = [W_q; W_k; W_v]. Everything else (QK-norm,
    RoPE, the cache, attention, W_o) is ``GQAttention``'s own code, on the original's modules and settings."""

    def __init__(self, attn: GQAttention):
        nn.Module.__init__(self)  # not GQAttention.__init__: the parts come from attn, not fresh random ones
        self.h, self.kv, self.dh, self.qk_norm, self.dropout = attn.h, attn.kv, attn.dh, attn.qk_norm, attn.dropout
        self.wqkv = fuse_linears(attn.wq, attn.wk, attn.wv)  # [d] -> [(h + 2·n_kv)·d_h]
        self.wo, self.q_norm, self.k_norm = attn.wo, attn.q_norm, attn.k_norm
        self.train(attn.training)

    def project(self, x: torch.Tensor):
        """q, k and v of x [B, T, d] from one matrix multiplication, split into heads."""
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.h * self.dh, self.kv * self.dh, self.kv * self.dh], dim=-1)
        q = q.view(B, T, self.h, self.dh).transpose(1, 2)  # [B, h, T, dh]
        k = k.view(B, T, self.kv, self.dh).transpose(1, 2)  # [B, kv, T, dh]
        v = v.view(B, T, self.kv, self.dh).transpose(1, 2)  # [B, kv, T, dh]
        return q, k, v


class FusedSwiGLU(nn.Module):
    """SwiGLU with gate and up in one matrix, ``w_gate_up`` = [W_gate; W_up]."""

    def __init__(self, ffn: SwiGLU):
        super().__init__()
        self.d_ff = ffn.w_gate.out_features
        self.w_gate_up = fuse_linears(ffn.w_gate, ffn.w_up)  # [d] -> [2·d_ff]
        self.w_down = ffn.w_down
        self.train(ffn.training)

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.w_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        gate, up = self.w_gate_up(x).split(self.d_ff, dim=-1)  # [..., d_ff] each
        return self.w_down(F.silu(gate) * up)  # [..., d]


FUSED = {GQAttention: FusedGQAttention, SwiGLU: FusedSwiGLU}  # the two classes fused_copy replaces

M = TypeVar("M", bound=nn.Module)


def fused_copy(model: M) -> M:
    """A copy of ``model`` (for inference: no gradients, eval mode) with every ``GQAttention`` and ``SwiGLU``
    replaced by its fused version. ``model`` itself is not changed."""
    model = copy.deepcopy(model)  # a tied head stays tied in the copy
    swaps = [(parent, name, FUSED[type(child)]) for parent in model.modules()
             for name, child in parent.named_children() if type(child) in FUSED]
    for parent, name, fused in swaps:
        setattr(parent, name, fused(getattr(parent, name)))
    return model.requires_grad_(False).eval()
