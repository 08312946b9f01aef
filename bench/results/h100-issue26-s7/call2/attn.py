"""Scratch (session 25): causal prefill attention of Qwen3-0.6B's shape (16 q heads, 8 kv heads, head dim 128, bf16)
over 1 x 1024, 8 x 1024 and 1 x 4096 tokens: FlashInfer's ragged prefill by backend, torch SDPA by backend."""
import statistics
import sys

import torch
import flashinfer as fi
from torch.nn.attention import SDPBackend, sdpa_kernel

H, KV, D = 16, 8, 128
dev = "cuda"
ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)


def timeit(f, n=50):
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ts)


def flops(seqs, L):
    return seqs * 4 * L * L / 2 * D * H


rows = []
for seqs, L in [(1, 1024), (8, 1024), (1, 4096), (1, 256)]:
    T = seqs * L
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, KV, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(T, KV, D, device=dev, dtype=torch.bfloat16)
    indptr = torch.arange(0, T + 1, L, dtype=torch.int32)
    ref = None
    for backend in ["fa3", "fa2", "cudnn"]:
        try:
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(indptr, indptr, H, KV, D, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            out = w.run(q, k, v)
            if ref is None:
                ref = out.float()
            err = (out.float() - ref).abs().max().item()
            us = timeit(lambda: w.run(q, k, v))
            rows.append((f"{seqs}x{L}", f"flashinfer {backend}", us, flops(seqs, L) / us / 1e6, err))
        except Exception as e:  # noqa: BLE001
            print(f"{seqs}x{L} flashinfer {backend}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    qs = q.view(seqs, L, H, D).transpose(1, 2)
    ks = k.view(seqs, L, KV, D).transpose(1, 2)
    vs = v.view(seqs, L, KV, D).transpose(1, 2)
    for name, b in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                    ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(b):
                f = lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
                out = f().transpose(1, 2).reshape(T, H, D)
                err = (out.float() - ref).abs().max().item()
                us = timeit(f)
            rows.append((f"{seqs}x{L}", f"torch sdpa {name}", us, flops(seqs, L) / us / 1e6, err))
        except Exception as e:  # noqa: BLE001
            print(f"{seqs}x{L} sdpa {name}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    del q, k, v
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {fi.__version__}; median of 50 calls")
print("| seqs x tokens | kernel | us | TFLOP/s | max abs diff vs fa3 |")
print("|---|---|--:|--:|--:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.3g} |")
