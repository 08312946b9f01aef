"""The tiny Qwen3 test checkpoint in HF layout, deterministic from a seed: config, random weights,
generation config and a byte-level BPE tokenizer trained on the prose in data/corpus.txt."""

from __future__ import annotations

import filecmp
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from xrt.config import ModelArgs
from xrt.models.loader import CheckpointError

# Bump when the files written here change, so cached checkpoints are rebuilt.
TINY_FORMAT_VERSION = 2
CORPUS = Path(__file__).with_name("data") / "corpus.txt"
BPE_VOCAB_SIZE = 2000
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Qwen2/Qwen3's pre-tokenizer split.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# Large for a random model on purpose: with std 0.02 greedy output just repeats the last token,
# whatever came before; at 0.3 continuations depend on the whole context (and parity tests can fail).
WEIGHT_STD = 0.3
NORM_JITTER = 0.1


def tiny_model_args() -> ModelArgs:
    """The qwen3-tiny shape (conf/model/qwen3-tiny.yaml): GQA, qk-norm, rope, tied embeddings."""
    return ModelArgs(
        name="qwen3-tiny",
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        max_model_len=1024,
    )


def tiny_fingerprint(model: ModelArgs, seed: int) -> str:
    """Short hash of everything that determines the checkpoint's bytes."""
    key = {"config": hf_config(model, special_token_ids(model)), "seed": seed, "version": TINY_FORMAT_VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def bpe_vocab_size(model: ModelArgs) -> int:
    size = min(BPE_VOCAB_SIZE, model.vocab_size - len(SPECIAL_TOKENS))
    if size < 512:
        raise CheckpointError(
            f"model.vocab_size: the tiny checkpoint's tokenizer needs at least {512 + len(SPECIAL_TOKENS)} tokens, "
            f"got {model.vocab_size}"
        )
    return size


def special_token_ids(model: ModelArgs) -> dict[str, int]:
    # Qwen places its special tokens right after the BPE vocabulary.
    base = bpe_vocab_size(model)
    return {token: base + i for i, token in enumerate(SPECIAL_TOKENS)}


def hf_config(model: ModelArgs, specials: dict[str, int]) -> dict:
    """config.json in the layout of the published Qwen3 checkpoints."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": specials[ENDOFTEXT],
        "eos_token_id": specials[IM_END],
        "head_dim": model.head_dim,
        "hidden_act": "silu",
        "hidden_size": model.hidden_size,
        "initializer_range": WEIGHT_STD,
        "intermediate_size": model.intermediate_size,
        "max_position_embeddings": model.max_position_embeddings,
        "max_window_layers": model.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": model.num_attention_heads,
        "num_hidden_layers": model.num_hidden_layers,
        "num_key_value_heads": model.num_key_value_heads,
        "rms_norm_eps": model.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": model.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": model.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": model.vocab_size,
    }


def generation_config(specials: dict[str, int]) -> dict:
    return {
        "bos_token_id": specials[ENDOFTEXT],
        "eos_token_id": [specials[IM_END], specials[ENDOFTEXT]],
        "pad_token_id": specials[ENDOFTEXT],
    }


def tiny_weights(model: ModelArgs, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 weights under their HF names; norms near 1 but not equal, so a skipped norm shows."""
    g = torch.Generator().manual_seed(seed)
    h, d, inter = model.hidden_size, model.head_dim, model.intermediate_size
    q, kv = model.num_attention_heads * d, model.num_key_value_heads * d

    def dense(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g) * WEIGHT_STD

    def norm(n: int) -> torch.Tensor:
        return 1.0 + torch.randn(n, generator=g) * NORM_JITTER

    out = {"model.embed_tokens.weight": dense(model.vocab_size, h)}
    for i in range(model.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "self_attn.q_proj.weight"] = dense(q, h)
        out[p + "self_attn.k_proj.weight"] = dense(kv, h)
        out[p + "self_attn.v_proj.weight"] = dense(kv, h)
        out[p + "self_attn.o_proj.weight"] = dense(h, q)
        out[p + "self_attn.q_norm.weight"] = norm(d)
        out[p + "self_attn.k_norm.weight"] = norm(d)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        out[p + "mlp.gate_proj.weight"] = dense(inter, h)
        out[p + "mlp.up_proj.weight"] = dense(inter, h)
        out[p + "mlp.down_proj.weight"] = dense(h, inter)
    out["model.norm.weight"] = norm(h)
    if not model.tie_word_embeddings:
        out["lm_head.weight"] = dense(model.vocab_size, h)
    return out


@functools.lru_cache(maxsize=4)
def tokenizer_json(bpe_size: int) -> str:
    """tokenizer.json of a Qwen-style byte-level BPE with `bpe_size` learned tokens, then the special tokens."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    paragraphs = [p for p in CORPUS.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    tok.train_from_iterator(paragraphs, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok.to_str(pretty=True)


def tokenizer_config(model: ModelArgs, specials: dict[str, int]) -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for t, i in specials.items()
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model.max_position_embeddings,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _write_json(file: str, data: dict) -> None:
    with open(file, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _write_files(out: str, model: ModelArgs, seed: int) -> None:
    specials = special_token_ids(model)
    _write_json(os.path.join(out, "config.json"), hf_config(model, specials))
    _write_json(os.path.join(out, "generation_config.json"), generation_config(specials))
    _write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(model, specials))
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tokenizer_json(bpe_vocab_size(model)))
    save_file(tiny_weights(model, seed), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for name in FILES:
        os.chmod(os.path.join(out, name), 0o644)


def is_tiny_checkpoint(path: str) -> bool:
    return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, f)) for f in FILES)


def _same_files(a: str, b: str) -> bool:
    match, mismatch, errors = filecmp.cmpfiles(a, b, FILES, shallow=False)
    return not mismatch and not errors


def _publish(tmp: str, out: str) -> None:
    """Move the finished `tmp` to `out` so readers see either no checkpoint or a whole one."""
    try:
        os.rename(tmp, out)
        return
    except OSError:
        if not os.path.isdir(out):
            raise
    # Concurrent makers of the same checkpoint write identical bytes: keep theirs, readers may hold it open.
    if _same_files(tmp, out):
        shutil.rmtree(tmp)
        return
    if set(os.listdir(out)) - set(FILES):
        shutil.rmtree(tmp)
        raise CheckpointError(f"{out} exists and holds other files than a tiny checkpoint; refusing to replace it")
    trash = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
    os.rename(out, os.path.join(trash, "old"))
    os.rename(tmp, out)
    shutil.rmtree(trash)


def make_tiny_checkpoint(out_dir: str, model: ModelArgs, seed: int = 0) -> str:
    """Write the tiny checkpoint for `model`'s shape to `out_dir` atomically; returns out_dir."""
    out = os.path.abspath(os.path.expanduser(out_dir))
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache directory should read like any other
    try:
        _write_files(tmp, model, seed)
        _publish(tmp, out)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
    return out
