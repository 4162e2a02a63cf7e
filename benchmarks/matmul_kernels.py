"""Which kernel multiplies one token by SmolLM2-135M's matrices fastest, in each weight format: the measurement that
chose the fast layer's integer kernel (lesson 10, ``modern_block/fast/w8a8.py``).

One token (a [1, n_in] vector) through the 121 matrices of the fused model (per layer q/k/v stacked, o, gate/up
stacked, down; then the tied head), the real weights of the Q4_1 file, nothing else: each candidate in turn, in
interleaved rounds (a, b, c, a, b, c, ...), at 1 thread (this process's CPU time) and at 2 threads (wall clock).
A candidate that quantizes activations does it inside the timed call, per matrix, as a decoding step must.

    python benchmarks/matmul_kernels.py [--rounds 7] [--threads 1 2] [--out FILE]      # about 10 min on 2 cores

Candidates (a ``compiled`` one runs as ``torch.compile(fullgraph=True)`` of all 121 products, as the fast layer's
step does; ``frozen`` adds inductor's freezing, which turns the weights into constants its patterns may rewrite):

* ``fp32``, ``bf16``: ``F.linear`` (MKL / oneDNN);
* ``int8 weight-only, aten kernel``: ``aten._weight_int8pack_mm`` on a bf16 input (the int8 format eager);
* ``int8 weight-only, compiled``: the multiply-and-sum the int8 format's compiled step fuses (float arithmetic);
* ``w8a8 fbgemm (torch.ao dynamic, deprecated)``: ``torch.ao.nn.quantized.dynamic.Linear``, per-channel weights;
* ``w8a8 _int_mm u8s8 (the format)``: ``modern_block.fast.w8a8.W8A8Linear``, ``torch._int_mm`` on activations
  shifted to uint8 (torchao's CPU recipe on VNNI CPUs), eager and compiled; on CPU ``torch._int_mm`` is oneDNN's
  integer matmul;
* ``w8a8 torchao``: ``torchao.quantization.Int8DynamicActivationInt8WeightConfig`` (needs ``torchao``), compiled and
  frozen, so that its inductor pattern can route the product to oneDNN's quantized linear;
* ``w8a8 oneDNN qlinear (frozen s8 pattern)``: signed int8 ``_int_mm`` with the scales after it, frozen: inductor
  rewrites it to ``onednn.qlinear_pointwise``;
* ``w8a8 inductor int32``: the integer dot product written as a multiply-and-sum in int32 for inductor to generate;
* ``int4 weight-only, aten kernel``: ``aten._weight_int4pack_mm_for_cpu``, groups of 32 (llama.cpp's block size).

Each candidate's products are compared with the fp32 ones (the relative error of the worst matrix: the weights'
rounding, and the activations' for w8a8). Writes ``benchmarks/results_kernels_cpu.json``.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from cpu_vs_hf import fresh_compile_cache  # noqa: E402
from smollm2_decoding import progress  # noqa: E402

from modern_block.fast import decoding as fast  # noqa: E402
from modern_block.fast.profiling import memory_bandwidth  # noqa: E402
from modern_block.fast.w8a8 import W8A8Linear, quantize_activations  # noqa: E402
from modern_block.fast.weights import quantize_int8  # noqa: E402
from modern_block.interop import load_gguf  # noqa: E402
from modern_block.training.device import cpu_name  # noqa: E402

GROUP = 32  # int4 block size, as llama.cpp's Q4 formats


def fused_matrices() -> list[torch.Tensor]:
    """The fused fast model's matrices [n_out, n_in] in the order a step uses them (fp32, the file's Q4_1)."""
    model = load_gguf()
    m = fast.prepare(model, compile=False).model
    return [x.weight.detach() for x in m.modules() if isinstance(x, nn.Linear)]


class Products(nn.Module):
    """Every matrix times the one input vector of its width: ``forward(xs)`` -> list of [1, n_out]."""

    def __init__(self, mats: list[nn.Module]):
        super().__init__()
        self.mats = nn.ModuleList(mats)

    def forward(self, xs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [m(xs[m.in_features]) for m in self.mats]


class Dense(nn.Module):
    def __init__(self, w: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("w", w.to(dtype))  # [n_out, n_in]
        self.in_features = w.shape[1]

    def forward(self, x):  # [1, n_in] -> [1, n_out]
        return F.linear(x.to(self.w.dtype), self.w)


class Int8Rows(nn.Module):
    """int8 rows with one scale each; ``kind`` picks the product."""

    def __init__(self, w: torch.Tensor, kind: str):
        super().__init__()
        q, s = quantize_int8(w)  # [n_out, n_in], [n_out] (bf16)
        self.kind, self.in_features = kind, w.shape[1]
        self.register_buffer("s", s.float() if kind != "woq_aten" else s)
        if kind == "s8":
            self.register_buffer("qt", q.t().contiguous())  # [n_in, n_out]: the layout inductor's pattern takes
        else:
            self.register_buffer("q", q)  # [n_out, n_in]

    def forward(self, x):  # [1, n_in] -> [1, n_out]
        if self.kind == "woq_aten":
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.s).float()
        if self.kind == "woq_sum":
            return (x.float() * self.q.float()).sum(-1) * self.s  # [n_out] (one row)
        xq, sx = quantize_activations(x)  # int8 [1, n_in], fp32 [1, 1]
        if self.kind == "i32":
            return (xq.to(torch.int32) * self.q.to(torch.int32)).sum(-1) * sx.reshape(1) * self.s
        return torch._int_mm(xq, self.qt).float() * sx * self.s  # s8: inductor's frozen pattern, oneDNN qlinear


class Format(nn.Module):
    """The w8a8 format's own module (``W8A8Linear``, unsmoothed: smoothing adds one multiplication per input)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        q, s = quantize_int8(w)
        self.lin = W8A8Linear(nn.Parameter(q, requires_grad=False), nn.Parameter(s, requires_grad=False))
        self.in_features = w.shape[1]

    def forward(self, x):
        return self.lin(x)


class FbgemmDynamic(nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        import torch.ao.nn.quantized.dynamic as nnqd

        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight = nn.Parameter(w.clone())
        lin.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's eager quantization: deprecated in favour of torchao
            self.lin = nnqd.Linear.from_float(lin)
        self.in_features = w.shape[1]

    def forward(self, x):
        return self.lin(x)


class Int4Groups(nn.Module):
    """4-bit weights in groups of 32 (asymmetric, a scale and a minimum each), aten's CPU weight-only kernel."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        n, k = w.shape
        g = w.reshape(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1), g.amax(-1)  # [n, k / 32]
        s = ((hi - lo) / 15).clamp(min=1e-8)
        q = torch.round((g - lo[..., None]) / s[..., None]).clamp(0, 15)  # [n, k / 32, 32]
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.reshape(n, k).to(torch.int32), 1))
        zero = lo + 8 * s  # the kernel reads w = (q - 8) * s + zero
        self.register_buffer("sz", torch.stack([s, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16))
        self.in_features = k

    def forward(self, x):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.sz).float()


def _stored_bytes(p: torch.Tensor) -> int:
    """Bytes a parameter stores: a torchao quantized tensor's int8 data and scales, else its own elements."""
    parts = [getattr(p, a) for a in ("qdata", "scale") if isinstance(getattr(p, a, None), torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in parts) if parts else p.numel() * p.element_size()


def torchao_products(ws: list[torch.Tensor]) -> nn.Module | None:
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        return None
    lins = []
    for w in ws:
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight = nn.Parameter(w.clone(), requires_grad=False)
        lins.append(lin)
    prods = Products(lins)
    quantize_(prods, Int8DynamicActivationInt8WeightConfig())
    return prods


def candidates(ws: list[torch.Tensor]) -> dict[str, tuple[nn.Module, str]]:
    """name -> (Products module, how it runs: "eager", "compiled" or "frozen")."""
    c = {"fp32": (Products([Dense(w, torch.float32) for w in ws]), "eager"),
         "bf16": (Products([Dense(w, torch.bfloat16) for w in ws]), "eager"),
         "int8 weight-only, aten kernel": (Products([Int8Rows(w, "woq_aten") for w in ws]), "eager"),
         "int8 weight-only, compiled": (Products([Int8Rows(w, "woq_sum") for w in ws]), "compiled"),
         "w8a8 fbgemm (torch.ao dynamic, deprecated)": (Products([FbgemmDynamic(w) for w in ws]), "eager"),
         "w8a8 _int_mm u8s8 (the format), eager": (Products([Format(w) for w in ws]), "eager"),
         "w8a8 _int_mm u8s8 (the format), compiled": (Products([Format(w) for w in ws]), "compiled")}
    ao = torchao_products(ws)
    if ao is not None:
        c["w8a8 torchao Int8DynamicActivationInt8Weight, frozen"] = (ao, "frozen")
    c["w8a8 oneDNN qlinear (frozen s8 pattern)"] = (Products([Int8Rows(w, "s8") for w in ws]), "frozen")
    c["w8a8 inductor int32"] = (Products([Int8Rows(w, "i32") for w in ws]), "compiled")
    c["int4 weight-only, aten kernel"] = (Products([Int4Groups(w) for w in ws]), "eager")
    return c


def runner(prods: nn.Module, how: str):
    if how == "eager":
        return prods
    options = {"cpp_wrapper": True, "compile_threads": 1, "freezing": how == "frozen"}
    return torch.compile(prods, fullgraph=True, dynamic=False, options=options)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="candidates whose name contains one of these")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_kernels_cpu.json"))
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    torch.manual_seed(0)
    ws = fused_matrices()
    xs = {n: torch.randn(1, n) for n in {w.shape[1] for w in ws}}  # [1, n_in] per width
    with torch.no_grad():
        ref = [F.linear(xs[w.shape[1]], w) for w in ws]
    cands = candidates(ws)
    if args.only:
        cands = {k: v for k, v in cands.items() if k == "fp32" or any(o in k for o in args.only)}
    nbytes = {}
    for name, (prods, _) in cands.items():
        nbytes[name] = sum(b.numel() * b.element_size() for b in prods.buffers() if b.dim() == 2
                           and b.dtype != torch.int32)  # the weights (and group scales) a token reads
        nbytes[name] += sum(_stored_bytes(p) for p in prods.parameters())
    blocks = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        clock = time.process_time if threads == 1 else time.perf_counter
        torch.compiler.reset()
        runs, compile_s, errors = {}, {}, {}
        for name, (prods, how) in cands.items():
            progress(f"{threads} thread(s): {name} ({how})")
            run = runner(prods, how)
            with torch.inference_mode(), fresh_compile_cache():
                t0 = time.perf_counter()
                out = run(xs)
                compile_s[name] = time.perf_counter() - t0 if how != "eager" else None
            errors[name] = max(((o.reshape(r.shape).float() - r).norm() / r.norm()).item()
                               for o, r in zip(out, ref, strict=True))
            runs[name] = run
        seconds: dict[str, list[float]] = {n: [] for n in runs}
        with torch.inference_mode():
            for _ in range(args.rounds):
                for name, run in runs.items():
                    t0 = clock()
                    run(xs)
                    seconds[name].append(clock() - t0)
        bw = memory_bandwidth(clock=clock)
        rows = {}
        for name, s in seconds.items():
            x = [a / b for a, b in zip(seconds["fp32"], s, strict=True)]
            ms = 1e3 * statistics.median(s)
            rows[name] = {"how": cands[name][1], "seconds": s, "ms": ms, "bytes": nbytes[name],
                          "gb_per_s": nbytes[name] / ms / 1e6, "x_fp32_median": statistics.median(x),
                          "x_fp32_range": [min(x), max(x)], "rel_error_vs_fp32": errors[name],
                          "compile_wall_s": compile_s[name]}
        blocks[str(threads)] = {"threads": threads, "clock": "process CPU time" if threads == 1 else "wall clock",
                                "copy_bandwidth_best_bytes_per_s": bw["best"], "rows": rows}
        for line in table_lines(blocks[str(threads)]):
            print(line)
        torch.compiler.reset()
    results = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "torch": torch.__version__,
               "torchao": _torchao_version(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "matrices": len(ws), "rounds": args.rounds,
               "machine": f"{os.cpu_count()}-core machine; 1-minute load average {load:.2f} at the start, "
                          f"{os.getloadavg()[0]:.2f} at the end",
               "threads": blocks, "total_wall_s": time.perf_counter() - t_start}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out} ({results['total_wall_s']:.0f} s)")
    return results


def _torchao_version() -> str | None:
    try:
        import torchao
    except ImportError:
        return None
    return torchao.__version__


def table_lines(block: dict) -> list[str]:
    copy = block["copy_bandwidth_best_bytes_per_s"] / 1e9
    lines = [f"{block['threads']} thread(s), {block['clock']}; copy {copy:.1f} GB/s",
             f"{'candidate':52s} {'ms':>6s} {'x fp32':>6s} {'rounds':>11s} {'MB':>6s} {'GB/s':>5s} "
                       f"{'rel err':>7s}"]
    for name, r in block["rows"].items():
        lo, hi = r["x_fp32_range"]
        lines.append(f"{name:52s} {r['ms']:6.1f} {r['x_fp32_median']:5.2f}x {lo:5.2f}-{hi:<5.2f} "
                     f"{r['bytes'] / 1e6:6.1f} {r['gb_per_s']:5.1f} {r['rel_error_vs_fp32']:7.4f}")
    return lines


if __name__ == "__main__":
    main()
