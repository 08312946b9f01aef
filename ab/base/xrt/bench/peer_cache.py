"""The peer's figures shared by the jobs of a sweep, which may run in other processes (joblib, submitit) or on
other machines with the sweep directory mounted: one JSON line per (shape, batch) in <sweep dir>/peer.jsonl,
read and extended under a file lock, so the peer is measured once per shape and batch however the jobs run."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xrt.bench.peer_figures import PEER_SHAPE, earlier_peer_figures
from xrt.bench.results import Record

PEER_CACHE = "peer.jsonl"


class PeerCache:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a job looks its figures up and measures those missing: a second job waits, then finds them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def lookup(self, like: Record) -> dict[int, Any]:
        """{batch: figures} measured by an earlier job for `like`'s shape (`earlier_peer_figures`)."""
        if not self.path.is_file():
            return {}
        lines = [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]
        return earlier_peer_figures(lines, like)

    def add(self, like: Record, figures: dict[int, Any]) -> None:
        """Lines in the form `earlier_peer_figures` reads: the shape's keys, the batch and the peer_* figures."""
        shape = {k: like[k] for k in ("scenario", *PEER_SHAPE)}
        model = (like.get("config") or {}).get("model", {})
        with self.path.open("a") as f:
            for batch, p in figures.items():
                line = {**shape, "config": {"model": model}, "batch": batch, "peer_ttft_ms": p["ttft_ms"],
                        "peer_tpot_ms": p["tpot_ms"], "peer_ttft_ms_all": p["ttft_ms_all"],
                        "peer_tpot_ms_all": p["tpot_ms_all"], "peer_weights": p["weights"]}
                f.write(json.dumps(line, sort_keys=True) + "\n")


__all__ = ["PEER_CACHE", "PeerCache"]
