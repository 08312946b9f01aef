"""Which attention backend a runner uses: the torch reference on CPU; FlashInfer on CUDA, or the torch
reference (whose graph requirement says why) where FlashInfer cannot serve the model."""

from __future__ import annotations

from xrt.attention.backend import AttentionBackend, AttentionShape
from xrt.attention.torch_ref import TorchRefBackend
from xrt.log import get_logger

log = get_logger(__name__)


def make_backend(shape: AttentionShape, workspace_mb: int, max_pages_per_seq: int,
                 fuse_qk_norm_rope: bool = False, prefill_kernel: str = "auto") -> AttentionBackend:
    """max_pages_per_seq: the pages of the longest sequence (bounds FlashInfer's small-batch decode kernel);
    fuse_qk_norm_rope: executor.fuse_qk_norm_rope; prefill_kernel: executor.prefill_attention's value."""
    if shape.device.type != "cuda":
        return TorchRefBackend(shape.device)
    try:
        from xrt.attention.flashinfer import FlashInferBackend

        # A prefill without cached prefixes attends over this step's k/v, not the pages.
        return FlashInferBackend(shape, workspace_mb, ragged_prefill=True, max_pages_per_seq=max_pages_per_seq,
                                 fuse_qk_norm_rope=fuse_qk_norm_rope, prefill_kernel=prefill_kernel)
    except ImportError as e:  # also FlashInferUnavailable: no flashinfer, or a dtype/head_dim it lacks
        log.info(f"attention: torch reference backend ({e})")
        return TorchRefBackend(shape.device, graph_requirement=f"FlashInfer attention ({e})")
