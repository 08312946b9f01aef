"""Qwen3 through xrt's paged KV cache against HF transformers' Qwen3ForCausalLM on the same real
HF checkpoint, float32: prefill and decode logits, chunked prefill and shared prefix pages;
load_weights' handling of fused, tied, missing, misshapen and unexpected tensors."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from hf_checkpoint import write_hf_qwen3
from op_log import XrtOpLog
from safetensors.torch import load_file

from xrt.config import CacheArgs, Device, ModelArgs, XrtConfig
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput
from xrt.models.loader import CheckpointError
from xrt.models.qwen3 import Qwen3ForCausalLM
from xrt.ops.parallel_state import SINGLE, TPState
from xrt.reflect import from_hf

transformers = pytest.importorskip("transformers")


PAGE_SIZE = 4
REL_TOL = 1e-4


def make_hf_checkpoint(path: str, tied: bool, seed: int) -> None:
    write_hf_qwen3(path, seed=seed, tied=tied)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    path = str(tmp_path_factory.mktemp("hf_tied" if request.param else "hf_untied"))
    make_hf_checkpoint(path, tied=request.param, seed=1 if request.param else 2)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return path, hf.eval()


def model_args(path: str) -> ModelArgs:
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    return from_hf(ModelArgs, hf_config, {"name": "parity", "path": path, "dtype": "float32", "max_model_len": 256})


def make_runner(path: str, num_pages: int = 96) -> ModelRunner:
    cache = CacheArgs(page_size=PAGE_SIZE, num_pages=num_pages)
    cfg = XrtConfig(model=model_args(path), device=Device.CPU, cache=cache)
    return ModelRunner(cfg)


def hf_logits(hf: object, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def assert_rel_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    assert rel < REL_TOL, f"relative error {rel:.2e}"


class PagePool:
    """Hands out page ids in shuffled order so sequences' pages are never contiguous."""

    def __init__(self, num_pages: int, seed: int = 0) -> None:
        self.free = list(range(num_pages))
        random.Random(seed).shuffle(self.free)

    def take(self, tokens: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-tokens // PAGE_SIZE))]


def test_prefill_and_decode_logits_match_hf(checkpoint: tuple[str, object]) -> None:
    path, hf = checkpoint
    runner = make_runner(path)
    steps = 6
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (1, 5, 12, 17, 8)]
    pool = PagePool(runner.num_pages)
    tables = [pool.take(len(p) + steps) for p in prompts]
    seqs = [list(p) for p in prompts]

    prefill = runner.execute(StepInput(True, [SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)]))
    assert prefill.dtype == torch.float32 and prefill.shape == (len(prompts), 256)
    rows = [prefill]
    for _ in range(steps):
        for s, logits in zip(seqs, rows[-1], strict=True):
            s.append(int(logits.argmax()))  # greedy: HF must agree on every logit, hence every token
        step = StepInput(False, [SeqChunk([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables, strict=True)])
        rows.append(runner.execute(step))

    for i, (prompt, seq) in enumerate(zip(prompts, seqs, strict=True)):
        ref = hf_logits(hf, seq)
        for j, step_logits in enumerate(rows):
            assert_rel_close(step_logits[i], ref[len(prompt) - 1 + j])


def test_chunked_prefill_and_shared_prefix_pages_match_hf(checkpoint: tuple[str, object]) -> None:
    path, hf = checkpoint
    runner = make_runner(path)
    rng = random.Random(1)
    a = [rng.randrange(256) for _ in range(30)]
    b = a[:8] + [rng.randrange(256) for _ in range(7)]  # shares a's first two full pages
    c = [rng.randrange(256) for _ in range(6)]
    pool = PagePool(runner.num_pages, seed=3)
    ta = pool.take(31)
    tb = ta[:2] + pool.take(len(b) + 1 - 8)
    tc = pool.take(len(c) + 1)

    out1 = runner.execute(StepInput(True, [SeqChunk(a[:7], 0, ta)]))
    out2 = runner.execute(StepInput(True, [SeqChunk(a[7:20], 7, ta), SeqChunk(c, 0, tc)]))
    out3 = runner.execute(StepInput(True, [SeqChunk(a[20:], 20, ta, needs_logits=False), SeqChunk(b[8:], 8, tb)]))
    na, nb, nc = int(hf_logits(hf, a)[-1].argmax()), int(out3[0].argmax()), int(out2[1].argmax())
    out4 = runner.execute(StepInput(False, [SeqChunk([na], 30, ta), SeqChunk([nb], 15, tb), SeqChunk([nc], 6, tc)]))

    ref_a, ref_b, ref_c = hf_logits(hf, a + [na]), hf_logits(hf, b + [nb]), hf_logits(hf, c + [nc])
    assert out3.shape[0] == 1  # a's last chunk asked for no logits
    assert_rel_close(out1[0], ref_a[6])
    assert_rel_close(out2[0], ref_a[19])
    assert_rel_close(out2[1], ref_c[5])
    assert_rel_close(out3[0], ref_b[14])
    assert_rel_close(out4[0], ref_a[30])
    assert_rel_close(out4[1], ref_b[15])
    assert_rel_close(out4[2], ref_c[6])

    # The same prompt in one piece gives the same last logits as the three chunks.
    whole = make_runner(path).execute(StepInput(True, [SeqChunk(a[:20], 0, ta)]))
    assert_rel_close(out2[0], whole[0])


def test_layers_at_tp2_give_each_rank_its_share() -> None:
    """At tp = 2 (collectives stubbed): the column-parallel projection of the normed rows gives each rank its rows
    of the unsharded output, and the MLP (row-parallel down projection) a partial sum that the all-reduce after it
    completes."""
    from xrt.layers.linear import ColumnParallelLinear
    from xrt.layers.mlp import GatedMLP
    from xrt.layers.norm import RMSNorm

    log = XrtOpLog(skip=("all_reduce_",))
    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen)
    norm = RMSNorm(16, 1e-6, torch.float32, "cpu")
    norm.weight.data.uniform_(0.5, 1.5, generator=gen)
    proj = ColumnParallelLinear(16, 8, torch.float32, "cpu")
    mlp = GatedMLP(16, 24, torch.float32, "cpu")
    for p in (proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight):
        p.data.normal_(generator=gen)
    normed, want_residual = norm.add_forward(x.clone(), residual.clone())
    want_proj, want_mlp = proj(normed), mlp(x)
    parts = []
    for rank in range(2):
        tp = TPState(rank, 2)
        proj_r = ColumnParallelLinear(16, 8, torch.float32, "cpu", tp)
        proj_r.weight_loader(proj_r.weight, proj.weight.data)
        normed_r, new_residual = norm.add_forward(x.clone(), residual.clone())
        torch.testing.assert_close(proj_r(normed_r), want_proj[:, 4 * rank : 4 * rank + 4], rtol=1e-6, atol=1e-6)
        assert torch.equal(new_residual, want_residual)
        mlp_r = GatedMLP(16, 24, torch.float32, "cpu", tp)
        for shard, rows in enumerate(mlp.gate_up_proj.weight.data.chunk(2)):
            mlp_r.gate_up_proj.weight_loader(mlp_r.gate_up_proj.weight, rows, shard)
        mlp_r.down_proj.weight_loader(mlp_r.down_proj.weight, mlp.down_proj.weight.data)
        with log:
            parts.append(mlp_r(x))
    reduced = log.skipped
    assert len(reduced) == 2 and all(r is p for r, p in zip(reduced, parts, strict=True))
    torch.testing.assert_close(parts[0] + parts[1], want_mlp, rtol=1e-5, atol=1e-5)


def test_load_weights_fuses_projections(checkpoint: tuple[str, object]) -> None:
    path, _ = checkpoint
    args = model_args(path)
    tensors = load_file(os.path.join(path, "model.safetensors"))
    model = Qwen3ForCausalLM(args, torch.float32, "cpu")
    model.load_weights(tensors.items())
    layer = model.model.layers[1]
    attn = "model.layers.1.self_attn."
    qkv = torch.cat([tensors[attn + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv, rtol=0, atol=0)
    mlp = "model.layers.1.mlp."
    gate_up = torch.cat([tensors[mlp + "gate_proj.weight"], tensors[mlp + "up_proj.weight"]])
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight, gate_up, rtol=0, atol=0)
    lm_head = tensors["model.embed_tokens.weight"] if args.tie_word_embeddings else tensors["lm_head.weight"]
    torch.testing.assert_close(model.lm_head.weight, lm_head, rtol=0, atol=0)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == args.tie_word_embeddings


@pytest.fixture(scope="module")
def untied_tensors(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    path = str(tmp_path_factory.mktemp("hf_errors"))
    make_hf_checkpoint(path, tied=False, seed=3)
    return model_args(path), load_file(os.path.join(path, "model.safetensors"))


def load(args: ModelArgs, tensors: dict[str, torch.Tensor], tp: TPState = SINGLE) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(args, torch.float32, "cpu", tp)
    model.load_weights(tensors.items())
    return model


def test_load_weights_missing_tensor(untied_tensors: tuple[ModelArgs, dict[str, torch.Tensor]]) -> None:
    args, tensors = untied_tensors
    partial = {k: v for k, v in tensors.items() if k != "model.layers.0.mlp.up_proj.weight"}
    with pytest.raises(CheckpointError, match=r"^model\.layers\.0\.mlp\.up_proj\.weight: missing from checkpoint$"):
        load(args, partial)
    no_head = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"^lm_head\.weight: missing from checkpoint$"):
        load(args, no_head)


def test_load_weights_wrong_shape(untied_tensors: tuple[ModelArgs, dict[str, torch.Tensor]]) -> None:
    args, tensors = untied_tensors
    bad = dict(tensors)
    bad["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(31, 64)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight: expected shape "
                                              r"\(32, 64\), got \(31, 64\)"):
        load(args, bad)


def test_load_weights_unexpected_tensors(untied_tensors: tuple[ModelArgs, dict[str, torch.Tensor]]) -> None:
    args, tensors = untied_tensors
    harmless = dict(tensors)
    harmless["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    load(args, harmless)
    extra = dict(tensors)
    extra["model.layers.0.mlp.extra_proj.weight"] = torch.ones(2, 2)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight: unexpected tensor"):
        load(args, extra)


def test_tied_model_ignores_a_saved_lm_head(untied_tensors: tuple[ModelArgs, dict[str, torch.Tensor]]) -> None:
    args, tensors = untied_tensors
    tied = ModelArgs(**{**{f: getattr(args, f) for f in ("vocab_size", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")},
                        "tie_word_embeddings": True})
    model = load(tied, tensors)
    torch.testing.assert_close(model.lm_head.weight, tensors["model.embed_tokens.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("tp", [2, 4])
def test_load_weights_slices_for_the_tp_rank(
    untied_tensors: tuple[ModelArgs, dict[str, torch.Tensor]], tp: int
) -> None:
    """4 heads, 2 KV heads of 16, MLP 96, vocab 256: at tp=4 each KV head is replicated on two ranks."""
    args, t = untied_tensors
    heads, kv_heads, d = 4 // tp, max(1, 2 // tp), 16
    inter, vocab = 96 // tp, 256 // tp

    def rows(name: str, start: int, n: int) -> torch.Tensor:
        return t[f"model.layers.0.{name}.weight"][start * n : (start + 1) * n]

    def cols(name: str, start: int, n: int) -> torch.Tensor:
        return t[f"model.layers.0.{name}.weight"][:, start * n : (start + 1) * n]

    for rank in range(tp):
        model = load(args, t, TPState(rank, tp))
        layer = model.model.layers[0]
        kv_rank = rank // max(1, tp // 2)
        qkv = torch.cat([rows("self_attn.q_proj", rank, heads * d), rows("self_attn.k_proj", kv_rank, kv_heads * d),
                         rows("self_attn.v_proj", kv_rank, kv_heads * d)])
        assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
        gate_up = torch.cat([rows("mlp.gate_proj", rank, inter), rows("mlp.up_proj", rank, inter)])
        assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)
        assert torch.equal(layer.mlp.down_proj.weight, cols("mlp.down_proj", rank, inter))
        assert torch.equal(layer.self_attn.o_proj.weight, cols("self_attn.o_proj", rank, heads * d))
        assert torch.equal(model.model.embed_tokens.weight, t["model.embed_tokens.weight"][rank * vocab :][:vocab])
        assert torch.equal(model.lm_head.weight, t["lm_head.weight"][rank * vocab :][:vocab])


def test_init_dummy_is_deterministic_with_unit_norms() -> None:
    args = ModelArgs(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                     max_model_len=64)
    a, b, c = (Qwen3ForCausalLM(args, torch.float32, "cpu") for _ in range(3))
    a.init_dummy(7)
    b.init_dummy(7)
    c.init_dummy(8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if name.endswith("norm.weight"):
            assert torch.equal(pa, torch.ones_like(pa)), name
        else:
            assert not torch.equal(pa, pc), name
            assert 0.015 < pa.std().item() < 0.025, name


def test_linear_layers_match_f_linear_and_follow_replaced_weights() -> None:
    """The linear layers multiply by a cached transposed view of the weight: bitwise F.linear, for 2-D and
    3-D inputs, and still right after the parameter's storage is replaced (or updated in place)."""
    from xrt.layers.linear import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(0)
    for layer in (ColumnParallelLinear(16, 24, torch.float32, "cpu"), RowParallelLinear(16, 24, torch.float32, "cpu")):
        layer.weight.data.normal_()
        x = torch.randn(5, 16)
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
        assert torch.equal(layer(x.view(5, 1, 16)), torch.nn.functional.linear(x, layer.weight).view(5, 1, 24))
        layer.weight.data.mul_(2)
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
        layer.weight.data = torch.randn(24, 16)
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))
