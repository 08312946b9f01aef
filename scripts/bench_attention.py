"""FlashInfer paged decode at the bench's shapes (Qwen3-0.6B: 16 q heads, 8 kv heads, head_dim 128,
bf16): time per layer call for batch x context, with and without tensor cores, per page size, with
FlashInfer's split-KV on (its planner's choice, merge kernel included) and off (`disable_split_kv`), through the
CUDA-graph wrappers the executor replays.
Usage on a GPU machine: python scripts/bench_attention.py [--batch 1 8 100] [--ctx 1024] [--page 16]"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    import flashinfer
    from triton.testing import do_bench_cudagraph

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 100])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--page", type=int, nargs="+", default=[16])
    args = ap.parse_args()
    h, kv, d, dt = 16, 8, 128, torch.bfloat16
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    print("| batch | ctx | page | tensor cores | split-KV | us/call | KV GB/s |\n|--:|--:|--:|---|---|--:|--:|")
    for b in args.batch:
        for ps in args.page:
            pages_per_seq = -(-args.ctx // ps)
            num_pages = b * pages_per_seq
            cache = torch.randn(num_pages, 2, ps, kv, d, dtype=dt, device="cuda")
            q = torch.randn(b, h, d, dtype=dt, device="cuda")
            indptr = torch.arange(b + 1, dtype=torch.int32) * pages_per_seq
            indices = torch.randperm(num_pages, dtype=torch.int32)
            last = torch.full((b,), args.ctx - (pages_per_seq - 1) * ps, dtype=torch.int32)
            dev_indptr, dev_indices, dev_last = indptr.cuda(), indices.cuda(), last.cuda()
            for tc in (False, True):
                for no_split in (False, True):
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                        ws, "NHD", use_tensor_cores=tc, use_cuda_graph=True, paged_kv_indptr_buffer=dev_indptr,
                        paged_kv_indices_buffer=dev_indices, paged_kv_last_page_len_buffer=dev_last,
                    )
                    w.plan(indptr, indices, last, h, kv, d, ps, q_data_type=dt, kv_data_type=dt,
                           disable_split_kv=no_split)
                    w.run(q, cache)
                    ms = do_bench_cudagraph(lambda w=w, q=q, c=cache: w.run(q, c))
                    gbs = b * args.ctx * kv * d * 2 * 2 / (ms * 1e-3) / 1e9
                    print(f"| {b} | {args.ctx} | {ps} | {tc} | {'off' if no_split else 'auto'} | {ms * 1e3:.1f} "
                          f"| {gbs:.0f} |", flush=True)
            del cache


if __name__ == "__main__":
    main()
