"""Launch sizing shared by the kernels: block widths and warp counts picked from static shapes only,
so a kernel compiles once per model shape and never inside a CUDA graph capture. Cached: the same few
model widths are asked for on every launch."""

from __future__ import annotations

import functools

import triton
import triton.language as tl
import triton.language.extra.cuda  # noqa: F401  (tl.extra.cuda.gdc_*)

from xrt.kernels import settings


@functools.cache
def block_size(n: int) -> int:
    """The power-of-two block that covers n elements (masked past n)."""
    return triton.next_power_of_2(max(int(n), 1))


@functools.cache
def num_warps_for(block: int, max_warps: int = 16) -> int:
    # About 8 elements per thread: 16-byte vector accesses for bf16/fp16 without register spills.
    return max(1, min(max_warps, block // 256))


@functools.cache
def _pdl_on(device_index: int) -> bool:
    import os

    import torch
    import triton.language.extra.cuda as tl_cuda

    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if not hasattr(tl_cuda, "gdc_wait"):
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl(t: object, rows: int) -> bool:
    """Whether a launch over `rows` rows of t's device uses programmatic dependent launch (Hopper and later,
    rows <= executor.pdl_max_rows, none with executor.pdl=false: `xrt.kernels.settings`). A PDL kernel may
    start while the kernel before it drains (its launch and set-up overlap the tail of the other); it must run
    `gdc_wait()` before it reads what earlier kernels wrote or writes anything they may still read. Pass
    `PDL=on, **pdl_launch(on)` to the launch."""
    device = getattr(t, "device", None)
    return rows <= settings.pdl_max_rows and device is not None and device.type == "cuda" and _pdl_on(device.index or 0)


def pdl_launch(on: bool) -> dict[str, bool]:
    # Only given when on: the interpreter and older launchers need not know the option.
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First thing in a kernel that takes part in PDL: wait until the kernels before it have finished (their
    writes visible), then let the next kernel launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
