"""Session 32, a prototype (not part of xrt yet): a decode layer's MLP half as one persistent Triton kernel at batch 1.

Today a decode layer ends in three launches chained by PDL: fused_add_rms_norm (residual <- h + residual,
x <- rms_norm(residual) * w), linear_silu_and_mul (the gate_up GEMV with the activation in its epilogue) and linear
(the down GEMV). Here one launch of at most one program per SM walks a static list of work items: first the gate_up
tiles (each recomputes the row's RMS, a few KB from L2, then streams its [gate; up] rows), then the down tiles. A down
tile loads its first weight chunk, then spins on an arrival counter until every gate_up tile has stored its slice of
the activation, so its weight stream starts while the activation is still being made, which a PDL chain cannot do
(bench/NOTES.md, "The persistent decode kernel"). The last down tile resets the counters: a captured graph needs no
memset. Spinning needs every program resident at once: the grid is at most the SM count.

Numerics follow the unfused ops (xrt/ops/reference.py): the sum rounded to the activation dtype before the norm, the
normalised row rounded before the GEMV, gate and up rounded before silu(gate) * up, which is rounded once.

  python bench/results/cpu-issue26-s32/mlp_persistent.py          # CPU: Triton's interpreter, a grid of one program
  python bench/results/cpu-issue26-s32/mlp_persistent.py --gpu    # CUDA: checks, then 28 layers in a graph vs xrt's ops
  python bench/results/cpu-issue26-s32/mlp_persistent.py --sm90   # no GPU: compiled for sm_90a, ptxas' registers

On CPU the single program walks the items in order, so every counter it reads is already met (the interpreter runs
programs one after another: a grid of more would spin forever)."""

from __future__ import annotations

import os
import statistics
import sys

if "--gpu" not in sys.argv and "--sm90" not in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import pdl_enter, pdl_launch


@triton.jit
def _summed(h_ptr, res_ptr, k):
    h = tl.load(h_ptr + k).to(tl.float32)
    r = tl.load(res_ptr + k).to(tl.float32)
    return (h + r).to(h_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _mlp_kernel(h_ptr, res_ptr, norm_w_ptr, wgu_ptr, wd_ptr, act_ptr, out_ptr, res_out_ptr, cnt_ptr, eps,
                H: tl.constexpr, FF: tl.constexpr, BN_A: tl.constexpr, BK_A: tl.constexpr,
                BN_B: tl.constexpr, BK_B: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    NA: tl.constexpr = FF // BN_A
    NB: tl.constexpr = H // BN_B
    dtype = h_ptr.dtype.element_ty
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    for item in range(pid, NA + NB, grid):
        if item < NA:
            # gate rows j0.., up rows FF + j0..: both weight tiles' first chunk go out before the row's RMS
            j = item * BN_A + tl.arange(0, BN_A)
            rk = tl.arange(0, BK_A)
            g_rows = wgu_ptr + j.to(tl.int64)[:, None] * H
            u_rows = wgu_ptr + (j + FF).to(tl.int64)[:, None] * H
            wg = tl.load(g_rows + rk[None, :])
            wu = tl.load(u_rows + rk[None, :])
            ss = tl.zeros([BK_A], dtype=tl.float32)
            for k0 in range(0, H, BK_A):
                s = _summed(h_ptr, res_ptr, k0 + rk)
                ss += s * s
            rstd = 1.0 / tl.sqrt(tl.sum(ss, 0) / H + eps)
            acc_g = tl.zeros([BN_A, BK_A], dtype=tl.float32)
            acc_u = tl.zeros([BN_A, BK_A], dtype=tl.float32)
            for k0 in range(0, H, BK_A):
                k = k0 + rk
                if k0 > 0:
                    wg = tl.load(g_rows + k[None, :])
                    wu = tl.load(u_rows + k[None, :])
                s = _summed(h_ptr, res_ptr, k)
                x = (s * rstd * tl.load(norm_w_ptr + k).to(tl.float32)).to(dtype).to(tl.float32)
                acc_g += wg.to(tl.float32) * x[None, :]
                acc_u += wu.to(tl.float32) * x[None, :]
                if item == 0:
                    tl.store(res_out_ptr + k, s.to(dtype))
            g = tl.sum(acc_g, 1).to(dtype).to(tl.float32)
            u = tl.sum(acc_u, 1).to(dtype).to(tl.float32)
            a = g / (1.0 + tl.exp(-g)) * u
            tl.store(act_ptr + j, a.to(dtype))
            # every thread's store before the (single) release below
            tl.debug_barrier()
            tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
        else:
            r = (item - NA) * BN_B + tl.arange(0, BN_B)
            rkb = tl.arange(0, BK_B)
            d_rows = wd_ptr + r.to(tl.int64)[:, None] * FF
            w0 = tl.load(d_rows + rkb[None, :]).to(tl.float32)
            arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            while arrived < NA:
                arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            # .cg: the activation is read at L2, where the other programs stored it, never from a stale L1 line
            acc = w0 * tl.load(act_ptr + rkb, cache_modifier=".cg").to(tl.float32)[None, :]
            for k0 in range(BK_B, FF, BK_B):
                kb = k0 + rkb
                w = tl.load(d_rows + kb[None, :]).to(tl.float32)
                acc += w * tl.load(act_ptr + kb, cache_modifier=".cg").to(tl.float32)[None, :]
            tl.store(out_ptr + r, tl.sum(acc, 1).to(dtype))
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu")
            if done == NB - 1:
                # every down tile has read the first counter: both go back to zero for the next launch
                tl.atomic_xchg(cnt_ptr, 0)
                tl.atomic_xchg(cnt_ptr + 1, 0)


class PersistentMLP:
    """Buffers for one shape (H hidden, FF intermediate); `run` launches the kernel (batch 1: h, residual [1, H])."""

    def __init__(self, H: int, FF: int, dtype: torch.dtype, device: torch.device, grid: int,
                 bn_a: int = 16, bk_a: int = 256, bn_b: int = 8, bk_b: int = 512, num_warps: int = 4) -> None:
        bk_a, bk_b = min(bk_a, H), min(bk_b, FF)
        for name, n, b in (("FF", FF, bn_a), ("H", H, bk_a), ("H", H, bn_b), ("FF", FF, bk_b)):
            if n % b:
                raise ValueError(f"{name} = {n} is not a multiple of the block {b}")
        self.H, self.FF, self.grid, self.num_warps = H, FF, min(grid, FF // bn_a + H // bn_b), num_warps
        self.blocks = {"BN_A": bn_a, "BK_A": bk_a, "BN_B": bn_b, "BK_B": bk_b}
        self.act = torch.empty(FF, dtype=dtype, device=device)
        self.cnt = torch.zeros(2, dtype=torch.int32, device=device)

    def run(self, h, res, norm_w, w_gu, w_down, eps, out, res_out, pdl=False):
        _mlp_kernel[(self.grid,)](h, res, norm_w, w_gu, w_down, self.act, out, res_out, self.cnt, eps,
                                  H=self.H, FF=self.FF, PDL=pdl, num_warps=self.num_warps, **self.blocks,
                                  **pdl_launch(pdl))


def reference(h, res, norm_w, w_gu, w_down, eps):
    """The unfused ops' numerics (xrt/ops/reference.py): returns (out, residual)."""
    s = (h + res).float().to(h.dtype)
    s32 = s.float()
    x = (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps) * norm_w.float()).to(h.dtype)
    gu = (x.float() @ w_gu.float().t()).to(h.dtype).float()
    i = w_gu.shape[0] // 2
    a = (torch.nn.functional.silu(gu[..., :i]) * gu[..., i:]).to(h.dtype)
    return (a.float() @ w_down.float().t()).to(h.dtype), s


def make(H, FF, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(dtype).to(device)  # noqa: E731
    return t(1, H), t(1, H), (1 + t(H, scale=0.1)), t(2 * FF, H, scale=H ** -0.5), t(H, FF, scale=FF ** -0.5)


def check(H, FF, dtype, device, grid, **blocks):
    h, res, nw, wgu, wd = make(H, FF, dtype, device)
    m = PersistentMLP(H, FF, dtype, device, grid, **blocks)
    out, res_out = torch.empty_like(h), torch.empty_like(h)
    for _ in range(2):  # the second launch checks the counters came back to zero
        m.run(h, res, nw, wgu, wd, 1e-6, out, res_out)
    ref_out, ref_res = reference(h, res, nw, wgu, wd, 1e-6)
    if device.type == "cuda":
        assert torch.equal(res_out, ref_res), "residual differs"
    else:  # Triton's interpreter truncates to bf16 where the GPU rounds to nearest: one unit in the last place
        assert torch.allclose(res_out.float(), ref_res.float(), rtol=2 ** -7, atol=0), "residual differs"
    err = (out.float() - ref_out.float()).abs().max().item()
    scale = ref_out.float().abs().max().item()
    assert err <= 0.02 * scale + 1e-3, f"out differs by {err} (max |ref| {scale})"
    assert m.cnt.tolist() == [0, 0], f"counters left at {m.cnt.tolist()}"
    print(f"H={H} FF={FF} grid={m.grid} {blocks}: max |out - ref| {err:.3g} (max |ref| {scale:.3g}), counters reset")


CONFIGS = ({}, {"bn_a": 32}, {"bn_a": 8}, {"bn_b": 16}, {"bn_b": 4}, {"bk_a": 512}, {"bk_b": 256}, {"num_warps": 8})


def time_gpu(H, FF, layers=28, reps=30):
    """28 layers (own weights each) in one CUDA graph: xrt's three launches vs the persistent kernel, us a layer."""
    import xrt.ops  # noqa: F401  (registers torch.ops.xrt)

    dev, dtype = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ws = [make(H, FF, dtype, dev, seed=i) for i in range(layers)]
    outs = [torch.empty(1, H, dtype=dtype, device=dev) for _ in range(2)]

    def xrt_ops():
        # in place (x <- norm, residual <- sum), as the model runs them: values drift over replays, times do not
        for h, res, nw, wgu, wd in ws:
            torch.ops.xrt.fused_add_rms_norm(h, res, nw, 1e-6, True)
            a = torch.ops.xrt.linear_silu_and_mul(h, wgu, True)
            torch.ops.xrt.linear(a, wd, True)

    def persistent(m):
        def fn():
            for h, res, nw, wgu, wd in ws:
                m.run(h, res, nw, wgu, wd, 1e-6, outs[1], outs[0], pdl=True)
        return fn

    def graph_us(fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3 / layers)
        return statistics.median(ts)

    mb = (3 * FF * H * 2) / 1e6
    base = graph_us(xrt_ops)
    print(f"H={H} FF={FF} ({mb:.1f} MB of weights a layer), {sms} SMs: xrt ops {base:.2f} us a layer "
          f"({mb / base:.2f} TB/s)", flush=True)
    for cfg in CONFIGS:
        m = PersistentMLP(H, FF, dtype, dev, sms, **cfg)
        pers = graph_us(persistent(m))
        print(f"  persistent {cfg or 'default'} (grid {m.grid}): {pers:.2f} us ({mb / pers:.2f} TB/s, "
              f"{pers / base - 1:+.1%})", flush=True)
    print(f"  xrt ops again: {graph_us(xrt_ops):.2f} us", flush=True)


def sm90():
    """Registers and spills of the 0.6B and 8B shapes' kernels for sm_90a (tests/sm90_support.py, nothing launched)."""
    import tempfile

    sys.path.insert(0, os.getcwd())
    from tests.sm90_support import launches, ptxas_report, spill_bytes

    for H, FF in ((1024, 3072), (4096, 12288)):
        m = PersistentMLP(H, FF, torch.bfloat16, torch.device("cpu"), 132)
        shapes = ((1, H), (1, H), (H,), (2 * FF, H), (H, FF), (1, H), (1, H))
        args = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
        (launch,) = launches(lambda m=m, args=args: m.run(*args[:5], 1e-6, *args[5:], pdl=True))
        with tempfile.TemporaryDirectory() as tmp:
            report = ptxas_report(launch, tmp)
        regs = next(line for line in report.splitlines() if "registers" in line).strip()
        print(f"H={H} FF={FF} grid {m.grid}: {regs}; spills {spill_bytes(report)} bytes")


def main():
    if "--sm90" in sys.argv:
        sm90()
    elif "--gpu" in sys.argv:
        dev = torch.device("cuda")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        print(torch.cuda.get_device_name(), "triton", triton.__version__)
        for H, FF in ((1024, 3072), (4096, 12288)):
            check(H, FF, torch.bfloat16, dev, sms)
            check(H, FF, torch.bfloat16, dev, 7)  # fewer programs than items of either kind
        for H, FF in ((1024, 3072), (4096, 12288)):
            time_gpu(H, FF)
    else:
        for blocks in ({"bn_a": 16, "bk_a": 32, "bn_b": 8, "bk_b": 32},
                       {"bn_a": 8, "bk_a": 64, "bn_b": 16, "bk_b": 32}):
            check(64, 96, torch.bfloat16, torch.device("cpu"), 1, **blocks)


if __name__ == "__main__":
    main()
