"""Model classes by HF architecture name (config.json "architectures")."""

from __future__ import annotations

from xrt.models.loader import CheckpointError
from xrt.models.qwen3 import Qwen3ForCausalLM

DEFAULT_ARCHITECTURE = "Qwen3ForCausalLM"
# Every model class offers Qwen3ForCausalLM's interface: forward, compute_logits, load_weights, init_dummy.
MODELS: dict[str, type[Qwen3ForCausalLM]] = {"Qwen3ForCausalLM": Qwen3ForCausalLM}


def model_class(architecture: str) -> type[Qwen3ForCausalLM]:
    try:
        return MODELS[architecture]
    except KeyError:
        raise CheckpointError(
            f"config.json architectures: {architecture} is not supported; supported: {', '.join(sorted(MODELS))}"
        ) from None


def architecture_of(hf_config: dict) -> str:
    """The checkpoint's architecture; DEFAULT_ARCHITECTURE when config.json does not say."""
    archs = hf_config.get("architectures") or [DEFAULT_ARCHITECTURE]
    return str(archs[0])
