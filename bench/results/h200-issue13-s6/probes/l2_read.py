"""Session probe (not shipped): NIXL POSIX read bandwidth vs dd O_DIRECT on this disk, by backend params."""
import os, sys, time, zlib, subprocess, ctypes
from concurrent.futures import ThreadPoolExecutor
import torch
from nixl_cu13._api import nixl_agent, nixl_agent_config
d = "/tmp/l2probe"; os.makedirs(d, exist_ok=True)
CH = 37748736  # 8B chunk: 256 tokens x 147 KB
NF = 48
buf = torch.empty(NF * CH, dtype=torch.uint8, pin_memory=True)
buf.random_(0, 255)
for i in range(NF):
    p = f"{d}/c{i}.kv"
    if not os.path.exists(p):
        with open(p, "wb") as f: f.write(buf[i*CH:(i+1)*CH].numpy().tobytes())
os.sync()
def drop():
    for i in range(NF):
        fd = os.open(f"{d}/c{i}.kv", os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
drop()
r = subprocess.run(f"dd if={d}/c0.kv of=/dev/null bs=16M iflag=direct 2>&1; cat {d}/c*.kv > /dev/null", shell=True, capture_output=True, text=True)
drop()
t = time.perf_counter(); subprocess.run(f"for i in $(seq 0 {NF-1}); do dd if={d}/c$i.kv of=/dev/null bs=16M iflag=direct status=none; done", shell=True); dt = time.perf_counter() - t
print(f"dd O_DIRECT sequential, {NF} files: {NF*CH/dt/1e9:.2f} GB/s", flush=True)
drop()
def par_dd(k):
    drop(); t = time.perf_counter()
    with ThreadPoolExecutor(k) as ex:
        list(ex.map(lambda i: subprocess.run(f"dd if={d}/c{i}.kv of=/dev/null bs=16M iflag=direct status=none", shell=True), range(NF)))
    return NF*CH/(time.perf_counter()-t)/1e9
for k in (2, 4, 8): print(f"dd O_DIRECT {k} parallel: {par_dd(k):.2f} GB/s", flush=True)
def nixl_read(params, batch, direct):
    a = nixl_agent(f"p{time.time_ns()}", nixl_agent_config(backends=[]))
    a.create_backend("POSIX", params)
    reg = a.register_memory([(buf.data_ptr(), buf.numel(), 0, "")], "DRAM", backends=["POSIX"])
    drop()
    t = time.perf_counter()
    for b0 in range(0, NF, batch):
        idx = list(range(b0, min(NF, b0 + batch)))
        fds = [os.open(f"{d}/c{i}.kv", os.O_RDONLY | (os.O_DIRECT if direct else 0)) for i in idx]
        fr = a.register_memory([(0, CH, fd, "") for fd in fds], "FILE", backends=["POSIX"])
        loc = a.get_xfer_descs([(buf.data_ptr() + i*CH, CH, 0) for i in idx], "DRAM")
        rem = a.get_xfer_descs([(0, CH, fd) for fd in fds], "FILE")
        h = a.initialize_xfer("READ", loc, rem, a.name, backends=["POSIX"])
        s = a.transfer(h)
        while s == "PROC": s = a.check_xfer_state(h)
        assert s == "DONE", s
        h.release(); a.deregister_memory(fr, backends=["POSIX"])
        for fd in fds: os.close(fd)
    dt = time.perf_counter() - t
    a.deregister_memory(reg, backends=["POSIX"])
    return NF*CH/dt/1e9
for params in ({}, {"use_aio": "true"}, {"use_uring": "true"}, {"use_posix_aio": "true"}):
    for batch in (7, 48):
        for direct in (False, True):
            try:
                print(f"nixl POSIX {params} batch {batch} direct {direct}: {nixl_read(params, batch, direct):.2f} GB/s", flush=True)
            except Exception as e:
                print(f"nixl POSIX {params} batch {batch} direct {direct}: FAILED {str(e)[:200]}", flush=True)
mv = memoryview(buf.numpy())
for k in (1, 4, 8, 16):
    t = time.perf_counter()
    with ThreadPoolExecutor(k) as ex: list(ex.map(lambda i: zlib.crc32(mv[i*CH:(i+1)*CH]), range(NF)))
    print(f"crc32 {k} threads: {NF*CH/(time.perf_counter()-t)/1e9:.2f} GB/s", flush=True)
