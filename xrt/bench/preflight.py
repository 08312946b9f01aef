"""What a bench scenario would refuse once started (lengths past the model, a prefix shorter than a chunk), found
from the config alone: a sweep checks every job with it before the first one runs (xrt.cli.multirun)."""

from __future__ import annotations

from xrt.bench.setup import BenchError, bench_config
from xrt.config import BenchScenario, XrtConfig


def scenario_problem(cfg: XrtConfig) -> str | None:
    """`field: message`, or None when the scenario's copy of the config can be made."""
    try:
        if cfg.bench.scenario is BenchScenario.PREFIX:
            from xrt.bench.prefix import prefix_config

            prefix_config(cfg)
        elif cfg.bench.scenario is BenchScenario.MULTITURN:
            from xrt.bench.multiturn import multiturn_config

            multiturn_config(cfg)
        elif cfg.bench.scenario is BenchScenario.SERVE:
            from xrt.bench.serve import serve_config

            serve_config(cfg)
        else:
            bench_config(cfg)
    except BenchError as e:
        return str(e)
    return None
