"""Strided byte copies between the device KV tensor and host slots: `copy2d(dst, dpitch, src, spitch, width,
height)` copies `height` rows of `width` bytes, row r from src + r * spitch to dst + r * dpitch (addresses
as ints).

Why not tensor copies: a chunk's pages are one row per layer on each side (the KV tensor's layer stride on the
device, the slot's on the host), and torch copies a strided cross-device tensor through a contiguous temporary
(an extra device copy and a caching-allocator block per chunk, which allocated new device memory and blocked
the host ~0.6 ms per chunk on the H200: 18.6 ms of host time for an 8k-token Qwen3-8B load). The CUDA runtime's
cudaMemcpy2DAsync does the strided copy in one call straight between the pinned slot and the pages.

`CudaCopy` calls the CUDA runtime torch itself loaded (found in /proc/self/maps) through ctypes, on a given
stream; `HostCopy` does the same rows with memmove on CPU, so the CPU tests run the exact address arithmetic
the GPU does."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Protocol

from xrt.log import get_logger

log = get_logger(__name__)

H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
_MAX_PITCH_ATTR = 11  # cudaDevAttrMaxPitch: the largest pitch cudaMemcpy2DAsync takes (2 GiB - 1 on Hopper)


class StridedCopy(Protocol):
    def copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: int,
               stream: int) -> None: ...


class HostCopy:
    """CPU memory on both sides: one memmove per row."""

    def copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: int,
               stream: int) -> None:
        for r in range(height):
            ctypes.memmove(dst + r * dpitch, src + r * spitch, width)


def _loaded_cudart() -> Path | None:
    """The CUDA runtime library this process has mapped (torch's own), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if fields and "/libcudart.so" in fields[-1]:
            return Path(fields[-1])
    return None


class CudaCopy:
    """cudaMemcpy2DAsync (and cudaMemcpyAsync per row past the device's largest pitch) of torch's runtime."""

    def __init__(self, lib: ctypes.CDLL, device: int) -> None:
        self._lib = lib
        size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
        lib.cudaMemcpy2DAsync.argtypes = [ptr, size_t, ptr, size_t, size_t, size_t, ctypes.c_int, ptr]
        lib.cudaMemcpy2DAsync.restype = ctypes.c_int
        lib.cudaMemcpyAsync.argtypes = [ptr, ptr, size_t, ctypes.c_int, ptr]
        lib.cudaMemcpyAsync.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        value = ctypes.c_int(0)
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        self._check(lib.cudaDeviceGetAttribute(ctypes.byref(value), _MAX_PITCH_ATTR, device), "cudaDeviceGetAttribute")
        self.max_pitch = value.value

    @classmethod
    def load(cls, device: int) -> CudaCopy | None:
        """None where torch's CUDA runtime is not found (a static build): the caller copies with tensors."""
        path = _loaded_cudart()
        if path is None:
            return None
        try:
            return cls(ctypes.CDLL(str(path)), device)
        except (OSError, AttributeError, RuntimeError) as e:
            log.warning("KV tiers: %s unusable for strided copies (%s); copying through tensors", path, e)
            return None

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: {self._lib.cudaGetErrorString(status).decode()} ({status})")

    def copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: int,
               stream: int) -> None:
        if height == 1 or max(dpitch, spitch) <= self.max_pitch:
            self._check(self._lib.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream),
                        "cudaMemcpy2DAsync")
            return
        for r in range(height):  # a KV cache over 2 GiB a layer: its pitch is past what one 2D copy takes
            self._check(self._lib.cudaMemcpyAsync(dst + r * dpitch, src + r * spitch, width, kind, stream),
                        "cudaMemcpyAsync")
