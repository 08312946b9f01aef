"""Every model op of the `xrt` namespace, declared once: `@op(schema, fake)` on its numerical reference in
plain torch, which runs on any device without a faster kernel (`xrt.ops.cuda_impls` registers the CUDA
kernels by name; they are tested against these functions). In-place functions mutate exactly what their
schema declares (`Tensor(a!)`). Callers use `torch.ops.xrt.<name>`; the functions here call each other
directly, never through the dispatcher. `pdl` (ops whose CUDA kernel can take part in programmatic dependent
launch): whether that launch may, as the calling layer decides (`xrt.layers.options.uses_pdl`); None, for calls
outside a model, leaves it to the kernel (`xrt.kernels.launch.pdl`). The references ignore it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xrt.ops.registry import op


def _like_first(x: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(x)


def _like_first_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(residual)


def _rows_by_out_features(x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@op("(Tensor x, Tensor weight, float eps, bool? pdl=None) -> Tensor", _like_first)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


@op("(Tensor(a0!) x, Tensor(a1!) residual, Tensor weight, float eps, bool? pdl=None) -> ()")
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None
) -> None:
    """In place: residual <- x + residual; x <- rms_norm(residual) * weight."""
    # The sum is rounded to the activation dtype before normalising, as an unfused add would be.
    summed = x + residual
    residual.copy_(summed)
    x.copy_(rms_norm(summed, weight, eps))


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style RoPE (HF rotate_half): x [..., D] fp32, cos/sin [..., D/2] broadcastable."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@op(
    "(Tensor(a0!) qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, float eps, bool? pdl=None) -> ()"
)
def qk_norm_rope(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, pdl: bool | None = None,
) -> None:
    """In place on the q and k heads of qkv [T, (H + 2 KV) * D]: per-head RMSNorm, then NeoX RoPE
    (cos_sin_cache[pos] = cat(cos, sin), each D/2 wide); v untouched."""
    t = qkv.shape[0]
    q_end = num_heads * head_dim
    k_end = q_end + num_kv_heads * head_dim
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for start, end, heads, weight in ((0, q_end, num_heads, q_weight), (q_end, k_end, num_kv_heads, k_weight)):
        part = qkv[:, start:end].view(t, heads, head_dim)
        normed = rms_norm(part.float(), weight, eps)
        part.copy_(rotate_neox(normed, cos, sin))


@op("(Tensor x, Tensor weight, bool? pdl=None) -> Tensor", _rows_by_out_features)
def linear(x: torch.Tensor, weight: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T -> [M, N] (nn.Linear without bias). On CUDA the skinny-GEMM kernel where it
    beats cuBLAS (`xrt.ops.cuda_impls.linear`)."""
    return torch.mm(x, weight.t())


@op("(Tensor x, bool? pdl=None) -> Tensor", lambda x, pdl=None: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)))
def silu_and_mul(x: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    half = x.shape[-1] // 2
    x32 = x.float()
    return (F.silu(x32[..., :half]) * x32[..., half:]).to(x.dtype)


@op("(Tensor x, Tensor weight, bool? pdl=None, Tensor? norm_weight=None, float eps=1e-6) -> Tensor",
    lambda x, weight, *args: x.new_empty((x.shape[0], weight.shape[0] // 2)))
def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, pdl: bool | None = None,
                        norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """The gated MLP's first half: silu_and_mul(linear(x, weight)), weight [gate; up] [2I, K] -> [M, I]; with
    norm_weight, x is rms_norm(x, norm_weight, eps) first. On CUDA one skinny-GEMM launch with the activation as its
    epilogue where that kernel runs the shape, and past its batches a Triton GEMM with the activation in its
    epilogue and the norm as its prologue (`xrt.ops.cuda_impls.linear_silu_and_mul`)."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    return silu_and_mul(linear(x, weight))


@op("(Tensor x, Tensor weight, Tensor residual) -> Tensor", _like_first_residual)
def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + linear(x, weight), the product rounded first (as the layers' unfused add: `fused_add_rms_norm`).
    On CUDA one Triton GEMM with the add in its epilogue past the skinny GEMM's batches
    (`xrt.ops.cuda_impls.linear_add`)."""
    return linear(x, weight) + residual


@op("(Tensor logits, Tensor(a1!) out, bool? pdl=None) -> ()")
def argmax_rows(logits: torch.Tensor, out: torch.Tensor, pdl: bool | None = None) -> None:
    """In place: out [R] (int64) <- the greedy token of each row of logits [R, V] (the first maximum; NaN above
    every number). On CUDA one launch spread over the row, taking part in PDL (`xrt.kernels.argmax`)."""
    torch.argmax(logits, dim=-1, out=out)


@op("(Tensor k, Tensor v, Tensor(a2!) kv_cache, Tensor slot_mapping, bool? pdl=None) -> ()")
def store_kv(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, pdl: bool | None = None
) -> None:
    """k/v [T, KV, D] into kv_cache [P, 2, page, KV, D] at slot_mapping[T] (page * page_size + offset);
    slots < 0 are skipped."""
    page_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    pages, offsets = slots // page_size, slots % page_size
    kv_cache[pages, 0, offsets] = k[keep].to(kv_cache.dtype)
    kv_cache[pages, 1, offsets] = v[keep].to(kv_cache.dtype)


@op(
    "(Tensor(a0!) qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "Tensor(a5!) kv_cache, Tensor slot_mapping, SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, "
    "float eps, bool? pdl=None) -> ()"
)
def qk_norm_rope_store_kv(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, pdl: bool | None = None,
) -> None:
    """qk_norm_rope, then store_kv of the rotated k heads and the v heads of qkv."""
    qk_norm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_heads, num_kv_heads, head_dim, eps)
    t, q_end = qkv.shape[0], num_heads * head_dim
    k, v = qkv[:, q_end:].view(t, 2, num_kv_heads, head_dim).unbind(1)
    store_kv(k, v, kv_cache, slot_mapping)


@op(
    "(Tensor x, Tensor weight, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "Tensor(a6!) kv_cache, Tensor slot_mapping, SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, "
    "float eps, Tensor? norm_weight=None) -> Tensor",
    _rows_by_out_features,
)
def linear_qk_norm_rope_store_kv(
    x: torch.Tensor, weight: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, norm_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The prefill's qkv projection and what follows it: qkv = linear(x, weight), then qk_norm_rope_store_kv on
    it; returns qkv. With norm_weight, x is rms_norm(x, norm_weight, eps) first (the layer's input norm; Qwen3's
    norms share one eps). On CUDA one GEMM with the norm as its prologue and the rest in its epilogue where that
    kernel takes the shape (`xrt.ops.cuda_impls.linear_qk_norm_rope_store_kv`)."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    qkv = linear(x, weight)
    qk_norm_rope_store_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping, num_heads,
                          num_kv_heads, head_dim, eps)
    return qkv


@op(
    "(Tensor q, Tensor kv_cache, Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, "
    "Tensor kv_last_page_len, float scale) -> Tensor",
    _like_first,
)
def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged KV: the sequence's last new
    token sits at its last KV position, so query i of n sees KV positions <= kv_len - n + i."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    qo, kvp, last = qo_indptr.tolist(), kv_indptr.tolist(), kv_last_page_len.tolist()
    for i in range(len(qo) - 1):
        n_q, n_pages = qo[i + 1] - qo[i], kvp[i + 1] - kvp[i]
        if n_q == 0 or n_pages == 0:
            continue
        kv_len = (n_pages - 1) * page_size + last[i]
        pages = kv_indices[kvp[i] : kvp[i + 1]].long()
        kv = kv_cache[pages].float()  # [n_pages, 2, page, KV, D]
        k = kv[:, 0].reshape(-1, num_kv_heads, head_dim)[:kv_len].repeat_interleave(group, dim=1)
        v = kv[:, 1].reshape(-1, num_kv_heads, head_dim)[:kv_len].repeat_interleave(group, dim=1)
        qi = q[qo[i] : qo[i + 1]].float()
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        q_pos = torch.arange(kv_len - n_q, kv_len, device=q.device)[:, None]
        k_pos = torch.arange(kv_len, device=q.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[qo[i] : qo[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
