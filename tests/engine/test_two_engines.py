"""Two engines in one process keep their own layer options and tensor-parallel state: what a runner's model
is built with (`LayerOptions`, `TPState`) stays with that model, whatever is built or run after it. (These were
module globals once: the last runner built set them for every model in the process.)"""

from __future__ import annotations

from collections.abc import Callable

import torch
from op_log import XrtOpLog

from xrt.config import ExecutorArgs, SamplingArgs, XrtConfig
from xrt.engine.llm import LLM
from xrt.layers.linear import _Linear
from xrt.layers.norm import RMSNorm
from xrt.layers.options import LayerOptions
from xrt.models.qwen3 import Qwen3ForCausalLM
from xrt.models.tiny import tiny_model_args
from xrt.ops.parallel_state import SINGLE, TPState

PROMPTS = [[5, 9, 300, 41, 7], [12, 1000, 3]]
SAMPLING = SamplingArgs(max_tokens=6)
# Where each op that can take part in PDL has its rows and its `pdl` argument.
PDL_ARG = {"fused_add_rms_norm": 4, "rms_norm": 3, "silu_and_mul": 1, "qk_norm_rope_store_kv": 11}


def layer_values(llm: LLM) -> set[tuple[str, int, int, int, int]]:
    """(kind, skinny_rows, pdl_max_rows, tp_rank, tp_size) over the model's linear layers, and the norms'."""
    model = llm.engine.runner.model
    out = {("linear", m.skinny_rows, m.pdl_max_rows, m.tp_rank, m.tp_size) for m in model.modules()
           if isinstance(m, _Linear)}
    head = model.lm_head
    out.add(("lm_head", head.skinny_rows, head.pdl_max_rows, head.tp_rank, head.tp_size))
    return out | {("norm", -1, m.pdl_max_rows, -1, -1) for m in model.modules() if isinstance(m, RMSNorm)}


def generate_logged(llm: LLM) -> tuple[list[list[int]], list[tuple[int, bool]]]:
    """Greedy tokens, and (rows, pdl) of every launch that could use PDL, as the layers asked for it."""
    log = XrtOpLog()
    with log:
        outs = llm.generate(PROMPTS, SAMPLING)
    asks = [(args[0].shape[0], args[PDL_ARG[name]]) for name, args in zip(log.calls, log.args, strict=True)
            if name in PDL_ARG]
    return [o.token_ids for o in outs], asks


def test_two_engines_keep_their_own_options_and_tp_state(tiny_cfg: Callable[..., XrtConfig]) -> None:
    first = LLM(tiny_cfg())  # the defaults: skinny_gemm_max_rows 8, pdl_max_rows 16, one rank
    first_values = layer_values(first)
    assert first_values == {("linear", 8, 16, 0, 1), ("lm_head", 8, 16, 0, 1), ("norm", -1, 16, -1, -1)}
    second = LLM(tiny_cfg(executor=ExecutorArgs(skinny_gemm_max_rows=2, pdl_max_rows=1)))
    second_values = layer_values(second)
    assert second_values == {("linear", 2, 1, 0, 1), ("lm_head", 2, 1, 0, 1), ("norm", -1, 1, -1, -1)}
    assert layer_values(first) == first_values  # building the second changed nothing of the first's
    assert first.engine.runner.tp_state is SINGLE and second.engine.runner.tp_state is SINGLE

    # A third model, rank 1 of 2 (only built: its collectives would need the other rank), changes neither.
    sharded = Qwen3ForCausalLM(tiny_model_args(), torch.float32, "cpu", tp=TPState(1, 2))
    assert {(m.tp_rank, m.tp_size) for m in sharded.modules() if isinstance(m, _Linear)} == {(1, 2)}
    assert layer_values(first) == first_values and layer_values(second) == second_values

    # Generating alternately, each engine's layers ask for PDL by their own pdl_max_rows.
    runs = [generate_logged(llm) for llm in (first, second, first, second)]
    for (tokens, asks), max_rows in zip(runs, (16, 1, 16, 1), strict=True):
        assert asks and all(pdl == (rows <= max_rows) for rows, pdl in asks), (max_rows, asks)
        assert tokens == runs[0][0]  # the options route kernels on CUDA only: the same greedy tokens here
    assert any(pdl for _, pdl in runs[0][1]) and not any(pdl for _, pdl in runs[1][1])
    assert layer_values(first) == first_values and layer_values(second) == second_values
    assert first.engine.runner.options == LayerOptions(8, 16)
    assert second.engine.runner.options == LayerOptions(2, 1)
    for llm in (first, second):
        llm.close()
