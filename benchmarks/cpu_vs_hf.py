"""The course's Llama against Hugging Face's, same weights, same process: training step (eager and
compiled), cached greedy decoding (the plain model, the fast layer, Hugging Face eager and Hugging Face's
static cache with torch.compile), the memory-bandwidth floor, the KV-cache speedup and cache bytes.
Prints one table and writes it as JSON.

    python benchmarks/cpu_vs_hf.py [--quick] [--no-compile] [--clock cpu --threads 1] [--out FILE]

Timings alternate the contenders (a, b, c, a, b, c, ...) so that a noisy, shared machine slows them
alike, and quote three figures per ratio: the ratio of the medians, the ratio of the best runs (the
runs least disturbed by other work) and the range of the per-round ratios (the spread). Every compile
starts from an empty inductor cache, so its time is what a first user pays.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from modern_block import KVCache, LlamaStyleLM, generate
from modern_block.fast import decoding as fast  # noqa: E402
from modern_block.fast.agreement import cached_logits, compare_decodes  # noqa: E402
from modern_block.fast.profiling import decode_weight_bytes, memory_bandwidth  # noqa: E402
from modern_block.interop.hf import from_hf  # noqa: E402
from modern_block.kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token  # noqa: E402
from modern_block.mla import MLAConfig  # noqa: E402
from modern_block.training.device import cpu_name  # noqa: E402

CONFIG = dict(V=512, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, seq=256, batch=8, prompt=16)
CLOCK = time.perf_counter  # --clock cpu switches to this process's CPU time (see main)
DEVICE = torch.device("cpu")  # --device cuda: the same table on a GPU


def build_pair(seed: int = 0):
    """A random-initialised Hugging Face Llama and the course model converted from it, on DEVICE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    c = CONFIG
    cfg = LlamaConfig(vocab_size=c["V"], hidden_size=c["d"], intermediate_size=c["d_ff"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv_heads"], max_position_embeddings=4096, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attn_implementation="sdpa", pad_token_id=0, eos_token_id=None,
                      bos_token_id=None)
    hf = LlamaForCausalLM(cfg).eval()
    return from_hf(hf).eval().to(DEVICE), hf.to(DEVICE)


def _now() -> float:
    """The clock, after the GPU (if any) has finished the work queued so far."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    return CLOCK()


def alternate(fns: dict, repeats: int, warm_up: bool = True) -> dict[str, list[float]]:
    """Seconds per call of each callable, run in turn ``repeats`` times (after one warm-up call each)."""
    for fn in fns.values() if warm_up else ():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = _now()
            fn()
            times[name].append(_now() - t0)
    return times


def ratio(prefix: str, times: dict, ours: str, theirs: str) -> dict:
    """ours / theirs: the ratio of the medians, of the bests, and the range of the per-round ratios."""
    a, b = times[ours], times[theirs]
    per_round = [x / y for x, y in zip(a, b, strict=True)]
    return {f"{prefix}_ratio": statistics.median(a) / statistics.median(b), f"{prefix}_ratio_best": min(a) / min(b),
            f"{prefix}_ratio_range": [min(per_round), max(per_round)]}


def medians(prefix: str, times: dict) -> dict:
    return {f"{prefix}_{name}_s": statistics.median(t) for name, t in times.items()} | {
        f"{prefix}_{name}_best_s": min(t) for name, t in times.items()}


@contextmanager
def fresh_compile_cache():
    """An empty inductor cache for what runs inside, so a compile time is what a first user pays."""
    with tempfile.TemporaryDirectory() as cache_dir, mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir):
        yield


def first_call_seconds(fn) -> float:
    with fresh_compile_cache():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------- training
def train_step_fn(model, idx, targets, hf: bool = False):
    def step():
        out = model(input_ids=idx).logits if hf else model(idx)
        loss = F.cross_entropy(out.flatten(0, 1), targets.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
    return step


def bench_train(ours, hf, repeats: int, compile_ours: bool) -> dict:
    c = CONFIG
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, c["V"], (c["batch"], c["seq"]), generator=g).to(DEVICE)
    targets = torch.randint(0, c["V"], (c["batch"], c["seq"]), generator=g).to(DEVICE)
    ours.train(), hf.train()
    fns = {"ours": train_step_fn(ours, idx, targets), "hf": train_step_fn(hf, idx, targets, hf=True)}
    if compile_ours:  # the trainer's --compile path: torch.compile(model), the loss outside
        torch.compiler.reset()
        compiled = torch.compile(ours)
        fns["compiled"] = train_step_fn(compiled, idx, targets)
        first = first_call_seconds(fns["compiled"])  # compiles forward and backward
    times = alternate(fns, repeats)
    row = medians("train", times) | ratio("train_eager", times, "ours", "hf")
    if compile_ours:
        row |= ratio("train_compiled", times, "compiled", "hf")
        row["train_compile_s"] = first - statistics.median(times["compiled"])
    ours.eval(), hf.eval()
    return row


# ------------------------------------------------------------------------------------------- decoding
def hf_static_generate(hf, prompt, new_tokens: int):
    """Hugging Face's own fast path: a static cache, and the decode step compiled by ``generate``
    itself (as it does on a GPU; ``_compile_all_devices`` asks for that on the CPU too)."""
    from transformers import CompileConfig

    config = CompileConfig()  # Hugging Face's defaults
    config._compile_all_devices = True
    with torch.inference_mode():
        return hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=0, cache_implementation="static", compile_config=config)


def decode_contenders(ours, fast_model, hf, prompt, new_tokens: int, out: dict) -> dict:
    """The four ways to decode greedily; each stores its tokens in ``out`` for the same-tokens check."""
    def plain():
        out["plain"] = generate(ours, prompt, new_tokens, use_cache=True)

    def fast_layer():
        out["fast"] = fast.generate(fast_model, prompt, new_tokens)

    def hf_eager():
        with torch.inference_mode():
            out["hf"] = hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=0)

    def hf_static():
        out["hf_static"] = hf_static_generate(hf, prompt, new_tokens)

    return {"plain": plain, "fast": fast_layer, "hf": hf_eager, "hf_static": hf_static}


def bench_decode(ours, fast_model, hf, new_tokens: int, repeats: int, compiled: bool = True) -> dict:
    """Cached greedy decoding of ``new_tokens`` after a 16-token prompt, batch 1, four ways, interleaved.
    The compiled contenders' first calls (the compile, from an empty cache) are timed on their own."""
    prompt = torch.randint(0, CONFIG["V"], (1, CONFIG["prompt"]), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to(DEVICE)
    out = {}
    fns = decode_contenders(ours, fast_model, hf, prompt, new_tokens, out)
    if not compiled:
        del fns["hf_static"]
    n = new_tokens
    first = {name: first_call_seconds(fns[name]) for name in ("fast", "hf_static") if name in fns}
    times = alternate(fns, repeats)
    # compile time: the first call (compile and one decode), less a steady-state decode
    row = {f"decode{n}_compile_{name}_s": t - statistics.median(times[name]) for name, t in first.items()}
    row |= medians(f"decode{n}", times)
    row |= ratio(f"decode{n}_plain_vs_hf", times, "plain", "hf")
    row |= ratio(f"decode{n}_fast_vs_plain", times, "fast", "plain")
    if compiled:
        row |= ratio(f"decode{n}_fast_vs_hf_static", times, "fast", "hf_static")
        row |= ratio(f"decode{n}_hf_static_vs_hf", times, "hf_static", "hf")
    row[f"decode{n}_same_tokens"] = all(torch.equal(t, out["plain"]) for t in out.values())
    # other kernels may flip a near-tie: the margin rule (fast/agreement.py) says whether each path's tokens agree
    forwards = {"plain": lambda s: cached_logits(ours, s, prompt.shape[1]), "fast": fast_model.model,
                "hf": lambda s: hf(s).logits, "hf_static": lambda s: hf(s).logits}
    row[f"decode{n}_tokens_agree"] = all(tokens_agree(ours, forwards[name], out["plain"], t, prompt.shape[1])
                                         for name, t in out.items())
    return row


def tokens_agree(ours, other_forward, want, got, prompt_len: int) -> bool:
    """True when the decode ``got`` follows ``want`` (ours) by the margin rule."""
    try:
        compare_decodes(ours, other_forward, want, got, prompt_len)
    except AssertionError:
        return False
    return True


def bandwidth_row() -> dict:
    """The machine's memory bandwidth: a 512 MiB copy (read + write), best and median of 10."""
    bw = memory_bandwidth(512 * 2**20, repeats=10, device=DEVICE)
    return {"bandwidth_bytes_per_s": bw["best"], "bandwidth_median_bytes_per_s": bw["median"],
            "bandwidth_copy_bytes": bw["bytes"]}


def floor_row(ours, results: dict, n: int) -> dict:
    """Seconds per token each path takes against the floor: weight bytes per token / bandwidth."""
    floor = decode_weight_bytes(ours) / results["bandwidth_bytes_per_s"]
    row = {"weight_bytes_per_token": decode_weight_bytes(ours), "floor_s_per_token": floor}
    for name in ("plain", "fast", "hf", "hf_static"):
        if f"decode{n}_{name}_best_s" in results:
            per_token = results[f"decode{n}_{name}_best_s"] / n
            row[f"floor_decode{n}_{name}_s_per_token"] = per_token
            row[f"floor_decode{n}_{name}_fraction"] = floor / per_token
    return row


# ------------------------------------------------------------------------------------------- the cache
def bench_cache_speedup(ours, new_tokens: int, repeats: int) -> dict:
    """Decoding time without the cache / with it (ours, same prompt, same tokens checked)."""
    prompt = torch.randint(0, CONFIG["V"], (1, 16), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = {}

    def run(use_cache):
        def fn():
            out[use_cache] = generate(ours, prompt, new_tokens, use_cache=use_cache)
        return fn

    long = new_tokens > 1024  # minutes without the cache: one pair, and only the cached run warms up
    if long:
        run(True)()
    times = alternate({"cache": run(True), "no_cache": run(False)}, repeats, warm_up=not long)
    r = ratio(f"speedup{new_tokens}", times, "no_cache", "cache")
    return {f"speedup{new_tokens}": r[f"speedup{new_tokens}_ratio"],
            f"speedup{new_tokens}_best": r[f"speedup{new_tokens}_ratio_best"],
            f"speedup{new_tokens}_cache_s": statistics.median(times["cache"]),
            f"speedup{new_tokens}_no_cache_s": statistics.median(times["no_cache"]),
            f"speedup{new_tokens}_same_tokens": torch.equal(out[True], out[False]),
            f"speedup{new_tokens}_tokens_agree": tokens_agree(ours, lambda s: cached_logits(ours, s, 16), out[False],
                                                              out[True], 16)}


def bench_cache_bytes(n_tokens: int = 300) -> dict:
    """Bytes the cache holds after n tokens against the formulas, for GQA and for MLA (bf16 cache)."""
    c = CONFIG
    gqa = LlamaStyleLM(c["V"], c["d"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["d_ff"], max_len=512)
    mla_cfg = MLAConfig(kv_latent_dim=64, rope_dim=16, nope_dim=32, v_head_dim=32)
    mla = LlamaStyleLM(c["V"], c["d"], c["n_layers"], c["n_heads"], d_ff=c["d_ff"], max_len=512, mla=mla_cfg)
    idx = torch.randint(0, c["V"], (1, n_tokens), device=DEVICE)
    row = {}
    for name, model, formula in [
        ("gqa", gqa, kv_cache_bytes_per_token(c["n_layers"], c["n_kv_heads"], c["d"] // c["n_heads"], 2)),
        ("mla", mla, mla_cache_bytes_per_token(c["n_layers"], mla_cfg.kv_latent_dim, mla_cfg.rope_dim, 2)),
    ]:
        model.to(DEVICE, torch.bfloat16).eval()
        cache = KVCache(len(model.blocks), n_tokens)
        with torch.inference_mode():
            model(idx, cache)
        assert cache.length == n_tokens
        row[f"cache_bytes_{name}"] = cache.nbytes()
        row[f"cache_bytes_{name}_formula"] = formula * n_tokens
    return row


# ------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds; skip the 2048-token uncached decode")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip everything torch.compile does (compiled training step, compiled fast "
                             "layer, Hugging Face's static path): the fast layer then runs uncompiled")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds per timing (default 7, quick 3)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or this process's CPU time (fairer on a machine busy with other work; "
                             "use it with --threads 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the same table on a GPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_cpu.json"))
    args = parser.parse_args(argv)
    global CLOCK, DEVICE
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and args.clock == "cpu":
        parser.error("--clock cpu measures this process's CPU time; on a GPU use the wall clock")
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 7)
    compiled = not args.no_compile
    ours, hf = build_pair()
    import transformers

    transformers.logging.set_verbosity_error()
    gpu = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else None
    results = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
               "transformers": transformers.__version__, "cpu": cpu_name(), "device": gpu or "cpu",
               "threads": torch.get_num_threads(), "clock": args.clock, "config": CONFIG, "repeats": repeats,
               "fast_compile_options": fast.COMPILE_OPTIONS if compiled else None}
    t0 = time.perf_counter()
    progress("memory bandwidth (a 512 MiB copy)")
    results.update(bandwidth_row())
    progress("training step, eager" + (" and torch.compile (a minute or more to compile)" if compiled else ""))
    results.update(bench_train(ours, hf, repeats, compiled))
    fast_model = fast.prepare(ours, compile=compiled)
    for n in (128, 512):
        progress(f"cached greedy decoding of {n} tokens: plain, fast layer, HF"
                 + (", HF static + compile (compiles first)" if compiled else ""))
        results.update(bench_decode(ours, fast_model, hf, n, repeats, compiled))
        results.update(floor_row(ours, results, n))
    for n in (128, 512) if args.quick else (128, 512, 2048):
        progress(f"decoding {n} tokens with and without the cache" + (" (about 8 minutes)" if n == 2048 else ""))
        results.update(bench_cache_speedup(ours, n, min(repeats, 5) if n < 2048 else 1))
    progress("cache bytes")
    results.update(bench_cache_bytes())
    results["total_s"] = time.perf_counter() - t0
    print_table(results)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{results['total_s']:.0f} s in all; written to {args.out}")
    return results


def progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what} ...", file=sys.stderr, flush=True)


def table_rows(r: dict) -> list[tuple[str, str, str]]:
    """(what, key prefix, target) for every ratio the run measured."""
    rows = [("training step, eager: ours / HF", "train_eager", "<= 1.0")]
    if "train_compiled_ratio" in r:
        rows.append((f"training step, torch.compile(ours) ({r['train_compile_s']:.0f} s to compile) / HF eager",
                     "train_compiled", "<= 0.9"))
    for n in (128, 512):
        rows.append((f"decode {n}: plain generate / HF generate", f"decode{n}_plain_vs_hf", "<= 0.85"))
        rows.append((f"decode {n}: fast layer / plain (compile {r[f'decode{n}_compile_fast_s']:.0f} s)",
                     f"decode{n}_fast_vs_plain", "<= 0.7"))
        if f"decode{n}_fast_vs_hf_static_ratio" in r:
            hf_compile = r[f"decode{n}_compile_hf_static_s"]
            rows.append((f"decode {n}: fast layer / HF static+compile (compile {hf_compile:.0f} s)",
                         f"decode{n}_fast_vs_hf_static", "< 1"))
            rows.append((f"decode {n}: HF static+compile / HF generate", f"decode{n}_hf_static_vs_hf", ""))
    return rows


def print_table(r: dict) -> None:
    where = r["device"] if r["device"] != "cpu" else f"{r['cpu']}, {r['threads']} threads"
    print(f"{where}, torch {r['torch']}, transformers {r['transformers']}, "
          f"{r['clock']} clock, {r['repeats']} interleaved rounds, {r['date']}")
    print(f"{'measure':<66} {'median':>7} {'best':>7} {'range':>13}  target")
    for name, key, target in table_rows(r):
        lo, hi = r[f"{key}_ratio_range"]
        print(f"{name:<66} {r[f'{key}_ratio']:6.3f}x {r[f'{key}_ratio_best']:6.3f}x {lo:6.3f}-{hi:5.3f}x  {target}")
    for n in (128, 512, 2048):
        if f"speedup{n}" in r:
            print(f"{f'KV-cache speedup at {n} tokens: uncached / cached':<66} {r[f'speedup{n}']:6.1f}x "
                  f"{r[f'speedup{n}_best']:6.1f}x")
    bw = r["bandwidth_bytes_per_s"]
    print(f"\nfloor: {r['weight_bytes_per_token'] / 2**20:.2f} MiB of weights per token / {bw / 2**30:.1f} GiB/s "
          f"(a 512 MiB copy, best) = {1e3 * r['floor_s_per_token']:.2f} ms per token")
    for n in (128, 512):
        parts = [f"{name} {1e3 * r[f'floor_decode{n}_{name}_s_per_token']:.2f} ms "
                 f"({100 * r[f'floor_decode{n}_{name}_fraction']:.0f}%)"
                 for name in ("plain", "fast", "hf", "hf_static") if f"floor_decode{n}_{name}_fraction" in r]
        print(f"  decode {n}, best ms per token (floor / that): " + ", ".join(parts))
        print(f"  decode {n}: same tokens in all paths: {r[f'decode{n}_same_tokens']}, agreeing by the margin rule: "
              f"{r.get(f'decode{n}_tokens_agree')}")
    for kind in ("gqa", "mla"):
        held, formula = r[f"cache_bytes_{kind}"], r[f"cache_bytes_{kind}_formula"]
        print(f"{kind.upper()} cache after 300 tokens: {held:,} B held, formula {formula:,} B "
              f"({'equal' if held == formula else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
