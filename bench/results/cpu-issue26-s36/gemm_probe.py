"""Can a Triton GEMM match cuBLAS at the 0.6B prefill's qkv and gate_up shapes? (Session 36's probe, before building
a qkv GEMM with the q/k norm, RoPE and KV write in its epilogue: that only pays if the GEMM itself loses little.)
Plain tl.dot with pointer loads, and with TMA tensor descriptors, a few tiles each, against torch.mm (cuBLAS);
triton.testing.do_bench medians, us. Run on the GPU machine: `python3 bench/results/cpu-issue26-s36/gemm_probe.py`."""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from xrt.kernels.gemm_tiles import grouped_tile


@triton.jit
def _mm_ptr(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pm, pn = grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    ap = a + rm[:, None].to(tl.int64) * K + rk[None, :]
    bp = b + rn[:, None].to(tl.int64) * K + rk[None, :]  # b is [N, K] (a linear's weight)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for _ in range(0, K, BK):
        x = tl.load(ap, mask=rm[:, None] < M, other=0.0)
        w = tl.load(bp)
        acc = tl.dot(x, tl.trans(w), acc)
        ap += BK
        bp += BK
    tl.store(c + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(c.dtype.element_ty), mask=rm[:, None] < M)


@triton.jit
def _mm_tma(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            GROUP: tl.constexpr):
    pm, pn = grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        x = a_desc.load([pm * BM, k])
        w = b_desc.load([pn * BN, k])
        acc = tl.dot(x, w.T, acc)
    c_desc.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


def run_ptr(a, b, c, BM, BN, BK, warps, stages):
    M, K = a.shape
    N = b.shape[0]
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    return lambda: _mm_ptr[grid](a, b, c, M, N, K, BM, BN, BK, 8, num_warps=warps, num_stages=stages)


def run_tma(a, b, c, BM, BN, BK, warps, stages):
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = a.shape
    N = b.shape[0]
    ad = TensorDescriptor.from_tensor(a, [BM, BK])
    bd = TensorDescriptor.from_tensor(b, [BN, BK])
    cd = TensorDescriptor.from_tensor(c, [BM, BN])
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    return lambda: _mm_tma[grid](ad, bd, cd, M, N, K, BM, BN, BK, 8, num_warps=warps, num_stages=stages)


CONFIGS = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3),
           (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 8, 3)]


def main() -> None:
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for M in (1024, 8192, 102400):
        for name, N, K in (("qkv", 4096, 1024), ("gate_up", 6144, 1024)):
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 32
            ref = a @ b.t()
            cublas = do_bench(lambda a=a, b=b: torch.mm(a, b.t()), warmup=25, rep=100) * 1e3
            flops = 2 * M * N * K
            print(f"{name} M={M}: cuBLAS {cublas:.1f} us ({flops / cublas / 1e6:.0f} TFLOP/s)", flush=True)
            for kind, fn in (("ptr", run_ptr), ("tma", run_tma)):
                for cfg in CONFIGS:
                    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    try:
                        f = fn(a, b, c, *cfg)
                        f()
                        err = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                        us = do_bench(f, warmup=25, rep=100) * 1e3
                        print(f"  {kind} {cfg}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s, {cublas / us:.2f}x "
                              f"cuBLAS) err {err:.1e}", flush=True)
                    except Exception as e:  # a config that does not compile or fit: name it, go on
                        print(f"  {kind} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
