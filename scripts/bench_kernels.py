"""Time each Triton kernel against its torch reference (xrt.ops.reference) at the Qwen3-0.6B shapes with
triton.testing.do_bench (median, GPU time) and print a markdown table:
`python scripts/bench_kernels.py [--dtype bf16] [--tokens 1,8,64,512] [--out FILE]`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable

# Runnable from a fresh clone without installing xrt.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from xrt.ops import reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Qwen3-0.6B.
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, PAGE, EPS, MAX_POS = 1024, 3072, 16, 8, 128, 16, 1e-6, 40960


def rope_cache(device: torch.device) -> torch.Tensor:
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64, device=device) / HEAD_DIM)
    freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float64, device=device), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


Call = Callable[[], object]


def cases(n: int, dtype: torch.dtype, device: torch.device) -> list[tuple[str, Call, Call]]:
    """(name, triton call, torch reference call) at n tokens, on fresh random inputs."""
    from xrt.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv
    from xrt.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from xrt.kernels.silu_and_mul import silu_and_mul
    from xrt.kernels.store_kv import store_kv

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    x, res, w = rand(n, HIDDEN), rand(n, HIDDEN), rand(HIDDEN)
    gate_up = rand(n, 2 * INTER)
    qkv, q_w, k_w = rand(n, (HEADS + 2 * KV_HEADS) * HEAD_DIM), rand(HEAD_DIM), rand(HEAD_DIM)
    cos_sin = rope_cache(device)
    positions = torch.randint(0, MAX_POS, (n,), device=device)
    num_pages = (n + PAGE - 1) // PAGE + 1
    cache = rand(num_pages, 2, PAGE, KV_HEADS, HEAD_DIM)
    slots = torch.randperm(num_pages * PAGE, device=device)[:n]
    k_start, v_start = HEADS * HEAD_DIM, (HEADS + KV_HEADS) * HEAD_DIM
    k = qkv[:, k_start:v_start].view(n, KV_HEADS, HEAD_DIM)
    v = qkv[:, v_start:].view(n, KV_HEADS, HEAD_DIM)
    qk_args = (q_w, k_w, cos_sin, positions)
    dims = (HEADS, KV_HEADS, HEAD_DIM, EPS)

    def unfused_triton() -> None:
        qk_norm_rope(qkv, *qk_args, *dims)
        store_kv(k, v, cache, slots)

    def unfused_torch() -> None:
        reference.qk_norm_rope(qkv, *qk_args, *dims)
        reference.store_kv(k, v, cache, slots)

    return [
        ("rms_norm", lambda: rms_norm(x, w, EPS), lambda: reference.rms_norm(x, w, EPS)),
        ("fused_add_rms_norm", lambda: fused_add_rms_norm(x, res, w, EPS),
         lambda: reference.fused_add_rms_norm(x, res, w, EPS)),
        ("silu_and_mul", lambda: silu_and_mul(gate_up), lambda: reference.silu_and_mul(gate_up)),
        ("qk_norm_rope", lambda: qk_norm_rope(qkv, *qk_args, *dims),
         lambda: reference.qk_norm_rope(qkv, *qk_args, *dims)),
        ("store_kv", lambda: store_kv(k, v, cache, slots), lambda: reference.store_kv(k, v, cache, slots)),
        ("qk_norm_rope + store_kv (2 Triton launches)", unfused_triton, unfused_torch),
        ("qk_norm_rope_store_kv (fused)", lambda: qk_norm_rope_store_kv(qkv, *qk_args, cache, slots, *dims),
         unfused_torch),
    ]


def header() -> str:
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    return (f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
            f"commit {commit or '?'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--tokens", default="1,8,64,512", help="comma-separated token counts")
    parser.add_argument("--out", default="", help="also write the table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_kernels needs a CUDA device", file=sys.stderr)
        return 2
    try:
        token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        print(f"error: --tokens: expected comma-separated integers, got {args.tokens!r}", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    lines = [f"Qwen3-0.6B shapes, {args.dtype}; {header()}; do_bench median (us)", "",
             "| kernel | tokens | triton us | torch us | torch / triton |", "|---|---|---|---|---|"]
    for n in token_counts:
        for name, fast, ref in cases(n, dtype, device):
            t_fast = do_bench(fast, return_mode="median") * 1e3
            t_ref = do_bench(ref, return_mode="median") * 1e3
            lines.append(f"| {name} | {n} | {t_fast:.1f} | {t_ref:.1f} | {t_ref / t_fast:.2f}x |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
