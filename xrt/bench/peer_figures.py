"""The peer's figures per batch: measured with HfPeer, or taken from an earlier job of the same sweep
(`xrt.bench.peer_cache`)."""

from __future__ import annotations

from typing import Any

import torch

from xrt.bench.clock import StepClock
from xrt.bench.engine_timing import Progress, summarize
from xrt.bench.peer_hf import HfPeer
from xrt.bench.results import Record
from xrt.bench.workload import WARMUP_REP, batch_prompts
from xrt.config import BenchPeer, XrtConfig

# Warm-up of the peer only needs its kernels and allocator warm, not a full-length decode.
PEER_WARMUP_TOKENS = 8
# A result line's keys that fix the peer's figures (with the model section): not our executor or scheduler.
PEER_SHAPE = ("model", "input_len", "output_len", "dtype", "device_name", "warmup", "iters", "peer")


def _peer_model(config: dict[str, Any]) -> dict[str, Any]:
    """What the peer is built from: the model section, less what only our engine uses."""
    return {k: v for k, v in config.get("model", {}).items() if k != "max_model_len"}


def earlier_peer_figures(records: list[Record], like: Record) -> dict[int, Any]:
    """Peer figures measured by an earlier job of the same sweep for the same shape, device and dtype:
    the peer does not depend on our executor, so a sweep measures it once per batch."""
    same = PEER_SHAPE
    out: dict[int, Any] = {}
    for r in records:
        same_model = _peer_model(r.get("config") or {}) == _peer_model(like["config"])
        if r.get("scenario") == "latency" and r.get("peer_ttft_ms") is not None and same_model and all(
            r.get(k) == like[k] for k in same
        ):
            out[r["batch"]] = {
                "ttft_ms": r["peer_ttft_ms"], "tpot_ms": r["peer_tpot_ms"], "ttft_ms_all": r["peer_ttft_ms_all"],
                "tpot_ms_all": r["peer_tpot_ms_all"], "weights": r["peer_weights"],
            }
    return out


def peer_figures(
    cfg: XrtConfig, kind: BenchPeer, device: torch.device, dtype: torch.dtype, batches: list[int], progress: Progress
) -> dict[int, Any]:
    """kind: hf or compile (one of bench.peer's kinds)."""
    b = cfg.bench
    peer = HfPeer(cfg, device, dtype, compiled=kind is BenchPeer.COMPILE)
    clock = StepClock(device)
    out: dict[int, Any] = {}
    try:
        for batch in batches:
            for w in range(b.warmup):
                peer.time_batch(clock, batch_prompts(cfg, batch, WARMUP_REP + w), min(b.output_len, PEER_WARMUP_TOKENS))
            runs = [peer.time_batch(clock, batch_prompts(cfg, batch, i), b.output_len) for i in range(b.iters)]
            out[batch] = {**summarize(runs), "weights": peer.weights}
            progress(f"[bench] {kind.value} batch {batch}: TTFT {out[batch]['ttft_ms']:.3f} ms, "
                     f"TPOT {out[batch]['tpot_ms'] or float('nan'):.3f} ms")
    except torch.OutOfMemoryError as e:
        progress(f"[bench] {kind.value} peer ran out of memory at batch {batch}: {str(e).splitlines()[0]}")
    finally:
        peer.close()
    return out
