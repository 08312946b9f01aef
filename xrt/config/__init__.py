"""xrt's configuration: the schema (attrs classes, `xrt.config.schema`, `xrt.config.cache` and
`xrt.config.bench`) from which `xrt.reflect` derives help, JSON Schema, dumps, HF mapping and validation, and the
composer (`xrt.config.compose`: Hydra's conf/ groups and overrides -> a validated `XrtConfig`). Library code: the
CLI and the Python API (`xrt.load_config`) both call it."""

from __future__ import annotations

from xrt.config.bench import BenchArgs, BenchObjective, BenchPeer, BenchScenario, ProfileArgs
from xrt.config.cache import CacheArgs, KVTiers, L1Args, L2Args, L2Backend, L2LoadPolicy
from xrt.config.problems import Problems
from xrt.config.schema import (
    Device,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    LogLevel,
    ModelArgs,
    ParallelArgs,
    ParallelBackend,
    PrefillAttention,
    SamplingArgs,
    SchedulerArgs,
    XrtConfig,
    runtime_check,
)
from xrt.config.serve import ServeArgs

__all__ = [
    "BenchArgs", "BenchObjective", "BenchPeer", "BenchScenario", "CacheArgs", "DType", "Device", "ExecutorArgs",
    "ExecutorKind", "KVTiers", "L1Args", "L2Args", "L2Backend", "L2LoadPolicy", "LoadFormat", "LogLevel",
    "ModelArgs", "ParallelArgs", "ParallelBackend", "PrefillAttention", "Problems", "ProfileArgs", "SamplingArgs",
    "SchedulerArgs", "ServeArgs", "XrtConfig", "runtime_check",
]
