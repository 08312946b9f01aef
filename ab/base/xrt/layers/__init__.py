"""The model's building blocks (linear, norm, rotary, embedding, attention), calling `torch.ops.xrt.*`."""

import xrt.ops  # noqa: F401  (declares torch.ops.xrt.* before any layer calls one)
