"""Shared fixtures: the tiny checkpoint in a session-scoped cache directory, a tiny-model config,
and a fake model runner that checks the engine's paging through a simulated KV cache.

GPU tests live next to the CPU tests of their part in files named `*_gpu.py`; they are collected only with
`--gpu` (or when named on the command line) and then carry the `gpu` marker. Their `device` fixture skips
without CUDA (and Triton). `slow` marks what only the full GPU run needs (tests/README.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from interpret_guard import register as register_interpret_guard

from xrt.config import CacheArgs, Device, DType, ModelArgs, SchedulerArgs, XrtConfig
from xrt.executor.interface import PendingTokens
from xrt.executor.step import DecodeBatch, StepInput
from xrt.kvcache.connector import NoTierConnector
from xrt.kvcache.device import KVLayout

# ---------------------------------------------------------------- GPU tests: *_gpu.py, collected with --gpu

GPU_SUFFIX = "_gpu.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu", action="store_true", default=False,
                     help=f"collect the GPU tests (files named *{GPU_SUFFIX}, marked `gpu`); they skip without CUDA")


def _named_on_command_line(path: Path, config: pytest.Config) -> bool:
    """path is one of the files given as arguments (`pytest tests/kernels/test_gemv_gpu.py[::test]`)."""
    base = config.invocation_params.dir
    return any((base / arg.split("::")[0]).resolve() == path.resolve() for arg in config.args)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out *_gpu.py files without --gpu, unless the file is named on the command line."""
    if collection_path.name.endswith(GPU_SUFFIX) and not config.getoption("gpu"):
        return None if _named_on_command_line(collection_path, config) else True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.endswith(GPU_SUFFIX):
            item.add_marker(pytest.mark.gpu)


def _flashinfer_cache() -> str:
    """The FlashInfer JIT cache the run starts from. ninja rebuilds a module whose inputs are newer than its
    objects: reinstalling the flashinfer wheel (new header mtimes) makes every cached module cost its full compile
    again, ~10-95 s each (tests/README.md)."""
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    modules = list(base.glob("*/*/cached_ops/*/*.so")) if base.is_dir() else []
    line = f"FlashInfer JIT cache {base}: {len(modules)} compiled modules"
    spec = importlib.util.find_spec("flashinfer")
    if modules and spec is not None and spec.submodule_search_locations:
        headers = Path(list(spec.submodule_search_locations)[0]) / "data" / "include"
        newest = max((f.stat().st_mtime for f in headers.rglob("*.cuh")), default=0.0)
        stale = sum(1 for m in modules if m.stat().st_mtime < newest)
        if stale:
            line += f", {stale} older than the installed flashinfer headers: ninja will rebuild them"
    return line


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which JIT caches the run starts from: timings are only comparable between runs that start alike."""
    if not torch.cuda.is_available():
        return []
    triton = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    kernels = sum(1 for _ in triton.rglob("*.cubin")) if triton.is_dir() else 0
    return [_flashinfer_cache(), f"Triton cache {triton}: {kernels} compiled kernels"]


@pytest.fixture
def device() -> torch.device:
    """The CUDA device of the GPU tests; skips without CUDA or without Triton."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("triton")
    return torch.device("cuda")


# ---------------------------------------------------------------- shared fixtures


def pytest_configure(config: pytest.Config) -> None:
    register_interpret_guard(config)  # XRT_REQUIRE_TRITON=1 (CI): fail when the Triton interpreter tests skip


@pytest.fixture(scope="session")
def xrt_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh XRT_CACHE_DIR for the whole session (the tiny checkpoint is made there once)."""
    path = str(tmp_path_factory.mktemp("xrt_cache"))
    old = os.environ.get("XRT_CACHE_DIR")
    os.environ["XRT_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("XRT_CACHE_DIR", None)
    else:
        os.environ["XRT_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tiny_checkpoint(xrt_cache_dir: str) -> str:
    """Directory of the tiny Qwen3 checkpoint (config.json, model.safetensors, tokenizer.json, ...)."""
    checkpoint = pytest.importorskip("xrt.models.checkpoint")
    from xrt.models.tiny import tiny_model_args

    path = checkpoint.resolve_checkpoint(tiny_model_args())
    assert path is not None
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint_diverse(tiny_checkpoint: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny checkpoint's shape and tokenizer with larger random weights (HF init, std 0.3).
    The tiny checkpoint's small weights make greedy output repeat the last token whatever came
    before it; these make continuations depend on the whole context, so parity tests can fail."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_diverse")
    config = transformers.AutoConfig.from_pretrained(tiny_checkpoint)
    config.initializer_range = 0.3
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(path))
    for name in os.listdir(tiny_checkpoint):  # tokenizer files and generation config as shipped
        if name != "config.json" and not name.startswith("model") and os.path.isfile(f"{tiny_checkpoint}/{name}"):
            shutil.copy(os.path.join(tiny_checkpoint, name), path / name)
    return str(path)


def tiny_config(checkpoint_dir: str = "", **sections: Any) -> XrtConfig:
    """An XrtConfig for the tiny model on CPU in float32. `sections` replace whole config sections
    (cache=CacheArgs(...), scheduler=SchedulerArgs(...)) or set root fields."""
    import attrs

    from xrt.models.tiny import tiny_model_args

    model = attrs.evolve(tiny_model_args(), path=checkpoint_dir, dtype=DType.FLOAT32)
    return XrtConfig(model=model, device=Device.CPU, **sections)


@pytest.fixture
def tiny_cfg(tiny_checkpoint: str) -> Callable[..., XrtConfig]:
    """tiny_cfg(cache=CacheArgs(num_pages=8), ...) -> XrtConfig pointing at the tiny checkpoint."""

    def make(**sections: Any) -> XrtConfig:
        return tiny_config(tiny_checkpoint, **sections)

    return make


@pytest.fixture
def diverse_cfg(tiny_checkpoint_diverse: str) -> Callable[..., XrtConfig]:
    """Like tiny_cfg, pointing at tiny_checkpoint_diverse."""

    def make(**sections: Any) -> XrtConfig:
        return tiny_config(tiny_checkpoint_diverse, **sections)

    return make


class FakeRunner:
    """Stands in for ModelRunner. It writes (token, position) into a simulated paged KV cache, reads
    each sequence's whole context back through its page table, and returns logits that are a
    deterministic function of that context. Wrong paging (a stale prefix page, a page shared while
    being written) changes the context read back, hence the tokens; a slot holding the wrong
    position fails at once."""

    def __init__(self, num_pages: int = 64, page_size: int = 4, max_model_len: int = 256, vocab_size: int = 97):
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.checkpoint_dir: str | None = None
        self.decode_capacity = 0  # no launch_decode: every step goes through execute()
        self.last_argmax: torch.Tensor | None = None
        self.kv: list[tuple[int, int] | None] = [None] * (num_pages * page_size)
        self.kv_layout = KVLayout(1, page_size, 1, 1, torch.float32)  # the fake keeps its KV in self.kv
        self.connector = NoTierConnector()
        self.steps: list[StepInput] = []

    def close(self) -> None:
        pass

    @staticmethod
    def context_logits(context: list[int], vocab_size: int) -> torch.Tensor:
        digest = hashlib.blake2b(array("q", context).tobytes(), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest, "little") % 2**63)
        return torch.randn(vocab_size, generator=g) * 3.0

    def reference_greedy(self, prompt: list[int], max_tokens: int) -> list[int]:
        ids = list(prompt)
        for _ in range(max_tokens):
            ids.append(int(self.context_logits(ids, self.vocab_size).argmax()))
        return ids[len(prompt) :]

    def execute(self, step: StepInput) -> torch.Tensor:
        self.steps.append(step)
        ps = self.page_size
        rows = []
        for chunk in step.seqs:
            assert step.is_prefill or len(chunk.token_ids) == 1
            end = chunk.start_pos + len(chunk.token_ids)
            assert len(chunk.page_table) * ps >= end, "page table too short"
            for i, tok in enumerate(chunk.token_ids):
                pos = chunk.start_pos + i
                self.kv[chunk.page_table[pos // ps] * ps + pos % ps] = (tok, pos)
            if not chunk.needs_logits:
                continue
            context = []
            for pos in range(end):
                entry = self.kv[chunk.page_table[pos // ps] * ps + pos % ps]
                assert entry is not None and entry[1] == pos, f"slot for position {pos} holds {entry}"
                context.append(entry[0])
            rows.append(self.context_logits(context, self.vocab_size))
        if not rows:
            return torch.empty(0, self.vocab_size)
        return torch.stack(rows)

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingTokens:
        raise NotImplementedError("FakeRunner has decode_capacity 0")


def _missing_members(obj: object, protocol: type) -> list[str]:
    declared = set(protocol.__annotations__) | {
        name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")
    }
    return sorted(name for name in declared if not hasattr(obj, name))


@pytest.fixture
def missing_members() -> Callable[[object, type], list[str]]:
    """missing_members(obj, Protocol) -> the attributes and methods the protocol declares that obj
    lacks (a structural check that also covers plain attributes, which isinstance ignores)."""
    return _missing_members


@pytest.fixture
def fake_runner() -> Callable[..., FakeRunner]:
    return FakeRunner


def fake_config(
    *, page_size: int = 4, num_pages: int = 64, max_batched_tokens: int = 64, chunked_prefill: bool = True,
    prefix_caching: bool = True, max_num_seqs: int = 256, **root: Any,
) -> XrtConfig:
    return XrtConfig(
        model=ModelArgs(vocab_size=97, max_model_len=256),
        cache=CacheArgs(page_size=page_size, num_pages=num_pages, prefix_caching=prefix_caching),
        scheduler=SchedulerArgs(
            max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill
        ),
        device=Device.CPU,
        **root,
    )


@pytest.fixture
def fake_cfg() -> Callable[..., XrtConfig]:
    """fake_cfg(page_size=4, num_pages=64, max_batched_tokens=64, ...) -> XrtConfig for a FakeRunner."""
    return fake_config
