"""A small random Qwen3 checkpoint written by transformers itself, for parity tests against HF."""

from __future__ import annotations

import torch


def write_hf_qwen3(path: str, *, seed: int, tied: bool, vocab_size: int = 256, num_kv_heads: int = 2,
                   intermediate_size: int = 96, num_heads: int = 4, max_position_embeddings: int = 256) -> None:
    """Weights larger than HF's init, so attention is far from uniform and greedy continuations depend on the
    whole context (parity tests can fail)."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=intermediate_size, num_hidden_layers=2,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=16, rope_theta=10000.0,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-6, tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
