"""xrt's configuration schema. These attrs classes are the single source of truth: help,
JSON Schema, dumps, HF-config mapping and validation are all derived from them by `xrt.reflect`.

Cross-field rules live in each class's `check()`, which returns `(dotted_field, message)` pairs
relative to that class; `xrt.reflect.build` prefixes the path and reports all of them at once.
Checks that need the machine (CUDA present, a writable path) run in `runtime_check()`, called
when running, not when composing a config."""

from __future__ import annotations

import enum
import os

import attrs

from xrt.config.bench import BenchArgs, ProfileArgs
from xrt.config.cache import CacheArgs
from xrt.config.limits import INT32_MAX, MAX_LOGPROBS
from xrt.config.problems import Problems
from xrt.config.serve import ServeArgs
from xrt.log import LEVELS
from xrt.reflect import each, field, ge, gt, in_range, le

# torch.Generator.manual_seed takes a uint64 (negative seeds wrap around: refused, so a seed means one thing).
SEED_MAX = 2**64 - 1


class Device(enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class LoadFormat(enum.Enum):
    AUTO = "auto"
    SAFETENSORS = "safetensors"
    DUMMY = "dummy"


class DType(enum.Enum):
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


# The levels xrt.log knows (debug, info, warning, error), defined there once.
LogLevel = enum.Enum("LogLevel", {level.upper(): level for level in LEVELS})


class ExecutorKind(enum.Enum):
    EAGER = "eager"
    CUDAGRAPH = "cudagraph"


class PrefillAttention(enum.Enum):
    """FlashInfer's kernel for the ragged prefill of fresh prompts (FlashInfer's own backend names)."""

    AUTO = "auto"
    FA2 = "fa2"
    FA3 = "fa3"


class ParallelBackend(enum.Enum):
    AUTO = "auto"
    NCCL = "nccl"
    GLOO = "gloo"


@attrs.define
class ModelArgs:
    # Defaults are the qwen3-tiny shape, so a bare ModelArgs() names and describes the same model.
    # With model.path, config.json gives every `hf` field: the shape keys must be there (a checkpoint without
    # them is refused); a missing key with an `hf_default` takes transformers' Qwen3Config default, as loading
    # the checkpoint with transformers would (checked against Qwen3Config in tests/models).
    name: str = field(
        "qwen3-tiny",
        help="model name; qwen3-tiny is made on first use when no path is given; with model.path, unless set: the "
        "checkpoint's Hub id or directory name",
    )
    path: str = field(
        "", help="HF checkpoint directory (config.json, *.safetensors, tokenizer.json), or a Hub id (org/name) in "
        "the local Hugging Face cache"
    )
    load_format: LoadFormat = field(
        LoadFormat.AUTO, help="auto: safetensors when a checkpoint exists; dummy: random weights, no files"
    )
    dtype: DType = field(DType.AUTO, help="weight/activation dtype; auto: bfloat16 on CUDA, float32 on CPU")
    vocab_size: int = field(2048, help="vocabulary size", hf="vocab_size", validator=gt(0))
    hidden_size: int = field(64, help="model width", hf="hidden_size", validator=gt(0))
    intermediate_size: int = field(128, help="MLP width", hf="intermediate_size", validator=gt(0))
    num_hidden_layers: int = field(3, help="decoder layers", hf="num_hidden_layers", validator=gt(0))
    num_attention_heads: int = field(4, help="query heads", hf="num_attention_heads", validator=gt(0))
    num_key_value_heads: int = field(2, help="key/value heads (GQA)", hf="num_key_value_heads", validator=gt(0))
    head_dim: int = field(16, help="per-head dimension", hf="head_dim", validator=gt(0))
    rope_theta: float = field(
        10000.0, help="RoPE base", hf=("rope_theta", "rope_parameters.rope_theta"), hf_default=10000.0,
        validator=gt(0),
    )
    rms_norm_eps: float = field(1e-6, help="RMSNorm epsilon", hf="rms_norm_eps", hf_default=1e-6, validator=gt(0))
    max_position_embeddings: int = field(
        2048, help="longest position the model supports", hf="max_position_embeddings", hf_default=32768,
        validator=[gt(0), le(INT32_MAX)],
    )
    tie_word_embeddings: bool = field(
        True, help="lm_head shares the embedding matrix", hf="tie_word_embeddings", hf_default=False
    )
    max_model_len: int = field(
        1024,
        help="longest sequence (prompt + output) served; unless set on the command line, capped by the "
        "checkpoint's max_position_embeddings when model.path is given",
        unit="tokens",
        validator=[gt(0), le(INT32_MAX)],
    )

    def check(self) -> Problems:
        out: Problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            out.append(
                (
                    "num_key_value_heads",
                    f"must divide num_attention_heads={self.num_attention_heads}, got {self.num_key_value_heads}",
                )
            )
        if self.max_model_len > self.max_position_embeddings:
            out.append(
                (
                    "max_model_len",
                    f"must be <= max_position_embeddings={self.max_position_embeddings}, got {self.max_model_len}",
                )
            )
        return out


@attrs.define
class ParallelArgs:
    tp: int = field(
        1,
        help="tensor-parallel degree: one model over tp ranks (GPUs of a host; or the ranks torchrun starts). "
        "xrt spawns tp - 1 worker processes itself unless RANK/WORLD_SIZE say torchrun started it",
        validator=ge(1),
    )
    backend: ParallelBackend = field(
        ParallelBackend.AUTO, help="torch.distributed backend of the model's collectives; auto: nccl on CUDA, gloo "
        "on CPU (the step channel to the workers is always a gloo group)",
    )
    master_addr: str = field(
        "127.0.0.1", help="where spawned ranks rendezvous (rank 0's TCP store); under torchrun MASTER_ADDR is used"
    )
    master_port: int = field(
        0, help="rendezvous port for spawned ranks; 0: a free port the OS picks (so runs on one host never "
        "collide); under torchrun MASTER_PORT is used", validator=in_range(0, 65535),
    )
    timeout_s: float = field(
        120.0,
        help="a collective, rendezvous or step-channel wait longer than this fails the run (a dead rank is "
        "noticed at once; this bounds a hung one); rank 0 keeps an idle channel alive",
        unit="s",
        validator=gt(0),
    )


@attrs.define
class ExecutorArgs:
    kind: ExecutorKind = field(ExecutorKind.EAGER, help="eager: run the model directly; cudagraph: graph decode")
    max_batch: int = field(
        256, help="largest decode batch captured as a CUDA graph; a larger decode step runs eager (conf/executor/"
        "cudagraph.yaml sets it to scheduler.max_num_seqs)", validator=[ge(1), le(INT32_MAX)]
    )
    buckets: list[int] = field(
        factory=list,
        help="decode graph batch buckets; empty: 1, 2, 4, 8, then steps of 8 (to 32) and 16 up to max_batch",
        validator=[each(ge(1)), each(le(INT32_MAX))],
    )
    capture_sampling: bool = field(True, help="capture lm_head and greedy argmax inside the decode graph")
    overlap: bool = field(
        True, help="cudagraph: the host prepares decode step N+1 while the GPU runs step N (greedy batches)"
    )
    workspace_mb: int = field(256, help="FlashInfer workspace size", unit="MiB", validator=ge(16))
    prefill_attention: PrefillAttention = field(
        PrefillAttention.AUTO,
        help="FlashInfer kernel of the ragged prefill (fresh prompts, eager and graph): fa3 (Hopper's TMA / wgmma "
        "kernel, sm_90+), fa2 (mma.sync, any CUDA GPU; measured slower on Hopper), auto (FlashInfer's pick: fa3 on "
        "Hopper) (figures: bench/NOTES.md)",
    )
    prefill_graph: bool = field(
        False,
        help="cudagraph: replay captured prefill graphs for batches of fresh prompts (no cached prefix) up to "
        "prefill_graph_max_tokens tokens",
    )
    prefill_graph_max_tokens: int = field(
        8192, help="largest prefill replayed as a CUDA graph (padding included)", unit="tokens",
        validator=[ge(1), le(INT32_MAX)],
    )
    prefill_graph_token_buckets: list[int] = field(
        factory=list,
        help="prefill graph token buckets; empty: 256, 512, 1024, ... doubling, capped at prefill_graph_max_tokens",
        validator=[each(ge(1)), each(le(INT32_MAX))],
    )
    prefill_graph_max_seqs: int = field(
        8, help="most sequences in a replayed prefill; graphs for 1, 2, 4, ... up to it",
        validator=[ge(1), le(INT32_MAX)],
    )
    prefill_graph_head_layers: int = field(
        2,
        help="each prefill shape is captured as two graphs, the embedding and this many layers, then the rest: the "
        "device runs the short head while the host launches the long tail (launching one graph costs host time per "
        "kernel, with the device idle until it is in); 0: one graph (figures: bench/NOTES.md)",
        validator=[ge(0), le(INT32_MAX)],
    )
    pdl: bool = field(
        True,
        help="programmatic dependent launch for xrt's Triton kernels on Hopper+: a kernel starts while the one "
        "before it drains, hiding the launch and ramp-up of the short decode kernels (figures: bench/NOTES.md)",
    )
    pdl_max_rows: int = field(
        16,
        help="largest launch (rows) that uses PDL: with PDL on every launch large decode batches replayed slower, "
        "and prefill kernels are long enough that there is little to hide (figures: bench/NOTES.md)",
        validator=ge(0),
    )
    skinny_gemm_max_rows: int = field(
        8,
        help="CUDA linears of at most this many rows go through xrt::linear, which runs the skinny-GEMM kernel "
        "for the shapes where it measured faster than cuBLAS (figures: bench/NOTES.md); 0: always cuBLAS",
        validator=ge(0),
    )
    fuse_activation: bool = field(
        True,
        help="decode batches whose gate_up projection runs on the skinny-GEMM kernel's FMA path (batch 1 on the "
        "measured shapes) compute silu(gate) * up in its epilogue: one launch a layer fewer (figures: bench/NOTES.md)",
    )
    fuse_qk_norm_rope: bool = field(
        True,
        help="decode batches that xrt's Triton decode attention serves (CUDA, at most 8 rows) normalise and rotate q "
        "and k and write this step's K/V inside that kernel instead of in xrt::qk_norm_rope_store_kv: one launch a "
        "layer fewer (figures: bench/NOTES.md)",
    )
    fuse_qkv_epilogue: bool = field(
        False,
        help="prefill passes of more rows than skinny_gemm_max_rows run the qkv projection, q/k norm, RoPE "
        "and KV write as one xrt::linear_qk_norm_rope_store_kv: on CUDA a Triton GEMM with the rest in its epilogue "
        "instead of cuBLAS then xrt::qk_norm_rope_store_kv, so qkv is written once and not read back (off until "
        "measured: bench/NOTES.md)",
    )
    fuse_prefill_activation: bool = field(
        False,
        help="prefill passes of more rows than skinny_gemm_max_rows run the MLP's gate_up projection and "
        "activation as one xrt::linear_silu_and_mul: on CUDA a Triton GEMM computing silu(gate) * up in its epilogue "
        "instead of cuBLAS then xrt::silu_and_mul, so the [T, 2I] projection is never written (off until measured: "
        "bench/NOTES.md)",
    )
    fuse_prefill_norms: bool = field(
        False,
        help="with fuse_qkv_epilogue and fuse_prefill_activation, prefill passes of more rows than "
        "skinny_gemm_max_rows run each RMSNorm as the prologue of the GEMM after it (qkv, gate_up) and each "
        "residual add as the epilogue of the projection before it (o_proj, down: xrt::linear_add; with tensor "
        "parallelism the add follows the all-reduce), so no norm kernel runs and the residual stream is written once "
        "a sublayer (off until measured: bench/NOTES.md)",
    )
    staging_loop_max_rows: int = field(
        8, help="decode batches up to this many rows are staged by a per-row loop, larger ones vectorized (host "
        "time only)", validator=ge(0),
    )

    def check(self) -> Problems:
        out: Problems = []
        if self.buckets and max(self.buckets) > self.max_batch:
            out.append(("buckets", f"must all be <= max_batch={self.max_batch}, got {max(self.buckets)}"))
        top = self.prefill_graph_max_tokens
        if self.prefill_graph_token_buckets and max(self.prefill_graph_token_buckets) > top:
            out.append(
                (
                    "prefill_graph_token_buckets",
                    f"must all be <= prefill_graph_max_tokens={top}, got {max(self.prefill_graph_token_buckets)}",
                )
            )
        if self.fuse_prefill_norms and not (self.fuse_qkv_epilogue and self.fuse_prefill_activation):
            out.append(("fuse_prefill_norms", "needs fuse_qkv_epilogue=true and fuse_prefill_activation=true (the "
                        "norms run as those GEMMs' prologue)"))
        return out


@attrs.define
class SchedulerArgs:
    max_num_seqs: int = field(256, help="most sequences in one batch", validator=[ge(1), le(INT32_MAX)])
    max_batched_tokens: int = field(
        8192, help="token budget of one prefill step", unit="tokens", validator=[ge(1), le(INT32_MAX)]
    )
    chunked_prefill: bool = field(True, help="split long prompts across steps under the token budget")


@attrs.define
class SamplingArgs:
    temperature: float = field(0.0, help="0: greedy; > 0: sample from softmax(logits / temperature)", validator=ge(0))
    top_k: int = field(0, help="keep the k most likely tokens; 0: all", validator=ge(0))
    top_p: float = field(1.0, help="keep the smallest set with this probability mass",
                         validator=in_range(0.0, 1.0, lo_open=True))
    max_tokens: int = field(
        64,
        help="most tokens generated per request; more than model.max_model_len leaves after the prompt: "
        "generation stops there (finish_reason context_length, logged once)",
        validator=ge(1),
    )
    seed: int | None = field(
        None, help="per-request sampling seed; null: from the global seed", validator=in_range(0, SEED_MAX)
    )
    ignore_eos: bool = field(False, help="keep generating past the end-of-sequence token")
    stop: list[str] = field(factory=list, help="stop strings; output ends before the first match")
    logprobs: int | None = field(
        None,
        help="null: none; k: each generated token's log-probability and rank plus the k most likely tokens "
        f"(0..{MAX_LOGPROBS}), from the model's raw logits (float32 log-softmax before temperature, top-k, top-p)",
        validator=in_range(0, MAX_LOGPROBS),
    )


@attrs.define
class XrtConfig:
    model: ModelArgs = field(factory=ModelArgs, help="model and checkpoint")
    parallel: ParallelArgs = field(factory=ParallelArgs, help="tensor parallelism")
    executor: ExecutorArgs = field(factory=ExecutorArgs, help="how forward passes run")
    cache: CacheArgs = field(factory=CacheArgs, help="paged KV cache (the L1/L2 tiers: issue 13)")
    scheduler: SchedulerArgs = field(factory=SchedulerArgs, help="batching and chunked prefill")
    sampling: SamplingArgs = field(factory=SamplingArgs, help="default sampling parameters")
    bench: BenchArgs = field(factory=BenchArgs, help="benchmark protocol")
    profile: ProfileArgs = field(factory=ProfileArgs, help="`xrt profile`: where a step's time goes")
    serve: ServeArgs = field(factory=ServeArgs, help="`xrt serve`: the OpenAI-compatible HTTP server")
    device: Device = field(Device.AUTO, help="auto: cuda when present, else cpu")
    log_level: LogLevel = field(LogLevel.INFO, help="xrt's log lines on stderr (the CLI's -v: debug, -q: warning)")
    seed: int = field(0, help="global seed (dummy weights, sampling)", validator=in_range(0, SEED_MAX))
    prompt: str = field("Hello", help="run: the prompt to generate from")
    prompts_file: str = field("", help="run: JSONL ({\"prompt\": ...} per line) or text file, one prompt per line")
    output: str = field(
        "", help="run: write generations as JSONL here, one line per request as it finishes (completion order); an "
        "existing file is refused unless output_overwrite=true"
    )
    output_overwrite: bool = field(False, help="run: replace an existing `output` file (false: refuse it, so no "
                                   "earlier results are lost)")
    stream: bool = field(False, help="run: print each generation to the terminal as its tokens arrive (in prompt "
                         "order: the first unfinished request streams, later ones are printed when it ends)")
    chat: bool = field(False, help="run: apply the checkpoint's chat template to each prompt")

    def check(self) -> Problems:
        out: Problems = []
        tp, m = self.parallel.tp, self.model
        if m.num_attention_heads % tp:
            out.append(("parallel.tp", f"must divide model.num_attention_heads={m.num_attention_heads}, got {tp}"))
        if m.intermediate_size % tp:
            out.append(("parallel.tp", f"must divide model.intermediate_size={m.intermediate_size}, got {tp}"))
        if m.num_key_value_heads % tp and tp % m.num_key_value_heads:
            out.append(
                (
                    "parallel.tp",
                    f"must divide model.num_key_value_heads={m.num_key_value_heads} or be a multiple of it, got {tp}",
                )
            )
        if self.scheduler.max_batched_tokens < self.cache.page_size:
            out.append(("scheduler.max_batched_tokens", f"must be >= cache.page_size={self.cache.page_size}"))
        return out


def runtime_check(cfg: XrtConfig) -> Problems:
    """Rules that depend on this machine; checked when running, not when composing."""
    import torch

    out: Problems = []
    cuda = torch.cuda.is_available()
    if cfg.executor.kind is ExecutorKind.CUDAGRAPH and (cfg.device is Device.CPU or not cuda):
        out.append(("executor.kind", "cudagraph needs a CUDA device, and none is available; use executor=eager"))
    if cfg.device is Device.CUDA and not cuda:
        out.append(("device", "cuda requested but torch.cuda.is_available() is false"))
    # A config built in code (`LLM(cfg)`) never went through build's check(): the tp rules must hold before any
    # rank starts.
    out += [p for p in cfg.check() if p[0] == "parallel.tp"]
    tp, on_cuda = cfg.parallel.tp, cuda and cfg.device is not Device.CPU
    world = os.environ.get("WORLD_SIZE") if "RANK" in os.environ else None  # torchrun started this process
    if world is not None and world.isdigit() and int(world) != tp:
        out.append(("parallel.tp", f"must equal the {world} ranks torchrun started, got {tp}"))
    elif world is None and on_cuda and tp > torch.cuda.device_count():
        out.append(("parallel.tp", f"needs {tp} CUDA devices, {torch.cuda.device_count()} visible"))
    if cfg.parallel.backend is ParallelBackend.NCCL and not on_cuda:
        out.append(("parallel.backend", "nccl needs CUDA devices; use gloo (or auto) on CPU"))
    return out
