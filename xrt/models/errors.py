"""The errors of loading a checkpoint into a model: `CheckpointError` (defined in xrt.checkpoint, below config and
models, so config composition raises it too) and `TensorError`, one tensor's problem."""

from __future__ import annotations

from xrt.checkpoint.errors import CheckpointError

__all__ = ["CheckpointError", "TensorError"]


class TensorError(CheckpointError):
    """A problem with one tensor, raised where the tensor's file is not known (the model's load_weights); the
    runner names the file (`xrt.models.loader.file_of`)."""

    def __init__(self, tensor: str, message: str) -> None:
        super().__init__(f"{tensor}: {message}")
        self.tensor = tensor
