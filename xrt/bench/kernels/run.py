"""Run the kernels scenario: the comparisons `bench.kernels` selects, one result line per implementation
timed, each carrying where it ran (device, versions, commit) and the config."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import torch

from xrt.bench.engine_timing import Progress
from xrt.bench.environment import config_dict, environment
from xrt.bench.floor import copy_bandwidth, default_copy_bytes
from xrt.bench.kernels import attention, elementwise, gemv, prefill_epilogues
from xrt.bench.kernels.timing import Measurement
from xrt.bench.results import Record
from xrt.bench.setup import BenchError
from xrt.config import Device, XrtConfig
from xrt.config.bench import KernelGroup
from xrt.executor.device import resolve_dtype

ATTENTION = (KernelGroup.DECODE_ATTENTION, KernelGroup.FLASHINFER)


def check_runnable(cfg: XrtConfig) -> None:
    """One line naming the field when this machine cannot run the selected comparisons."""
    if not cfg.bench.kernels:
        raise BenchError("bench.kernels: must list at least one of " + ", ".join(g.value for g in KernelGroup))
    if cfg.parallel.tp > 1:
        raise BenchError("parallel.tp: the kernels scenario times one device's kernels at the whole model's shapes; "
                         "use parallel.tp=1")
    if cfg.device is Device.CPU or not torch.cuda.is_available():
        raise BenchError("bench.scenario: kernels times CUDA kernels and needs a CUDA device; none is available")
    if importlib.util.find_spec("triton") is None:
        raise BenchError("bench.scenario: kernels needs triton, which is not installed")
    if KernelGroup.FLASHINFER in cfg.bench.kernels and importlib.util.find_spec("flashinfer") is None:
        raise BenchError("bench.kernels: flashinfer needs flashinfer-python, which is not installed")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("triton", "flashinfer"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:  # not installed, or a broken install: the line records its absence
            out[name] = None
    return out


def measurements(cfg: XrtConfig, dtype: torch.dtype, device: torch.device) -> Iterator[Measurement]:
    groups = cfg.bench.kernels
    if KernelGroup.ELEMENTWISE in groups:
        yield from elementwise.run(cfg, dtype, device)
    if KernelGroup.GEMV in groups:
        yield from gemv.run(cfg, dtype, device)
    if any(g in groups for g in ATTENTION):
        yield from attention.run(cfg, dtype, device, groups)
    if KernelGroup.PREFILL_EPILOGUES in groups:
        yield from prefill_epilogues.run(cfg, dtype, device)


def run_kernels(cfg: XrtConfig, progress: Progress) -> list[Record]:
    check_runnable(cfg)
    device = torch.device("cuda")
    dtype = resolve_dtype(cfg, device)
    bandwidth = copy_bandwidth(device, default_copy_bytes(device))
    progress(f"[bench] {device} copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    base: Record = {
        "scenario": "kernels",
        "model": cfg.model.name,
        "dtype": str(dtype).removeprefix("torch."),
        "page_size": cfg.cache.page_size,
        "tp": 1,  # one device's kernels at the whole model's shapes (run_kernels refuses parallel.tp > 1)
        "bandwidth_gbps": bandwidth / 1e9,
        **versions(),
        **environment(device),
        "config": config_dict(cfg),
    }
    records = []
    for m in measurements(cfg, dtype, device):
        records.append({**base, **m.record()})
        progress(progress_line(records[-1]))
    return records


def progress_line(r: Record) -> str:
    where = f"{r['case']} rows {r['rows']}" + (f" context {r['context']}" if r["context"] else "")
    took = f"{r['us']:.2f} us" if r["us"] is not None else r["status"]
    return f"[bench] {r['group']} {where}: {r['impl']} {took}" + (f" ({r['note']})" if r["note"] else "")
