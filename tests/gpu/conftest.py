"""GPU-only tests: every test here takes `device` and is skipped without CUDA (and Triton)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("triton")
    return torch.device("cuda")
