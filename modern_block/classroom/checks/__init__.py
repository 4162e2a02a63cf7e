"""Checks for the exercise notebooks: does the student's code agree with the package, and if not, why?

Each ``check_*`` takes the student's function or class, runs it next to the package's reference
implementation on several inputs (shapes, batch 1 and > 1, float32 / float16 / bfloat16, tiny
magnitudes, long positions, one KV head ...) and

* prints one line ``✓ check_x passed (...)`` when everything agrees;
* raises ``NotAttempted`` when the code still raises ``NotImplementedError`` (the exercise stub);
* raises ``CheckFailed`` with a diagnosis otherwise (in a Jupyter notebook both are printed instead).

A diagnosis names the likely mathematical mistake: the check computes the outputs of the common
wrong formulas itself (LayerNorm's mean subtraction, eps outside the square root, the other RoPE
layout, tiled KV heads, no causal mask, ...) and reports the one the student's output matches in every
failing case.
The formula is judged first, on float32 inputs; only then come precision (fp32 upcast), dtype and
shape complaints, so a secondary problem never hides a wrong formula.

Both exceptions subclass ``AssertionError``; the grader (``modern_block.classroom.grade``) tells them apart.
Every check runs in well under a second on a CPU and leaves the global random state untouched.

Layout: ``core`` (the shared machinery), ``reference`` (float64 formulas with a knob per mistake) and
one module per lesson, ``lesson00`` ... ``lesson10`` and ``lesson09b``; ``verdict`` names a mistake only when it
explains every failing case; ``in_notebook`` is the student's loop (no check stops Run All; ``summary()`` at the
end). Under ``graded(secret)`` (the grader's mode) the inputs are drawn from the secret and nothing is printed.
"""

from .core import CheckFailed, NotAttempted, graded
from .in_notebook import summary
from .lesson00 import check_causal_attention, check_gpt2_attention, check_gpt2_block_params, check_gpt2_small_params
from .lesson01 import check_rms, check_rmsnorm
from .lesson02 import check_ffn_weight_count, check_llama3_70b_d_ff, check_swiglu, check_swiglu_hidden_dim
from .lesson03 import check_apply_rope, check_apply_rope_interleaved, check_rope_cache
from .lesson04 import check_gqattention, check_kv_cache, check_repeat_kv
from .lesson05 import (
    check_absorb_query,
    check_absorbed_scores,
    check_kimi_k2_cache_bytes,
    check_mla_absorption,
    check_mla_cache_bytes,
)
from .lesson06 import check_qk_norm_attention, check_qk_norm_rope
from .lesson07 import check_block, check_llama_lm, check_llama_param_count
from .lesson08 import check_fair_comparison, check_flops_per_token, check_llama3_8b_train_flops, check_lr_schedule
from .lesson09 import check_dequantize_q4_0, check_smollm2_cache_bytes, check_unpermute_qk
from .lesson09b import check_llama3_rope_scaling, check_ntk_scaled_base
from .lesson10 import check_bytes_per_token, check_floor_ms, check_quantize_row_int8

__all__ = [
    "CheckFailed", "NotAttempted", "graded", "summary",
    "check_gpt2_block_params", "check_causal_attention", "check_gpt2_attention", "check_gpt2_small_params",
    "check_rms", "check_rmsnorm",
    "check_swiglu_hidden_dim", "check_swiglu", "check_ffn_weight_count", "check_llama3_70b_d_ff",
    "check_rope_cache", "check_apply_rope", "check_apply_rope_interleaved",
    "check_repeat_kv", "check_gqattention", "check_kv_cache",
    "check_mla_cache_bytes", "check_absorb_query", "check_absorbed_scores", "check_mla_absorption",
    "check_kimi_k2_cache_bytes",
    "check_qk_norm_rope", "check_qk_norm_attention",
    "check_block", "check_llama_lm", "check_llama_param_count",
    "check_lr_schedule", "check_flops_per_token", "check_fair_comparison", "check_llama3_8b_train_flops",
    "check_smollm2_cache_bytes", "check_dequantize_q4_0", "check_unpermute_qk",
    "check_llama3_rope_scaling", "check_ntk_scaled_base",
    "check_bytes_per_token", "check_floor_ms", "check_quantize_row_int8",
]
