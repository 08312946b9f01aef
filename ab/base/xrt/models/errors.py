"""The error a checkpoint the user pointed at raises: missing, unreadable, or one that cannot be right. Torch-free,
so config composition and the Hub cache lookup raise it without importing torch (`xrt config` stays fast)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory or file a user pointed at is missing, unreadable or inconsistent. One line, naming
    the file and the tensor or key."""


class TensorError(CheckpointError):
    """A problem with one tensor, raised where the tensor's file is not known (the model's load_weights); the
    runner names the file (`xrt.models.loader.file_of`)."""

    def __init__(self, tensor: str, message: str) -> None:
        super().__init__(f"{tensor}: {message}")
        self.tensor = tensor
