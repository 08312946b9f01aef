import filecmp
import importlib.util
import json
import os
import threading
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file

from xrt.config import LoadFormat, ModelArgs
from xrt.models.checkpoint import CheckpointError, resolve_checkpoint
from xrt.models.tiny import FILES, WEIGHT_STD, make_tiny_checkpoint, tiny_model_args
from xrt.reflect import from_hf

transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny") / "ckpt"), tiny_model_args(), seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny: str) -> object:
    return transformers.AutoTokenizer.from_pretrained(tiny)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XRT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def assert_hf_holds_file_weights(path: str, hf: torch.nn.Module) -> None:
    """HF silently random-initialises weights it did not find; every parameter must come from the file."""
    stored = load_file(os.path.join(path, "model.safetensors"))
    params = dict(hf.named_parameters(remove_duplicate=False))
    for name, p in params.items():
        source = name if name in stored else "model.embed_tokens.weight"
        assert name in stored or name == "lm_head.weight", name
        assert torch.equal(p.detach(), stored[source]), name


def test_hf_transformers_loads_and_runs_the_tiny_model(tiny: str, tokenizer: object) -> None:
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tiny).eval()
    model = tiny_model_args()
    assert hf.dtype == torch.float32
    assert hf.config.num_key_value_heads == model.num_key_value_heads < hf.config.num_attention_heads
    assert hf.config.tie_word_embeddings and hf.lm_head.weight is hf.model.embed_tokens.weight
    assert_hf_holds_file_weights(tiny, hf)
    ids = tokenizer("The river runs past the old mill.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = hf(ids).logits
    assert logits.shape == (1, ids.shape[1], model.vocab_size)
    assert torch.isfinite(logits).all() and logits.std() > 0.01


def test_untied_shape_writes_lm_head_and_hf_uses_the_config(tmp_path: Path) -> None:
    model = attrs.evolve(tiny_model_args(), tie_word_embeddings=False, num_hidden_layers=2, rope_theta=5000.0)
    path = make_tiny_checkpoint(str(tmp_path / "untied"), model, seed=3)
    stored = load_file(os.path.join(path, "model.safetensors"))
    assert "lm_head.weight" in stored and "model.layers.2.mlp.up_proj.weight" not in stored
    hf = transformers.Qwen3ForCausalLM.from_pretrained(path)
    assert hf.config.rope_parameters["rope_theta"] == 5000.0 and hf.config.num_hidden_layers == 2
    assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    assert_hf_holds_file_weights(path, hf)


def test_config_json_maps_back_to_the_model_args(tiny: str) -> None:
    with open(os.path.join(tiny, "config.json")) as f:
        config = json.load(f)
    model = tiny_model_args()
    assert from_hf(ModelArgs, config, {"name": model.name, "max_model_len": model.max_model_len}) == model
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["torch_dtype"] == "float32"


def test_weights_are_random_normal_with_norms_near_but_not_one(tiny: str) -> None:
    stored = load_file(os.path.join(tiny, "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in stored.values())
    q = stored["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (4 * 16, 64) and abs(q.std().item() - WEIGHT_STD) < 0.1 * WEIGHT_STD
    norms = ("model.norm.weight", "model.layers.1.self_attn.k_norm.weight", "model.layers.2.input_layernorm.weight")
    for name in norms:
        w = stored[name]
        assert abs(w.mean().item() - 1.0) < 0.1 and w.std() > 0.03, name


def test_same_seed_gives_identical_files_and_another_seed_other_weights(tiny: str, tmp_path: Path) -> None:
    again = make_tiny_checkpoint(str(tmp_path / "again"), tiny_model_args(), seed=0)
    match, mismatch, errors = filecmp.cmpfiles(tiny, again, FILES, shallow=False)
    assert sorted(match) == sorted(FILES), (mismatch, errors)
    other = make_tiny_checkpoint(str(tmp_path / "other"), tiny_model_args(), seed=1)
    match, mismatch, _ = filecmp.cmpfiles(tiny, other, FILES, shallow=False)
    assert mismatch == ["model.safetensors"]
    a = load_file(os.path.join(tiny, "model.safetensors"))
    b = load_file(os.path.join(other, "model.safetensors"))
    assert a.keys() == b.keys() and not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_tokenizer_round_trips_text_and_has_qwen_special_tokens(tokenizer: object, tiny: str) -> None:
    text = "It's 12:45 on a grey morning; the café's lights are on.\n\n  Naïve bees — 3,000 of them!"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode()) * 0.6  # BPE merges, not bytes
    assert len(tokenizer) <= tiny_model_args().vocab_size
    specials = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert len(set(specials)) == 3 and all(i < len(tokenizer) for i in specials)
    assert tokenizer("<|im_start|>user<|im_end|>")["input_ids"][0] == specials[1]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    with open(os.path.join(tiny, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == [specials[2], specials[0]]
    with open(os.path.join(tiny, "config.json")) as f:
        config = json.load(f)
    assert (config["bos_token_id"], config["eos_token_id"]) == (specials[0], specials[2])


def test_tokenizer_learned_about_two_thousand_tokens(tokenizer: object) -> None:
    assert 1900 <= len(tokenizer) <= 2048
    assert len(tokenizer(" the river")["input_ids"]) == 2


def test_chat_template_renders_qwen_format(tokenizer: object) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )


def test_resolve_dummy_is_none_and_a_path_is_itself(tiny: str) -> None:
    assert resolve_checkpoint(ModelArgs(load_format=LoadFormat.DUMMY, name="anything")) is None
    assert resolve_checkpoint(ModelArgs(name="other", path=tiny)) == tiny


def test_resolve_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(CheckpointError, match=f"model.path: {missing} does not exist"):
        resolve_checkpoint(ModelArgs(path=missing))


def test_resolve_unknown_name_without_path_says_what_to_set(cache: Path) -> None:
    with pytest.raises(CheckpointError, match="model.path") as e:
        resolve_checkpoint(ModelArgs(name="qwen3-0.6b"))
    assert "model.load_format=dummy" in str(e.value)


def test_resolve_tiny_creates_once_in_the_cache_and_reuses(cache: Path, tiny: str) -> None:
    model = tiny_model_args()
    path = resolve_checkpoint(model)
    assert path is not None and Path(path).parent == cache and Path(path).name.startswith("qwen3-tiny-")
    assert filecmp.cmpfiles(path, tiny, FILES, shallow=False)[0] == list(FILES)
    inode = os.stat(os.path.join(path, "model.safetensors")).st_ino
    assert resolve_checkpoint(model) == path
    assert os.stat(os.path.join(path, "model.safetensors")).st_ino == inode
    other = resolve_checkpoint(attrs.evolve(model, num_hidden_layers=2))
    assert other != path and sorted(os.listdir(cache)) == sorted([Path(path).name, Path(other).name])


def test_resolve_tiny_rebuilds_an_incomplete_cache_entry(cache: Path) -> None:
    path = resolve_checkpoint(tiny_model_args())
    os.remove(os.path.join(path, "tokenizer.json"))
    assert resolve_checkpoint(tiny_model_args()) == path
    assert os.path.isfile(os.path.join(path, "tokenizer.json"))


def test_concurrent_creators_publish_one_whole_checkpoint(cache: Path) -> None:
    results: list[str | None] = []
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            results.append(resolve_checkpoint(tiny_model_args()))
        except BaseException as e:  # noqa: BLE001 - collected and re-raised on the main thread
            errors.append(e)

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert os.listdir(cache) == [Path(results[0]).name]  # no temp directories left behind
    assert sorted(os.listdir(results[0])) == sorted(FILES)


def test_make_replaces_a_checkpoint_but_never_another_directory(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    make_tiny_checkpoint(str(out), tiny_model_args(), seed=0)
    before = load_file(str(out / "model.safetensors"))["model.norm.weight"]
    make_tiny_checkpoint(str(out), tiny_model_args(), seed=5)
    assert not torch.equal(load_file(str(out / "model.safetensors"))["model.norm.weight"], before)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="refusing to replace"):
        make_tiny_checkpoint(str(tmp_path / "mine"), tiny_model_args())
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "mine"]


def test_script_writes_the_checkpoint(tmp_path: Path, tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("make_tiny_checkpoint", REPO / "scripts" / "make_tiny_checkpoint.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "cli"
    assert script.main(["--out", str(out), "--seed", "0"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert filecmp.cmpfiles(out, tiny, FILES, shallow=False)[0] == list(FILES)
    assert script.main(["--out", str(tmp_path), "--seed", "0"]) == 2
    assert "refusing to replace" in capsys.readouterr().err
