"""End to end on the GPU: the tiny checkpoint in float32 generates the CPU path's greedy tokens;
the Qwen3-0.6B shape in bf16 (HF's random weights loaded into ours) tracks HF transformers bf16
(logits close, greedy tokens identical step by step under teacher forcing); KV-cache sizing from
cache.max_memory_utilization (the only GPU test that sizes the cache by profiling a prefill: every other one
sets cache.num_pages).

The smoke subset keeps the tiny checkpoint (fp32: torch reference attention, no FlashInfer) and the cudagraph
refusal; the 0.6B tests (one HF model shared by both executors, ~1.2 GB of weights) are `slow`."""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
import pytest
import torch

from xrt.config import (
    CacheArgs,
    Device,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    ModelArgs,
    SamplingArgs,
    XrtConfig,
)
from xrt.executor.step import SeqChunk, StepInput

QWEN3_06B = dict(
    name="qwen3-0.6b", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
    max_position_embeddings=40960, tie_word_embeddings=True,
)
STEPS = 16
LOGITS_REL_TOL = 5e-2  # bf16 through 28 layers, two different kernel stacks


def test_tiny_fp32_on_gpu_matches_cpu_greedy(device: torch.device, tiny_cfg: Callable[..., XrtConfig]) -> None:
    from xrt.engine.llm import LLM

    rng = random.Random(0)
    prompts = [[rng.randrange(2048) for _ in range(n)] for n in (1, 9, 33, 70)]
    sampling = SamplingArgs(max_tokens=24, ignore_eos=True)
    cpu = LLM(tiny_cfg())
    gpu_cfg = tiny_cfg(cache=CacheArgs(num_pages=512))
    gpu_cfg.device = Device.CUDA
    gpu = LLM(gpu_cfg)
    assert gpu.engine.runner.device.type == "cuda" and gpu.engine.runner.dtype == torch.float32
    want = [o.token_ids for o in cpu.generate(prompts, sampling, use_tqdm=False)]
    got = [o.token_ids for o in gpu.generate(prompts, sampling, use_tqdm=False)]
    assert got == want


@pytest.fixture(scope="module")
def hf_qwen3() -> torch.nn.Module:
    """HF transformers' Qwen3ForCausalLM at the 0.6B shape, random weights (seed 0), bf16, on the GPU: built
    once for both executors."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    transformers = pytest.importorskip("transformers")
    s = QWEN3_06B
    config = transformers.Qwen3Config(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], head_dim=s["head_dim"], rope_theta=s["rope_theta"],
        rms_norm_eps=s["rms_norm_eps"], max_position_embeddings=s["max_position_embeddings"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def our_greedy(runner: object, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decoding through runner.execute: one prefill step for all prompts, then decode steps.
    Returns the tokens and the float32 logits of every step ([num_prompts, vocab] each)."""
    page_size = runner.page_size  # type: ignore[attr-defined]
    max_len = max(len(p) for p in prompts) + steps
    pages_each = -(-max_len // page_size)
    tables = [list(range(i * pages_each, (i + 1) * pages_each)) for i in range(len(prompts))]
    seqs = [SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    logits = runner.execute(StepInput(True, seqs)).clone()  # type: ignore[attr-defined]
    out, all_logits = [[int(t)] for t in logits.argmax(-1).tolist()], [logits]
    for _ in range(steps - 1):
        seqs = [SeqChunk([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, out, tables, strict=True)]
        logits = runner.execute(StepInput(False, seqs)).clone()  # type: ignore[attr-defined]
        all_logits.append(logits)
        for o, t in zip(out, logits.argmax(-1).tolist(), strict=True):
            o.append(int(t))
    return out, all_logits


@pytest.mark.slow
@pytest.mark.parametrize("kind", [ExecutorKind.EAGER, ExecutorKind.CUDAGRAPH])
def test_qwen3_06b_bf16_matches_hf(device: torch.device, kind: ExecutorKind, hf_qwen3: torch.nn.Module) -> None:
    pytest.importorskip("flashinfer")
    from xrt.executor.factory import build_runner

    hf = hf_qwen3
    cfg = XrtConfig(
        model=ModelArgs(**QWEN3_06B, load_format=LoadFormat.DUMMY, dtype=DType.BFLOAT16, max_model_len=512),
        executor=ExecutorArgs(kind=kind, max_batch=8),
        cache=CacheArgs(num_pages=64),
    )
    runner = build_runner(cfg)
    assert type(runner.backend).__name__ == "FlashInferBackend"
    runner.model.load_weights(hf.state_dict().items())

    rng = random.Random(1)
    prompts = [[rng.randrange(151936) for _ in range(n)] for n in (37, 64, 5)]
    ours, our_logits = our_greedy(runner, prompts, STEPS)
    near_ties = 0
    for i, (prompt, toks) in enumerate(zip(prompts, ours, strict=True)):
        with torch.no_grad():
            ids = torch.tensor([prompt + toks[:-1]], device=device)
            ref = hf(ids).logits[0, len(prompt) - 1 :].float()  # [STEPS, vocab], teacher-forced on our tokens
        mine = torch.stack([step[i] for step in our_logits])
        rel = ((mine - ref).abs().max() / ref.abs().max()).item()
        print(f"prompt {i} ({len(prompt)} tokens, {kind.value}): logits max rel error {rel:.3e} over {STEPS} steps")
        assert rel < LOGITS_REL_TOL, f"prompt {i}: logits relative error {rel:.3e}"
        top2 = ref.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        hf_argmax = ref.argmax(-1).tolist()
        for step, (a, b) in enumerate(zip(toks, hf_argmax, strict=True)):
            if a == b:
                continue
            # Only a genuine near-tie (HF's own top two within bf16 noise) may go either way.
            noise = 2 * rel * ref[step].abs().max().item()
            assert margin[step].item() < noise, (
                f"prompt {i} step {step}: ours {a}, HF {b} with margin {margin[step].item():.3e} (noise {noise:.3e})"
            )
            near_ties += 1
    print(f"greedy tokens: {sum(len(t) for t in ours) - near_ties}/{sum(len(t) for t in ours)} identical to HF "
          f"({near_ties} near-ties)")


@pytest.mark.slow
def test_kv_cache_sized_from_memory_utilization(device: torch.device) -> None:
    pytest.importorskip("flashinfer")
    from xrt.executor.runner import ModelRunner

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    model = ModelArgs(**QWEN3_06B, load_format=LoadFormat.DUMMY, dtype=DType.BFLOAT16, max_model_len=2048)
    weights = 0.6e9 * 2 * 1.3  # 0.6B bf16 parameters, generously
    util = min(0.95, (used + weights + 4 * 2**30) / total)
    cfg = XrtConfig(model=model, cache=CacheArgs(max_memory_utilization=util))
    runner = ModelRunner(cfg)
    kv_bytes = runner.kv_cache.tensor.numel() * runner.kv_cache.tensor.element_size()
    assert runner.num_pages > 0
    assert kv_bytes <= util * total - used, "KV cache larger than the budget left after what was already in use"
    assert torch.cuda.memory_allocated(device) <= util * total
    del runner

    too_small = XrtConfig(model=model, cache=CacheArgs(max_memory_utilization=max(used / total / 2, 1e-3)))
    with pytest.raises(ValueError, match=r"^cache.max_memory_utilization: .* leaves no room for the KV cache"):
        ModelRunner(too_small)
    torch.cuda.empty_cache()


def test_fp32_cudagraph_is_refused_with_a_reason(device: torch.device, tiny_cfg: Callable[..., XrtConfig]) -> None:
    from xrt.executor.runner import ModelRunner

    cfg = tiny_cfg(cache=CacheArgs(num_pages=64))
    cfg = attrs.evolve(cfg, device=Device.CUDA, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    with pytest.raises(ValueError, match=r"^executor.kind: cudagraph needs FlashInfer attention \(.*\)"):
        ModelRunner(cfg)
