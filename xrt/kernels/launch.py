"""Launch sizing shared by the kernels: block widths and warp counts picked from static shapes only,
so a kernel compiles once per model shape and never inside a CUDA graph capture. Cached: the same few
model widths are asked for on every launch."""

from __future__ import annotations

import functools

import triton
import triton.language as tl
import triton.language.extra.cuda  # noqa: F401  (tl.extra.cuda.gdc_*)


@functools.cache
def block_size(n: int) -> int:
    """The power-of-two block that covers n elements (masked past n)."""
    return triton.next_power_of_2(max(int(n), 1))


@functools.cache
def num_warps_for(block: int, max_warps: int = 16) -> int:
    # About 8 elements per thread: 16-byte vector accesses for bf16/fp16 without register spills.
    return max(1, min(max_warps, block // 256))


@functools.cache
def sm_count(device_index: int) -> int:
    """The CUDA device's streaming multiprocessors: what one wave of a grid fills."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Launches whose caller leaves PDL to the kernel (pdl=None: benchmarks and tests calling a kernel or op directly)
# use it up to this many rows, as the default executor.pdl_max_rows does for the model's launches.
DEFAULT_PDL_MAX_ROWS = 16


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


def pdl(t: object, rows: int, wanted: bool | None) -> bool:
    """Whether a launch over `rows` rows of t's device uses programmatic dependent launch: where the caller wants
    it (a layer decides from executor.pdl / pdl_max_rows and its forward pass: `xrt.layers.options.uses_pdl`;
    None: rows <= DEFAULT_PDL_MAX_ROWS) and the device has it (Hopper and later, not the interpreter). A PDL
    kernel may start while the kernel before it drains (its launch and set-up overlap the tail of the other); it
    must run `gdc_wait()` before it reads what earlier kernels wrote or writes anything they may still read. Pass
    `PDL=on, **pdl_launch(on)` to the launch."""
    if wanted is None:
        wanted = rows <= DEFAULT_PDL_MAX_ROWS
    device = getattr(t, "device", None)
    return wanted and device is not None and device.type == "cuda" and _pdl_on(device.index or 0)


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
