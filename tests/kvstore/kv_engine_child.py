"""One engine with cache=l1_l2 in a process of its own, for the kvstore tests that need several processes, a file
size limit or a kill (kvstore_support.spawn_child). argv[1]: a JSON spec:

  checkpoint, l2_path, prompts (token id lists), out (where the result goes), l1_chunks / l2_chunks (optional);
  obj (optional): cache.l2.backend_params for cache.l2.backend=OBJ (l2_path is then the key prefix);
  ready, go (optional): touch `ready` once the engine is built, then wait for `go` to exist;
  index_read_delay (optional): seconds every read of index.json takes longer, which widens an index update's
    read-modify-write (under its lock) so that two processes' updates overlap unless the lock keeps them apart;
  fsize (optional): {"limit": bytes, "prompts": n}: the first n prompts run under RLIMIT_FSIZE=limit (SIGXFSZ
    ignored, so writes past it fail with EFBIG), the rest without;
  stall (optional): {"after_prompts": n, "at": "transfer" | "rename", "started": path}: once the first n prompts
    are generated and flushed, the next L2 store stops for good (touching `started` first) right after its NIXL
    write ("transfer": nothing renamed yet) or right after renaming its first data file ("rename": before the
    index lists it), so the parent can kill it there.

The result, {"pid", "outputs", "stats"}, is written to `out` when every prompt is done and the writer flushed."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import attrs
from conftest import tiny_config
from kvstore_support import generate_each, tier_cache, tiers_of

from xrt.config import KVTiers, L2Backend
from xrt.engine.llm import LLM
from xrt.kvstore.index import L2Index
from xrt.kvstore.l2 import L2Store


def stall_stores(at: str, started: Path) -> None:
    def stop() -> None:
        started.touch()
        time.sleep(600)  # until killed

    if at == "transfer":
        transfer = L2Store._transfer

        def stalled_transfer(self: L2Store, op: str, slots: Any, fds: Any) -> None:
            transfer(self, op, slots, fds)
            if op == "WRITE":
                stop()

        L2Store._transfer = stalled_transfer  # type: ignore[method-assign]
    elif at == "rename":
        replace = os.replace

        def stalled_replace(src: Any, dst: Any) -> None:
            replace(src, dst)
            if str(dst).endswith(".kv"):
                stop()

        os.replace = stalled_replace  # type: ignore[assignment]
    else:
        raise ValueError(at)


def slow_index_reads(seconds: float) -> None:
    read = L2Index._read

    def slow_read(self: L2Index) -> dict[str, list[float]]:
        entries = read(self)
        time.sleep(seconds)
        return entries

    L2Index._read = slow_read  # type: ignore[method-assign]


def slow_stores(seconds: float) -> None:
    store = L2Store.store

    def slow_store(self: L2Store, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return store(self, *args, **kwargs)

    L2Store.store = slow_store  # type: ignore[method-assign]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("slow_l2_store"):
        slow_stores(spec["slow_l2_store"])
    if spec.get("index_read_delay"):
        slow_index_reads(spec["index_read_delay"])
    cache = tier_cache(KVTiers.L1_L2, spec["l2_path"], spec.get("l1_chunks"), spec.get("l2_chunks"))
    if spec.get("obj"):
        cache = attrs.evolve(cache, l2=attrs.evolve(cache.l2, backend=L2Backend.OBJ, backend_params=spec["obj"]))
    cfg = tiny_config(spec["checkpoint"], cache=cache)
    llm = LLM(cfg)
    tiers = tiers_of(llm)
    if spec.get("ready"):
        Path(spec["ready"]).touch()
        while not os.path.exists(spec["go"]):
            time.sleep(0.001)
    prompts = spec["prompts"]
    fsize, stall = spec.get("fsize"), spec.get("stall")
    split = fsize["prompts"] if fsize else stall["after_prompts"] if stall else len(prompts)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    if fsize:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize["limit"], limits[1]))
    outputs = generate_each(llm, prompts[:split])
    if spec.get("exit_unflushed"):
        Path(spec["out"]).write_text(json.dumps({"pid": os.getpid(), "outputs": outputs, "stats": {}}))
        return
    tiers.flush()
    if fsize:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    if stall:
        stall_stores(stall["at"], Path(stall["started"]))
    outputs += generate_each(llm, prompts[split:])
    tiers.close()
    result = {"pid": os.getpid(), "outputs": outputs, "stats": dataclasses.asdict(tiers.stats)}
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
