"""What a graph manager is built from, given explicitly: the model, the attention backend, how graphs are
taken, and the device and page layout. Both managers' captured bodies end the same way (lm_head into static
logits, greedy argmax), so that lives here once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from xrt.attention.backend import AttentionBackend
from xrt.attention.context import forward_context
from xrt.attention.metadata import AttentionMetadata
from xrt.executor.graphs.capture import CaptureStrategy


class GraphLMHead(Protocol):
    """What the graphs need of the model's lm_head (`xrt.layers.embedding.ParallelLMHead`)."""

    num_embeddings: int
    weight: torch.Tensor

    def argmax_into(self, logits: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> None: ...


class GraphModel(Protocol):
    """What the graphs need of the model (`xrt.models.qwen3.Qwen3ForCausalLM`)."""

    lm_head: GraphLMHead

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def forward_head(self, input_ids: torch.Tensor, positions: torch.Tensor, num_layers: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def forward_tail(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                     first_layer: int) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor, pdl: bool = True) -> torch.Tensor: ...


@dataclass(frozen=True)
class GraphParts:
    model: GraphModel
    backend: AttentionBackend
    capture: CaptureStrategy
    device: torch.device
    page_size: int
    argmax: bool  # greedy argmax inside the graphs (executor.capture_sampling)

    def static_logits(self, rows: int) -> torch.Tensor:
        """[rows, vocab] in the model dtype: what lm_head writes inside a graph."""
        head = self.model.lm_head
        return torch.zeros(rows, head.num_embeddings, dtype=head.weight.dtype, device=self.device)

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                kv_ready: Sequence[torch.cuda.Event | None] | None = None, pdl: bool = True) -> torch.Tensor:
        with forward_context(meta, self.backend, kv_ready, pdl):
            return self.model(input_ids, meta.positions)

    def forward_head(self, input_ids: torch.Tensor, meta: AttentionMetadata, num_layers: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` up to layer num_layers: (its output, the residual stream), what forward_tail continues from."""
        with forward_context(meta, self.backend):
            return self.model.forward_head(input_ids, meta.positions, num_layers)

    def forward_tail(self, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata,
                     first_layer: int) -> torch.Tensor:
        with forward_context(meta, self.backend):
            return self.model.forward_tail(meta.positions, hidden, residual, first_layer)

    def logits_into(self, hidden: torch.Tensor, logits: torch.Tensor, argmax: torch.Tensor, pdl: bool = True) -> None:
        """lm_head of `hidden` into the static `logits`, and with argmax its greedy tokens into `argmax`; pdl: the
        forward pass's (ForwardContext.pdl)."""
        logits.copy_(self.model.compute_logits(hidden, pdl))
        if self.argmax:
            # Over the model-dtype logits: widening to float32 is exact, so the argmax is the same.
            self.model.lm_head.argmax_into(logits, argmax, pdl)
