"""Helpers shared by the kvstore tests: a small chunk layout (2 layers, pages of 4 tokens, chunks of 8 = 2 pages)
and deterministic chunks; for the engine-level tests over the tiny model (tests/conftest.py `diverse_cfg`), the
tier config, greedy outputs one prompt at a time, an L2 directory's integrity check and the child process of
the multi-process tests (kv_engine_child.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import torch

import xrt
import xrt.config
from xrt.config import CacheArgs, KVTiers, L1Args, L2Args, SamplingArgs, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvcache.device import KVLayout
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.index import INDEX, LOCK, parse_data_name
from xrt.kvstore.keys import KeyNamespace, chunk_keys
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.l2_files import DIR_PREFIX, MEASUREMENTS, TEMP_SUFFIX
from xrt.models.tiny import tiny_model_args
from xrt.units import GB

LAYOUT = ChunkLayout(KVLayout(num_layers=2, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16), 8)


def chunk_of(layout: ChunkLayout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape, generator=g).to(layout.kv.dtype)


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")


def put_chunk(l1: L1Cache, k: bytes, chunk: torch.Tensor) -> bool:
    """Copy a chunk into L1 as the tiers do (reserve, write the slot, publish); False when it was there."""
    slot = l1.reserve(k)
    if slot is None:
        return False
    try:
        l1.slot_view(slot).copy_(chunk)
    except BaseException:
        l1.abort(slot)
        raise
    l1.publish(slot)
    return True


def get_chunk(l1: L1Cache, k: bytes, out: torch.Tensor) -> bool:
    """Copy a chunk out of L1 into `out` (acquire, read the slot, release); False on a miss."""
    got = l1.acquire(k)
    if got is None:
        return False
    try:
        out.copy_(l1.slot_view(got[0]))
    finally:
        l1.release(got[0])
    return True


# ---------------------------------------------------------------- engine level: the tiny model on CPU, float32

CHUNK = 16  # tokens per chunk: 4 pages of 4 tokens
SAMPLING = SamplingArgs(max_tokens=6, ignore_eos=True)
_TINY = tiny_model_args()
# the tiny model's chunk (tests/conftest.py tiny_config: float32): what cache.l1/l2 sizes are counted in
ENGINE_LAYOUT = ChunkLayout(
    KVLayout(_TINY.num_hidden_layers, 4, _TINY.num_key_value_heads, _TINY.head_dim, torch.float32), CHUNK
)


def size_gb(chunks: int) -> float:
    """A tier size that holds exactly `chunks` of the tiny model's chunks."""
    return (chunks + 0.5) * ENGINE_LAYOUT.nbytes / GB


def _exact_loads() -> dict[str, Any]:
    """L2 options that make loads a function of what the tiers hold, not of this machine's timing: where
    cache.l2 has a load policy and prefetching (the tiered manager being rewritten), `always` and no prefetch."""
    names = {a.name for a in attrs.fields(L2Args)}
    policy = getattr(xrt.config, "L2LoadPolicy", None)
    out: dict[str, Any] = {}
    if "load_policy" in names and policy is not None:
        out["load_policy"] = policy.ALWAYS
    if "prefetch" in names:
        out["prefetch"] = False
    return out


def tier_cache(
    tiers: KVTiers, path: str | Path, l1_chunks: int | None = None, l2_chunks: int | None = None
) -> CacheArgs:
    """The engine tests' cache: 256 pages of 4 tokens, chunks of CHUNK tokens, L1 of 162 chunks unless given,
    L2 under `path` (of cache.l2.size_gb unless given)."""
    l1 = L1Args(size_gb=0.002 if l1_chunks is None else size_gb(l1_chunks))
    l2 = L2Args(path=str(path), **_exact_loads())
    if l2_chunks is not None:
        l2 = attrs.evolve(l2, size_gb=size_gb(l2_chunks))
    return CacheArgs(page_size=4, num_pages=256, chunk_tokens=CHUNK, tiers=tiers, l1=l1, l2=l2)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 2000) for _ in range(n)]


def tail(rng: random.Random, j: int, n: int) -> list[int]:
    """n tokens starting with 2000 + j: tails with different j part at their first token, so prompts sharing a
    prefix share exactly its chunks."""
    return [2000 + j] + tokens(rng, n - 1)


def generate_each(llm: LLM, prompts: Iterable[list[int]], sampling: SamplingArgs = SAMPLING) -> list[list[int]]:
    """Greedy token ids of each prompt, one request at a time."""
    return [llm.generate([p], sampling, use_tqdm=False)[0].token_ids for p in prompts]


def reference(make_cfg: Callable[..., XrtConfig], prompts: Iterable[list[int]]) -> list[list[int]]:
    """What cache=gpu generates for each prompt: the outputs every tier configuration must reproduce."""
    return generate_each(LLM(make_cfg(cache=tier_cache(KVTiers.GPU, ""))), prompts)


def tiers_of(llm: LLM) -> TieredConnector:
    tiers = llm.engine.runner.connector
    assert isinstance(tiers, TieredConnector)
    return tiers


def settle(tiers: TieredConnector, close: bool = False, timeout: float = 60) -> None:
    """tiers.flush() (or close()), failing rather than hanging when the L2 writer never gets through its queue
    (it died, or is stuck)."""
    t = threading.Thread(target=tiers.close if close else tiers.flush, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"the L2 writer did not finish its queue in {timeout} s"


def break_transfers(monkeypatch: Any, l2: L2Store | None, direction: str, how: str) -> list[Any]:
    """Makes every transfer of one direction fail: "store" (the WRITE agent) or "load" (every other agent: the
    reads at admission, and ahead of it where there is a prefetch agent). NIXL reports ERR (`how="err"`) or its
    binding raises (`"raise"`). Returns the transfers attempted."""
    assert l2 is not None
    calls: list[Any] = []

    def transfer(handle: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(handle)
        if how == "raise":
            raise RuntimeError("injected NIXL failure")
        return "ERR"

    for role, agent in l2._agents.items():
        if (role == "WRITE") == (direction == "store"):
            monkeypatch.setattr(agent.agent, "transfer", transfer)
    return calls


def assert_l1_idle(l1: L1Cache) -> None:
    """No slot referenced or half written: every read, write and L2 transfer released what it took."""
    assert not l1._writing and not any(l1._refs), (l1._writing, l1._refs)


def computed_keys(sequences: Iterable[list[int]], namespace: KeyNamespace) -> set[str]:
    """Key hex of every whole chunk of these sequences' computed tokens (prompt + output but the last token,
    whose KV no step wrote): what cache=l1_l2 stores when nothing is dropped."""
    return {k.hex() for s in sequences for k in chunk_keys(s[:-1], namespace)}


def namespace_dir(root: str | Path) -> Path:
    """The one namespace directory (xrt-kv-*) under an L2 root."""
    dirs = list(Path(root).glob(f"{DIR_PREFIX}*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def temp_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(TEMP_SUFFIX))


def file_ids(d: Path) -> dict[str, tuple[int, int, int]]:
    """{name: (inode, mtime_ns, size)} of every file in d but the policy's measurements (rewritten by every
    engine's close, by design): equal only when no chunk or index file was rewritten or replaced."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in d.iterdir()
            if p.name != MEASUREMENTS}


def check_l2_dir(d: Path, nbytes: int = ENGINE_LAYOUT.nbytes) -> dict[str, int]:
    """Asserts an L2 namespace directory is consistent at rest: no temp files, nothing but the lock, the index
    and data files, the index's entries exactly the data files (key and crc32), every data file whole and its
    bytes matching the crc32 in its name. Returns {key hex: crc32}."""
    names = os.listdir(d)
    assert not temp_files(d), temp_files(d)
    files = {p[0]: p[1] for p in map(parse_data_name, names) if p is not None}
    assert set(names) - {f"{k}-{c:08x}.kv" for k, c in files.items()} <= {INDEX, LOCK, MEASUREMENTS}, names
    if INDEX in names:
        data = json.loads((d / INDEX).read_text())
        index = {k: int(v[0]) for k, v in data["entries"].items()}
    else:
        index = {}
    assert index == files, (sorted(index.items()), sorted(files.items()))
    for k, crc in files.items():
        raw = (d / f"{k}-{crc:08x}.kv").read_bytes()
        assert len(raw) == nbytes and zlib.crc32(raw) == crc, k
    return files


def load_all(l2: L2Store) -> dict[str, int | None]:
    """Loads every entry of the store's index through its agent into spare L1 slots (released again):
    {key hex: crc32 verified, or None for a failed load}."""
    with l2._index_lock:
        l2.index.refresh(force=True)
        keys = [bytes.fromhex(k) for k in l2.index.entries]
    out: dict[str, int | None] = {}
    step = l2.l1.num_slots
    for start in range(0, len(keys), step):
        batch = keys[start : start + step]
        slots = [l2.l1.reserve(b"spare" + k) for k in batch]  # other L1 keys: only L2 is read
        try:
            got = l2.load(list(zip(batch, slots, strict=True)))
            for k, crc in zip(batch, getattr(got, "crcs", got), strict=True):  # a list, or a LoadResult's
                out[k.hex()] = crc
        finally:
            for s in slots:
                l2.l1.abort(s)
    return out


# ---------------------------------------------------------------- child processes (kv_engine_child.py)

CHILD = Path(__file__).with_name("kv_engine_child.py")


def spawn_child(spec: dict[str, Any], spec_path: Path) -> subprocess.Popen[bytes]:
    """Starts kv_engine_child.py on `spec` (written to spec_path) with this xrt first on its path."""
    spec_path.write_text(json.dumps(spec))
    here = Path(__file__).parent
    path = [str(Path(xrt.__file__).resolve().parents[1]), str(here.parent), str(here)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(CHILD), str(spec_path)], env=env, stderr=subprocess.PIPE)


def child_result(proc: subprocess.Popen[bytes], spec: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """Waits for a child that must succeed and returns what it wrote to spec['out'] (killed past timeout)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the child ran past {timeout} s: {err.decode()}") from None
    assert proc.returncode == 0, err.decode()
    return json.loads(Path(spec["out"]).read_text())


def kill_left(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Kills the children still running (a test that failed before waiting for them) and reaps them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()
