"""A record of the `xrt::` ops a piece of code calls, for tests that check which op ran (the layers call
`torch.ops.xrt.*` through the dispatcher, so a dispatch mode sees every call)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class XrtOpLog(TorchDispatchMode):
    """Records the name of every `xrt::` op called inside it (as the layers call them, through the
    dispatcher); ops named in `skip` are recorded with their first argument and not run."""

    def __init__(self, skip: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.args: list[tuple] = []
        self.skipped: list[torch.Tensor] = []
        self.skip = skip

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.namespace == "xrt":
            name = func._opname
            self.calls.append(name)
            self.args.append(args)
            if name in self.skip:
                self.skipped.append(args[0])
                return None
        return func(*args, **(kwargs or {}))
