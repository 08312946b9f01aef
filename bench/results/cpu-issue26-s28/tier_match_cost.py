"""Session 28: what `Scheduler.schedule_overlapped`'s fit check cost under a full KV cache before and after it matched
the GPU prefix cache only (`KVCacheManager.gpu_match`) instead of making a full lookup (`lookup`: that match, then
the KV tiers' match, which keys the prompt's chunks). The check is made at every overlapped decode step while a
waiting prompt does not fit the free pages without its prefix. Tiny model on CPU, `cache=l1` (chunks of 256 tokens,
page size 16), a prompt generated once so that its whole prefix is in L1, then either left in the GPU prefix cache
("GPU hit": the tiers' match returns at once) or evicted from it ("L1 only": the tiers key the prompt's chunks, as for
a waiting prompt whose pages a full cache has handed out again); median of 200 calls each.
`python bench/results/cpu-issue26-s28/tier_match_cost.py` from the repository root."""
import platform
import random
import statistics
import sys
import time

import attrs

sys.path.insert(0, "tests")
from conftest import tiny_config  # noqa: E402

from xrt.config import CacheArgs, KVTiers, L1Args, SamplingArgs  # noqa: E402
from xrt.engine.llm import LLM  # noqa: E402


def median_us(fn) -> float:
    times = []
    for _ in range(200):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
print("| prompt tokens | where its prefix is | GPU match us | full lookup us (GPU + tiers) |")
print("|--:|---|--:|--:|")
for n in (1024, 8192):
    cfg = tiny_config(cache=CacheArgs(page_size=16, num_pages=n // 16 + 64, chunk_tokens=256, tiers=KVTiers.L1,
                                      l1=L1Args(size_gb=1.0)))
    cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, max_model_len=n + 64, max_position_embeddings=n + 64))
    llm = LLM(cfg)
    ids = [random.Random(n).randrange(3, 2000) for _ in range(n)]
    llm.generate([ids], SamplingArgs(max_tokens=2, temperature=0.0), use_tqdm=False)
    kv = llm.engine.scheduler.kv
    assert kv.gpu_match(ids).num_tokens >= n - 16, "the prompt is not in the GPU prefix cache"
    for where in ("GPU hit", "L1 only"):
        if where == "L1 only":
            kv.pool.evict()
            assert kv.gpu_match(ids).num_tokens == 0 and kv.lookup(ids).num_tokens >= n - 256
        print(f"| {n} | {where} | {median_us(lambda kv=kv, ids=ids: kv.gpu_match(ids)):.0f} | "
              f"{median_us(lambda kv=kv, ids=ids: kv.lookup(ids)):.0f} |")
    llm.close() if hasattr(llm, "close") else None
