"""xrt: a declarative, config-driven LLM inference runtime.

    import xrt
    cfg = xrt.load_config(["model=qwen3-0.6b", "model.path=/ckpt"])   # the CLI's composition (xrt.config.compose)
    outputs = xrt.LLM(cfg).generate(["Hello"])
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "XrtConfig", "load_config", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import xrt` must stay cheap (config commands start in well under a second).
    if name == "LLM":
        from xrt.engine.llm import LLM

        return LLM
    if name == "XrtConfig":
        from xrt.config import XrtConfig

        return XrtConfig
    if name == "load_config":
        from xrt.config.compose import load_config

        return load_config
    raise AttributeError(name)
