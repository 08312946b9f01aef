"""Host <-> device staging, one way for every input a step uploads: a host tensor (pinned on CUDA, so a
non-blocking copy is truly asynchronous), its device twin and a numpy view of the host side, written
on the host and uploaded in one copy. Events say when a copy is done; on CPU copies are synchronous and
the events are no-ops, so the same code runs in the CPU tests."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


def host_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, fill: int = 0) -> torch.Tensor:
    """A host tensor for copies to and from `device`: pinned when it is CUDA (pinning needs CUDA)."""
    return torch.full(shape, fill, dtype=dtype, pin_memory=device.type == "cuda")


class StagedBuffer:
    """host: the host tensor; np: its numpy view (what staging writes); dev: the device twin, or a given
    device tensor of the same shape (a view of a larger block the graph reads)."""

    def __init__(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, dev: torch.Tensor | None = None
    ) -> None:
        self.host = host_tensor(shape, dtype, device)
        self.np: np.ndarray = self.host.numpy()
        self.dev = torch.zeros(shape, dtype=dtype, device=device) if dev is None else dev
        if self.dev.shape != self.host.shape or self.dev.dtype != dtype:  # a view of the wrong block
            raise ValueError(f"StagedBuffer: device {tuple(self.dev.shape)} {self.dev.dtype}, host {shape} {dtype}")

    def upload(self, n: int | None = None) -> torch.Tensor:
        """Start copying the first n rows (all when None) to the device; returns the device rows."""
        if n is None:
            self.dev.copy_(self.host, non_blocking=True)
            return self.dev
        dst = self.dev[:n]
        dst.copy_(self.host[:n], non_blocking=True)
        return dst


class Event(Protocol):
    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class HostEvent:
    """A CPU 'device' has nothing in flight: every copy and kernel is done when its call returns."""

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


def device_event(device: torch.device) -> Event:
    return torch.cuda.Event() if device.type == "cuda" else HostEvent()
