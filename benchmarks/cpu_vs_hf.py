"""The course's Llama against Hugging Face's, same weights, same process: training step, cached decoding,
KV-cache speedup and cache bytes. Prints one table and writes it as JSON.

    python benchmarks/cpu_vs_hf.py [--quick] [--no-compile] [--out benchmarks/results_cpu.json]

Timings alternate the two contenders (ours, theirs, ours, theirs, ...) and quote medians, so a noisy,
shared machine slows both alike; the figures that matter are the ratios.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from modern_block import KVCache, LlamaStyleLM, generate, kv_cache_bytes_per_token, mla_cache_bytes_per_token  # noqa: E402
from modern_block.hf import from_hf  # noqa: E402
from modern_block.mla import MLAConfig  # noqa: E402

CONFIG = dict(V=512, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, seq=256, batch=8)


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


CLOCK = time.perf_counter  # --clock cpu switches to this process's CPU time (see main)
DEVICE = torch.device("cpu")  # --device cuda: the same table on a GPU


def _now() -> float:
    """The clock, after the GPU (if any) has finished the work queued so far."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    return CLOCK()


def alternate(fns: dict, repeats: int, warm_up: bool = True) -> tuple[dict, dict]:
    """Median and best (minimum) seconds of each callable, run in turn ``repeats`` times after one
    warm-up each. The best is the run least disturbed by other work on the machine."""
    for fn in fns.values() if warm_up else ():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = _now()
            fn()
            times[name].append(_now() - t0)
    return ({name: statistics.median(t) for name, t in times.items()}, {name: min(t) for name, t in times.items()})


def ratios(prefix: str, med: dict, best: dict, ours: str, theirs: str) -> dict:
    """Median times of both, and the ratio ours / theirs of the medians and of the bests."""
    return {f"{prefix}_{ours}_s": med[ours], f"{prefix}_{theirs}_s": med[theirs],
            f"{prefix}_ratio": med[ours] / med[theirs], f"{prefix}_ratio_best": best[ours] / best[theirs]}


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
    row = ratios("train_step", *alternate({"ours": train_step_fn(ours, idx, targets),
                                           "hf": train_step_fn(hf, idx, targets, hf=True)}, repeats), "ours", "hf")
    if compile_ours:
        # the Trainer's path: torch.compile(model), loss outside; a fresh cache so the compile time is honest
        with tempfile.TemporaryDirectory() as cache_dir, mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir):
            torch._dynamo.reset()
            compiled = torch.compile(ours)
            t0 = time.perf_counter()
            train_step_fn(compiled, idx, targets)()  # first call compiles forward and backward
            row["compile_s"] = time.perf_counter() - t0
            row.update(ratios("train_step_compiled", *alternate({
                "compiled": train_step_fn(compiled, idx, targets),
                "hf": train_step_fn(hf, idx, targets, hf=True)}, repeats), "compiled", "hf"))
    ours.eval(), hf.eval()
    return row


def bench_decode(ours, hf, new_tokens: int, repeats: int) -> dict:
    """Cached greedy decoding of ``new_tokens`` after a 16-token prompt, batch 1; same tokens checked."""
    prompt = torch.randint(0, CONFIG["V"], (1, 16), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = {}

    def ours_fn():
        out["ours"] = generate(ours, prompt, new_tokens, use_cache=True)

    def hf_fn():
        with torch.inference_mode():
            out["hf"] = hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                    do_sample=False, pad_token_id=0)

    row = ratios(f"decode{new_tokens}", *alternate({"ours": ours_fn, "hf": hf_fn}, repeats), "ours", "hf")
    row[f"decode{new_tokens}_same_tokens"] = torch.equal(out["ours"], out["hf"])
    return row


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
    med, best = alternate({"cache": run(True), "no_cache": run(False)}, repeats, warm_up=not long)
    return {f"speedup{new_tokens}": med["no_cache"] / med["cache"],
            f"speedup{new_tokens}_best": best["no_cache"] / best["cache"],
            f"speedup{new_tokens}_cache_s": med["cache"], f"speedup{new_tokens}_no_cache_s": med["no_cache"],
            f"speedup{new_tokens}_same_tokens": torch.equal(out[True], out[False])}


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats; skip the 2048-token uncached decode")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile training step (its compile takes about a minute)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved pairs per timing (default 7, quick 3)")
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
    ours, hf = build_pair()
    import transformers

    gpu = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else None
    results = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
               "transformers": transformers.__version__, "cpu": _cpu_name(), "device": gpu or "cpu",
               "threads": torch.get_num_threads(),
               "clock": args.clock, "config": CONFIG, "repeats": repeats}
    t0 = time.perf_counter()
    progress("training step, eager" + ("" if args.no_compile else " and torch.compile (about a minute to compile)"))
    results.update(bench_train(ours, hf, repeats, not args.no_compile))
    for n in (128, 512):
        progress(f"cached greedy decoding of {n} tokens")
        results.update(bench_decode(ours, hf, n, repeats))
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


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def print_table(r: dict) -> None:
    rows = [("training step, eager: ours / HF", "train_step_ratio", "<= 1.0")]
    if "train_step_compiled_ratio" in r:
        rows.append((f"training step, torch.compile ({r['compile_s']:.0f} s to compile): ours / HF eager",
                     "train_step_compiled_ratio", "<= 0.9"))
    for n in (128, 512):
        rows.append((f"cached greedy decode, {n} tokens: ours / HF generate", f"decode{n}_ratio", "<= 0.7"))
    for n in (128, 512, 2048):
        if f"speedup{n}" in r:
            target = ">= 5" if n == 512 else ""
            rows.append((f"KV-cache speedup at {n} tokens: uncached / cached", f"speedup{n}", target))
    where = r["device"] if r["device"] != "cpu" else f"{r['cpu']}, {r['threads']} threads"
    print(f"{where}, torch {r['torch']}, transformers {r['transformers']}, "
          f"{r['clock']} clock, {r['repeats']} interleaved pairs, {r['date']}")
    print(f"{'measure':<72} {'median':>7} {'best':>7}  target")
    for name, key, target in rows:
        best = r.get(f"{key}_best")
        best = f"{best:6.2f}x" if best is not None else " " * 7
        print(f"{name:<72} {r[key]:6.2f}x {best}  {target}")
    for kind in ("gqa", "mla"):
        held, formula = r[f"cache_bytes_{kind}"], r[f"cache_bytes_{kind}_formula"]
        print(f"{kind.upper()} cache after 300 tokens: {held:,} B held, formula {formula:,} B "
              f"({'equal' if held == formula else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
