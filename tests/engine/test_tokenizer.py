from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from xrt.engine.tokenizer import Tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln: naïve café, déjà vu, smörgåsbord.",
    "日本語のテキストと中文文本 mixed with English words.",
    "Emoji 🙂🚀 and symbols ∑ √ ≠ appear here too.",
] * 20
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def write_checkpoint(path: Path, generation_config: dict | None = None, config: dict | None = None,
                     tokenizer_config: dict | None = None) -> Path:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config if tokenizer_config is not None else
                   {"chat_template": TEMPLATE, "eos_token": "<|im_end|>"})
    )
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = write_checkpoint(tmp_path_factory.mktemp("tok"), generation_config={"eos_token_id": [2, 0]})
    return Tokenizer(str(path))


@pytest.mark.parametrize("text", CORPUS[:4] + ["a🙂b日c", "  leading spaces and\nnewlines\n\n"])
def test_incremental_decode_equals_full_decode(tokenizer: Tokenizer, text: str) -> None:
    prompt = tokenizer.encode("Prompt: ")
    output = tokenizer.encode(text)
    detok = tokenizer.detokenizer(len(prompt))
    ids = list(prompt)
    pieces = []
    for t in output:
        ids.append(t)
        piece = detok.step(ids)
        assert "\ufffd" not in piece  # never a broken UTF-8 sequence
        pieces.append(piece)
    assert "".join(pieces) == tokenizer.decode(output) == text


def byte_token(tokenizer: Tokenizer, b: int) -> int:
    """The id of the single-byte token for byte b (GPT-2's byte-to-unicode map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [x for x in range(256) if x not in printable]
    char = chr(b) if b in printable else chr(256 + extra.index(b))
    token_id = tokenizer._tok.token_to_id(char)
    assert token_id is not None
    return token_id


def test_multibyte_characters_are_held_back_until_complete(tokenizer: Tokenizer) -> None:
    ids = [byte_token(tokenizer, b) for b in "🙂".encode()]  # 4 tokens, one per UTF-8 byte
    detok = tokenizer.detokenizer(0)
    pieces = [detok.step(ids[: i + 1]) for i in range(len(ids))]
    assert pieces == ["", "", "", "🙂"]


@pytest.mark.parametrize("text", CORPUS[:4] + ["a🙂b日c", "  leading spaces and\nnewlines\n\n"])
def test_token_bytes_add_up_to_the_text_even_inside_a_character(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert b"".join(tokenizer.token_bytes(t) for t in ids) == text.encode()
    for b in "🙂".encode():  # a token holding one byte of a character: its bytes, though its text is U+FFFD
        token = byte_token(tokenizer, b)
        assert tokenizer.token_bytes(token) == bytes([b]) and tokenizer.token_text(token) == "\ufffd"
    end = tokenizer._tok.token_to_id("<|im_end|>")
    assert tokenizer.token_text(end) == "<|im_end|>" and tokenizer.token_bytes(end) == b"<|im_end|>"


def test_eos_ids_come_from_generation_config_then_config_then_the_eos_token(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a", generation_config={"eos_token_id": [2, 0]}, config={"eos_token_id": 1})
    assert Tokenizer(str(a)).eos_token_ids == [2, 0]
    b = write_checkpoint(tmp_path / "b", config={"eos_token_id": 1})
    assert Tokenizer(str(b)).eos_token_ids == [1]
    c = write_checkpoint(tmp_path / "c")
    tok = Tokenizer(str(c))
    assert tok.eos_token_ids == [tok._tok.token_to_id("<|im_end|>")]


def test_special_tokens_are_skipped_in_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user hi<|im_end|>")
    assert ids[0] == tokenizer._tok.token_to_id("<|im_start|>")
    assert tokenizer.decode(ids) == "user hi"


def test_chat_template_renders_with_generation_prompt(tokenizer: Tokenizer) -> None:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert text == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_missing_or_messages_malformed(tmp_path: Path, tokenizer: Tokenizer) -> None:
    bare = Tokenizer(str(write_checkpoint(tmp_path / "bare", tokenizer_config={})))
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tokenizer.apply_chat_template([{"content": "no role"}])


def test_missing_tokenizer_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer(str(tmp_path))
