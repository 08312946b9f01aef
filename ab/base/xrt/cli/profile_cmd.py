"""`python -m xrt profile`: where a step's time goes (`profile.mode`: breakdown, step, host), printed as
markdown; configured by `profile.*` and the usual overrides, on the bench config by default."""

from __future__ import annotations

import sys

from xrt.config import XrtConfig


def main(cfg: XrtConfig) -> int:
    from xrt.bench.setup import BenchError
    from xrt.profile.run import run_profile

    def emit(text: str) -> None:
        print(text, flush=True)

    try:
        run_profile(cfg, emit)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
