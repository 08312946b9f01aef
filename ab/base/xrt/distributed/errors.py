"""The error a tensor-parallel run ends with when a rank other than 0 fails. No torch import: the CLI catches it."""

from __future__ import annotations


class WorkerFailed(RuntimeError):
    """A tensor-parallel rank died, raised, or stopped answering; the message names the rank and the error."""
