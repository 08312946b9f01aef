"""Token embedding and LM head, sharded over the vocabulary for tensor parallelism: each rank
holds ceil(vocab / tp) rows (the last rank's tail is zero padding). The embedding masks the ids outside a
rank's rows and all-reduces; the LM head all-gathers the shards' logits and cuts the padding columns off,
so a vocabulary that tp does not divide gives the same logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions
from xrt.layers.weights import check_shape, new_param
from xrt.ops.parallel_state import SINGLE, TPState


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, device: torch.device | str,
        tp: TPState = SINGLE,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size, self.group_name = tp.rank, tp.size, tp.group_name
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        # With more ranks than rows to share, the last ranks hold padding only.
        self.vocab_start = min(self.tp_rank * self.rows_per_rank, num_embeddings)
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self.weight = new_param((self.rows_per_rank, embedding_dim), dtype, device)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        check_shape(loaded, (self.num_embeddings, self.embedding_dim))
        n = self.vocab_end - self.vocab_start
        param.data.zero_()
        param.data.narrow(0, 0, n).copy_(loaded.narrow(0, self.vocab_start, n))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        y = F.embedding((input_ids - self.vocab_start) * mine, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        torch.ops.xrt.all_reduce_(y, self.group_name)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """The embedding's shards as the output projection; CUDA batches of at most `skinny_rows` rows (LayerOptions)
    through xrt::linear, as the linear layers."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, device: torch.device | str,
        tp: TPState = SINGLE, options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, dtype, device, tp)
        self.skinny_rows, self.pdl_max_rows = options.skinny_rows, options.pdl_max_rows

    def compute_logits(self, hidden: torch.Tensor, pdl: bool = True) -> torch.Tensor:
        """pdl: whether the launch may use PDL at all; the runner passes its forward pass's ForwardContext.pdl
        (this runs after the pass, outside its context)."""
        rows = hidden.shape[0]
        if hidden.is_cuda and hidden.dim() == 2 and rows <= self.skinny_rows:
            logits = torch.ops.xrt.linear(hidden, self.weight, pdl and rows <= self.pdl_max_rows)
        else:
            logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = torch.ops.xrt.all_gather(logits, -1, self.tp_size, self.group_name)[:, : self.num_embeddings]
        return logits

    def argmax_into(self, logits: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> None:
        """The greedy token of each row of `logits` [R, vocab] into int64 `out` [R]; pdl as compute_logits'."""
        torch.ops.xrt.argmax_rows(logits, out, pdl and logits.shape[0] <= self.pdl_max_rows)
