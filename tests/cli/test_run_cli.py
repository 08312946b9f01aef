"""`xrt run`: prompts in (prompt, prompts_file as JSONL or text, chat), generations and summary out."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from xrt.cli.run_cmd import main
from xrt.config import CacheArgs, SamplingArgs, XrtConfig


@pytest.fixture
def cfg(tiny_cfg: Callable[..., XrtConfig]) -> XrtConfig:
    return tiny_cfg(cache=CacheArgs(num_pages=64), sampling=SamplingArgs(max_tokens=6, ignore_eos=True))


def test_single_prompt_prints_generation_and_summary(cfg: XrtConfig, capsys: pytest.CaptureFixture[str]) -> None:
    cfg.prompt = "The quick brown fox"
    assert main(cfg) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[0] 'The quick brown fox' -> ") and out[0].endswith("(6 tokens, length)")
    assert out[-1].startswith("startup ") and "1 requests" in out[-1] and "6 generated" in out[-1]
    assert "tokens/s" in out[-1]


def test_jsonl_prompts_file_and_jsonl_output(cfg: XrtConfig, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello"}\n\n{"prompt": "Once upon a time"}\n{"prompt_token_ids": [5, 6, 7]}\n')
    cfg.prompts_file = str(prompts)
    (tmp_path / "out").mkdir()
    cfg.output = str(tmp_path / "out" / "gen.jsonl")
    assert main(cfg) == 0
    # Lines are written in completion order; request_id gives the prompt order.
    records = sorted((json.loads(line) for line in Path(cfg.output).read_text().splitlines()),
                     key=lambda r: r["request_id"])
    assert [r["prompt"] for r in records] == ["Hello", "Once upon a time", None]
    assert records[2]["prompt_token_ids"] == [5, 6, 7]
    assert all(len(r["token_ids"]) == 6 and r["finish_reason"] == "length" and r["error"] is None for r in records)
    assert all(isinstance(r["text"], str) and r["ttft_s"] is not None for r in records)
    assert all("logprobs" not in r for r in records)  # not asked for: the lines stay small
    assert "3 requests" in capsys.readouterr().out


def test_jsonl_output_has_logprobs_when_sampling_asks(cfg: XrtConfig, tmp_path: Path) -> None:
    cfg.prompt, cfg.output = "Hello", str(tmp_path / "gen.jsonl")
    cfg.sampling.logprobs = 2
    assert main(cfg) == 0
    (r,) = [json.loads(line) for line in Path(cfg.output).read_text().splitlines()]
    assert [e["token_id"] for e in r["logprobs"]] == r["token_ids"]
    for e in r["logprobs"]:
        assert len(e["top"]) == 2 and e["top"][0][1] >= e["top"][1][1] and e["logprob"] <= 0
        assert e["rank"] == 1 and e["top"][0] == [e["token_id"], e["logprob"]]  # greedy: the most likely


def test_text_prompts_file_one_prompt_per_line(cfg: XrtConfig, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond {not json}\n")
    cfg.prompts_file = str(prompts)
    assert main(cfg) == 0
    out = capsys.readouterr().out
    assert "[0] 'first prompt' -> " in out and "[1] 'second {not json}' -> " in out


def test_chat_applies_the_template(cfg: XrtConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg.prompt, cfg.chat, cfg.output = "Hi", True, str(tmp_path / "chat.jsonl")
    assert main(cfg) == 0
    (record,) = [json.loads(line) for line in Path(cfg.output).read_text().splitlines()]
    assert record["prompt"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "error: prompts_file: no such file"),
        ("", "holds no prompts"),
        ('{"prompt": "ok"}\n{"prompt": 3}\n', 'line 2: expected {"prompt": "<text>"}'),
        ('{"prompt": "ok"}\n{"prompt": \n', "line 2: not valid JSON"),
    ],
)
def test_bad_prompts_file_is_one_clear_line(cfg: XrtConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: str | None, expected: str) -> None:
    path = tmp_path / "prompts.jsonl"
    if content is not None:
        path.write_text(content)
    cfg.prompts_file = str(path)
    assert main(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: prompts_file: ") and expected in err[0]


def test_too_long_prompt_stops_the_run_with_one_line(cfg: XrtConfig, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("short one\n" + "word " * 1100 + "\n")
    cfg.prompts_file = str(prompts)
    assert main(cfg) == 2
    captured = capsys.readouterr()
    assert "short one" not in captured.out  # refused before anything ran
    err = [ln for ln in captured.err.strip().splitlines() if not ln.startswith("[xrt] ")]  # log lines aside
    assert len(err) == 1
    assert err[0].startswith(f"error: prompts_file: {prompts} line 2: prompt has ")
    assert "model.max_model_len=1024" in err[0]


def test_python_m_xrt_run_end_to_end(xrt_cache_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from xrt.cli.main import main as xrt_main

    rc = xrt_main(["run", "prompt=Hello there", "sampling.max_tokens=5", "sampling.ignore_eos=true",
                   "cache.num_pages=32", "device=cpu"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[0] 'Hello there' -> " in out and "(5 tokens, length)" in out and "tokens/s" in out
