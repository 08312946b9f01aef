"""Session 27 (not run yet): causal prefill attention of Qwen3-0.6B's shape (16 q / 8 kv heads, dim 128, bf16) as the
prefill graph runs it: 28 calls captured in one CUDA graph (one per layer, each on its own q/k/v), replayed; us per
call = replay / 28. FlashInfer fa3 ragged (the engine's), torch SDPA cudnn / flash."""
import statistics
import sys

import flashinfer as fi
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

H, KV, D, LAYERS = 16, 8, 128, 28
dev = "cuda"
ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)


def graph_us(fn, n=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ts) / LAYERS


rows = []
for seqs, L in [(1, 1024), (1, 512), (1, 2048), (2, 1024), (8, 1024)]:
    T = seqs * L
    qs = [torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    ks = [torch.randn(T, KV, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    vs = [torch.randn(T, KV, D, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    indptr = torch.arange(0, T + 1, L, dtype=torch.int32)
    fl = seqs * 4 * L * L / 2 * D * H
    ref = None
    for backend in ["fa3", "fa2"]:
        try:
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            w.plan(indptr, indptr, H, KV, D, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            out = w.run(qs[0], ks[0], vs[0])
            if ref is None:
                ref = out.float()
            err = (out.float() - ref).abs().max().item()

            def f(w=w, qs=qs, ks=ks, vs=vs):
                for i in range(LAYERS):  # as the engine's backend calls it
                    w.run(qs[i], ks[i], vs[i], enable_pdl=True)
            us = graph_us(f)
            rows.append((f"{seqs}x{L}", f"flashinfer {backend}", us, fl / us / 1e6, err))
        except Exception as e:  # noqa: BLE001
            print(f"{seqs}x{L} flashinfer {backend}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    for name, b in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        try:
            q4 = [q.view(seqs, L, H, D).transpose(1, 2) for q in qs]
            k4 = [k.view(seqs, L, KV, D).transpose(1, 2) for k in ks]
            v4 = [v.view(seqs, L, KV, D).transpose(1, 2) for v in vs]
            with sdpa_kernel(b):
                out = torch.nn.functional.scaled_dot_product_attention(q4[0], k4[0], v4[0], is_causal=True,
                                                                       enable_gqa=True)
                err = (out.transpose(1, 2).reshape(T, H, D).float() - ref).abs().max().item()

                def f(q4=q4, k4=k4, v4=v4):
                    for i in range(LAYERS):
                        torch.nn.functional.scaled_dot_product_attention(q4[i], k4[i], v4[i], is_causal=True,
                                                                         enable_gqa=True)
                us = graph_us(f)
            rows.append((f"{seqs}x{L}", f"torch sdpa {name}", us, fl / us / 1e6, err))
        except Exception as e:  # noqa: BLE001
            print(f"{seqs}x{L} sdpa {name}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    del qs, ks, vs
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {fi.__version__}, "
      f"cudnn {torch.backends.cudnn.version()}; 28 calls in one graph, median of 30 replays / 28")
print("| seqs x tokens | kernel | us a call | TFLOP/s | max abs diff vs fa3 |")
print("|---|---|--:|--:|--:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.3g} |")
