"""Time the skinny-GEMM kernel (xrt.kernels.gemv) against torch.nn.functional.linear at the Qwen3-0.6B linear
shapes and decode batch sizes, for every candidate config (xrt.kernels.gemv.candidate_configs, the heuristic's
pick first), and write markdown tables: per candidate, per shape (torch / pick / best), and a decode-step
estimate. `python scripts/bench_gemv.py [--m 1,2,4,8,16] [--layers qkv,down] [--out FILE]`.

Timing: triton.testing.do_bench_cudagraph (launch overhead out, as in the CUDA-graph executor), median. Each
timed call runs over enough copies of the weight to overflow L2 (--cold-mb), since in a decode step every
weight comes from HBM; the time is per copy. Every candidate is checked against F.linear before it is timed."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

# Runnable from a fresh clone without installing xrt.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Qwen3-0.6B: (N, K) of each linear layer, and how many of it one decode step runs.
LAYERS = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}
NUM_LAYERS = 28
PER_STEP = {"qkv": NUM_LAYERS, "o_proj": NUM_LAYERS, "gate_up": NUM_LAYERS, "down": NUM_LAYERS, "lm_head": 1}


@dataclass
class Result:
    layer: str
    m: int
    name: str  # "torch" or the config
    us: float  # nan when it failed
    gbs: float
    pct: float
    note: str = ""


def bench_ms(fn: Callable[[], object], rep_ms: int) -> float:
    from triton import testing

    if hasattr(testing, "do_bench_cudagraph"):
        return testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    return testing.do_bench(fn, rep=rep_ms, return_mode="median")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def run_shape(layer: str, m: int, weights: list[torch.Tensor], args: argparse.Namespace) -> list[Result]:
    from xrt.kernels.gemv import candidate_configs, gemv

    n, k = weights[0].shape
    dtype, device = weights[0].dtype, weights[0].device
    x = torch.randn(m, k, dtype=dtype, device=device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    moved = (n * k + m * k + m * n) * weights[0].element_size()
    ref = F.linear(x, weights[0])

    def result(name: str, ms: float, note: str = "") -> Result:
        us = ms / len(weights) * 1e3
        gbs = moved / (us * 1e-6) / 1e9
        return Result(layer, m, name, us, gbs, 100 * gbs / (args.peak_tbs * 1e3), note)

    def run_torch() -> None:
        for w in weights:
            F.linear(x, w)

    results = [result("torch", bench_ms(run_torch, args.rep))]
    cands = candidate_configs(m, n, k)
    if args.max_candidates:
        cands = cands[:args.max_candidates]
    for i, cfg in enumerate(cands):
        name = str(cfg) + (" (pick)" if i == 0 else "")
        try:
            err = rel_err(gemv(x, weights[0], out=out, config=cfg), ref)
            if not err < 2e-2:
                results.append(Result(layer, m, name, math.nan, math.nan, math.nan, f"WRONG: rel err {err:.2e}"))
                continue

            def run_gemv(cfg: object = cfg) -> None:
                for w in weights:
                    gemv(x, w, out=out, config=cfg)

            results.append(result(name, bench_ms(run_gemv, args.rep)))
        except Exception as e:  # a config the compiler rejects (e.g. shared memory) is reported, not fatal
            msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
            results.append(Result(layer, m, name, math.nan, math.nan, math.nan, f"ERROR: {msg}"))
    return results


def header(args: argparse.Namespace) -> str:
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    return (f"Qwen3-0.6B linear shapes, {args.dtype}; GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"triton {triton.__version__}, commit {commit or '?'}; do_bench_cudagraph median over weights cycled "
            f"through {args.cold_mb} MB (cold L2); % of {args.peak_tbs} TB/s")


def fmt(r: Result) -> str:
    if math.isnan(r.us):
        return "-"
    return f"{r.us:.2f} us, {r.pct:.0f}%"


def tables(results: list[Result], layers: list[str], ms: list[int]) -> list[str]:
    lines = ["## Every candidate", "", "| layer | M | config | us | GB/s | % peak | torch / this |",
             "|---|---|---|---|---|---|---|"]
    best: dict[tuple[str, int], Result] = {}
    pick: dict[tuple[str, int], Result] = {}
    torch_r: dict[tuple[str, int], Result] = {}
    for r in results:
        key = (r.layer, r.m)
        if r.name == "torch":
            torch_r[key] = r
        else:
            if r.name.endswith("(pick)"):
                pick[key] = r
            if not math.isnan(r.us) and (key not in best or r.us < best[key].us):
                best[key] = r
        t = torch_r.get(key)
        speed = f"{t.us / r.us:.2f}x" if t and not math.isnan(r.us) else "-"
        us = "-" if math.isnan(r.us) else f"{r.us:.2f}"
        gbs = "-" if math.isnan(r.gbs) else f"{r.gbs:.0f}"
        pct = "-" if math.isnan(r.pct) else f"{r.pct:.0f}"
        name = f"{r.name} {r.note}" if r.note else r.name
        lines.append(f"| {r.layer} | {r.m} | {name} | {us} | {gbs} | {pct} | {speed} |")

    lines += ["", "## Per shape", "", "| layer | M | torch | pick | best | best config | torch / best |",
              "|---|---|---|---|---|---|---|"]
    for layer in layers:
        for m in ms:
            key = (layer, m)
            t, p, b = torch_r.get(key), pick.get(key), best.get(key)
            if t is None:
                continue
            speed = f"{t.us / b.us:.2f}x" if b else "-"
            lines.append(f"| {layer} | {m} | {fmt(t)} | {fmt(p) if p else '-'} | {fmt(b) if b else '-'} | "
                         f"{b.name if b else '-'} | {speed} |")

    if set(layers) == set(LAYERS):
        lines += ["", f"## Decode step estimate ({NUM_LAYERS} layers x (qkv, o_proj, gate_up, down) + lm_head)", "",
                  "| M | torch us | pick us | best us |", "|---|---|---|---|"]
        for m in ms:
            def total(d: dict[tuple[str, int], Result], m: int = m) -> float:
                return sum(PER_STEP[layer] * d[(layer, m)].us if (layer, m) in d else math.nan for layer in LAYERS)
            lines.append(f"| {m} | {total(torch_r):.0f} | {total(pick):.0f} | {total(best):.0f} |")

    lines += ["", "## Winners (for pick_config)", "", "```python", "WINNERS = {"]
    for (layer, m), b in sorted(best.items(), key=lambda kv: (list(LAYERS).index(kv[0][0]), kv[0][1])):
        lines.append(f"    ({LAYERS[layer][0]}, {LAYERS[layer][1]}, {m}): \"{b.name.removesuffix(' (pick)')}\",")
    lines += ["}", "```"]
    return lines


def parse_list(value: str, flag: str, choices: object = None) -> list:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if choices is None:
        try:
            return [int(v) for v in items]
        except ValueError:
            raise SystemExit(f"error: {flag}: expected comma-separated integers, got {value!r}") from None
    bad = [v for v in items if v not in choices]
    if bad:
        raise SystemExit(f"error: {flag}: unknown {bad}, expected some of {', '.join(choices)}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--m", default="1,2,4,8,16", help="comma-separated batch sizes (rows of x)")
    parser.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {', '.join(LAYERS)}")
    parser.add_argument("--max-candidates", type=int, default=0, help="time only the first N configs (0: all)")
    parser.add_argument("--rep", type=int, default=10, help="do_bench repetition time per measurement, ms")
    parser.add_argument("--cold-mb", type=int, default=256, help="weight copies cycled per timed call, MB")
    parser.add_argument("--peak-tbs", type=float, default=4.2, help="bandwidth the %% column is relative to")
    parser.add_argument("--out", default="", help="also write the markdown tables to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_gemv needs a CUDA device", file=sys.stderr)
        return 2
    ms = parse_list(args.m, "--m")
    layers = parse_list(args.layers, "--layers", LAYERS)
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    start = time.time()
    lines = [header(args), ""]
    print(lines[0], flush=True)
    results: list[Result] = []
    for layer in layers:
        n, k = LAYERS[layer]
        w_bytes = n * k * dtype.itemsize
        copies = max(2, math.ceil(args.cold_mb * 2**20 / w_bytes))
        weights = [torch.randn(n, k, device=device).mul_(k ** -0.5).to(dtype) for _ in range(copies)]
        for m in ms:
            for r in run_shape(layer, m, weights, args):
                results.append(r)
                us = "-" if math.isnan(r.us) else f"{r.us:8.2f} us {r.gbs:6.0f} GB/s {r.pct:4.0f}%"
                print(f"{layer:8s} M={m:<3d} {r.name:36s} {us} {r.note}", flush=True)
        del weights
        torch.cuda.empty_cache()
    lines += tables(results, layers, ms)
    lines += ["", f"({time.time() - start:.0f} s)"]
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
