"""The prefill's fused GEMM paths over two ranks (tiny shape, float32, CPU over gloo): executor.fuse_qkv_epilogue,
fuse_prefill_activation and fuse_prefill_norms at tp=2 against one unfused rank. The norms go into the
column-parallel GEMMs' ops and each residual add follows the row-parallel projection's all-reduce
(`RowParallelLinear.forward_add`); on CPU the ops are their references, so only the sharding can differ."""

from __future__ import annotations

import torch
from test_tp_parity import LENGTHS, config, prefill
from tp_helpers import tp_workers

from xrt.distributed.driver import TPRunner
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput


def test_prefill_and_decode_logits_match_one_unfused_rank(tiny_checkpoint_diverse: str) -> None:
    ref = ModelRunner(config(tiny_checkpoint_diverse, 1))
    cfg = config(tiny_checkpoint_diverse, 2)
    cfg.executor.fuse_qkv_epilogue = cfg.executor.fuse_prefill_activation = cfg.executor.fuse_prefill_norms = True
    tp = TPRunner(cfg)
    try:
        step = prefill(LENGTHS, seed=1)
        want, got = ref.execute(step), tp.execute(step)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        step = StepInput(False, [SeqChunk([t], len(c.token_ids), c.page_table)
                                 for c, t in zip(step.seqs, want.argmax(-1).tolist(), strict=True)])
        torch.testing.assert_close(tp.execute(step), ref.execute(step), rtol=1e-4, atol=1e-4)
    finally:
        tp.close()
    assert not tp_workers()
