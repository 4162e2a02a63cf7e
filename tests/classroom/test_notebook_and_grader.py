"""The notebook and the grader agree: every known case of issue 42 (wrong answers, answers typed in or looked up,
the package's own answers in functions and in value cells, a forbidden torch function) gets the same verdict when
the notebook runs it (Run All, the checks in the notebook's mode) and when the grader grades it (its sandbox, its
secret, its copy of the package). Each case is an answer cell of a solution notebook replaced; the other
exercises of that notebook keep their right answers, so every notebook also shows right answers passing both ways.

(A table of answers harvested from the notebook is the one disagreement by design: it passes the notebook's public
cases and fails the grader's; tests/classroom/test_checks_graded.py holds it to that.)"""

import contextlib
import io
from collections import defaultdict

import nbformat
import pytest
from submissions import ROOT, answered, sandbox_problem, write

from modern_block.classroom.checks import Mode, in_notebook
from modern_block.classroom.checks.mode import using
from modern_block.classroom.grading import grade

QKV_BIAS_AS_D = ("def gpt2_block_params(d, d_ff=None):\n    d_ff = 4 * d if d_ff is None else d_ff\n"
                 "    return 4 * d + (3 * d * d + d) + (d * d + d) + (2 * d * d_ff + d_ff + d)")
FUSED = "def causal_attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v, is_causal=True)"
GPT2_BY_THE_PACKAGE = ("import modern_block as mb\nwith torch.device('meta'):\n    gpt2_small_params = "
                       "mb.count_parameters(mb.GPT2LM(50257, d=768, n_layers=12, n_heads=12, max_len=1024))")
MULTIPLIER_ON_D = ("def swiglu_hidden_dim(d, multiple_of=256, ffn_dim_multiplier=None):\n"
                   "    d = int(ffn_dim_multiplier * d) if ffn_dim_multiplier else d\n"
                   "    return multiple_of * math.ceil(int(2 * 4 * d / 3) / multiple_of)")
ROTARY = ("import modern_block as mb\n\n\ndef rope_tables(positions, dh, base=10000.0):\n"
          "    return mb.RotaryEmbedding(dh, 4096, base, scaling={'rope_type': 'linear', 'factor': 1.0})(positions)")
KV_ORACLE = ("from modern_block import kv_cache_bytes_per_token\n\n\ndef mla_cache_bytes(n_layers, kv_latent_dim, "
             "rope_dim, bytes_per_elem=2):\n    return kv_cache_bytes_per_token(n_layers, 1, kv_latent_dim + rope_dim, "
             "bytes_per_elem) // 2")
PRESET_COUNT = ("import modern_block as mb\n\n\ndef llama_param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, "
                "tie=False, qk_norm=True, qkv_bias=False):\n"
                "    return mb.ModelPreset('x', n_layers, n_heads, n_kv_heads, d // n_heads, d_model=d, d_ff=d_ff, "
                "vocab_size=V, tied=tie, qk_norm=qk_norm).parameters()")
RELATIVE_TO_B = ("def unfair_differences(a, b, compared=('arch',), size_tolerance=0.02):\n"
                 "    keys = sorted(k for k in set(a) | set(b) if k not in compared)\n"
                 "    return [k for k in keys if k not in a or k not in b or (\n"
                 "        abs(b[k] - a[k]) > size_tolerance * b[k] if k == 'n_params' else a[k] != b[k])]")
UNSORTED = ("def unfair_differences(a, b, compared=('arch',), size_tolerance=0.02):\n"
            "    return list({k for k in set(a) | set(b) if k not in compared and (k not in a or k not in b or (\n"
            "        abs(b[k] - a[k]) > size_tolerance * a[k] if k == 'n_params' else a[k] != b[k]))})")
NTK_TENSOR = ("def ntk_scaled_base(base, dh, kappa):\n"
              "    return torch.tensor(base) * kappa ** (dh / (dh - 2))")
FLOAT_SCALE = ("def quantize_row_int8(w):\n    scale = w.abs().max() / 127\n"
               "    return torch.round(w / scale).to(torch.int8), scale.item()")
HEAD_DIM_DEFAULT = ("def kv_bytes_per_token(cfg):\n    L, h = cfg['num_hidden_layers'], cfg['num_attention_heads']\n"
                    "    if 'kv_lora_rank' in cfg:\n"
                    "        return L * (cfg['kv_lora_rank'] + cfg['qk_rope_head_dim']) * 2\n"
                    "    return 2 * L * cfg.get('num_key_value_heads', h) * "
                    "cfg.get('head_dim', cfg['hidden_size'] // h) * 2")
SEARCH = ("def smallest_multiple_of(d, d_ff, ffn_dim_multiplier=None):\n    h = int(8 * d / 3)\n"
          "    h = int(ffn_dim_multiplier * h) if ffn_dim_multiplier else h\n"
          "    for m in [2**k for k in range({powers})]:\n        if -(-h // m) * m == d_ff:\n            return m\n"
          "    return {none}")
SHARED_NOT_ACTIVE = ("def moe_ffn_parameters(L, d, d_ff, first_k_dense, n_routed, top_k, d_expert, n_shared):\n"
                     "    expert, moe = 3 * d * d_expert, L - first_k_dense\n"
                     "    dense, router = first_k_dense * 3 * d * d_ff, d * n_routed\n"
                     "    return (dense + moe * (router + (n_routed + n_shared) * expert),\n"
                     "            dense + moe * (router + top_k * expert))")
KV_AT_BY_THE_CARD = ("def kv_cache_at(cfg, context):\n    from modern_block.interop.config_card import config_card\n\n"
                     "    return config_card(cfg).cache_bytes(context)")

CASES = [  # (lesson, answer cell, answer, the verdict both must give, what it is)
    ("00_gpt2_block", "ex1_block_params", QKV_BIAS_AS_D, "failed", "q/k/v bias counted as d"),
    ("00_gpt2_block", "ex2_causal_attention", FUSED, "failed", "the forbidden fused attention"),
    ("00_gpt2_block", "ex4_gpt2_small", "gpt2_small_params = 124_439_808 * 1", "failed", "a literal times 1"),
    ("00_gpt2_block", "ex4_gpt2_small", "gpt2_small_params = int('124439808')", "failed", "int of a string"),
    ("00_gpt2_block", "ex4_gpt2_small", GPT2_BY_THE_PACKAGE, "failed", "the package's count in a value cell"),
    ("02_swiglu", "ex1_hidden_dim", MULTIPLIER_ON_D, "failed", "the multiplier applied to d"),
    ("02_swiglu", "ex3_weights", "def ffn_weight_count(d, d_ff, gated):\n"
                                 "    return 3 * d * d_ff if gated else 8 * d * d", "failed", "8d² whatever d_ff"),
    ("02_swiglu", "ex4_llama3_70b_d_ff", "d, m, mult = 8192, 4096, 1.3\n"
                                         "llama3_70b_d_ff = m * (int(mult * int(8 * d / 3)) // m)", "failed",
     "rounded down"),
    ("02_swiglu", "ex4_llama3_70b_d_ff", "llama3_70b_d_ff = 7 * 4096", "failed", "a product of literals"),
    ("02_swiglu", "ex4_llama3_70b_d_ff", "import modern_block as mb\nllama3_70b_d_ff = mb.swiglu_hidden_dim(8192, "
                                         "4096, 1.3)", "failed", "the package's function in a value cell"),
    ("02_swiglu", "ex4_llama3_70b_d_ff", "import modern_block as mb\n"
                                         "llama3_70b_d_ff = mb.PRESETS['Llama 3 70B'].d_ff", "failed",
     "the package's table of answers"),
    ("03_rope", "ex1_rope_cache", ROTARY, "failed", "RotaryEmbedding as an oracle"),
    ("05_mla", "ex1_cache_bytes", KV_ORACLE, "failed", "kv_cache_bytes_per_token as an oracle"),
    ("05_mla", "ex5_kimi_k2_cache", "import modern_block as mb\n"
                                    "kimi_k2_cache_bytes = mb.mla_cache_bytes_per_token(61, 512, 64)", "failed",
     "the package's function in a value cell"),
    ("07_llama_block", "ex3_param_count", PRESET_COUNT, "failed", "ModelPreset as an oracle"),
    ("08_train_llama_vs_gpt2", "ex3_fair", RELATIVE_TO_B, "failed", "the tolerance relative to b"),
    ("08_train_llama_vs_gpt2", "ex3_fair", UNSORTED, "failed", "an unsorted set"),
    ("09b_rope_scaling", "ex2_ntk_base", NTK_TENSOR, "failed", "a tensor for a float"),
    ("10_fast_decoding", "ex3_quantize_row_int8", FLOAT_SCALE, "failed", "a Python float for a 0-dim tensor"),
    ("11_read_any_config", "ex1_kv_bytes_per_token", HEAD_DIM_DEFAULT, "failed", "head_dim read with a default"),
    ("11_read_any_config", "ex2_smallest_multiple_of", SEARCH.format(powers="4, 12", none="None"), "failed",
     "a search that stops at 2,048"),
    ("11_read_any_config", "ex2_smallest_multiple_of", SEARCH.format(powers="4, 13", none="0"), "failed",
     "0 for None"),
    ("11_read_any_config", "ex4_moe_ffn_parameters", SHARED_NOT_ACTIVE, "failed", "the shared expert not active"),
    ("11_read_any_config", "ex5_kv_cache_at", KV_AT_BY_THE_CARD, "failed", "the config card as an oracle"),
]


def notebooks() -> list[tuple[str, str, object, dict[str, str]]]:
    """(file name, lesson, notebook, {answer cell: expected verdict}): each lesson's cases spread over as few
    notebooks as hold one case per exercise."""
    rounds: dict[str, list[dict]] = defaultdict(list)
    for lesson, cell, source, verdict, _ in CASES:
        slot = next((r for r in rounds[lesson] if cell not in r), None)
        if slot is None:
            slot = {}
            rounds[lesson].append(slot)
        slot[cell] = (source, verdict)
    out = []
    for lesson, slots in rounds.items():
        for n, slot in enumerate(slots):
            nb = answered(lesson, {cell: source for cell, (source, _) in slot.items()}, base="solutions")
            out.append((f"{lesson}-{n}", lesson, nb, {cell: verdict for cell, (_, verdict) in slot.items()}))
    return out


def check_of(nb) -> dict[int, str]:
    """Exercise number -> the check its check cell calls."""
    out = {}
    for cell in nb.cells:
        cid = cell.get("id") or ""
        if cid.endswith("-check") and cell.source.startswith("checks."):
            out[len(out) + 1] = cell.source.split("(")[0].removeprefix("checks.")
    return out


def run_as_a_notebook(nb) -> dict[str, str]:
    """Run All in this process as a kernel does: each cell in one namespace, the checks in the notebook's mode
    (the cells run so far as the input history); check name -> its status."""
    from IPython.core.inputtransformer2 import TransformerManager

    in_notebook.reset()
    namespace: dict = {"__name__": "__main__"}
    ran: list[str] = []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            ran.append(cell.source)
            with using(Mode.notebook(ran, namespace)):
                try:
                    exec(compile(TransformerManager().transform_cell(cell.source), "<cell>", "exec"), namespace)
                except Exception:  # a cell's error (the package's own answer raising, say): Run All stops here
                    break
    results = {name: status for name, (status, _) in in_notebook.results().items()}
    in_notebook.reset()
    return results


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every case notebook graded once by the grader (its sandbox where bubblewrap runs, else plain processes)."""
    folder = tmp_path_factory.mktemp("class")
    built = notebooks()
    for name, lesson, nb, _ in built:
        write(folder, name, lesson, nb)
    limits = grade.Limits() if sandbox_problem() is None else grade.Limits(sandbox=False)
    reports = grade.grade_all(grade.collect([folder]), grade.load_reference(ROOT / "exercises"),
                              grade.Options(timeout=120, notebook_timeout=900), jobs=2, limits=limits)
    return {r.student: r for r in reports}


@pytest.mark.parametrize("name, lesson, nb, expected", notebooks(), ids=[n for n, *_ in notebooks()])
def test_every_known_case_gets_the_same_verdict_in_the_notebook_and_in_the_grader(name, lesson, nb, expected, graded):
    report = graded[name]
    assert report.error is None, grade.format_report(report)
    by_grader = {e.number: e.status for e in report.exercises}
    by_notebook = run_as_a_notebook(nbformat.from_dict(nb))
    checks_of = check_of(nb)
    answers = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    for number, check in checks_of.items():
        notebook_verdict = by_notebook.get(check, "failed (the notebook stopped before its check)")
        want = expected.get(answers[number - 1], "passed")
        assert by_grader[number] == notebook_verdict == want, (name, number, check, grade.format_report(report))
