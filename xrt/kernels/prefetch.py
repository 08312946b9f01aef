"""L2 prefetch of weights, in one launch: `prefetch.global.L2` of every 128-byte line of up to four contiguous
tensors, for a decode step to bring a layer's next weights into the GPU's L2 while a latency-bound kernel (the
decode attention) leaves the memory idle (`executor.l2_prefetch`, xrt.executor.graphs.prefetch). Nothing is read
into registers and nothing is written: the requests are hints the memory system serves on its own, so a program
issues its lines and leaves.

Each program takes BLOCK lines of one tensor (every tensor's lines are padded to whole programs, so a program never
straddles two); lines past a tensor's end are clamped onto its last one (a repeated request, never an address
outside the tensor).

With PDL (the launch in line with the other kernels, `executor.l2_prefetch=inline`) a program first lets the next
kernel launch, then issues its lines while the kernel before still runs (weights depend on no kernel), then waits
for that kernel: the next kernel's own wait, on this one, still orders it after the kernel before."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import pdl as launch_pdl
from xrt.kernels.launch import pdl_launch

LINE_BYTES = 128
# Lines a program issues: 4 a thread at 4 warps.
_BLOCK = 512
_NUM_WARPS = 4
MAX_TENSORS = 4


@triton.jit
def _issue(ptr, nbytes, line0, BLOCK: tl.constexpr, LINE: tl.constexpr):
    last = (nbytes - 1) // LINE
    lines = tl.minimum(line0 + tl.arange(0, BLOCK), last)
    ptrs = ptr + lines.to(tl.int64) * LINE
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_kernel(p0, n0, p1, n1, p2, n2, p3, n3, e0, e1, e2,
                     COUNT: tl.constexpr, BLOCK: tl.constexpr, LINE: tl.constexpr, PDL: tl.constexpr):
    # e0 .. e2: the programs of the tensors before 1 .. 3 (each tensor's lines padded to whole programs).
    pid = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if pid < e0:
        _issue(p0, n0, pid * BLOCK, BLOCK, LINE)
    elif COUNT > 1 and pid < e1:
        _issue(p1, n1, (pid - e0) * BLOCK, BLOCK, LINE)
    elif COUNT > 2 and pid < e2:
        _issue(p2, n2, (pid - e1) * BLOCK, BLOCK, LINE)
    elif COUNT > 3:
        _issue(p3, n3, (pid - e2) * BLOCK, BLOCK, LINE)
    if PDL:
        tl.extra.cuda.gdc_wait()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"prefetch_l2: expected contiguous tensors, got shape {tuple(t.shape)} strides {t.stride()}")
    return t.reshape(-1).view(torch.uint8)


def programs_for(nbytes: Sequence[int]) -> list[int]:
    """Programs of each tensor of these sizes: its 128-byte lines in whole BLOCKs."""
    return [triton.cdiv(triton.cdiv(n, LINE_BYTES), _BLOCK) for n in nbytes]


def prefetch_l2(weights: Sequence[torch.Tensor], pdl: bool | None = None) -> None:
    """Ask L2 for every line of each tensor (1 to 4, contiguous, on one CUDA device; empty ones are skipped).
    pdl: `launch.pdl`'s wanted (None: on, the launch being one row's worth of work)."""
    flat = [_bytes(w) for w in weights if w.numel()]
    if not flat:
        return
    if len(flat) > MAX_TENSORS:
        raise ValueError(f"prefetch_l2: at most {MAX_TENSORS} tensors a launch, got {len(flat)}")
    device = flat[0].device
    if any(t.device != device for t in flat):
        raise ValueError(f"prefetch_l2: expected every tensor on {device}, got {[str(t.device) for t in flat]}")
    sizes = [t.numel() for t in flat]
    ends = list(itertools.accumulate(programs_for(sizes)))
    args: list[object] = []
    for i in range(MAX_TENSORS):
        t = flat[min(i, len(flat) - 1)]  # unused slots repeat the last tensor (COUNT leaves them out)
        args += [t, t.numel()]
    on = launch_pdl(flat[0], 1, pdl)
    _prefetch_kernel[(ends[-1],)](
        *args, *(ends + [ends[-1]] * MAX_TENSORS)[: MAX_TENSORS - 1],
        COUNT=len(flat), BLOCK=_BLOCK, LINE=LINE_BYTES, PDL=on, num_warps=_NUM_WARPS, **pdl_launch(on),
    )
