"""Linear layers, sharded for tensor parallelism (one rank by default): column-parallel splits
the output features, row-parallel the input features (then all-reduces). QKV and gate/up are
fused column-parallel layers loaded shard by shard from the checkpoint's separate tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions, uses_pdl
from xrt.layers.weights import check_shape, divide, new_param
from xrt.ops.parallel_state import SINGLE, TPState


class _Linear(nn.Module):
    """y = x @ weight.t() through a cached transposed view: F.linear on a 2-D input runs aten::linear,
    matmul, t, transpose and as_strided before the same mm, about 5 us of host time per call. CUDA inputs of at
    most `skinny_rows` rows (LayerOptions) go through xrt::linear, which runs the skinny-GEMM kernel for the
    shapes where it beats cuBLAS. tp: this rank's shard (TPState)."""

    weight: nn.Parameter
    _weight_t: torch.Tensor | None = None
    # The dimension of weight [output, input] split across tensor-parallel ranks: 0 output (column-parallel),
    # 1 input (row-parallel).
    split_dim: int

    def __init__(
        self, input_size: int, output_size: int, dtype: torch.dtype, device: torch.device | str,
        tp: TPState = SINGLE, options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank, self.tp_size, self.group_name = tp.rank, tp.size, tp.group_name
        self.skinny_rows, self.pdl_max_rows = options.skinny_rows, options.pdl_max_rows
        shape, what = [output_size, input_size], ("output size", "input size")[self.split_dim]
        shape[self.split_dim] = divide(shape[self.split_dim], self.tp_size, what)
        self.weight = new_param(tuple(shape), dtype, device)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's slice of the checkpoint's full [output, input] tensor."""
        check_shape(loaded, (self.output_size, self.input_size))
        n = param.shape[self.split_dim]
        param.data.copy_(loaded.narrow(self.split_dim, self.tp_rank * n, n))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return F.linear(x, self.weight)
        if x.is_cuda and x.shape[0] <= self.skinny_rows:
            return torch.ops.xrt.linear(x, self.weight, uses_pdl(x.shape[0], self.pdl_max_rows))
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
        self, input_size: int, output_sizes: list[int], dtype: torch.dtype, device: torch.device | str,
        tp: TPState = SINGLE, options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), dtype, device, tp, options)

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
        tp: TPState = SINGLE,
        options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        ranks = tp.size
        self.head_dim = head_dim
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, ranks, "num_attention_heads")
        if ranks >= total_num_kv_heads:
            self.num_kv_heads = 1
            divide(ranks, total_num_kv_heads, "num_key_value_heads (as divisor)")
        else:
            self.num_kv_heads = divide(total_num_kv_heads, ranks, "num_key_value_heads")
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim * ranks
        super().__init__(hidden_size, output_size, dtype, device, tp, options)

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

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + forward(x), a new tensor: on one rank one xrt::linear_add (on CUDA past the skinny GEMM's
        batches a GEMM with the add in its epilogue); with more ranks the add follows the all-reduce."""
        if self.tp_size == 1 and x.dim() == 2:
            return torch.ops.xrt.linear_add(x, self.weight, residual)
        return self.forward(x) + residual

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        # Each rank's partial product over its input slice: the all-reduce sums them.
        if self.tp_size > 1:
            torch.ops.xrt.all_reduce_(y, self.group_name)
        return y
