"""Latency scenario: per batch, TTFT and TPOT of the engine (medians over timed repetitions after
warm-up), the HF peer with the same protocol, and the bandwidth floor."""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from xrt.bench.clock import StepClock
from xrt.bench.engine_timing import Engine, Progress, summarize, time_batch
from xrt.bench.environment import adjusted, config_dict, environment
from xrt.bench.floor import copy_bandwidth, decode_kv_bytes, decode_weight_bytes, default_copy_bytes
from xrt.bench.peer_cache import PeerCache
from xrt.bench.peer_figures import peer_figures
from xrt.bench.results import Record
from xrt.bench.setup import bench_config, decode_bucket
from xrt.bench.workload import WARMUP_REP, batch_prompts
from xrt.config import BenchPeer, XrtConfig
from xrt.executor.device import resolve_device, resolve_dtype


def kv_pages(engine: Engine) -> tuple[int, int] | None:
    """(num_pages, page_size) of the engine's KV cache, when the engine exposes its runner."""
    for holder in (engine, getattr(engine, "runner", None), getattr(engine, "model_runner", None)):
        if holder is not None and hasattr(holder, "num_pages") and hasattr(holder, "page_size"):
            return int(holder.num_pages), int(holder.page_size)
    return None


def pages_needed(batch: int, tokens: int, page_size: int) -> int:
    return batch * -(-tokens // page_size)


def build_engine(cfg: XrtConfig) -> Engine:
    from xrt.engine.engine import LLMEngine

    return LLMEngine(cfg)


def close_engine(engine: Engine) -> None:
    """Close the engine (its tiers' threads and L2 queue, its worker processes); the caller then drops its
    reference and frees the memory (free_memory) before the next engine is built."""
    close = getattr(engine, "close", None)  # a stand-in engine of the tests may have none
    if close is not None:
        close()


def free_memory(device: torch.device) -> None:
    """After dropping the engine: free its KV cache and graphs before the next job of a sweep sizes its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_latency(
    cfg: XrtConfig,
    progress: Progress,
    peers: PeerCache | None = None,
    engine_factory: Callable[[XrtConfig], Engine] = build_engine,
) -> list[Record]:
    """peers: the peer figures of this sweep's jobs; those of this shape are reused, the missing ones added."""
    given = config_dict(cfg)
    cfg = bench_config(cfg)
    b = cfg.bench
    device = resolve_device(cfg)
    dtype = resolve_dtype(cfg, device)
    bandwidth = copy_bandwidth(device, default_copy_bytes(device))
    progress(f"[bench] {device} copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    elem = dtype.itemsize
    tp = cfg.parallel.tp
    weight_bytes = decode_weight_bytes(cfg.model, elem)
    base: dict[str, Any] = {
        "scenario": "latency",
        "executor": cfg.executor.kind.value,
        "model": cfg.model.name,
        "dtype": str(dtype).removeprefix("torch."),
        "input_len": b.input_len,
        "output_len": b.output_len,
        "warmup": b.warmup,
        "iters": b.iters,
        "tp": tp,
        "peer": b.peer.value,
        "bandwidth_gbps": bandwidth / 1e9,
        "weight_bytes": weight_bytes,
        **environment(device),
        "config": given,
        "adjusted": adjusted(given, config_dict(cfg)),
    }
    # Each peer kind's figures by batch (bench.peer=both: hf's and compile's), under its own name in the records.
    peer_of: dict[str, dict[int, Any]] = {}
    for kind in b.peer.kinds:
        like = {**base, "peer": kind.value}
        with peers.locked() if peers else nullcontext():
            figures = peers.lookup(like) if peers else {}
            todo = [x for x in b.batch if x not in figures]
            if todo:
                # The peer runs first and is freed, so the engine sizes its KV cache from the whole device.
                measured = peer_figures(cfg, kind, device, dtype, todo, progress)
                figures.update(measured)
                if peers:
                    peers.add(like, measured)
        peer_of[kind.value] = figures

    engine = engine_factory(cfg)
    capacity = kv_pages(engine)
    clock = StepClock(device)
    records: list[Record] = []
    for batch in b.batch:
        rec: Record = {**base, "batch": batch, "bucket": decode_bucket(cfg.executor, batch),
                       "status": "ok", "reason": None}
        if capacity is not None:
            num_pages, page_size = capacity
            need = pages_needed(batch, b.input_len + b.output_len, page_size)
            if need > num_pages:
                rec.update(status="skipped", reason=f"needs {need} KV pages, the cache has {num_pages}")
                records.extend(_per_peer(rec, peer_of))
                progress(f"[bench] {rec['executor']} batch {batch}: skipped ({rec['reason']})")
                continue
        for w in range(b.warmup):
            time_batch(engine, clock, batch_prompts(cfg, batch, WARMUP_REP + w), b.output_len)
        runs = [time_batch(engine, clock, batch_prompts(cfg, batch, i), b.output_len) for i in range(b.iters)]
        rec.update(summarize(runs))
        kv_bytes = decode_kv_bytes(cfg.model, batch, b.input_len + b.output_len / 2, elem)
        floor_ms = (weight_bytes + kv_bytes) / (tp * bandwidth) * 1e3
        rec.update(kv_bytes=kv_bytes, floor_ms=floor_ms,
                   floor_pct=100 * floor_ms / rec["tpot_ms"] if rec["tpot_ms"] else None)
        for r in _per_peer(rec, peer_of):
            records.append(r)
            progress(_progress_line(r))
    close_engine(engine)
    del engine
    free_memory(device)
    return records


def _per_peer(rec: Record, peer_of: dict[str, dict[int, Any]]) -> list[Record]:
    """The batch's record once per peer kind, each with that peer's figures (those it has for the batch) and its
    name in "peer"; the record as it is without a peer."""
    if not peer_of:
        return [rec]
    out = []
    for kind, figures in peer_of.items():
        r = {**rec, "peer": kind}
        p = figures.get(rec["batch"])
        if p and rec["status"] == "ok":
            r.update(peer_ttft_ms=p["ttft_ms"], peer_tpot_ms=p["tpot_ms"], peer_weights=p["weights"],
                     peer_ttft_ms_all=p["ttft_ms_all"], peer_tpot_ms_all=p["tpot_ms_all"],
                     peer_ttft_ratio=p["ttft_ms"] / rec["ttft_ms"],
                     peer_tpot_ratio=p["tpot_ms"] / rec["tpot_ms"] if p["tpot_ms"] and rec["tpot_ms"] else None)
        out.append(r)
    return out


def _progress_line(r: Record) -> str:
    line = f"[bench] {r['executor']} batch {r['batch']}: TTFT {r['ttft_ms']:.3f} ms"
    if r["tpot_ms"] is not None:
        line += f", TPOT {r['tpot_ms']:.3f} ms ({r['floor_pct']:.0f}% of floor {r['floor_ms']:.3f} ms)"
    if r.get("peer_tpot_ratio"):
        peer = "HF compiled" if r["peer"] == BenchPeer.COMPILE.value else "HF"
        line += f", {peer}/ours TTFT {r['peer_ttft_ratio']:.2f}x TPOT {r['peer_tpot_ratio']:.2f}x"
    return line
