"""Copies between the device KV tensor [layers, pages, 2, page_size, kv_heads, head_dim] and L1 slots (the chunk
layout of chunk.py: the same axes with the chunk's pages picked out).

A chunk's pages are split into runs of consecutive page ids (the KV manager hands out a sequence's fresh pages
in ascending order, so a chunk is usually one run); a run is one strided copy of every layer's rows at once,
straight between the slot and the pages, with no index tensor, no device temporary and nothing that blocks
the host. On CUDA each direction is either a copy kernel with a bounded grid (xrt/kernels/copy_rows.py,
reaching the pinned slot through its device mapping; `cache.l1.store_programs` / `load_programs` programs) or,
with 0 programs, a DMA copy on the copy engine (memcpy.py: cudaMemcpy2DAsync); on CPU memmove rows, the same
address arithmetic. Stores default to the kernel: a DMA copy down queues on the D2H copy engine ahead of the
steps' own read-backs (see `gather`).

On CUDA both directions run on a side stream, so a decode step on the compute stream never waits for them.
`gather` first makes the side stream wait for the compute stream (the pages' KV was written there).
`scatter_chunks` (a load) copies layer group by layer group (the KV cache's `KVArrivals` groups, every chunk
of the load in each), and records each group's event there: the next forward pass waits for each layer's
group just before that layer attends, so the first layers compute while the last ones' KV is
still on its way (an 8k-token Qwen3-8B prefix is 1.2 GB, ~22 ms at the H200's 55 GB/s). Without arrivals
the caller orders the compute stream after the returned event itself. Both return the CUDA event that marks
the end of the copies, or None on CPU where they are done when they return. The caller keeps the pages (and
the slots) referenced until the event has completed.

Loads are timed (events with timing on CUDA, read once complete; wall time on CPU): `finished_scatters` hands
back (tag, bytes, seconds) per tag the caller gave (the tier whose chunks they were)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch

from xrt.kvcache.device import LAYER_GROUPS, KVArrivals, layer_groups
from xrt.kvstore.memcpy import D2H, H2D, CudaCopy, HostCopy, StridedCopy

Run = tuple[int, int, int]  # (first page's index in the chunk, its page id, pages)


def page_runs(page_ids: Sequence[int]) -> list[Run]:
    """The chunk's pages as runs of consecutive ascending page ids."""
    runs: list[Run] = []
    for i, p in enumerate(page_ids):
        if runs and p == runs[-1][1] + runs[-1][2]:
            start, first, n = runs[-1]
            runs[-1] = (start, first, n + 1)
        else:
            runs.append((i, p, 1))
    return runs


class ChunkCopier:
    def __init__(self, kv: torch.Tensor, arrivals: KVArrivals | None = None, groups: int = LAYER_GROUPS,
                 store_programs: int = 16, load_programs: int = 0) -> None:
        """store_programs / load_programs: the copy kernel's programs for gathers / scatters on CUDA; 0: DMA."""
        if not kv.is_contiguous():
            raise ValueError("ChunkCopier needs the contiguous KV tensor [layers, pages, ...]")
        self.kv = kv
        self.arrivals = arrivals
        # a load's layer groups: the arrivals' own (each has its event), else `groups` of them
        self.groups = arrivals.groups if arrivals is not None else layer_groups(kv.shape[0], groups)
        self.page_bytes = kv[0, 0].numel() * kv.element_size()
        self.stream = torch.cuda.Stream(device=kv.device) if kv.device.type == "cuda" else None
        self._copy: StridedCopy | None = HostCopy()
        self._programs = {D2H: 0, H2D: 0}  # per direction: the copy kernel's programs, 0 for DMA copies
        if self.stream is not None:
            self._copy = CudaCopy.load(kv.device.index or 0)  # None: per-layer tensor copies (_tensor_copies)
            self._programs = {D2H: store_programs, H2D: load_programs}
        self._timed: deque[tuple[torch.cuda.Event, torch.cuda.Event, dict[str, int]]] = deque()
        self._finished: list[tuple[str, int, float]] = []

    def finished_scatters(self) -> list[tuple[str, int, float]]:
        """(tag, bytes, seconds) of the loads done since the last call, one entry per tag of each load (a load's
        time shared among its tags by bytes)."""
        out, self._finished = self._finished, []
        while self._timed and self._timed[0][1].query():
            start, end, tags = self._timed.popleft()
            out.extend(_shares(tags, start.elapsed_time(end) / 1e3))
        return out

    # ------------------------------------------------------------------ the copies

    def _rows(self, slot: torch.Tensor, run: Run, layers: tuple[int, int], kind: int) -> None:
        """One run's pages of these layers: slot <-> KV pages (kind H2D: into the pages)."""
        if self._programs[kind] and slot.is_pinned():
            self._kernel_rows(slot, run, layers, kind)
            return
        if self._copy is None:
            self._tensor_copies(slot, run, layers, kind)
            return
        start, page, n = run
        l0, l1 = layers
        elem = self.kv.element_size()
        kv_pitch, slot_pitch = self.kv.stride(0) * elem, slot.stride(0) * elem
        kv_at = self.kv.data_ptr() + l0 * kv_pitch + page * self.page_bytes
        slot_at = slot.data_ptr() + l0 * slot_pitch + start * self.page_bytes
        width, height = n * self.page_bytes, l1 - l0
        stream = self.stream.cuda_stream if self.stream is not None else 0
        if kind == H2D:
            self._copy.copy2d(kv_at, kv_pitch, slot_at, slot_pitch, width, height, kind, stream)
        else:
            self._copy.copy2d(slot_at, slot_pitch, kv_at, kv_pitch, width, height, kind, stream)

    def _kernel_rows(self, slot: torch.Tensor, run: Run, layers: tuple[int, int], kind: int) -> None:
        """_rows by the bounded copy kernel, on the current (side) stream, through the slot's device mapping."""
        from xrt.kernels.copy_rows import copy_rows  # triton: only on CUDA

        start, page, n = run
        l0, l1 = layers
        pages = self.kv[l0:l1, page : page + n].flatten(1)
        mapped = _device_alias(slot[l0:l1, start : start + n], self.kv.device).flatten(1)
        if kind == H2D:
            copy_rows(pages, mapped, self._programs[kind])
        else:
            copy_rows(mapped, pages, self._programs[kind])

    def _up(self, plans: Sequence[tuple[torch.Tensor, list[Run]]], layers: tuple[int, int]) -> None:
        """Every planned (slot, runs) of a load into its pages, these layers."""
        for slot, runs in plans:
            for run in runs:
                self._rows(slot, run, layers, H2D)

    def _tensor_copies(self, slot: torch.Tensor, run: Run, layers: tuple[int, int], kind: int) -> None:
        """Without the CUDA runtime's strided copy: one contiguous tensor copy per layer."""
        start, page, n = run
        for layer in range(*layers):
            pages, part = self.kv[layer, page : page + n], slot[layer, start : start + n]
            if kind == H2D:
                pages.copy_(part, non_blocking=True)
            else:
                part.copy_(pages, non_blocking=True)

    def _check_slot(self, slot: torch.Tensor, pages: int) -> None:
        """The copies address memory directly: a slot must be this KV's pages, each layer's contiguous."""
        if (slot.dtype != self.kv.dtype or slot.dim() != self.kv.dim() or slot.shape[0] != self.kv.shape[0]
                or slot.shape[1] != pages or slot.shape[2:] != self.kv.shape[2:] or not slot[0].is_contiguous()):
            raise ValueError(f"a slot of {pages} pages of the KV layout {tuple(self.kv.shape[2:])} "
                             f"({self.kv.dtype}), each layer's contiguous; got {tuple(slot.shape)} {slot.dtype} "
                             f"strides {slot.stride()}")

    def gather(self, page_ids: Sequence[int], slot: torch.Tensor) -> torch.cuda.Event | None:
        """Every layer's K and V of these pages (in order) into `slot` ([layers, len(page_ids), ...])."""
        self._check_slot(slot, len(page_ids))
        runs = page_runs(page_ids)
        every = (0, self.kv.shape[0])
        if self.stream is None:
            for run in runs:
                self._rows(slot, run, every, D2H)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.kv.device))
        with torch.cuda.stream(self.stream):
            for run in runs:
                self._rows(slot, run, every, D2H)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done

    def scatter(self, slot: torch.Tensor, page_ids: Sequence[int], tag: str = "") -> torch.cuda.Event | None:
        """The chunk in `slot` into these pages of every layer."""
        return self.scatter_chunks([(slot, page_ids, tag)])

    def scatter_chunks(self, chunks: Sequence[tuple[torch.Tensor, Sequence[int], str]]) -> torch.cuda.Event | None:
        """Each (slot, page ids, tag) into its pages, layer group by layer group; with arrivals, each group's
        event is recorded there for the next forward pass."""
        if not chunks:
            return None
        plans = []
        tags: dict[str, int] = {}
        for slot, page_ids, tag in chunks:
            self._check_slot(slot, len(page_ids))
            plans.append((slot, page_runs(page_ids)))
            tags[tag] = tags.get(tag, 0) + len(page_ids) * self.page_bytes * self.kv.shape[0]  # every layer's
        if self.stream is None:  # the same groups as on CUDA (so the CPU tests run their arithmetic), no events
            t0 = time.perf_counter()
            for layers in self.groups:
                self._up(plans, layers)
            self._finished.extend(_shares(tags, time.perf_counter() - t0))
            return None
        # fresh pages may have belonged to a sequence whose last step is still queued on the compute stream
        self.stream.wait_stream(torch.cuda.current_stream(self.kv.device))
        with torch.cuda.stream(self.stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            for g, layers in enumerate(self.groups):
                self._up(plans, layers)
                if self.arrivals is not None:
                    self.arrivals.record(g, self.stream)
            done = torch.cuda.Event(enable_timing=True)
            done.record(self.stream)
        self._timed.append((start, done, tags))
        return done


class _Mapped:
    """A pinned host range as a CUDA array (UVA: pinned memory is mapped at the same address on the device)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _device_alias(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor over the same pinned host memory as t (same shape, strides and dtype)."""
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))  # elements t reaches
    flat = torch.as_tensor(_Mapped(t.data_ptr(), span * t.element_size()), device=device)
    return flat.view(t.dtype).as_strided(t.shape, t.stride())


def _shares(tags: dict[str, int], seconds: float) -> list[tuple[str, int, float]]:
    total = sum(tags.values()) or 1
    return [(tag, n, seconds * n / total) for tag, n in tags.items()]
