"""results.jsonl: one JSON object per measurement. The jobs of a multirun that share an out_dir append to
the same file; the first of them starts it afresh so a rerun never mixes with stale lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Record = dict[str, Any]

RESULTS = "results.jsonl"
TABLE = "results.md"
PLOT = "plot.png"
KERNELS_PLOT = "kernels.png"


def write_records(out_dir: Path, records: list[Record], fresh: bool) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS
    with path.open("w" if fresh else "a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return path


def read_records(out_dir: Path) -> list[Record]:
    path = out_dir / RESULTS
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
