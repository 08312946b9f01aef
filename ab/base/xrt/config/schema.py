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
from xrt.config.problems import Problems
from xrt.log import LEVELS
from xrt.reflect import each, field, ge, gt, in_range, le, power_of_two

# Token counts, positions and page ids reach the attention metadata and page tables as int32.
INT32_MAX = 2**31 - 1
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
        128, help="largest decode batch captured as a CUDA graph", validator=[ge(1), le(INT32_MAX)]
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
    pdl: bool = field(
        True,
        help="programmatic dependent launch for xrt's Triton kernels on Hopper+: a kernel starts while the one "
        "before it drains (H200, 0.6B decode replay: 1118 -> 1003 us at batch 1, bench/results/h200-ee4b1de)",
    )
    pdl_max_rows: int = field(
        16,
        help="largest launch (rows) that uses PDL: with PDL on every launch, batch 100's decode replay took "
        "4.65-4.71 ms against 4.45-4.48 (bench/results/h200-5b0c7b6, h200-4e548c7); prefill kernels are long "
        "enough that there is little to hide",
        validator=ge(0),
    )
    skinny_gemm_max_rows: int = field(
        8,
        help="CUDA linears of at most this many rows go through xrt::linear, which runs the skinny-GEMM kernel "
        "where it beat cuBLAS on the H200 (bench/results/h200-microbench/gemv.md); 0: always cuBLAS",
        validator=ge(0),
    )
    fuse_prologues: bool = field(
        False,
        help="run the norm/activation before a skinny GEMM inside it (one launch fewer); off because with PDL "
        "it was slower on the H200 (0.6B decode replay 887 -> 961 us at batch 1, bench/results/h200-5b0c7b6)",
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
        return out


class KVTiers(enum.Enum):
    """Where KV chunks live besides the GPU pages (the conf/cache group sets it)."""

    GPU = "gpu"
    L1 = "l1"
    L1_L2 = "l1_l2"


class L2Backend(enum.Enum):
    """NIXL backends L2 can store through: files (POSIX; GDS and GDS_MT for GPUDirect Storage) or objects (OBJ)."""

    POSIX = "POSIX"
    GDS = "GDS"
    GDS_MT = "GDS_MT"
    OBJ = "OBJ"


class L2LoadPolicy(enum.Enum):
    """When a prefix found in L2 is loaded rather than recomputed."""

    MEASURED = "measured"  # only when loading is measured faster than recomputing; slow loads abandoned
    ALWAYS = "always"  # whatever L2 holds, however long it takes (tests, and measuring the tier itself)


@attrs.define
class L1Args:
    size_gb: float = field(4.0, help="L1 KV tier: host memory (pinned on CUDA) for KV chunks", unit="GB",
                           validator=gt(0))
    store_programs: int = field(
        16, help="thread blocks of the copy kernel that stores chunks GPU -> L1 on CUDA (few: the model keeps the "
        "other SMs); 0: DMA copies, which queue ahead of the steps' own token read-backs", validator=[ge(0), le(4096)]
    )
    load_programs: int = field(
        0, help="thread blocks of the copy kernel that loads chunks L1 -> GPU on CUDA; 0: DMA copies on the copy "
        "engine", validator=[ge(0), le(4096)]
    )


@attrs.define
class L2Args:
    path: str = field("", help="L2 KV tier: directory of the chunk files; empty: <XRT_CACHE_DIR>/kv")
    backend: L2Backend = field(L2Backend.POSIX, help="NIXL backend L2 transfers through")
    backend_params: dict[str, str] = field(
        factory=dict, help="passed to the NIXL backend as its init parameters (e.g. POSIX use_uring: true)"
    )
    size_gb: float = field(64.0, help="most bytes of chunk files per model namespace (LRU beyond)", unit="GB",
                           validator=gt(0))
    load_policy: L2LoadPolicy = field(
        L2LoadPolicy.MEASURED,
        help="measured: load a prefix from L2 only when the measured L2 bandwidth beats the measured prefill "
        "rate, abandoning a load that turns out slower (TTFT never worse than recomputing); always: load it",
    )
    load_batch_mb: int = field(256, help="bytes of chunks per L2 read transfer: after each, a slow load can stop",
                               unit="MB", validator=[ge(1), le(2**20)])
    prefetch: bool = field(True, help="read a queued request's L2 prefix into L1 in the background before it is "
                           "admitted (overlapping other requests' compute); with tensor parallelism every rank its own "
                           "shard")
    direct_io: bool = field(True, help="read chunk files with O_DIRECT when the chunk size and L1's slots are "
                            "4096-aligned (else, and where the filesystem refuses it, buffered): reads bypass the "
                            "page cache, which L1 already is, and run at the disk's direct rate (~1.4x buffered on "
                            "the H200 machine); writes stay buffered")


@attrs.define
class CacheArgs:
    page_size: int = field(16, help="tokens per KV page", unit="tokens", validator=[power_of_two(), le(2**30)])
    max_memory_utilization: float = field(
        0.9,
        help="fraction of total GPU memory the process may use; KV gets what is left after weights and activations",
        validator=in_range(0.0, 1.0, lo_open=True),
    )
    kv_size_gb: float = field(0.25, help="KV cache size on CPU (GPU sizes from max_memory_utilization)", unit="GB",
                              validator=gt(0))
    num_pages: int = field(
        0, help="explicit number of KV pages; 0: derive from memory", validator=[ge(0), le(INT32_MAX)]
    )
    prefix_caching: bool = field(True, help="reuse KV pages of identical prompt prefixes")
    tiers: KVTiers = field(KVTiers.GPU, help="KV tiers below the GPU pages: gpu (none), l1 (host memory), "
                           "l1_l2 (and storage through NIXL); needs prefix_caching")
    chunk_tokens: int = field(
        256, help="tokens per KV chunk, the unit the L1/L2 tiers store and key (a multiple of page_size)",
        unit="tokens", validator=[ge(1), le(2**20)]
    )
    l1: L1Args = field(factory=L1Args, help="L1 KV tier (cache=l1, l1_l2)")
    l2: L2Args = field(factory=L2Args, help="L2 KV tier through NIXL (cache=l1_l2)")

    def check(self) -> Problems:
        out: Problems = []
        if self.chunk_tokens % self.page_size:
            out.append(("chunk_tokens",
                        f"must be a multiple of cache.page_size={self.page_size}, got {self.chunk_tokens}"))
        if self.tiers is not KVTiers.GPU and not self.prefix_caching:
            out.append(("prefix_caching", f"cache.tiers={self.tiers.value} stores and finds prefixes: must be true"))
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
    device: Device = field(Device.AUTO, help="auto: cuda when present, else cpu")
    log_level: LogLevel = field(LogLevel.INFO, help="xrt's log lines on stderr (the CLI's -v: debug, -q: warning)")
    seed: int = field(0, help="global seed (dummy weights, sampling)", validator=in_range(0, SEED_MAX))
    prompt: str = field("Hello", help="run: the prompt to generate from")
    prompts_file: str = field("", help="run: JSONL ({\"prompt\": ...} per line) or text file, one prompt per line")
    output: str = field("", help="run: write generations as JSONL here")
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
