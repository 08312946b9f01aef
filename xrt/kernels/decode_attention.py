"""Paged decode attention for small batches (flash-decoding): one query token per sequence over its paged KV
(FlashInfer's CSR page table, NHD cache `[pages, 2, page_size, kv_heads, head_dim]`), one launch.

Grid (splits, kv heads, batch). A program owns one KV head of one sequence (all its GROUP = H / KV query
heads, so K and V are read once, q padded to 16 rows for tl.dot) and one contiguous chunk of the sequence's
tokens. The chunk length is chosen per sequence on the device: min(max_splits, cdiv(len, split_tokens))
chunks, rounded up to whole key blocks, so a long sequence gets longer chunks instead of more programs and
the grid stays `splits_for(B) x KV x B` whatever the longest context is (a grid sized for max_model_len
would be mostly empty programs). Programs past a sequence's chunk count exit at once.

A sequence covered by one chunk writes its output directly. Otherwise each chunk writes a normalised fp32
partial and its log2-sum-exp to a workspace; the last program of a (sequence, KV head) to arrive (an
arrival counter, as in xrt/kernels/gemv.py) merges the partials, writes the output and resets the counter,
so replays of a CUDA graph find it zero. The merge reads the partials in a fixed order and reduces them the
same way every time: the output is deterministic for a given batch size and metadata.

Nothing is read from the host in `run`: metadata lives in device tensors, the grid depends only on the batch
size, and no memory is allocated when `out` is given, so a launch can be captured once per batch bucket and
replayed with new page tables. Empty sequences (CUDA-graph padding rows: no pages) get zeros and their page
ids are never read."""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import pdl as launch_pdl
from xrt.kernels.launch import pdl_enter, pdl_launch
from xrt.kernels.qk_norm_rope_args import QKNormRope

# Programs wanted per launch when the split count is not fixed: two per SM on a 132-SM H200.
TARGET_PROGRAMS = 264
DEFAULT_SPLIT_TOKENS = 64
# Rows (heads x splits) of fp32 partials the merge loads at once: 64 x 128 fp32 is 64 registers a thread.
_MERGE_ROWS = 64


@triton.jit
def _halves(ptr, HALF: tl.constexpr):
    """A [D] vector's two halves as fp32 rows [1, HALF] (a norm weight; a cos / sin row)."""
    d = tl.arange(0, HALF)[None, :]
    return tl.load(ptr + d).to(tl.float32), tl.load(ptr + HALF + d).to(tl.float32)


@triton.jit
def _norm_rope(ptrs, mask, w1, w2, cos, sin, eps, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Heads [R, D] (ptrs: each head's first element, [R, 1]) -> per-head RMSNorm * w, NeoX-rotated by
    (cos, sin) (w, cos and sin as `_halves`): the two halves in fp32, as xrt.kernels.qk_norm_rope computes them."""
    d = tl.arange(0, HALF)[None, :]
    x1 = tl.load(ptrs + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF + d, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM + eps)[:, None]
    n1 = x1 * rstd * w1
    n2 = x2 * rstd * w2
    return n1 * cos - n2 * sin, n2 * cos + n1 * sin


@triton.jit(do_not_specialize=["max_splits", "split_tokens", "ws_splits", "stride_cs"])
def _decode_kernel(
    q_ptr, kv_ptr, out_ptr, ws_out_ptr, ws_lse_ptr, cnt_ptr,
    kv_indptr_ptr, kv_indices_ptr, last_len_ptr,
    scale_log2, max_splits, split_tokens, ws_splits,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_page, stride_kv, stride_tok, stride_head,
    # ROPE's (after the others: the plain kernel's parameters keep their places)
    q_w_ptr, k_w_ptr, cos_sin_ptr, pos_ptr, slot_ptr, stride_cs, eps,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, MERGE_H: tl.constexpr, MERGE_S: tl.constexpr,
    PRECISION: tl.constexpr, DOT_FP32: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr,
):
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)

    # Before the PDL wait: the step's metadata (page table and its bounds, position, slot) and, with ROPE, the
    # norm weights and the position's cos / sin. The host's copies wrote the metadata before the step's first
    # kernel and no kernel writes any of it (nor the weights, nor the cos / sin table), so only q, this step's
    # K / V and the workspace wait for the kernel before, and the K / V loads go out as soon as the wait ends.
    # A few bytes a program: unlike the K / V reads once tried here (bench/NOTES.md), nothing that competes
    # with the kernel before for bandwidth.
    page_lo = tl.load(kv_indptr_ptr + b)
    npages = tl.load(kv_indptr_ptr + b + 1) - page_lo
    last = tl.load(last_len_ptr + b)
    seq_len = tl.where(npages > 0, (npages - 1) * PAGE_SIZE + last, 0)
    if ROPE:
        pos = tl.load(pos_ptr + b).to(tl.int64)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        # An empty row (graph padding) reads position 0's: its position need not be one of the table's.
        cos, sin = _halves(cos_sin_ptr + tl.where(npages > 0, pos, 0) * stride_cs, HEAD_DIM // 2)
        qw1, qw2 = _halves(q_w_ptr, HEAD_DIM // 2)
        kw1, kw2 = _halves(k_w_ptr, HEAD_DIM // 2)
    n_target = tl.maximum(tl.minimum(max_splits, tl.cdiv(seq_len, split_tokens)), 1)
    # At least one block: an empty sequence gets no chunk (and no division by zero).
    chunk = tl.maximum(tl.cdiv(tl.cdiv(seq_len, n_target), BLOCK_N), 1) * BLOCK_N
    n_splits = tl.cdiv(seq_len, chunk)

    rh = tl.arange(0, BLOCK_H)
    rd = tl.arange(0, HEAD_DIM)
    h_mask = rh < GROUP
    head = kvh * GROUP + rh
    out_rows = out_ptr + b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + rd[None, :]

    # Token offsets of a block come from the page ids loaded one iteration earlier: K/V addresses then depend on
    # no load of their own iteration, and Triton's pipeliner keeps num_stages - 1 blocks of K and V in flight
    # (with the page-id load inside the iteration it keeps only one). The first block's ids are read before the
    # PDL wait (programs past the sequence's chunks read none).
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    t = start + tl.arange(0, BLOCK_N)
    page = tl.load(kv_indices_ptr + page_lo + t // PAGE_SIZE, mask=t < end, other=0)
    pdl_enter(PDL)  # q, this step's K/V and the workspace's counters come from the kernels before

    if split < n_splits:
        row = q_ptr + b.to(tl.int64) * stride_qb
        if ROPE:
            # q_ptr is the raw qkv row: this program normalises and rotates its own q heads (in registers;
            # nothing else reads them), rounded to q's dtype as xrt::qk_norm_rope_store_kv would store them.
            q1, q2 = _norm_rope(row + head[:, None] * stride_qh, h_mask[:, None], qw1, qw2, cos, sin, eps,
                                HEAD_DIM // 2, HEAD_DIM)
            dtype = q_ptr.dtype.element_ty
            q = tl.reshape(tl.permute(tl.join(q1.to(dtype), q2.to(dtype)), (0, 2, 1)), (BLOCK_H, HEAD_DIM))
            # The program whose chunk holds the newest token writes that token's k (normalised, rotated) and v
            # into the cache (padding rows have slot -1), then reads them back in its key loop like any other
            # token: the barrier makes the block's writes visible to all its threads first. No other program
            # reads this token (chunks are disjoint), so no program waits on another.
            if (split == (seq_len - 1) // chunk) & (slot >= 0):
                k_head = NUM_KV_HEADS * GROUP + kvh
                one = tl.arange(0, 1)
                k1, k2 = _norm_rope(row + (k_head + one[:, None]) * stride_qh, one[:, None] >= 0, kw1, kw2, cos,
                                    sin, eps, HEAD_DIM // 2, HEAD_DIM)
                cache_ty = kv_ptr.dtype.element_ty
                dst = (kv_ptr + (slot // PAGE_SIZE) * stride_page + (slot % PAGE_SIZE) * stride_tok
                       + kvh * stride_head)
                rh2 = tl.arange(0, HEAD_DIM // 2)[None, :]
                tl.store(dst + rh2, k1.to(cache_ty))
                tl.store(dst + HEAD_DIM // 2 + rh2, k2.to(cache_ty))
                v = tl.load(row + (k_head + NUM_KV_HEADS) * stride_qh + rd)
                tl.store(dst + stride_kv + rd, v.to(cache_ty))
            tl.debug_barrier()
        else:
            q = tl.load(row + head[:, None] * stride_qh + rd[None, :], mask=h_mask[:, None], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        k_base = kv_ptr + kvh * stride_head + rd[None, :]
        v_base = k_base + stride_kv
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
        tok = page.to(tl.int64) * stride_page + (t % PAGE_SIZE) * stride_tok
        for _ in range(start, end, BLOCK_N):
            t_mask = t < end
            k = tl.load(k_base + tok[:, None], mask=t_mask[:, None], other=0.0)
            v = tl.load(v_base + tok[:, None], mask=t_mask[:, None], other=0.0)
            t_next = t + BLOCK_N
            page_n = tl.load(kv_indices_ptr + page_lo + t_next // PAGE_SIZE, mask=t_next < end, other=0)
            tok_n = page_n.to(tl.int64) * stride_page + (t_next % PAGE_SIZE) * stride_tok
            if DOT_FP32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
            qk = tl.where(t_mask[None, :], qk, float("-inf"))
            # Every block holds at least one valid token, so m_new is finite.
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
            t = t_next
            tok = tok_n
        o = acc / l_i[:, None]

        if n_splits == 1:
            tl.store(out_rows, o.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
        else:
            ws_row = (b * (NUM_KV_HEADS * GROUP) + head).to(tl.int64) * ws_splits + split
            tl.store(ws_out_ptr + ws_row[:, None] * HEAD_DIM + rd[None, :], o, mask=h_mask[:, None])
            tl.store(ws_lse_ptr + ws_row, m_i + tl.log2(l_i), mask=h_mask)
            # Every thread's partial is written before the (single-thread) release of the arrival below.
            tl.debug_barrier()
            cnt = cnt_ptr + b * NUM_KV_HEADS + kvh
            arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if arrived == n_splits - 1:
                rg = tl.arange(0, MERGE_H)
                rs = tl.arange(0, MERGE_S)
                g_mask = rg < GROUP
                m_head = kvh * GROUP + rg
                rows = (b * (NUM_KV_HEADS * GROUP) + m_head).to(tl.int64) * ws_splits
                m = tl.full([MERGE_H], float("-inf"), dtype=tl.float32)
                den = tl.zeros([MERGE_H], dtype=tl.float32)
                total = tl.zeros([MERGE_H, HEAD_DIM], dtype=tl.float32)
                # One pass with a running max: the LSE and partial loads of a step go out together.
                for s0 in range(0, n_splits, MERGE_S):
                    s = s0 + rs
                    mask = g_mask[:, None] & (s < n_splits)[None, :]
                    ws = rows[:, None] + s[None, :]
                    # .cg: read at L2, where the other programs' partials are, never a stale L1 line.
                    lse = tl.load(ws_lse_ptr + ws, mask=mask, other=float("-inf"), cache_modifier=".cg")
                    part = tl.load(ws_out_ptr + ws[:, :, None] * HEAD_DIM + rd[None, None, :],
                                   mask=mask[:, :, None], other=0.0, cache_modifier=".cg")
                    # Padding heads (past GROUP) see only -inf: a finite max keeps them NaN-free.
                    m_new = tl.where(g_mask, tl.maximum(m, tl.max(lse, axis=1)), 0.0)
                    alpha = tl.exp2(m - m_new)
                    w = tl.exp2(lse - m_new[:, None])
                    den = den * alpha + tl.sum(w, axis=1)
                    total = total * alpha[:, None] + tl.sum(w[:, :, None] * part, axis=1)
                    m = m_new
                den = tl.where(den > 0, den, 1.0)
                m_rows = out_ptr + b.to(tl.int64) * stride_ob + m_head[:, None] * stride_oh + rd[None, :]
                tl.store(m_rows, (total / den[:, None]).to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
                tl.atomic_xchg(cnt, 0)
    elif seq_len == 0:
        if split == 0:
            zero = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
            tl.store(out_rows, zero.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


class DecodeAttention:
    """Static-shape split-KV decode attention, capturable in a CUDA graph.

    `split_tokens` is the shortest chunk one program takes (a power of two >= 16); `max_splits`, when given,
    fixes the most chunks per sequence for batches up to `fixed_max_batch` (every batch when None): a row's
    result then does not depend on which of those batches it runs in. Other batches aim `splits_for(B)` at
    TARGET_PROGRAMS programs (at most max_splits) for B rounded up to a power of two, so an eager batch and the
    CUDA-graph bucket it pads to (the default buckets are powers of two up to 8) cut their sequences alike and
    give the same result. The fp32 workspace and the
    arrival counters are allocated here, once. One object may serve every layer and every batch bucket, one
    launch at a time (the workspace and counters are shared): not from two streams at once."""

    def __init__(
        self,
        max_batch: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        max_pages_per_seq: int,
        device: torch.device | str,
        split_tokens: int | None = None,
        *,
        max_splits: int | None = None,
        fixed_max_batch: int | None = None,
        block_n: int = 64,
        num_warps: int = 4,
        num_stages: int = 3,
    ) -> None:
        split_tokens = DEFAULT_SPLIT_TOKENS if split_tokens is None else split_tokens
        for name, value in (("max_batch", max_batch), ("num_kv_heads", num_kv_heads), ("page_size", page_size),
                            ("max_pages_per_seq", max_pages_per_seq), ("num_warps", num_warps),
                            ("num_stages", num_stages)):
            if value < 1:
                raise ValueError(f"DecodeAttention {name}: expected >= 1, got {value}")
        if num_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"DecodeAttention num_heads: expected a positive multiple of num_kv_heads "
                             f"({num_kv_heads}), got {num_heads}")
        if not _pow2(head_dim) or head_dim < 16:
            raise ValueError(f"DecodeAttention head_dim: expected a power of two >= 16, got {head_dim}")
        if not _pow2(split_tokens) or split_tokens < 16:
            raise ValueError(f"DecodeAttention split_tokens: expected a power of two >= 16, got {split_tokens}")
        if not _pow2(block_n) or block_n < 16:
            raise ValueError(f"DecodeAttention block_n: expected a power of two >= 16, got {block_n}")
        if max_splits is not None and max_splits < 1:
            raise ValueError(f"DecodeAttention max_splits: expected >= 1, got {max_splits}")
        if fixed_max_batch is not None and fixed_max_batch < 1:
            raise ValueError(f"DecodeAttention fixed_max_batch: expected >= 1, got {fixed_max_batch}")
        self.max_batch = max_batch
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.max_pages_per_seq = max_pages_per_seq
        self.device = torch.device(device)
        self.split_tokens = split_tokens
        self.fixed_splits = max_splits
        self.fixed_max_batch = fixed_max_batch
        self.block_n = min(block_n, split_tokens)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.group = num_heads // num_kv_heads
        self._block_h = max(16, triton.next_power_of_2(self.group))
        self._merge_h = triton.next_power_of_2(self.group)
        # splits_for never grows with the batch: the batch-1 count sizes the workspace for every batch.
        self.ws_splits = self.splits_for(1)
        self._merge_s = max(1, min(triton.next_power_of_2(self.ws_splits), _MERGE_ROWS // self._merge_h))
        self.partial_out = torch.empty(max_batch, num_heads, self.ws_splits, head_dim, dtype=torch.float32,
                                       device=self.device)
        self.partial_lse = torch.empty(max_batch, num_heads, self.ws_splits, dtype=torch.float32,
                                       device=self.device)
        # Zeroed once; the merging program resets its counter, so every launch finds them zero.
        self.counters = torch.zeros(max_batch * num_kv_heads, dtype=torch.int32, device=self.device)

    def splits_for(self, batch: int) -> int:
        """The most chunks one sequence is cut into at this batch size (the grid's first dimension)."""
        limit = triton.cdiv(self.max_pages_per_seq * self.page_size, self.split_tokens)
        if self.fixed_splits is not None:
            if self.fixed_max_batch is None or batch <= self.fixed_max_batch:
                return max(1, min(self.fixed_splits, limit))
            limit = min(limit, self.fixed_splits)
        rows = triton.next_power_of_2(max(batch, 1))
        return max(1, min(limit, triton.cdiv(TARGET_PROGRAMS, rows * self.num_kv_heads)))

    def _check(self, q: torch.Tensor, kv_cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
               kv_last_page_len: torch.Tensor, out: torch.Tensor | None, rope: QKNormRope | None) -> None:
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        rows = h + 2 * kv if rope is not None else h
        what = "the packed qkv " if rope is not None else ""
        # Heads contiguous with the rope: the kernel finds the k and v heads of a row past its q heads.
        if (q.dim() != 3 or q.shape[1] != rows or q.shape[2] != d or q.stride(2) != 1
                or (rope is not None and q.stride(1) != d)):
            raise ValueError(f"DecodeAttention q: expected {what}[B, {rows}, {d}] with unit last stride, got shape "
                             f"{tuple(q.shape)} strides {q.stride()}")
        batch = q.shape[0]
        if batch > self.max_batch:
            raise ValueError(f"DecodeAttention q: batch {batch} exceeds max_batch {self.max_batch}")
        if (kv_cache.dim() != 5 or tuple(kv_cache.shape[1:]) != (2, self.page_size, kv, d)
                or kv_cache.stride(4) != 1):
            raise ValueError(f"DecodeAttention kv_cache: expected [pages, 2, {self.page_size}, {kv}, {d}] with "
                             f"unit last stride, got shape {tuple(kv_cache.shape)} strides {kv_cache.stride()}")
        if kv_cache.dtype != q.dtype or kv_cache.device != q.device:
            raise ValueError(f"DecodeAttention kv_cache: expected {q.dtype} on {q.device} like q, got "
                             f"{kv_cache.dtype} on {kv_cache.device}")
        for name, t, n in (("kv_indptr", kv_indptr, batch + 1), ("kv_indices", kv_indices, 0),
                           ("kv_last_page_len", kv_last_page_len, batch)):
            if t.dtype != torch.int32 or t.dim() != 1 or t.numel() < n or t.device != q.device or (
                    t.numel() > 1 and t.stride(0) != 1):
                raise ValueError(f"DecodeAttention {name}: expected a contiguous int32 vector of at least {n} "
                                 f"on {q.device}, got {t.dtype} shape {tuple(t.shape)} on {t.device}")
        shape = (batch, h, d)
        if out is not None and (tuple(out.shape) != shape or out.dtype != q.dtype
                                or out.device != q.device or out.stride(2) != 1):
            raise ValueError(f"DecodeAttention out: expected shape {shape} {q.dtype} on {q.device} with "
                             f"unit last stride, got {tuple(out.shape)} {out.dtype} on {out.device} "
                             f"strides {out.stride()}")
        if rope is not None:
            for name, t in (("q_weight", rope.q_weight), ("k_weight", rope.k_weight)):
                if tuple(t.shape) != (d,) or t.stride(0) != 1 or t.device != q.device:
                    raise ValueError(f"DecodeAttention rope.{name}: expected a contiguous [{d}] on {q.device}, "
                                     f"got {tuple(t.shape)} on {t.device}")
            cs = rope.cos_sin_cache
            if cs.dim() != 2 or cs.shape[1] != d or cs.stride(1) != 1 or cs.device != q.device:
                raise ValueError(f"DecodeAttention rope.cos_sin_cache: expected [max_pos, {d}] with unit last "
                                 f"stride on {q.device}, got {tuple(cs.shape)} on {cs.device}")
            for name, t in (("positions", rope.positions), ("slot_mapping", rope.slot_mapping)):
                if t.dim() != 1 or t.numel() < batch or t.device != q.device or (t.numel() > 1 and t.stride(0) != 1):
                    raise ValueError(f"DecodeAttention rope.{name}: expected a contiguous vector of at least "
                                     f"{batch} on {q.device}, got shape {tuple(t.shape)} on {t.device}")

    def run(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        scale: float,
        out: torch.Tensor | None = None,
        pdl: bool | None = None,
        rope: QKNormRope | None = None,
    ) -> torch.Tensor:
        """Attention of q [B, H, D] (one token per sequence, B <= max_batch) over each sequence's pages:
        sequence i owns kv_indices[kv_indptr[i]:kv_indptr[i+1]] and is (pages - 1) * page_size +
        kv_last_page_len[i] tokens long (0 without pages). Only the first B + 1 / B entries of kv_indptr /
        kv_last_page_len are read. Returns [B, H, D] in q's dtype (`out` when given). pdl: `launch.pdl`'s wanted.

        rope: q is this step's raw packed qkv viewed [B, H + 2 KV, D] instead, and the kernel first does
        xrt::qk_norm_rope_store_kv's work: q heads normalised and rotated in registers (qkv is not written), each
        sequence's newest token's k (normalised, rotated) and v written to the cache at rope.slot_mapping."""
        self._check(q, kv_cache, kv_indptr, kv_indices, kv_last_page_len, out, rope)
        batch = q.shape[0]
        if out is None:
            out = q.new_empty(batch, self.num_heads, self.head_dim)
        if batch == 0:
            return out
        splits = self.splits_for(batch)
        # The interpreter's dot multiplies 16-bit floats as their bit patterns: upcast there, never on a GPU.
        dot_fp32 = q.dtype != torch.float32 and os.environ.get("TRITON_INTERPRET") == "1"
        on = launch_pdl(q, batch, pdl)
        if rope is not None:
            rope_args = (rope.q_weight, rope.k_weight, rope.cos_sin_cache, rope.positions, rope.slot_mapping,
                         rope.cos_sin_cache.stride(0), float(rope.eps))
        else:  # dead arguments: ROPE is a constexpr
            rope_args = (q, q, q, kv_indptr, kv_indptr, 0, 0.0)
        _decode_kernel[(splits, self.num_kv_heads, batch)](
            q, kv_cache, out, self.partial_out, self.partial_lse, self.counters,
            kv_indptr, kv_indices, kv_last_page_len,
            float(scale) * math.log2(math.e), splits, self.split_tokens, self.ws_splits,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
            *rope_args,
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, HEAD_DIM=self.head_dim, PAGE_SIZE=self.page_size,
            BLOCK_H=self._block_h, BLOCK_N=self.block_n, MERGE_H=self._merge_h, MERGE_S=self._merge_s,
            PRECISION="ieee" if q.dtype == torch.float32 or dot_fp32 else "tf32", DOT_FP32=dot_fp32, PDL=on,
            ROPE=rope is not None,
            num_warps=self.num_warps, num_stages=self.num_stages, **pdl_launch(on),
        )
        return out
