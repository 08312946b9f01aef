"""Time the split-KV decode attention kernel (xrt.kernels.decode_attention) against FlashInfer's
BatchDecodeWithPagedKVCacheWrapper at the Qwen3-0.6B attention shape (16 q heads, 8 KV heads, head_dim 128,
bf16, page 16) for batch x context, over a few kernel variants (split_tokens, split cap, block, stages), so
the defaults can be picked from one GPU run. Writes a markdown table (`--out FILE` too).

`python scripts/bench_decode_attention.py [--batch 1,2,4,8,16,32] [--ctx 512,1024,2048] [--out FILE]`

Timing: triton.testing.do_bench_cudagraph (launch overhead out, as in the CUDA-graph executor), median. Each
timed call runs the attention over enough per-layer KV caches (same page table, as the layers of a decode step)
to overflow L2 (--cold-mb); the time is per layer. Pages are shuffled ids. Every output is checked against a
dense fp32 torch reference before it is timed; a config that fails is reported and the run moves on."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Runnable from a fresh clone without installing xrt.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
TOLERANCE = 2e-2


@dataclass
class Variant:
    name: str
    # DecodeAttention kwargs; "max_splits" may be a function of (batch, ctx).
    kwargs: dict[str, Any] = field(default_factory=dict)

    def resolve(self, batch: int, ctx: int) -> dict[str, Any]:
        return {k: v(batch, ctx) if callable(v) else v for k, v in self.kwargs.items()}


def variants() -> list[Variant]:
    from xrt.kernels.decode_attention import TARGET_PROGRAMS

    return [
        Variant("default"),
        Variant("st32", {"split_tokens": 32}),
        Variant("st128", {"split_tokens": 128}),
        Variant("st256", {"split_tokens": 256}),
        # Twice the programs: the split cap aimed at 4 per SM instead of 2.
        Variant("2x programs", {"max_splits": lambda b, c: -(-2 * TARGET_PROGRAMS // (b * KV_HEADS))}),
        # Fixed 64-token splits whatever the batch (the grid grows with the context).
        Variant("fixed st64", {"split_tokens": 64, "max_splits": lambda b, c: -(-c // 64)}),
        Variant("bn32", {"block_n": 32}),
        Variant("stages2", {"num_stages": 2}),
        Variant("bn32 stages4", {"block_n": 32, "num_stages": 4}),
    ]


def bench_ms(fn: Callable[[], object], rep_ms: int) -> float:
    from triton import testing

    return testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")


def reference(q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, ctx: int, scale: float) -> torch.Tensor:
    """Dense fp32 attention of every sequence over its first ctx tokens (all sequences ctx long)."""
    b, page = q.shape[0], cache.shape[2]
    kv = cache[indices.long()].view(b, -1, 2, page, KV_HEADS, HEAD_DIM).transpose(1, 2)
    kv = kv.reshape(b, 2, -1, KV_HEADS, HEAD_DIM)[:, :, :ctx].float()
    qg = q.float().view(b, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
    probs = (torch.einsum("bkgd,btkd->bkgt", qg, kv[:, 0]) * scale).softmax(dim=-1)
    return torch.einsum("bkgt,btkd->bkgd", probs, kv[:, 1]).reshape(b, HEADS, HEAD_DIM)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def error_note(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0][:100] if str(e).strip() else ""
    return f"ERROR {type(e).__name__}: {msg}"


@dataclass
class Cell:
    us: float = math.nan
    splits: int = 0  # chunks per sequence at this context (0: not this kernel)
    note: str = ""


def run_row(batch: int, ctx: int, args: argparse.Namespace, vs: list[Variant]) -> tuple[dict[str, Cell], float]:
    from xrt.kernels.decode_attention import DecodeAttention

    device, dtype, page = torch.device("cuda"), torch.bfloat16, args.page
    scale = HEAD_DIM ** -0.5
    pages_per_seq = -(-ctx // page)
    needed = batch * pages_per_seq
    num_pages = needed + needed // 8 + 1  # spare pages: ids are a shuffled subset
    kv_bytes = batch * ctx * KV_HEADS * HEAD_DIM * 2 * dtype.itemsize
    layer_bytes = num_pages * 2 * page * KV_HEADS * HEAD_DIM * dtype.itemsize
    layers = max(2, math.ceil(args.cold_mb * 2**20 / layer_bytes))
    caches = torch.randn(layers, num_pages, 2, page, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=dtype)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per_seq
    indices = torch.randperm(num_pages, dtype=torch.int32)[:needed]
    last = torch.full((batch,), ctx - (pages_per_seq - 1) * page, dtype=torch.int32)
    indptr_d, indices_d, last_d = indptr.to(device), indices.to(device), last.to(device)
    ref = reference(q, caches[0], indices_d, ctx, scale)
    out = torch.empty_like(q)
    cells: dict[str, Cell] = {}

    def timed(name: str, launch: Callable[[torch.Tensor], object], splits: int = 0) -> None:
        try:
            out.fill_(float("nan"))
            launch(caches[0])
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            if not err < TOLERANCE:
                cells[name] = Cell(splits=splits, note=f"WRONG: rel err {err:.2e}")
                return

            def run_all() -> None:
                for i in range(layers):
                    launch(caches[i])

            cells[name] = Cell(bench_ms(run_all, args.rep) / layers * 1e3, splits)
        except Exception as e:  # a config that fails to compile or run is reported, not fatal
            cells[name] = Cell(splits=splits, note=error_note(e))

    try:
        import flashinfer

        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=False)
        wrapper.plan(indptr, indices_d, last, HEADS, KV_HEADS, HEAD_DIM, page, q_data_type=dtype,
                     kv_data_type=dtype, sm_scale=scale)
        # As xrt's FlashInfer backend calls it (PDL on Hopper), writing into `out` where the version allows.
        params = inspect.signature(wrapper.run).parameters
        extra = {"enable_pdl": torch.cuda.get_device_capability()[0] >= 9} if "enable_pdl" in params else {}
        if "out" in params:
            timed("flashinfer", lambda c: wrapper.run(q, c, out=out, **extra))
        else:
            timed("flashinfer", lambda c: out.copy_(wrapper.run(q, c, **extra)))
    except Exception as e:
        cells["flashinfer"] = Cell(note=error_note(e))

    for v in vs:
        try:
            kwargs = v.resolve(batch, ctx)
            attn = DecodeAttention(batch, HEADS, KV_HEADS, HEAD_DIM, page, args.max_len // page, device, **kwargs)
            st = attn.split_tokens
            splits = min(attn.splits_for(batch), -(-ctx // st))
        except Exception as e:
            cells[v.name] = Cell(note=error_note(e))
            continue
        timed(v.name, lambda c, a=attn: a.run(q, c, indptr_d, indices_d, last_d, scale, out=out), splits)
    return cells, kv_bytes


def fmt(c: Cell | None, kv_bytes: float, with_gbs: bool = False) -> str:
    if c is None:
        return "-"
    if math.isnan(c.us):
        return c.note or "-"
    s = f"{c.us:.2f}"
    if with_gbs:
        s += f" ({kv_bytes / (c.us * 1e-6) / 1e9:.0f} GB/s)"
    if c.splits:
        s += f" [{c.splits}]"
    return s


def header(args: argparse.Namespace) -> str:
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    try:
        import flashinfer

        fi = flashinfer.__version__
    except Exception:
        fi = "not installed"
    return (f"Decode attention, Qwen3-0.6B shape ({HEADS} q / {KV_HEADS} KV heads, d{HEAD_DIM}), bf16, page "
            f"{args.page}, shuffled pages; GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{triton.__version__}, flashinfer {fi}, commit {commit or '?'}; do_bench_cudagraph median, us per "
            f"layer over per-layer caches cycled through >= {args.cold_mb} MB (cold L2). [n] = chunks per sequence.")


def parse_ints(value: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: {flag}: expected comma-separated integers, got {value!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="1,2,4,8,16,32", help="comma-separated batch sizes")
    parser.add_argument("--ctx", default="512,1024,2048", help="comma-separated context lengths (tokens)")
    parser.add_argument("--page", type=int, default=16, help="page size")
    parser.add_argument("--max-len", type=int, default=4096, help="max context the kernel is built for")
    parser.add_argument("--variants", default="", help="comma-separated variant names to run (default: all)")
    parser.add_argument("--rep", type=int, default=5, help="do_bench repetition time per measurement, ms")
    parser.add_argument("--cold-mb", type=int, default=256, help="KV bytes cycled per timed call, MB")
    parser.add_argument("--out", default="", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_decode_attention needs a CUDA device", file=sys.stderr)
        return 2
    batches, ctxs = parse_ints(args.batch, "--batch"), parse_ints(args.ctx, "--ctx")
    vs = variants()
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = sorted(set(wanted) - {v.name for v in vs})
        if unknown:
            raise SystemExit(f"error: --variants: unknown {unknown}, expected some of {[v.name for v in vs]}")
        vs = [v for v in vs if v.name in wanted]
    if args.max_len < max(ctxs):
        raise SystemExit(f"error: --max-len {args.max_len} is below the longest --ctx {max(ctxs)}")
    start = time.time()
    lines = [header(args), ""]
    print(lines[0], flush=True)
    names = [v.name for v in vs]
    lines += ["| batch | ctx | KV MB | flashinfer us | best | best us | FI / best | " + " | ".join(names) + " |",
              "|" + "---|" * (7 + len(names))]
    for batch in batches:
        for ctx in ctxs:
            try:
                cells, kv_bytes = run_row(batch, ctx, args, vs)
            except Exception as e:  # e.g. out of memory for one row
                print(f"batch {batch} ctx {ctx}: {error_note(e)}", flush=True)
                lines.append(f"| {batch} | {ctx} | - | {error_note(e)} |")
                torch.cuda.empty_cache()
                continue
            torch.cuda.empty_cache()
            timed = [n for n in names if n in cells and not math.isnan(cells[n].us)]
            best = min(timed, key=lambda n: cells[n].us) if timed else None
            fi = cells.get("flashinfer")
            speed = (f"{fi.us / cells[best].us:.2f}x" if best and fi and not math.isnan(fi.us) else "-")
            row = (f"| {batch} | {ctx} | {kv_bytes / 2**20:.1f} | {fmt(fi, kv_bytes, True)} | {best or '-'} | "
                   f"{fmt(cells[best], kv_bytes, True) if best else '-'} | {speed} | "
                   + " | ".join(fmt(cells.get(n), kv_bytes) for n in names) + " |")
            lines.append(row)
            print(row, flush=True)
    lines += ["", f"({time.time() - start:.0f} s)"]
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
