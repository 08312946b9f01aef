"""Session probe: where the first L1 hit of an engine spends its time (8B, cudagraph, 8k)."""
import random, sys
import torch
from torch.profiler import profile, ProfilerActivity
from xrt import load_config
from xrt.engine.engine import LLMEngine
from xrt.bench.tiers import run_requests, ttft_ms
n = 8192
cfg = load_config(["model=qwen3-8b", "model.load_format=dummy", f"model.max_model_len={n+64}",
    f"scheduler.max_batched_tokens={n+64}", "cache.num_pages=8192", "cache=l1", "cache.l1.size_gb=6", "executor=cudagraph"])
eng = LLMEngine(cfg)
rng = random.Random(0)
P = lambda: [rng.randrange(cfg.model.vocab_size) for _ in range(n + 1)]
run_requests(eng, [P()], 4); eng.tiers.flush()
p = P()
(o,) = run_requests(eng, [p], 4); print("cold", ttft_ms(o)); eng.tiers.flush()
(o,) = run_requests(eng, [p], 4); print("gpu", ttft_ms(o)); eng.tiers.evict()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    (o,) = run_requests(eng, [p], 1)
    torch.cuda.synchronize()
print("first l1", ttft_ms(o), o.cached_tokens)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)[:5000])
for i in range(3):
    p = P(); run_requests(eng, [p], 2); eng.tiers.flush(); run_requests(eng, [p], 2); eng.tiers.evict()
    (o,) = run_requests(eng, [p], 2); print("l1 again", ttft_ms(o), o.cached_tokens)
