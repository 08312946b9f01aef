"""xLLM's published H100 table (PR 1891) for the comparison columns: Qwen3-0.6B, input 1024,
output 256, times in ms. Read from bench/xllm_pr1891_h100.csv in the source tree."""

from __future__ import annotations

import csv
from pathlib import Path

XLLM_CSV = Path(__file__).resolve().parents[2] / "bench" / "xllm_pr1891_h100.csv"
XLLM_INPUT_LEN, XLLM_OUTPUT_LEN = 1024, 256


def load_xllm(path: Path = XLLM_CSV) -> dict[int, dict[str, float]]:
    """batch -> {column: ms}; empty when the file is absent (an installed wheel has no bench/)."""
    if not path.is_file():
        return {}
    rows = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    out: dict[int, dict[str, float]] = {}
    for row in csv.DictReader(rows):
        batch = int(row.pop("batch"))
        out[batch] = {k: float(v) for k, v in row.items() if k not in ("bucket", "padded")}
        out[batch]["bucket"] = float(row["bucket"])
    return out
