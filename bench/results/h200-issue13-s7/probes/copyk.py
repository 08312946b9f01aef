"""Probe: gathers/scatters between 0.6B-shaped KV pages and pinned L1 slots, by DMA, torch copy kernels and the
bounded copy kernel at several program counts: bandwidth, and what they do to a prefill-like workload and to a
sampler-like tail of small kernels on the compute stream."""
import time
import torch
from xrt.kvstore.copy import ChunkCopier, _device_alias

dev = torch.device("cuda")
L, P = 28, 4096
kv = torch.randn((L, P, 2, 16, 8, 128), device=dev).to(torch.bfloat16)
N = 32
buf = torch.empty((N, L, 16, 2, 16, 8, 128), dtype=torch.bfloat16, pin_memory=True)
nbytes = buf.numel() * 2
a = torch.randn(8192, 1024, device=dev, dtype=torch.bfloat16)
w = torch.randn(1024, 6144, device=dev, dtype=torch.bfloat16)
small = torch.randn(151936, device=dev)

def workload():
    for _ in range(60):
        torch.matmul(a, w)

def tail():
    for _ in range(10):
        small.mul_(1.0)

def gathers(c, mode):
    if mode == "torch":
        c.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(c.stream):
            for i in range(N):
                _device_alias(buf[i], dev).copy_(kv[:, i * 16:(i + 1) * 16])
            e = torch.cuda.Event(); e.record(c.stream)
        return e
    d = None
    for i in range(N):
        d = c.gather(list(range(i * 16, (i + 1) * 16)), buf[i])
    return d

def scatters(c):
    return c.scatter_chunks([(buf[i], list(range(2048 + i * 16, 2048 + (i + 1) * 16)), "l1") for i in range(N)])

def ev():
    e = torch.cuda.Event(enable_timing=True); e.record(); return e

# warm
workload(); tail(); torch.cuda.synchronize()
s, e = ev(), None; workload(); e = ev(); torch.cuda.synchronize(); print(f"workload alone {s.elapsed_time(e):.2f} ms")
s = ev(); tail(); e = ev(); torch.cuda.synchronize(); print(f"tail alone {s.elapsed_time(e):.3f} ms")

modes = [("dma", 0), ("torch", 0)] + [(f"k{p}", p) for p in (2, 4, 8, 16, 32, 64, 132)]
for name, p in modes:
    c = ChunkCopier(kv, store_programs=(0 if name in ("dma",) else max(p, 1)), load_programs=p)
    m = "torch" if name == "torch" else name
    gathers(c, m).synchronize()  # warm (compile)
    if name != "torch":
        scatters(c).synchronize()
    torch.cuda.synchronize()
    # bandwidth alone
    t0 = time.perf_counter(); d = gathers(c, m); host = time.perf_counter() - t0; d.synchronize()
    g = time.perf_counter() - t0
    up = float("nan")
    if name != "torch":
        t0 = time.perf_counter(); scatters(c).synchronize(); up = time.perf_counter() - t0
    # gathers with the workload
    torch.cuda.synchronize()
    s = ev(); d = gathers(c, m); workload(); e = ev(); t0 = time.perf_counter(); torch.cuda.synchronize()
    wl = s.elapsed_time(e)
    # the tail behind gathers
    torch.cuda.synchronize()
    d = gathers(c, m); s = ev(); tail(); e = ev(); torch.cuda.synchronize()
    tl_ = s.elapsed_time(e)
    # scatter under workload
    wl_up = float("nan")
    if name != "torch":
        torch.cuda.synchronize()
        s = ev(); d = scatters(c); workload(); e = ev(); torch.cuda.synchronize(); wl_up = s.elapsed_time(e)
    print(f"{name:6s} gather {nbytes / g / 1e9:5.1f} GB/s (host {host * 1e3:.1f} ms)  scatter {nbytes / up / 1e9:5.1f} GB/s"
          f"  workload+gathers {wl:6.2f} ms  tail behind gathers {tl_:6.3f} ms  workload+scatters {wl_up:6.2f} ms",
          flush=True)
