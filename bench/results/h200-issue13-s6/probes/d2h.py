"""Session probe: does a small D2H read on the compute stream wait behind big D2H gathers on a side stream?"""
import time, torch
from xrt.kvstore.copy import ChunkCopier
L, P, ppc, n = 28, 4096, 16, 32
kv = torch.randn((L, P, 2, 16, 8, 128), device="cuda").to(torch.bfloat16)
buf = torch.empty((n, L, ppc, 2, 16, 8, 128), dtype=torch.bfloat16, pin_memory=True)
x = torch.ones(4, device="cuda")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(3): (a @ a).sum().item()
def trial(mode):
    c = ChunkCopier(kv)
    if mode == "tensor": c._copy = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5): a @ a          # the "prefill" the gathers wait for
    for i in range(n): c.gather(list(range(i * ppc, (i + 1) * ppc)), buf[i])
    y = (x * 2).sum().item()          # the sampler's read-back on the compute stream
    t1 = time.perf_counter()
    torch.cuda.synchronize(); t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t0)
def kernel_trial():
    # gathers as copy kernels writing straight into pinned host memory (mapped: UVA)
    class Arr:
        def __init__(s, t): s.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": "<i2", "data": (t.data_ptr(), False), "version": 3, "strides": None}
    dev = torch.as_tensor(Arr(buf.view(torch.int16)), device="cuda").view(torch.bfloat16)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5): a @ a
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n): dev[i].copy_(kv[:, i * ppc:(i + 1) * ppc])
    y = (x * 2).sum().item()
    t1 = time.perf_counter()
    torch.cuda.synchronize(); t2 = time.perf_counter()
    ok = torch.equal(buf[3].cuda(), kv[:, 3 * ppc:4 * ppc])
    return 1e3 * (t1 - t0), 1e3 * (t2 - t0), ok
t0 = time.perf_counter()
for _ in range(5): a @ a
torch.cuda.synchronize(); print(f"5 GEMMs alone {1e3*(time.perf_counter()-t0):.2f} ms")
for mode in ("cuda2d", "tensor", "cuda2d"):
    for r in range(2):
        print(mode, "read-back at %.2f ms, all done %.2f ms" % trial(mode), flush=True)
for r in range(3):
    print("kernel", "read-back at %.2f ms, all done %.2f ms, ok %s" % kernel_trial(), flush=True)
