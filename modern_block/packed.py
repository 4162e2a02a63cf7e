"""Packed projections: the weights of several bias-free linears stored as row blocks of one matrix,
so that one matmul computes all their outputs.

    W_q [h·d_h, d]  ┐                          q ┐
    W_k [kv·d_h, d] ├─ one [(h+2kv)·d_h, d] ─►  k ├─ = x @ [W_q; W_k; W_v]ᵀ, split by columns
    W_v [kv·d_h, d] ┘                          v ┘

Decoding one token on a CPU costs more in per-op overhead than in arithmetic: every matmul call
pays the dispatcher, the transpose and the output allocation again. Production engines (vLLM,
gpt-fast) therefore keep q/k/v (and SwiGLU's gate/up) as one matrix. The course keeps its named
linears (``wq``, ``wk``, ``wv``; ``w_gate``, ``w_up``) and Hugging Face's checkpoint keys; in
inference their storage is shared with the packed matrix, and in training autograd sees them as
ordinary leaves (the stack is then a small copy of the weights).
"""

import torch
import torch.nn as nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks


def packed_weight(owner: nn.Module, names: tuple[str, ...]) -> torch.Tensor | None:
    """The [Σ out_features, in_features] matrix whose row blocks are the weights of ``owner``'s
    linears ``names``, sharing their memory.

    The first call moves the weights into one new block (values unchanged, Parameters kept, so
    optimisers and ``load_state_dict`` still see them) and remembers it with the weights' addresses;
    later calls only compare the addresses. ``.to()``, ``deepcopy`` or a new Parameter move a weight
    elsewhere: the weights are then packed again. None when they cannot share one block (different
    dtypes, devices or input sizes).
    """
    weights = [owner._modules[name]._parameters["weight"] for name in names]
    known = owner.__dict__.setdefault("_packed", {})  # names -> (packed block, the weights' addresses)
    packed, addresses = known.get(names, (None, None))
    if addresses == [w.data_ptr() for w in weights]:
        return packed
    first = weights[0]
    if any(w.dtype != first.dtype or w.device != first.device or w.shape[1] != first.shape[1] for w in weights):
        return None
    # a normal tensor even inside inference_mode, so the model can be trained again afterwards
    with torch.inference_mode(False), torch.no_grad():
        packed = torch.cat([w.detach() for w in weights])  # [Σ out, in]
        start = 0
        for w in weights:
            w.data = packed[start:start + w.shape[0]]  # the Parameter stays; its memory is now a view
            start += w.shape[0]
    known[names] = packed, [w.data_ptr() for w in weights]
    return packed


def stacked_weight(owner: nn.Module, names: tuple[str, ...], *, with_autograd: bool) -> torch.Tensor | None:
    """[W_1; W_2; ...], [Σ out, in], for one matmul in place of calling ``owner``'s linears ``names``;
    None: call them one by one.

    Autograd off (inference): the packed weights themselves (``packed_weight``, no copy).
    Autograd on: when ``with_autograd``, a concatenated copy of the weights, whose gradient autograd
    splits back to each Parameter (one big matmul beats several when the copy is small next to the
    activations); else None. Always None for linears with a bias or a forward hook (``F.linear`` on
    the stack would skip the hook). The module dicts are read directly: ``nn.Module.__getattr__``
    costs about a microsecond a call, which adds up on every decoded token.
    """
    linears = [owner._modules[name] for name in names]
    if (_global_forward_hooks or _global_forward_pre_hooks
            or any(lin._forward_hooks or lin._forward_pre_hooks or lin._parameters.get("bias") is not None
                   for lin in linears)):
        return None
    if not torch.is_grad_enabled():
        return packed_weight(owner, names)
    return torch.cat([lin._parameters["weight"] for lin in linears]) if with_autograd else None
