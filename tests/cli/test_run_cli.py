"""`xrt run`: prompts in (prompt, prompts_file as JSONL or text, chat), generations (whole, or streamed with
`stream=true`) and summary out."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from xrt.cli.run_cmd import main
from xrt.cli.run_output import StreamPrinter
from xrt.config import CacheArgs, LoadFormat, SamplingArgs, XrtConfig
from xrt.engine.outputs import RequestOutput, StreamOutput


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


def test_stream_prints_each_generation_as_its_tokens_arrive(cfg: XrtConfig, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond prompt\nthird one\n")
    cfg.prompts_file, cfg.output, cfg.stream = str(prompts), str(tmp_path / "o.jsonl"), True
    assert main(cfg) == 0
    out = capsys.readouterr().out
    texts = {r["request_id"]: r["text"] for r in map(json.loads, Path(cfg.output).read_text().splitlines())}
    # In prompt order, each generation whole (its streamed pieces joined are the final text)
    expected = "".join(f"[{i}] {p!r} -> {texts[i]}\n  (6 tokens, length)\n"
                       for i, p in enumerate(["first prompt", "second prompt", "third one"]))
    assert out.startswith(expected) and out[len(expected):].startswith("startup ")


def _delta(rid: int, text: str, done: bool = False) -> StreamOutput:
    output = RequestOutput(rid, [1], [2, 3], "all of it", "length", None, 0.1, prompt="ab"[rid]) if done else None
    return StreamOutput(rid, [2], text, output)


def test_the_stream_printer_streams_the_first_unfinished_request_and_holds_the_rest() -> None:
    out = io.StringIO()
    p = StreamPrinter([0, 1, 2], ["a", "b", [7, 8]], out)
    p.delta(_delta(1, "B1"))
    assert out.getvalue() == ""  # request 0 has not started: 1 waits its turn
    p.delta(_delta(0, "A1"))
    assert out.getvalue() == "[0] 'a' -> A1"  # shown as it arrives, before request 0 finishes
    p.delta(_delta(1, "B2", done=True))
    p.delta(_delta(0, "A2", done=True))
    assert out.getvalue() == "[0] 'a' -> A1A2\n  (2 tokens, length)\n[1] 'b' -> B1B2\n  (2 tokens, length)\n"
    p.delta(_delta(2, "C1"))
    p.flush()  # Ctrl-C: the streamed line ends
    assert out.getvalue().endswith("[2] [7, 8] -> C1\n")


def test_an_interrupted_stream_prints_the_finished_requests_it_held() -> None:
    out = io.StringIO()
    p = StreamPrinter([0, 1], ["a", "b"], out)
    p.delta(_delta(1, "B", done=True))
    assert out.getvalue() == ""
    p.flush()
    assert out.getvalue() == "[1] 'b' -> 'all of it'  (2 tokens, length)\n"


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the LLM fails the test: what is asserted is found before any model loads."""
    import xrt.engine.llm

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(xrt.engine.llm.LLM, "__init__", refuse)


def test_every_bad_line_is_reported_before_the_model_loads(cfg: XrtConfig, tmp_path: Path, no_model: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt": "ok"}\n{"prompt": ""}\n{"prompt": \n{"prompt_token_ids": [1, 99999]}\n'
                        b'{"prompt": "' + b"word " * 1100 + b'"}\n{"prompt": "caf\xe9"}\n{"prompt": "fine"}\n')
    cfg.prompts_file = str(prompts)
    assert main(cfg) == 2
    err = capsys.readouterr().err.splitlines()
    where = f"error: prompts_file: {prompts} line"
    assert [line[len(where):].split(":")[0] for line in err] == [" 2", " 3", " 4", " 5", " 6"]
    assert err[0].endswith(": prompt is empty") and "not valid JSON" in err[1]
    assert "token ids must be integers in [0, 2048), got 99999 at position 1" in err[2]
    assert "model.max_model_len=1024 leaves no room" in err[3]
    assert err[4].endswith("not UTF-8 text (byte 0xe9 at character 15)")


def test_text_needs_a_tokenizer_and_the_message_says_which_file_and_how_to_pass_ids(
        cfg: XrtConfig, tmp_path: Path, tiny_checkpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    ckpt = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / "tokenizer.json").unlink()
    cfg.model.path, cfg.prompt = str(ckpt), "Hi"
    assert main(cfg) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"error: prompt: text prompts need {ckpt / 'tokenizer.json'}, which is missing; pass "
                          'token ids instead ({"prompt_token_ids": [1, 2, 3]} lines in a prompts_file')
    cfg.model.path, cfg.model.load_format = "", LoadFormat.DUMMY
    assert main(cfg) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert "model.load_format=dummy (random weights) has none; pass token ids instead" in err


def test_a_directory_as_prompts_file_says_so(cfg: XrtConfig, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg.prompts_file = str(tmp_path)
    assert main(cfg) == 2
    assert capsys.readouterr().err == f"error: prompts_file: {str(tmp_path)!r} is a directory; expected a JSONL or " \
                                      "text file\n"


def test_a_prompt_of_bytes_that_are_not_utf8_says_so(cfg: XrtConfig, no_model: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg.prompt = b"caf\xe9".decode("utf-8", "surrogateescape")  # as Python hands a command-line argument over
    assert main(cfg) == 2
    assert capsys.readouterr().err == "error: prompt: not valid UTF-8: byte 0xe9 at character 3\n"


def test_verbose_logs_what_start_up_built_at_tp_1(tiny_checkpoint: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from xrt.cli.main import main as cli_main

    monkeypatch.setattr(logging.getLogger("xrt"), "level", logging.getLogger("xrt").level)
    errs = []
    for flags in ([], ["-v"]):
        assert cli_main(["run", *flags, "prompt=Hi", "sampling.max_tokens=2", "cache.num_pages=64"]) == 0
        errs.append(capsys.readouterr().err)
    quiet, verbose = errs
    assert "[xrt] model: qwen3-tiny, " not in quiet and "[xrt] engine: " not in quiet
    assert "[xrt] model: qwen3-tiny, " in verbose and f"from {tiny_checkpoint} in " in verbose
    assert "[xrt] KV cache: 64 pages of 16 tokens (1024 tokens, " in verbose and "executor eager" in verbose
    assert "[xrt] engine: at most 256 sequences and 8192 tokens a step, " in verbose
