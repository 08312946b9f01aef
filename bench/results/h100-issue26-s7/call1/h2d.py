"""Scratch (session 24): what a small host-to-device transfer costs the device on this machine: events around it on
an idle stream, then a tiny kernel that depends on it."""
import statistics
import subprocess
import time

import torch
import triton
import triton.language as tl

print(subprocess.run("nvidia-smi -q | grep -i -A4 'confidential\\|CC State\\|Compute Mode'", shell=True,
                     capture_output=True, text=True).stdout)
n = 3 * 1024 + 1
host = torch.arange(n, dtype=torch.int64).pin_memory()
pageable = torch.arange(n, dtype=torch.int64)
dev = torch.zeros(n, dtype=torch.int64, device="cuda")
other = torch.zeros(n, dtype=torch.int64, device="cuda")
out_host = torch.zeros(1, dtype=torch.int64).pin_memory()
host2s = torch.arange(4, dtype=torch.int32).pin_memory()
dev2 = torch.zeros(4, dtype=torch.int32, device="cuda")


@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def uva_view(t):
    class A:
        __cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": "<i8", "data": (t.data_ptr(), False),
                                    "version": 3, "strides": None}
    return torch.as_tensor(A(), device="cuda")


cases = {
    "nothing": lambda: None,
    "pinned copy_ non_blocking": lambda: dev.copy_(host, non_blocking=True),
    "pageable copy_": lambda: dev.copy_(pageable),
    "two pinned copies (flat + qo)": lambda: (dev.copy_(host, non_blocking=True), dev2.copy_(host2s, non_blocking=True)),
    "device-to-device copy_": lambda: dev.copy_(other),
    "tiny kernel (fill_)": lambda: dev.fill_(1),
    "pinned D2H copy_ of 8 bytes (after add_)": lambda: (dev.add_(1), out_host.copy_(dev[:1], non_blocking=True)),
    "triton store of 8 bytes to pinned host (after add_)": lambda: (dev.add_(1), copy_kernel[(1,)](dev, out_host, 1, BLOCK=16)),
    "triton kernel reading pinned host memory": lambda: copy_kernel[(triton.cdiv(n, 1024),)](host, dev, n, BLOCK=1024),
}
try:
    u = uva_view(host)
    cases["torch kernel on a UVA view of pinned memory"] = lambda: torch.add(u, 0, out=dev)
except Exception as e:  # noqa: BLE001
    print("uva view:", type(e).__name__, e)
res = {}
for name, f in list(cases.items()):
    try:
        f()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(name, "failed:", type(e).__name__, str(e)[:200])
        del cases[name]
for name in cases:
    res[name] = ([], [])
for i in range(60):
    for name, f in cases.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        time.sleep(0.001)
        e0.record()
        t = time.perf_counter()
        f()
        t = time.perf_counter() - t
        dev.add_(1)  # a kernel that depends on it
        e1.record()
        torch.cuda.synchronize()
        if i >= 10:
            res[name][0].append(t * 1e6)
            res[name][1].append(e0.elapsed_time(e1) * 1e3)
host2 = host.clone()
copy_kernel[(triton.cdiv(n, 1024),)](host, dev, n, BLOCK=1024)
torch.cuda.synchronize()
print("triton read of pinned memory correct:", torch.equal(dev.cpu(), host2))
dev.fill_(12345)
copy_kernel[(1,)](dev, out_host, 1, BLOCK=16)
torch.cuda.synchronize()
print("triton store to pinned memory correct:", int(out_host[0]) == 12345)
print(f"{torch.cuda.get_device_name()}: {n} int64, median of 50 (us)")
print("| before a dependent kernel | host call | device span (events) |")
print("|---|--:|--:|")
for name, (h, d) in res.items():
    print(f"| {name} | {statistics.median(h):.1f} | {statistics.median(d):.1f} |")
