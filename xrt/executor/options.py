"""Process-wide behaviour switches of the layers and kernels, set from the config when a runner is built
(`apply_options`), so every switch is a schema field that `xrt config show` prints and a sweep can vary."""

from __future__ import annotations

from xrt.config import XrtConfig


def apply_options(cfg: XrtConfig) -> None:
    """Set the layers' and kernels' switches from cfg.executor (pdl, pdl_max_rows, skinny_gemm_max_rows,
    fuse_prologues)."""
