"""Session probe: host time and device time of ChunkCopier gathers / scatters on the H200 (8B layout)."""
import time, torch
from xrt.kvstore.copy import ChunkCopier
from xrt.kvcache.device import KVArrivals
L, P, ppc = 36, 8192, 16
kv = torch.randn((L, P, 2, 16, 8, 128), device="cuda").to(torch.bfloat16)
n = 32
buf = torch.empty((n, L, ppc, 2, 16, 8, 128), dtype=torch.bfloat16, pin_memory=True)
print("pinned", buf.is_pinned(), flush=True)
for mode in ("cuda", "tensor"):
    c = ChunkCopier(kv, KVArrivals(L))
    if mode == "tensor":
        c._copy = None
    print(mode, type(c._copy).__name__, flush=True)
    for rep in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        evs = [c.gather(list(range(i * ppc, (i + 1) * ppc)), buf[i]) for i in range(n)]
        t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        print(f"  gather {n} chunks: host {1e3*(t1-t0):.2f} ms, until done {1e3*(t2-t0):.2f} ms = {n*buf[0].nbytes/(t2-t0)/1e9:.1f} GB/s", flush=True)
        t0 = time.perf_counter()
        ev = c.scatter_chunks([(buf[i], list(range(4000 + i * ppc, 4000 + (i + 1) * ppc)), "l1") for i in range(n)])
        t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        c.arrivals.take()
        print(f"  scatter {n} chunks: host {1e3*(t1-t0):.2f} ms, until done {1e3*(t2-t0):.2f} ms = {n*buf[0].nbytes/(t2-t0)/1e9:.1f} GB/s", flush=True)
    # a gather issued behind a long kernel on the compute stream: does the host block?
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20): a @ a
    t1 = time.perf_counter()
    c.gather(list(range(16)), buf[0])
    t2 = time.perf_counter()
    torch.cuda.synchronize(); t3 = time.perf_counter()
    print(f"  behind 20 GEMMs: launch {1e3*(t1-t0):.2f} ms, gather call {1e3*(t2-t1):.2f} ms, all done {1e3*(t3-t0):.2f} ms", flush=True)
