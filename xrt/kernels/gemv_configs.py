"""The skinny GEMM's launch configs (`xrt.kernels.gemv`, which re-exports these names): `GemvConfig` and its
checks, the H200 measurements, `prefer_gemv` (where the kernel beats cuBLAS), the heuristic for unmeasured
shapes, and the candidates the gemv kernel bench (`xrt bench bench.scenario=kernels bench.kernels=[gemv]`)
times. Fixed per shape, never autotuned."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

# Programs wanted per launch: about four per SM on a 132-SM H100/H200, enough memory requests in flight.
_TARGET_PROGRAMS = 512
# w elements one FMA program loads per K step: 16 KB in bf16, 64 per thread at 4 warps, no spills.
_FMA_TILE_ELEMS = 8192


@dataclass(frozen=True)
class GemvConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    split_k: int = 1
    use_dot: bool = False
    num_stages: int = 1

    def __str__(self) -> str:
        kind = "dot" if self.use_dot else "fma"
        return (f"{kind} m{self.block_m} n{self.block_n} k{self.block_k} w{self.num_warps} "
                f"s{self.split_k}" + (f" st{self.num_stages}" if self.use_dot else ""))


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_config(cfg: GemvConfig) -> None:
    for name in ("block_m", "block_n", "block_k", "num_warps"):
        if not _pow2(getattr(cfg, name)):
            raise ValueError(f"gemv config {name}: expected a power of two, got {getattr(cfg, name)}")
    if cfg.split_k < 1 or cfg.num_stages < 1:
        raise ValueError(f"gemv config split_k and num_stages: expected >= 1, got {cfg.split_k}, {cfg.num_stages}")
    if not cfg.use_dot and cfg.block_m > 4:
        raise ValueError(f"gemv config: the FMA path holds at most 4 rows (block_m <= 4), got {cfg}")
    if cfg.use_dot and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"gemv config: the dot path needs block_m, block_n, block_k >= 16, got {cfg}")


def _split_k(K: int, block_k: int, tiles: int) -> int:
    """K splits bringing the programs up to about half the target, dividing the K steps evenly (no empty split)."""
    if tiles >= _TARGET_PROGRAMS // 2:
        return 1
    steps = triton.cdiv(K, block_k)
    want = min(steps, triton.cdiv(_TARGET_PROGRAMS // 2, tiles))
    return max(d for d in range(1, want + 1) if steps % d == 0)


# Winners of the gemv kernel bench, keyed (N, K, M bucket: 1, 2, 4 for 3-4, 8 for 5-8; `_bucket`): on the H200 the
# Qwen3-0.6B decode shapes at M = 1 and 8 (then scripts/bench_gemv.py, bench/results/h200-microbench/gemv.md) and the
# Qwen3-8B ones (bench/results/h200-issue26-s1/call4/gemv-8b); on an H100 the 0.6B shapes at M = 2 and 4
# (bench/results/h100-issue26-s3) and the 8B ones (a run whose files were lost; the same bench on the H200 and the
# end-to-end A/B of these entries: bench/results/h200-issue26-s5), kept where the winner beat the config the shape
# had by more than 2%. A shape measured at 8 but not at its own bucket takes the M = 8 winner.
_MEASURED = {
    (4096, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 2048, 1): GemvConfig(1, 2, 1024, 4),
    (6144, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 3072, 1): GemvConfig(1, 1, 1024, 4),
    (151936, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 2048, 8): GemvConfig(4, 4, 512, 2),
    (1024, 3072, 8): GemvConfig(4, 4, 512, 2),
    (151936, 1024, 8): GemvConfig(16, 32, 256, 4, use_dot=True, num_stages=3),
    (4096, 1024, 2): GemvConfig(2, 2, 1024, 4),
    (1024, 2048, 2): GemvConfig(2, 1, 2048, 8),
    (6144, 1024, 2): GemvConfig(2, 2, 512, 2),
    (1024, 3072, 2): GemvConfig(2, 1, 1024, 4),
    (151936, 1024, 2): GemvConfig(2, 2, 512, 2),
    (4096, 1024, 4): GemvConfig(16, 32, 128, 4, use_dot=True, num_stages=4),
    (6144, 1024, 4): GemvConfig(16, 32, 128, 4, use_dot=True, num_stages=4),
    # 0.6B's qkv and gate_up at M = 5-8 on the M = 3-4 tile (block_m 16 covers both): alone it ties cuBLAS, in a
    # decode graph it joins the PDL chain that cuBLAS breaks (bench/results/h100-issue26-s13, -s14).
    (4096, 1024, 8): GemvConfig(16, 32, 128, 4, use_dot=True, num_stages=4),
    (6144, 1024, 8): GemvConfig(16, 32, 128, 4, use_dot=True, num_stages=4),
    (6144, 4096, 1): GemvConfig(1, 1, 2048, 8),
    (4096, 4096, 1): GemvConfig(1, 1, 2048, 8),
    (24576, 4096, 1): GemvConfig(1, 1, 2048, 8),
    (4096, 12288, 1): GemvConfig(1, 4, 2048, 8),
    (151936, 4096, 1): GemvConfig(1, 2, 2048, 8),
    (6144, 4096, 8): GemvConfig(16, 32, 128, 4, split_k=2, use_dot=True, num_stages=4),
    (4096, 4096, 8): GemvConfig(16, 32, 128, 4, split_k=2, use_dot=True, num_stages=4),
    (24576, 4096, 8): GemvConfig(16, 32, 128, 4, use_dot=True, num_stages=4),
    (4096, 12288, 8): GemvConfig(16, 64, 128, 4, split_k=4, use_dot=True, num_stages=3),
    (6144, 4096, 2): GemvConfig(2, 2, 512, 2),
    (4096, 4096, 2): GemvConfig(2, 8, 2048, 8),
    (24576, 4096, 2): GemvConfig(2, 8, 2048, 8),
    (4096, 12288, 2): GemvConfig(2, 2, 1024, 4),
    # The heuristic's FMA tile at M = 3-4 streams the 8B lm_head at 0.76x cuBLAS; the tensor-core tile beats both,
    # at M = 2 too (0.91x cuBLAS for the FMA tile on the H200, bench/results/h200-issue26-s5 section 2).
    (151936, 4096, 2): GemvConfig(16, 32, 256, 4, use_dot=True, num_stages=3),
    (151936, 4096, 4): GemvConfig(16, 32, 256, 4, use_dot=True, num_stages=3),
}


def _bucket(M: int) -> int:
    """The measured batch an M takes its config from: 1, 2, 4 (3-4), 8 (5-8); 0 past the kernel's batches."""
    return 1 if M == 1 else 2 if M == 2 else 4 if M <= 4 else 8 if M <= 8 else 0


def prefer_gemv(M: int, N: int, K: int) -> bool:
    """Whether this kernel beat cuBLAS for the shape: every measured shape at M = 1; at M = 2..8 the shapes
    measured with a winning config at M's bucket or at 8 (every 8B linear; 0.6B's qkv and gate_up, where the kernel
    ties cuBLAS alone at M = 8 and wins in a decode graph), and otherwise narrow outputs (0.6B's o_proj, down) and
    lm_head (figures: bench/NOTES.md)."""
    if M == 1:
        return True
    return M <= 8 and ((N, K, _bucket(M)) in _MEASURED or (N, K, 8) in _MEASURED or N <= 2048 or N >= 65536)


def pick_config(M: int, N: int, K: int) -> GemvConfig:
    """Fixed config for a shape (dtype-agnostic, tuned for 16-bit): the measurement at M's bucket where there is
    one, else at 8 for M <= 8, else a heuristic."""
    bucket = _bucket(M)
    return (_MEASURED.get((N, K, bucket)) or (_MEASURED.get((N, K, 8)) if bucket else None)
            or heuristic_config(M, N, K))


@functools.lru_cache(maxsize=4096)
def heuristic_config(M: int, N: int, K: int) -> GemvConfig:
    """The config rules used before measurement (and for unmeasured shapes)."""
    if M <= 4:
        block_k = min(triton.next_power_of_2(K), 1024)
        # x rows get the w tile's register layout only when one K step spans all warps at 8 elements a thread
        # (256 * num_warps); otherwise the compiler shuffles w through shared memory.
        num_warps = max(1, min(4, block_k // 256))
        block_m = triton.next_power_of_2(M)
        block_n = max(1, _FMA_TILE_ELEMS // (block_k * block_m))
        # Narrow tiles before splitting K: more programs and no fix-up.
        while block_n > 1 and triton.cdiv(N, block_n) < _TARGET_PROGRAMS:
            block_n //= 2
        cfg = GemvConfig(block_m, block_n, block_k, num_warps, _split_k(K, block_k, triton.cdiv(N, block_n)))
        # A long K holds more w per thread than registers do, and a spilled tile streams far below bandwidth
        # (Qwen3-8B's down, K = 12288: bench/results/h200-issue26-s1).
        # Narrower tiles first, then K split in more parts (still dividing its steps evenly).
        while cfg.block_n > 1 and not _fma_fits(cfg, K):
            block_n = cfg.block_n // 2
            cfg = GemvConfig(block_m, block_n, block_k, num_warps, _split_k(K, block_k, triton.cdiv(N, block_n)))
        steps = triton.cdiv(K, block_k)
        for split in range(cfg.split_k, steps + 1):
            fitted = GemvConfig(block_m, cfg.block_n, block_k, num_warps, split)
            if steps % split == 0 and _fma_fits(fitted, K):
                return fitted
        return cfg
    if M <= 16:
        block_k = max(16, min(triton.next_power_of_2(K), 256))
        # Narrower tiles for small N, so that K is split in at most a few parts.
        block_n = 32 if triton.cdiv(N, 32) >= _TARGET_PROGRAMS // 4 else 16
        split = _split_k(K, block_k, triton.cdiv(N, block_n))
        return GemvConfig(16, block_n, block_k, num_warps=4, split_k=split, use_dot=True, num_stages=3)
    # Larger M is not this kernel's target (cuBLAS wins there): a plain tensor-core tiling, kept correct.
    block_k = max(16, min(triton.next_power_of_2(K), 64))
    return GemvConfig(min(64, triton.next_power_of_2(M)), 64, block_k, num_warps=4, use_dot=True, num_stages=3)


def _fma_fits(cfg: GemvConfig, K: int) -> bool:
    """Register budget of the FMA path (checked with ptxas for sm_90): fp32 accumulators per thread, and w
    elements per thread over the whole unrolled K range (the loads of every step are hoisted together)."""
    threads = 32 * cfg.num_warps
    k_range = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    return (cfg.block_m * cfg.block_n * cfg.block_k // threads <= 128
            and cfg.block_n * k_range // threads <= 192)


def candidate_configs(M: int, N: int, K: int) -> list[GemvConfig]:
    """A few plausible configs for a shape, the heuristic's first, for the gemv kernel bench to time."""
    out = [pick_config(M, N, K)]

    def add(cfg: GemvConfig) -> None:
        if cfg not in out:
            out.append(cfg)

    kp = triton.next_power_of_2(K)
    if M <= 8:
        block_m = min(4, triton.next_power_of_2(M))
        for warps in (2, 4, 8):
            block_k = min(256 * warps, kp)
            if block_k < 256 * warps and warps > max(1, kp // 256):
                continue
            for block_n in (1, 2, 4, 8, 16):
                cfg = GemvConfig(block_m, block_n, block_k, warps)
                if _fma_fits(cfg, K) and triton.cdiv(N, block_n) >= 132:
                    add(cfg)
        if triton.cdiv(N, 8) < _TARGET_PROGRAMS:
            for warps in (2, 4):
                block_k = min(256 * warps, kp)
                for split in (2, 3, 4):
                    cfg = GemvConfig(block_m, 8 // block_m if block_m > 1 else 8, block_k, warps, split_k=split)
                    if triton.cdiv(K, block_k) % split == 0 and _fma_fits(cfg, K):
                        add(cfg)
    if M >= 2:
        block_m = 16 if M <= 16 else min(64, triton.next_power_of_2(M))
        for block_n, block_k, stages in ((16, 256, 3), (32, 256, 3), (32, 128, 4), (64, 128, 3), (16, 512, 2)):
            block_k = max(16, min(block_k, kp))
            for split in sorted({1, _split_k(K, block_k, triton.cdiv(N, block_n))}):
                add(GemvConfig(block_m, block_n, block_k, 4, split_k=split, use_dot=True, num_stages=stages))
    return out
