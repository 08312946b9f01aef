"""The bounded-grid row copy (xrt.kernels.copy_rows) against the rows it copies: odd widths (a tile's tail), more
tiles than programs and fewer, row strides on both sides, a pinned host destination and source through their
device mappings (how the KV tiers use it), and the checks on its arguments.

The check_* functions are device-agnostic so test_copy_rows_interpret.py runs them on CPU under
TRITON_INTERPRET=1; the kernel module is imported inside them, so collecting this file never imports triton."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch


def kernel() -> ModuleType:
    return importlib.import_module("xrt.kernels.copy_rows")


def check_copies(device: torch.device) -> None:
    k = kernel()
    gen = torch.Generator().manual_seed(0)
    # (rows, width in elements, dtype, programs): one partial tile, exact tiles, many tiles over few programs
    for rows, width, dtype, programs in [(1, 2, torch.bfloat16, 1), (3, 2 * k.BLOCK, torch.float32, 2),
                                         (5, k.BLOCK + 6, torch.bfloat16, 3), (7, 300, torch.float32, 64),
                                         (2, 3 * k.BLOCK - 2, torch.bfloat16, 1)]:
        src_full = torch.randn(rows, width + 10, generator=gen).to(dtype).to(device)
        src = src_full[:, 4 : 4 + width]  # a row stride past the width, an offset start
        dst_full = torch.zeros(rows, 2 * width + 8, dtype=dtype, device=device)
        dst = dst_full[:, 2 : 2 + width]
        k.copy_rows(dst, src, programs)
        assert torch.equal(dst, src), (rows, width, dtype, programs)
        # nothing outside the destination's rows written
        assert not dst_full[:, :2].any() and not dst_full[:, 2 + width :].any()


def check_argument_errors(device: torch.device) -> None:
    k = kernel()
    a = torch.zeros(2, 8, device=device)
    with pytest.raises(ValueError, match="differ"):
        k.copy_rows(a, torch.zeros(2, 9, device=device), 1)
    with pytest.raises(ValueError, match="contiguous rows"):
        k.copy_rows(a.t(), torch.zeros(8, 2, device=device), 1)
    with pytest.raises(ValueError, match="programs"):
        k.copy_rows(a, a.clone(), 0)
    odd = torch.zeros(2, 3, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="4-byte"):
        k.copy_rows(odd, odd.clone(), 1)


def test_copies(device: torch.device) -> None:
    check_copies(device)


def test_argument_errors(device: torch.device) -> None:
    check_argument_errors(device)


def test_pinned_host_through_its_device_mapping(device: torch.device) -> None:
    """Device -> pinned host and back, the host side reached by the kernel through its device alias."""
    from xrt.kvstore.copy import _device_alias

    src = torch.randn(6, 5000, device=device).to(torch.bfloat16)
    host = torch.zeros(6, 5000, dtype=torch.bfloat16, pin_memory=True)
    kernel().copy_rows(_device_alias(host, device), src, 4)
    torch.cuda.synchronize()
    assert torch.equal(host, src.cpu())
    back = torch.zeros_like(src)
    kernel().copy_rows(back, _device_alias(host, device), 4)
    torch.cuda.synchronize()
    assert torch.equal(back, src)
