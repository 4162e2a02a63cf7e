"""Lesson 10's fast layer, step by step, on the real SmolLM2-135M-Instruct (fp32, batch 1, one thread, CPU time):
the plain model, then fused projections, then the static cache, then the compiled step, beside transformers'
eager ``generate`` and its static cache + ``torch.compile`` on the same weights; each against the weight-bandwidth
floor. Writes the JSON that lesson 10 shows in quick mode (where the two compiles do not fit its time budget).

    python benchmarks/smollm2_decoding.py [--rounds 5] [--no-hf] [--warm-cache] [--out FILE]

One decoding step's time is measured by difference (26 new tokens less 4, the prompt's prefill cancels), in
interleaved rounds (``modern_block.fast.profiling.decode_step_seconds``); each compile runs first, from an empty
inductor cache, and is timed on its own. The floor is the weights one step reads over the best bandwidth of a
256 MiB copy, timed by the same clock. ``matrices`` is what stands between a step and that floor even with no
overhead at all: every weight matrix of the fused model multiplying one vector, in order, and nothing else.
"""

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from cpu_vs_hf import fresh_compile_cache, hf_static_generate  # noqa: E402

from modern_block import generate  # noqa: E402
from modern_block.fast import decoding as fast  # noqa: E402
from modern_block.fast.profiling import (  # noqa: E402
    decode_step_seconds,
    decode_weight_bytes,
    memory_bandwidth,
    step_table_lines,
)
from modern_block.interop import load_gguf, to_hf  # noqa: E402
from modern_block.training.device import cpu_name  # noqa: E402

QUESTION = "What is the capital of France?"
SHORT, LONG = 4, 26  # new tokens: a step's time is (t(LONG) - t(SHORT)) / (LONG - SHORT); with the 37-token
# prompt both fit the fast layer's 64-position cache, so both lengths run the same compiled step
STEPS = ("plain", "fused", "fused + static cache", "fused + static cache + compiled")


def chat_prompt(tok) -> torch.Tensor:
    return tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)["input_ids"]  # [1, T0]


def course_decoders(model, prompt) -> dict:
    """The fast layer's steps, each adding one to the last: name -> decode(n) -> tokens [1, T0 + n]."""
    fused = fast.prepare(model, compile=False, static_cache=False)  # fused projections, the plain KVCache
    static = fast.prepare(model, compile=False)  # + the static cache, eager
    compiled = fast.prepare(model)  # + the compiled one-token step
    return {"plain": lambda n: generate(model, prompt, n),
            "fused": lambda n: fast.generate(fused, prompt, n),
            "fused + static cache": lambda n: fast.generate(static, prompt, n),
            "fused + static cache + compiled": lambda n: fast.generate(compiled, prompt, n)}


def hf_decoders(hf, prompt) -> dict:
    """transformers on the same weights: its eager ``generate`` and its static cache + compiled step."""
    hf.generation_config.eos_token_id = None  # the course's loop does not stop at <|im_end|>: neither does this one
    hf.generation_config.pad_token_id = 0

    def eager(n):
        with torch.inference_mode():
            return hf.generate(prompt, max_new_tokens=n, do_sample=False)

    return {"transformers": eager, "transformers static cache + compile": lambda n: hf_static_generate(hf, prompt, n)}


def matrices_seconds(fast_model, repeats: int = 5) -> float:
    """Best CPU seconds of every weight matrix of the (fused) model multiplying one vector, in order: the matrix
    work of a step with no overhead around it."""
    weights = [m.weight for m in fast_model.model.modules() if isinstance(m, torch.nn.Linear)]
    xs = {n: torch.randn(1, n) for n in {w.shape[1] for w in weights}}  # [1, n_in] per input width

    def run():
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)  # [1, n_out]
    with torch.inference_mode():
        run()
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            run()
            times.append(time.process_time() - t0)
    return min(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers (its compile is the longest part)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep inductor's on-disk cache (a compile time is then not what a first user pays)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_smollm2_cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as lesson 10: one thread, this process's CPU time
    import transformers

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    model, tok = load_gguf(tokenizer=True)
    prompt = chat_prompt(tok)
    decoders = course_decoders(model, prompt) | ({} if args.no_hf else hf_decoders(to_hf(model), prompt))
    compile_s = {}
    for name in [n for n in decoders if "compile" in n]:
        progress(f"compiling: {name}")
        with contextlib.nullcontext() if args.warm_cache else fresh_compile_cache():
            c0, w0 = time.process_time(), time.perf_counter()
            decoders[name](SHORT)
            compile_s[name] = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0}
    for decode in decoders.values():  # warm-up (transformers' static cache compiles once more for each length)
        decode(SHORT), decode(LONG)
    progress(f"{args.rounds} interleaved rounds of {len(decoders)} decoders")
    seconds, tokens = decode_step_seconds(decoders, args.rounds, SHORT, LONG)
    same = {name: torch.equal(t, tokens["plain"]) for name, t in tokens.items()}
    bw = memory_bandwidth(clock=time.process_time)
    weight_bytes = decode_weight_bytes(model)
    floor_s = weight_bytes / bw["best"]
    matrices_s = matrices_seconds(fast.prepare(model, compile=False))
    rows = {}
    for name, s in seconds.items():
        x_plain = [p / x for p, x in zip(seconds["plain"], s, strict=True)]
        rows[name] = {"step_s": s, "median_ms": 1e3 * statistics.median(s),
                      "x_plain_median": statistics.median(x_plain), "x_plain_range": [min(x_plain), max(x_plain)],
                      "floor_fraction": floor_s / statistics.median(s), "same_tokens": same[name]}
    ours, theirs = seconds["fused + static cache + compiled"], seconds.get("transformers static cache + compile")
    vs_hf = [b / a for a, b in zip(ours, theirs, strict=True)] if theirs else None  # > 1: the fast layer is faster
    results = {
        "date": datetime.date.today().isoformat(), "cpu": cpu_name(), "threads": torch.get_num_threads(),
        "clock": "process CPU time", "torch": torch.__version__, "transformers": transformers.__version__,
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32 by modern_block.interop.load_gguf)",
        "prompt_tokens": prompt.shape[1], "new_tokens": [SHORT, LONG], "rounds": args.rounds,
        "compile_options": fast.COMPILE_OPTIONS, "weight_bytes": weight_bytes,
        "bandwidth_best_bytes_per_s": bw["best"], "bandwidth_median_bytes_per_s": bw["median"],
        "floor_ms": 1e3 * floor_s, "matrices_ms": 1e3 * matrices_s, "compile": compile_s, "steps": rows,
        "compiled_vs_hf_static": vs_hf and {"median": statistics.median(vs_hf), "range": [min(vs_hf), max(vs_hf)]},
        "inductor_cache": "warm" if args.warm_cache else "empty at each compile",
        "answer": tok.decode(tokens["plain"][0, prompt.shape[1]:prompt.shape[1] + SHORT]),
    }
    results["total_wall_s"] = time.perf_counter() - t_start
    print_table(results)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")
    return results


def print_table(r: dict) -> None:
    print(f"{r['cpu']}, {r['threads']} thread, torch {r['torch']}, transformers {r['transformers']}, {r['date']}; "
          f"{r['rounds']} interleaved rounds, {r['clock']}")
    steps = r["steps"]
    print("\n".join(step_table_lines({name: row["step_s"] for name, row in steps.items()}, r["floor_ms"],
                                     same_tokens={name: row["same_tokens"] for name, row in steps.items()})))
    vs = r["compiled_vs_hf_static"]
    if vs:
        print(f"compiled fast layer vs transformers static cache + compile: {vs['median']:.2f}x as fast "
              f"(rounds {vs['range'][0]:.2f}-{vs['range'][1]:.2f}x)")
    print(f"floor {r['floor_ms']:.1f} ms ({r['weight_bytes'] / 1e6:.0f} MB at "
          f"{r['bandwidth_best_bytes_per_s'] / 1e9:.1f} GB/s); the matrices alone {r['matrices_ms']:.1f} ms")
    for name, c in r["compile"].items():
        print(f"compile, {name}: {c['cpu_s']:.0f} s CPU, {c['wall_s']:.0f} s wall")


def progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what} ...", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
