"""The runner a config asks for, as the engine builds it: one process's `ModelRunner` at parallel.tp=1, else
rank 0's `TPRunner` over tp ranks. Under torchrun, on a rank other than 0, building the runner serves rank
0's steps until it shuts down and then ends the process: the code after `LLM(cfg)` runs on rank 0 only."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.distributed.env import torchrun_env
from xrt.executor.interface import Runner


def build_runner(cfg: XrtConfig) -> Runner:
    from xrt.executor.factory import build_runner as build_local

    if cfg.parallel.tp == 1:
        return build_local(cfg)
    env = torchrun_env()
    if env is not None and env.rank != 0:
        from xrt.distributed.worker import serve_torchrun

        raise SystemExit(serve_torchrun(cfg))
    from xrt.distributed.driver import TPRunner

    return TPRunner(cfg)
