"""Process-wide behaviour switches of the layers and kernels, set from the config when a runner is built
(`apply_options`), so every switch is a schema field that `xrt config show` prints and a sweep can vary."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.kernels import settings as kernel_settings
from xrt.layers import linear as linear_layers
from xrt.log import set_level


def apply_options(cfg: XrtConfig) -> None:
    """Set the layers' and kernels' switches from cfg.executor (pdl, pdl_max_rows, skinny_gemm_max_rows,
    fuse_prologues) and xrt's log level (cfg.log_level: so `LLM(cfg)` from Python honours it as the CLI does).
    Imports no triton: the kernels read `xrt.kernels.settings` when they launch."""
    set_level(cfg.log_level.value)
    ex = cfg.executor
    kernel_settings.set_pdl(ex.pdl, ex.pdl_max_rows)
    linear_layers.set_options(ex.skinny_gemm_max_rows, ex.fuse_prologues)
