"""Checks for the exercise notebooks: does the student's answer agree with the package, and if not, why?

``check_x(answer, mode=None)`` runs the student's function, class or value on several cases next to a float64
reference and prints ``✓ check_x passed (...)``, raises ``NotAttempted`` while the answer is the exercise's stub, or
raises ``CheckFailed`` with a diagnosis (in a Jupyter notebook both are printed instead). A known mistake is named
only when it alone computes the student's output in every failing case and fails no passing one, and no message
lets a student compute a target (``diagnosis``). The grader adds cases drawn from its secret (``mode``); a value
item must be computed in its cell (``in_notebook``); what each exercise hides is ``hiding.HIDES``.

Writing a check (a new exercise goes in its lesson's module and in ``__all__`` below, its hidden pieces in
``hiding.HIDES``)::

    def _count(d, n_layers, *, head=True):                  # the right answer, a keyword "knob" per mistake
        return ...

    MISTAKES = [                                            # one record per known mistake
        Mistake("the head was not counted: ...",            # what the teacher says
                dict(head=False),                           # how it computes: knobs, or a function of the case
                when=lambda c: not c.tied),                 # where it applies
    ]

    @exercise_check                                         # value="name" for a value item
    def check_count(run: CheckRun, count) -> str:
        public = [Case("count(768, 12)", partial(_count, 768, 12), (768, 12), tied=False)]

        def secret(g):                                      # the grader-only cases, drawn from the secret
            return [Case(...) for _ in range(3)]

        run.judge_each(count, run.cases(public, secret, seed=300), run.judge_int, MISTAKES)
        return "1 case ..."                                 # the success line's summary

``judge_each`` is the usual loop (``run.call`` on fresh copies, then ``judge``, ``judge_int``, ``judge_number`` or
``judge_equal``). Layout: ``core`` (Mistake, Case, CheckRun, the decorator), ``diagnosis`` (naming and wording),
``mode``, ``hiding``, ``in_notebook``, ``formulas`` (shared float64 references), one module per lesson.
"""

from .core import Case, CheckRun, Mistake
from .errors import CheckFailed, NotAttempted
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
from .lesson08b import check_holm, check_verdict
from .lesson09 import check_dequantize_q4_0, check_smollm2_cache_bytes, check_unpermute_qk
from .lesson09b import check_llama3_rope_scaling, check_ntk_scaled_base
from .lesson10 import check_bytes_per_token, check_floor_ms, check_quantize_row_int8
from .lesson11 import (
    check_active_parameters,
    check_kv_bytes_per_token,
    check_kv_cache_at,
    check_moe_ffn_parameters,
    check_smallest_multiple_of,
)
from .mode import Mode, answer_sources, graded

__all__ = [
    "CheckFailed", "NotAttempted", "Mode", "graded", "answer_sources", "summary", "Case", "CheckRun", "Mistake",
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
    "check_verdict", "check_holm",
    "check_smollm2_cache_bytes", "check_dequantize_q4_0", "check_unpermute_qk",
    "check_llama3_rope_scaling", "check_ntk_scaled_base",
    "check_bytes_per_token", "check_floor_ms", "check_quantize_row_int8",
    "check_kv_bytes_per_token", "check_smallest_multiple_of", "check_active_parameters", "check_moe_ffn_parameters",
    "check_kv_cache_at",
]
