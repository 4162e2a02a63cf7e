"""The fast layer: an explicit, opt-in transformation of a LlamaStyleLM for decoding.

    fast_model = fast.prepare(model)              # a new model: weights copied and fused once
    out = fast.generate(fast_model, idx, 128)     # the same tokens as modern_block.generate(model, idx, 128)

The plain model files never import this module, and ``modern_block.generate`` stays the plain loop.
``prepare`` applies, at that moment and on a copy, what production engines do at load time:

1. **Fused projections** (litgpt fuses q/k/v when it converts a checkpoint): W_q, W_k and W_v are
   stacked into one ``nn.Linear`` and W_gate and W_up into another, so a layer runs 4 matrix
   multiplications instead of 7. The fused weights are exactly the stacked originals.
2. **A static cache** (gpt-fast's recipe): every layer's K and V live in buffers of a fixed shape
   [B, n_kv, capacity, d_h], written at a position *tensor*; each step attends over the whole
   buffer with a mask that hides the slots not yet written. Every decode step then has the same
   shapes and the same code path, which is what lets a compiler treat it as one fixed graph.
3. **A compiled decode step**: ``torch.compile`` of the one-token step (full graph, static shapes)
   fuses each layer's small element-wise ops into a few kernels and takes Python out of the layer loop.

Measured gains are in ``benchmarks/README.md`` (and re-measured in lesson 04's "Making decoding fast").
The fast model is a snapshot for inference: later changes to the original model do not reach it.
Supported: ``LlamaStyleLM`` with grouped-query attention (MHA, GQA, MQA), with or without QK-norm,
tied or untied, any ``head_dim``, q/k/v biases (Qwen2), RoPE scaling with a fixed table (linear, YaRN,
Llama 3). Refused: MLA models (their decode path absorbs weights in a way
this module does not fuse), dynamic NTK scaling (its table changes with the length) and any other model class.
"""

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import GQAttention
from ..generate import check_request, next_token
from ..llama import LlamaStyleLM
from ..rope import apply_rope
from ..validate import positive_int, token_ids


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


class FastAttention(nn.Module):
    """GQA with one q/k/v matmul and a static cache written at ``pos``."""

    def __init__(self, attn: GQAttention):
        super().__init__()
        self.h, self.kv, self.dh = attn.h, attn.kv, attn.dh
        self.wqkv = fuse_linears(attn.wq, attn.wk, attn.wv)  # [d] -> [(h + 2 n_kv) d_h]
        self.wo = copy.deepcopy(attn.wo)
        self.q_norm, self.k_norm = copy.deepcopy(attn.q_norm), copy.deepcopy(attn.k_norm)
        self.k_cache: torch.Tensor | None = None  # [B, n_kv, capacity, d_h], set by FastLM.setup_cache
        self.v_cache: torch.Tensor | None = None

    def forward(self, x, cos, sin, pos, mask):
        """x: [B, T, d] at positions ``pos`` [T]; mask: [T, capacity], True where a slot may be read."""
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.h * self.dh, self.kv * self.dh, self.kv * self.dh], dim=-1)
        q = self.q_norm(q.view(B, T, self.h, self.dh).transpose(1, 2))  # [B, h, T, dh]
        k = self.k_norm(k.view(B, T, self.kv, self.dh).transpose(1, 2))  # [B, kv, T, dh]
        v = v.view(B, T, self.kv, self.dh).transpose(1, 2)  # [B, kv, T, dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k_cache[:, :, pos] = k  # write the new keys/values at their positions, in place
        self.v_cache[:, :, pos] = v
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                             enable_gqa=self.kv != self.h)  # [B, h, T, dh]
        return self.wo(out.transpose(1, 2).reshape(B, T, self.h * self.dh))  # [B, T, d]


class FastSwiGLU(nn.Module):
    """SwiGLU with gate and up in one matmul."""

    def __init__(self, ffn):
        super().__init__()
        self.d_ff = ffn.w_gate.out_features
        self.w_gate_up = fuse_linears(ffn.w_gate, ffn.w_up)  # [d] -> [2 d_ff]
        self.w_down = copy.deepcopy(ffn.w_down)

    def forward(self, x):  # x: [..., d]
        gate, up = self.w_gate_up(x).split(self.d_ff, dim=-1)  # [..., d_ff] each
        return self.w_down(F.silu(gate) * up)


class FastBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.attn_norm, self.ffn_norm = copy.deepcopy(block.attn_norm), copy.deepcopy(block.ffn_norm)
        self.attn, self.ffn = FastAttention(block.attn), FastSwiGLU(block.ffn)

    def forward(self, x, cos, sin, pos, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, pos, mask)
        return x + self.ffn(self.ffn_norm(x))


class FastLM(nn.Module):
    """What ``prepare`` returns: the model with fused projections and a static cache, for inference.

    ``forward(idx, pos)`` runs tokens ``idx`` [B, T] at positions ``pos`` [T] against the cache and returns
    logits [B, T, V]; ``step(tok, pos)`` is the one-token step (compiled when ``compile`` was asked).
    """

    def __init__(self, model: LlamaStyleLM):
        super().__init__()
        self.V, self.max_len = model.V, model.max_len
        self.emb = copy.deepcopy(model.emb)
        self.blocks = nn.ModuleList(FastBlock(b) for b in model.blocks)
        self.norm = copy.deepcopy(model.norm)
        self.head = self.emb_tied_head() if model.tied else copy.deepcopy(model.head)
        self.register_buffer("cos", model.cos.clone(), persistent=False)  # [max_len, dh/2]
        self.register_buffer("sin", model.sin.clone(), persistent=False)
        self.register_buffer("slots", torch.arange(model.max_len, device=model.cos.device), persistent=False)
        self.requires_grad_(False).eval()
        self.step = self._step  # replaced by the compiled step in ``compile``
        self.compiled = False

    def emb_tied_head(self) -> nn.Linear:
        head = nn.Linear(self.emb.weight.shape[1], self.V, bias=False, device=self.emb.weight.device)
        head.weight = self.emb.weight  # tied, as in the original
        return head

    @property
    def tied(self) -> bool:
        return self.head.weight is self.emb.weight

    @property
    def capacity(self) -> int:
        k = self.blocks[0].attn.k_cache
        return 0 if k is None else k.shape[2]

    def setup_cache(self, batch: int, capacity: int) -> None:
        """Allocate every layer's K/V buffers, [batch, n_kv, capacity, d_h], zero-filled."""
        positive_int("batch", batch)
        positive_int("capacity", capacity)
        if capacity > self.max_len:
            raise ValueError(f"capacity ({capacity}) must not exceed max_len ({self.max_len})")
        w = self.emb.weight
        for blk in self.blocks:
            a = blk.attn
            a.k_cache = torch.zeros(batch, a.kv, capacity, a.dh, dtype=w.dtype, device=w.device)
            a.v_cache = torch.zeros_like(a.k_cache)

    def forward(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """idx: [B, T] token ids at positions pos [T] (after the ones already cached). Returns [B, T, V]."""
        cap = self.capacity
        mask = self.slots[:cap] <= pos.unsqueeze(-1)  # [T, cap]: token at p reads slots 0..p
        cos, sin = self.cos[pos], self.sin[pos]  # [T, dh/2]
        x = self.emb(idx)  # [B, T, d]
        for blk in self.blocks:
            x = blk(x, cos, sin, pos, mask)
        return self.head(self.norm(x))  # [B, T, V]

    def _step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The decode step: one token per sequence, tok [B, 1] at position pos [1] -> logits [B, V]."""
        return self.forward(tok, pos)[:, -1]

    def compile(self, mode: str | None = None, options: dict | None = None) -> "FastLM":
        """Compile the one-token step with ``torch.compile`` (full graph, static shapes). The first
        call of each cache shape pays the compile time (tens of seconds on a laptop CPU)."""
        self.compiled = True
        self.step = torch.compile(self._step, fullgraph=True, dynamic=False, mode=mode, options=options)
        return self


# Inductor options for the decode step. cpp_wrapper: the graph's launcher is generated C++, not Python
# (measured ~8% off each CPU step, and one C++ file to build instead of one per kernel: a third less
# compile time); compile_threads 1: no pool of compile workers to start for that one file.
COMPILE_OPTIONS = {"cpp_wrapper": True, "compile_threads": 1}


def prepare(model: LlamaStyleLM, compile: bool = True, mode: str | None = None,
            options: dict | None = None) -> FastLM:
    """A fast copy of ``model`` for decoding: fused q/k/v and gate/up, a static cache and, unless
    ``compile=False``, a compiled decode step (``mode`` and ``options`` go to ``torch.compile``;
    ``options`` defaults to ``COMPILE_OPTIONS``). ``model`` itself is not changed."""
    if not isinstance(model, LlamaStyleLM):
        raise TypeError(f"fast.prepare takes a LlamaStyleLM, got {type(model).__name__}")
    if not isinstance(model.blocks[0].attn, GQAttention):
        raise ValueError("fast.prepare supports grouped-query attention (MHA/GQA/MQA) only; this model uses "
                         f"{type(model.blocks[0].attn).__name__} (MLA): decode it with modern_block.generate")
    if model.rope_scaling is not None and model.rope_scaling["rope_type"] == "dynamic":
        raise ValueError("fast.prepare: dynamic NTK RoPE scaling recomputes the frequencies as the sequence grows, "
                         "which a static table cannot do: decode this model with modern_block.generate")
    fast_model = FastLM(model)
    return fast_model.compile(mode, COMPILE_OPTIONS if options is None else options) if compile else fast_model


def cache_capacity(needed: int, max_len: int, multiple: int = 64) -> int:
    """Round the positions a request needs up to a multiple of ``multiple`` (at most max_len), so that
    requests of similar lengths share one compiled step."""
    return min(max_len, multiple * math.ceil(needed / multiple))


@torch.inference_mode()
def generate(fast_model: FastLM, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``modern_block.generate`` for a ``FastLM``: the same arguments, the same tokens.

    The prompt runs once through the (uncompiled) fast model, then one ``step`` per new token.
    """
    if not isinstance(fast_model, FastLM):
        raise TypeError(f"fast.generate takes the model fast.prepare returns, got {type(fast_model).__name__}")
    needed = check_request(fast_model, idx, max_new_tokens, temperature, top_k)
    token_ids(idx, fast_model.V, fast_model.max_len)  # checked once: generated ids are always in range
    w = fast_model.emb.weight
    if idx.device != w.device:
        raise ValueError(f"idx is on {idx.device} but the model is on {w.device}: move one of them")
    B, T0 = idx.shape
    capacity = cache_capacity(needed, fast_model.max_len)
    k = fast_model.blocks[0].attn.k_cache
    if k is None or (k.shape[0], k.shape[2], k.dtype, k.device) != (B, capacity, w.dtype, w.device):
        fast_model.setup_cache(B, capacity)
    pos = torch.arange(T0, device=idx.device)  # [T0]
    logits = fast_model(idx, pos)[:, -1]  # prefill: [B, V]
    new = [next_token(logits, temperature, top_k, generator)]  # [B, 1] per new token
    pos = pos[-1:] + 1  # [1]: the position of the token fed next, advanced in place

    def advance():
        new.append(next_token(fast_model.step(new[-1], pos), temperature, top_k, generator))
        pos.add_(1)

    if max_new_tokens > 1:
        advance()  # the first step checks the compiled graph's guards (and compiles, once per cache shape)
    # Every later step has the same shapes, dtypes and buffers as the first, so its guards cannot fail:
    # skip them (the condition torch.compiler.set_stance documents for skip_guard_eval_unsafe).
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=fast_model.compiled):
        for _ in range(max_new_tokens - 2):
            advance()
    return torch.cat([idx, *new], dim=1)
