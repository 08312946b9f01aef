"""The error a checkpoint the user pointed at raises: missing, unreadable, or one that cannot be right. Torch-free,
so config composition and the Hub cache lookup raise it without importing torch (`xrt config` stays fast)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory or file a user pointed at is missing, unreadable or inconsistent. One line, naming
    the file and the tensor or key."""
