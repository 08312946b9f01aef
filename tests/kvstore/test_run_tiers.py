"""`xrt run cache=l1_l2`: a run leaves its chunks in L2 and the next process on the directory finds them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # 97 tokens: 6 chunks of 16


def run(tmp_path: Path, checkpoint: str, *args: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "xrt", "run", "cache=l1_l2", f"cache.l2.path={tmp_path}", "cache.chunk_tokens=16",
         f"model.path={checkpoint}", f"prompt={PROMPT}", "sampling.max_tokens=4", *args],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_second_run_loads_from_l2(tmp_path: Path, tiny_checkpoint: str) -> None:
    first = run(tmp_path, tiny_checkpoint)
    assert "kv tiers: prefix tokens cached gpu 0, l1 0, l2 0, computed 97 (1 lookups)" in first[-2]
    assert "kv tiers: chunks stored l1 6, l2 6," in first[-1] and "store errors 0" in first[-1]
    assert len(list(tmp_path.glob("xrt-kv-*/*.kv"))) == 6
    # the run closed its engine: the load policy's measurements are there for the next process
    (measured,) = tmp_path.glob("xrt-kv-*/measurements.json")
    assert "prefill_rate" in measured.read_text()
    # load_policy=always: what L2 holds is loaded (with the first run's measurements the policy may rightly find
    # recomputing 97 tokens of the tiny model faster than reading them)
    second = run(tmp_path, tiny_checkpoint, "cache.l2.load_policy=always")
    # the request's chunks come from L2 through the prefetch started when it was queued (cache.l2.prefetch) or,
    # for those the prefetch had not reached at its admission, read then: 6 chunks either way
    assert "cached gpu 0, l1 0, l2 96, computed 1 (1 lookups) | loaded l1 0.0 MB, l2 " in second[-2]
    prefetched = int(second[-1].split("prefetched ")[1].split(" chunks")[0])
    read_mb = float(second[-2].split("loaded l1 ")[1].split(", l2 ")[1].split(" MB")[0])
    assert prefetched == 6 or read_mb > 0
    assert "checksum failures 0" in second[-1] and "chunks stored l1 0, l2 0" in second[-1]
    assert second[0] == first[0]  # the same generation
