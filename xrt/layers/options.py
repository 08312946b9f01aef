"""What the layers take from the executor's config: one frozen `LayerOptions` per runner, built from cfg.executor
and handed to the model at construction with the runner's `TPState` (`xrt.ops.parallel_state`). Each layer keeps
the values it needs as attributes, so two runners in one process (tests, a second `LLM`) keep their own: nothing
here is process-wide. Why the defaults are what they are: ExecutorArgs' field help, figures in bench/NOTES.md."""

from __future__ import annotations

from dataclasses import dataclass

from xrt.attention.context import pdl_allowed
from xrt.config import ExecutorArgs


@dataclass(frozen=True)
class LayerOptions:
    # CUDA matmuls of at most this many rows go through xrt::linear, which runs the skinny-GEMM kernel for the
    # shapes where it beats cuBLAS (executor.skinny_gemm_max_rows; 0: always cuBLAS).
    skinny_rows: int
    # Triton launches of at most this many rows use programmatic dependent launch where the GPU has it
    # (executor.pdl_max_rows; -1: none, executor.pdl=false).
    pdl_max_rows: int
    # The gated MLP's gate_up and silu_and_mul as one xrt::linear_silu_and_mul where xrt::linear would run
    # (executor.fuse_activation).
    fuse_activation: bool = True
    # The prefill's qkv projection, q/k norm, RoPE and KV write as one xrt::linear_qk_norm_rope_store_kv on CUDA
    # (executor.fuse_qkv_epilogue).
    fuse_qkv_epilogue: bool = False
    # The prefill's gate_up projection and activation as one xrt::linear_silu_and_mul
    # (executor.fuse_prefill_activation).
    fuse_prefill_activation: bool = False
    # The prefill's RMSNorms as the prologue of the qkv and gate_up GEMMs and the residual adds as the epilogue of
    # o_proj and down (executor.fuse_prefill_norms).
    fuse_prefill_norms: bool = False

    @classmethod
    def of(cls, executor: ExecutorArgs) -> LayerOptions:
        return cls(skinny_rows=executor.skinny_gemm_max_rows,
                   pdl_max_rows=executor.pdl_max_rows if executor.pdl else -1,
                   fuse_activation=executor.fuse_activation, fuse_qkv_epilogue=executor.fuse_qkv_epilogue,
                   fuse_prefill_activation=executor.fuse_prefill_activation,
                   fuse_prefill_norms=executor.fuse_prefill_norms)


# The schema's defaults: for models and layers built without a config (tests, tools).
DEFAULT_OPTIONS = LayerOptions.of(ExecutorArgs())


def uses_pdl(rows: int, max_rows: int) -> bool:
    """Whether a layer's launch over `rows` rows asks for PDL (the kernel adds whether the GPU has it): at most
    `max_rows` (the layer's LayerOptions.pdl_max_rows), and not in a forward pass whose layers wait on KV loads
    (`ForwardContext.pdl`)."""
    return rows <= max_rows and pdl_allowed()
