"""Linear layers, sharded for tensor parallelism (one rank by default): column-parallel splits
the output features, row-parallel the input features (then all-reduces). QKV and gate/up are
fused column-parallel layers loaded shard by shard from the checkpoint's separate tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xrt.layers.weights import check_shape, divide, new_param
from xrt.ops.gemm_routing import uses_skinny_gemm
from xrt.ops.parallel_state import tp_rank, tp_size

# The layers' switches, from cfg.executor through `xrt.executor.options.apply_options` (module attributes: read on
# every call, as cheap as the constants they were). Why these defaults: ExecutorArgs' field help.
# executor.skinny_gemm_max_rows: CUDA batches up to this many rows go through xrt::linear, whose implementation
# picks the skinny-GEMM kernel where it measured faster than cuBLAS (bench/results/h200-microbench/gemv.md).
SKINNY_ROWS = 8
# executor.fuse_prologues: where a layer runs the skinny GEMM, the norm or activation producing its input runs
# inside it (the fused prologue ops), one kernel launch fewer each.
FUSE_PROLOGUES = False


def set_options(skinny_rows: int, fuse_prologues: bool) -> None:
    global SKINNY_ROWS, FUSE_PROLOGUES
    SKINNY_ROWS, FUSE_PROLOGUES = skinny_rows, fuse_prologues


class _Linear(nn.Module):
    """y = x @ weight.t() through a cached transposed view: F.linear on a 2-D input runs aten::linear,
    matmul, t, transpose and as_strided before the same mm, about 5 us of host time per call."""

    weight: nn.Parameter
    _weight_t: torch.Tensor | None = None
    # The dimension of weight [output, input] split across tensor-parallel ranks: 0 output (column-parallel),
    # 1 input (row-parallel).
    split_dim: int

    def __init__(self, input_size: int, output_size: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        shape, what = [output_size, input_size], ("output size", "input size")[self.split_dim]
        shape[self.split_dim] = divide(shape[self.split_dim], self.tp_size, what)
        self.weight = new_param(tuple(shape), dtype, device)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's slice of the checkpoint's full [output, input] tensor."""
        check_shape(loaded, (self.output_size, self.input_size))
        n = param.shape[self.split_dim]
        param.data.copy_(loaded.narrow(self.split_dim, self.tp_rank * n, n))

    def fuses_prologue(self, x: torch.Tensor) -> bool:
        """Whether the elementwise op computing this layer's input from x (as many rows) runs fused into the
        matmul: exactly where `matmul` would run the skinny-GEMM kernel (CUDA decode batches, 16-bit, shapes
        where it beat cuBLAS). The one place that decides fused against unfused."""
        return FUSE_PROLOGUES and x.dim() == 2 and x.shape[0] <= SKINNY_ROWS and uses_skinny_gemm(x, self.weight)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return F.linear(x, self.weight)
        if x.is_cuda and x.shape[0] <= SKINNY_ROWS:
            return torch.ops.xrt.linear(x, self.weight)
        wt = self._weight_t
        # Re-made if the parameter's storage was replaced (the view would still read the old one).
        if wt is None or wt.data_ptr() != self.weight.data_ptr():
            wt = self._weight_t = self.weight.t()
        return torch.mm(x, wt)


class ColumnParallelLinear(_Linear):
    split_dim = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs side by side (gate and up): checkpoint shard i fills
    rows [sum(sizes[:i]), sum(sizes[:i+1])) / tp of this rank's weight."""

    def __init__(
        self, input_size: int, output_sizes: list[int], dtype: torch.dtype, device: torch.device | str
    ) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), dtype, device)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        full = self.output_sizes[shard_id]
        check_shape(loaded, (full, self.input_size))
        n = divide(full, self.tp_size, "merged output size")
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, n).copy_(loaded.narrow(0, self.tp_rank * n, n))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; output rows [q heads | k heads | v heads] of this rank.
    With more ranks than KV heads, each KV head is replicated on tp / num_kv_heads ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        tp = tp_size()
        self.head_dim = head_dim
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp, "num_attention_heads")
        if tp >= total_num_kv_heads:
            self.num_kv_heads = 1
            divide(tp, total_num_kv_heads, "num_key_value_heads (as divisor)")
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "num_key_value_heads")
        super().__init__(hidden_size, (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp, dtype, device)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        d = self.head_dim
        if shard_id == "q":
            check_shape(loaded, (self.total_num_heads * d, self.input_size))
            rows, src_start, dst_start = self.num_heads * d, self.tp_rank * self.num_heads * d, 0
        else:
            check_shape(loaded, (self.total_num_kv_heads * d, self.input_size))
            replicas = max(1, self.tp_size // self.total_num_kv_heads)
            rows = self.num_kv_heads * d
            src_start = (self.tp_rank // replicas) * rows
            dst_start = self.num_heads * d + (rows if shard_id == "v" else 0)
        param.data.narrow(0, dst_start, rows).copy_(loaded.narrow(0, src_start, rows))


class RowParallelLinear(_Linear):
    split_dim = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self.matmul(x))

    def silu_and_mul_forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """self(silu_and_mul(gate_up)); one kernel where the matmul runs the skinny GEMM (`fuses_prologue`)."""
        if self.fuses_prologue(gate_up):
            return self._reduce(torch.ops.xrt.silu_and_mul_linear(gate_up, self.weight))
        return self._reduce(self.matmul(torch.ops.xrt.silu_and_mul(gate_up)))

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        # Each rank's partial product over its input slice, fused prologue or not: the all-reduce follows both.
        if self.tp_size > 1:
            torch.ops.xrt.all_reduce_(y)
        return y
