"""Greedy argmax over the logits' rows, [R, V] -> int64 [R], in one launch: each program takes a chunk of a row, and
the last of a row's programs to arrive (an arrival counter per row, as in xrt/kernels/gemv.py) merges their
winners, writes the row's token and resets the counter. torch.argmax does a row of 152k logits in one kernel
that takes no part in PDL; this one spreads the row over the SMs and waits for lm_head with PDL instead.

Ties go to the lowest index and NaN counts above every number (the first NaN wins), as torch.argmax: values are
compared as order-preserving int32 keys of their float32 bits (-0.0 taken as +0.0, every NaN one key)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import pdl as launch_pdl
from xrt.kernels.launch import pdl_enter, pdl_launch

# Logits per program: a 152k vocabulary in 38 programs a row, 16 values a thread at 8 warps.
_CHUNK = 4096
_NUM_WARPS = 8


class _Scratch:
    """Winners workspace and zeroed arrival counters of a device, never freed (a captured graph keeps their
    addresses; the counters reset themselves). Shared by every launch on the device, one at a time: not from two
    streams at once (as DecodeAttention's workspace; the runner's steps run on one stream)."""

    def __init__(self, device: torch.device, rows: int, chunks: int) -> None:
        self.rows, self.chunks = rows, chunks
        self.keys = torch.empty(rows * chunks, dtype=torch.int32, device=device)
        self.idx = torch.empty(rows * chunks, dtype=torch.int32, device=device)
        self.counters = torch.zeros(rows, dtype=torch.int32, device=device)


# Per device, every scratch ever made (the last is the largest): graphs captured with an older one keep using it.
_scratch: dict[torch.device, list[_Scratch]] = {}


def _scratch_for(device: torch.device, rows: int, chunks: int) -> _Scratch:
    made = _scratch.setdefault(device, [])
    if made and made[-1].rows >= rows and made[-1].chunks >= chunks:
        return made[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"argmax_rows needs scratch for {rows} rows x {chunks} chunks on {device}, not allocated "
                           "before CUDA graph capture: run this shape once eagerly (warmup) before capturing")
    last = made[-1] if made else None
    made.append(_Scratch(device, max(rows, last.rows if last else 0, 256), max(chunks, last.chunks if last else 0)))
    return made[-1]


@triton.jit
def _keys(x):
    """Order-preserving int32 keys of fp32 values: -0.0 as +0.0, NaN above +inf."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return tl.where(x != x, 0x7FFFFFFF, key)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, keys_ptr, idx_ptr, cnt_ptr, V, stride_x, CHUNKS: tl.constexpr,
                   CHUNK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)  # the logits and the counters belong to the kernels before
    pid = tl.program_id(0)
    row = pid // CHUNKS
    chunk = pid % CHUNKS
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    key = _keys(x)
    best = tl.argmax(key, axis=0, tie_break_left=True)
    slot = row * CHUNKS + chunk
    tl.store(keys_ptr + slot, tl.max(key, axis=0))
    tl.store(idx_ptr + slot, chunk * CHUNK + best)
    # The winner is stored before the (single-thread) release of the arrival below.
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
    if arrived == CHUNKS - 1:
        c = tl.arange(0, triton.next_power_of_2(CHUNKS))
        live = c < CHUNKS
        # .cg: read at L2, where the other programs' winners are, never a stale L1 line.
        keys = tl.load(keys_ptr + row * CHUNKS + c, mask=live, other=-0x80000000, cache_modifier=".cg")
        idx = tl.load(idx_ptr + row * CHUNKS + c, mask=live, other=0, cache_modifier=".cg")
        # Chunks are in index order: the leftmost chunk of the top key holds the row's first maximum.
        win = tl.argmax(keys, axis=0, tie_break_left=True)
        tl.store(out_ptr + row, tl.sum(tl.where(c == win, idx, 0), axis=0).to(tl.int64))
        tl.atomic_xchg(cnt_ptr + row, 0)


def argmax_rows(logits: torch.Tensor, out: torch.Tensor, pdl: bool | None = None) -> None:
    """out[r] = argmax(logits[r]) for logits [R, V] (any float dtype, unit last stride) into int64 out [R].
    pdl: `launch.pdl`'s wanted."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.is_floating_point():
        raise ValueError(f"argmax_rows logits: expected float [R, V] with unit last stride, got "
                         f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}")
    rows, vocab = logits.shape
    if tuple(out.shape) != (rows,) or out.dtype != torch.int64 or out.device != logits.device:
        raise ValueError(f"argmax_rows out: expected int64 [{rows}] on {logits.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    if vocab == 0:
        raise ValueError("argmax_rows logits: expected at least one column")
    if rows == 0:
        return
    chunk = min(_CHUNK, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, chunk)
    s = _scratch_for(logits.device, rows, chunks)
    on = launch_pdl(logits, rows, pdl)
    _argmax_kernel[(rows * chunks,)](
        logits, out, s.keys, s.idx, s.counters, vocab, logits.stride(0), CHUNKS=chunks, CHUNK=chunk, PDL=on,
        num_warps=_NUM_WARPS if chunk >= 2048 else 4, **pdl_launch(on),
    )
