"""`LLM.generate` checks its whole input before queuing anything: bad prompts and sampling raise RequestError
with one line naming the field (the CLI's messages, for sampling), and leave the engine empty. Also the
config's numeric bounds, a KV cache larger than memory, and the same errors as `xrt run`'s exit status 2.
The tiny model runs end to end; one LLM per module (model.max_model_len=64, so a too-long prompt is short)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from conftest import tiny_config

from xrt import load_config
from xrt.cli.main import main as xrt_main
from xrt.config import CacheArgs, SamplingArgs, XrtConfig
from xrt.config.schema import SEED_MAX
from xrt.engine.errors import RequestError
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput
from xrt.reflect import ConfigError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX_MODEL_LEN = 64
VOCAB = 2048  # the tiny model's (its tokenizer has fewer: ids above it still run)


def config(checkpoint: str, **sections: object) -> XrtConfig:
    sampling = SamplingArgs(max_tokens=3, ignore_eos=True)
    cfg = tiny_config(checkpoint, **{"cache": CacheArgs(num_pages=64), "sampling": sampling, **sections})
    cfg.model = attrs.evolve(cfg.model, max_model_len=MAX_MODEL_LEN)
    return cfg


@pytest.fixture(scope="module")
def llm(tiny_checkpoint: str) -> LLM:
    return LLM(config(tiny_checkpoint))


def refused(llm: LLM, prompts: object, sampling: object = None) -> str:
    """The one-line message generate refused with, after checking it queued nothing."""
    with pytest.raises(RequestError) as e:
        llm.generate(prompts, sampling)  # type: ignore[arg-type]
    assert not llm.engine.has_unfinished()
    message = str(e.value)
    assert len(message.splitlines()) == 1
    return message


def still_serves(llm: LLM) -> None:
    """A valid call after a refused one gets exactly its own outputs (nothing of the refused call ran)."""
    outs = llm.generate(["fine", [5, 6]], use_tqdm=False)
    assert [o.prompt for o in outs] == ["fine", None] and outs[1].prompt_token_ids == [5, 6]
    assert all(len(o.token_ids) == 3 and o.finish_reason == "length" for o in outs)
    assert not llm.engine.has_unfinished()


def test_a_bad_prompt_after_a_good_one_queues_neither(llm: LLM) -> None:
    assert refused(llm, ["a", 5]) == "prompts[1]: expected text or a list of token ids, got int"
    still_serves(llm)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([1, True], "prompt: token ids must be integers in [0, 2048), got True at position 1"),
        ([1, 2.0], "prompt: token ids must be integers in [0, 2048), got 2.0 at position 1"),
        ([[1], [b"\x01"]], "prompts[1]: token ids must be integers in [0, 2048), got b'\\x01' at position 0"),
        ([[1], [0, -1]], "prompts[1]: token ids must be integers in [0, 2048), got -1 at position 1"),
        ([[1], [VOCAB]], "prompts[1]: token ids must be integers in [0, 2048), got 2048 at position 0"),
        ([1, 2**100], "prompt: token ids must be integers in [0, 2048), got an integer of 101 bits at position 1"),
        (["ok", b"bytes"], "prompts[1]: expected text or a list of token ids, got bytes"),
        (b"bytes", "prompts: expected text, a list of token ids or a list of prompts, got bytes"),
        ({"prompt": "hi"}, "prompts: expected text, a list of token ids or a list of prompts, got dict"),
        (None, "prompts: expected text, a list of token ids or a list of prompts, got NoneType"),
        (["ok", ""], "prompts[1]: prompt is empty"),
        ([[3], []], "prompts[1]: prompt is empty"),
        (["ok", "a\ud800b"], "prompts[1]: not valid Unicode: lone surrogate '\\ud800' at character 1"),
        ("\udcff", "prompt: not valid UTF-8: byte 0xff at character 0"),  # surrogateescape: a byte, not text
    ],
)
def test_bad_prompts_are_refused_naming_the_prompt(llm: LLM, prompts: object, message: str) -> None:
    assert refused(llm, prompts) == message


def test_no_prompts_is_no_outputs(llm: LLM) -> None:
    assert llm.generate([]) == []


def test_a_prompt_without_room_under_max_model_len_is_refused(llm: LLM) -> None:
    message = refused(llm, [[1, 2], list(range(MAX_MODEL_LEN))])
    assert message == (
        "prompts[1]: prompt has 64 tokens; model.max_model_len=64 leaves no room to generate (at most 63 prompt tokens)"
    )
    # The longest that has room runs, and generates the one token left.
    (out,) = llm.generate([list(range(MAX_MODEL_LEN - 1))])
    assert len(out.token_ids) == 1 and out.finish_reason == "context_length"


def test_a_prompt_longer_than_the_kv_cache_is_refused(llm: LLM) -> None:
    small = LLM(config(llm.engine.runner.checkpoint_dir or "", cache=CacheArgs(num_pages=2)))
    assert refused(small, list(range(40))) == (
        "prompt: prompt has 40 tokens but the KV cache holds 32 (2 pages of 16); raise cache.num_pages or "
        "cache.kv_size_gb"
    )


@pytest.mark.parametrize(
    ("field", "override", "value"),
    [
        ("top_p", "0", 0),
        ("temperature", "-1", -1),
        ("max_tokens", "0", 0),
        ("max_tokens", "1.5", 1.5),
        ("top_k", "abc", "abc"),
        ("seed", str(SEED_MAX + 1), SEED_MAX + 1),
        ("seed", "-1", -1),
        ("temprature", "1", 1),
        ("ignore_eos", "maybe", "maybe"),
        ("stop", "[a,null]", ["a", None]),
    ],
)
def test_sampling_dicts_get_the_clis_messages(llm: LLM, field: str, override: str, value: object) -> None:
    with pytest.raises(ConfigError) as cli:
        load_config([f"sampling.{field}={override}"])
    (line,) = cli.value.lines()
    assert refused(llm, ["a", "b"], {field: value}) == line
    # In a list, the entry is named by its index.
    assert refused(llm, ["a", "b"], [None, {field: value}]) == line.replace("sampling.", "sampling[1].")


def test_every_sampling_problem_is_on_the_one_line(llm: LLM) -> None:
    assert refused(llm, "a", {"top_p": 0, "top_k": -1}) == (
        "sampling.top_k: must be >= 0, got -1; sampling.top_p: must be in (0.0, 1.0], got 0"
    )


def test_sampling_is_rebuilt_from_a_samplingargs_too(llm: LLM) -> None:
    params = SamplingArgs()
    params.max_tokens = 2.5  # type: ignore[assignment]  # attrs validators check bounds, not types
    assert refused(llm, "a", params) == "sampling.max_tokens: must be an integer, got 2.5"
    assert refused(llm, "a", 0.5) == "sampling: expected SamplingArgs, a dict or None, got float"


def test_a_sampling_list_must_match_the_prompts(llm: LLM) -> None:
    assert refused(llm, ["a", "b"], [{}]) == "sampling: got a list of 1 for 2 prompts"
    assert refused(llm, "a", [{}, {}]) == "sampling: got a list of 2 for 1 prompt"
    outs = llm.generate(["a", "b"], [{"max_tokens": 2}, None])
    assert [len(o.token_ids) for o in outs] == [2, 3]  # the dict over cfg.sampling; None is cfg.sampling


def test_sampling_at_the_limits_of_its_bounds_runs(llm: LLM) -> None:
    greedy = llm.generate([[7, 8, 9]])[0].token_ids
    cases: list[dict[str, object]] = [
        {"temperature": 1e-300, "seed": 1},  # scaled logits would overflow to inf - inf without the shift
        {"temperature": 1.0, "top_p": 1e-300, "seed": 2},  # below float32's smallest: only the top token stays
        {"temperature": 1.0, "top_k": 1, "seed": SEED_MAX},  # the largest seed manual_seed takes
    ]
    for sampling in cases:
        assert llm.generate([[7, 8, 9]], sampling)[0].token_ids == greedy, sampling
    sampled = llm.generate([[7, 8, 9]], {"temperature": 1e300, "seed": 0, "max_tokens": 8})[0]
    assert len(sampled.token_ids) == 8


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("seed=-1", "seed: must be in [0, 18446744073709551615], got -1"),
        (f"seed={SEED_MAX + 1}", "seed: must be in [0, 18446744073709551615], got 18446744073709551616"),
        ("scheduler.max_batched_tokens=2147483648", "scheduler.max_batched_tokens: must be <= 2147483647, got "
         "2147483648"),
        ("scheduler.max_num_seqs=2147483648", "scheduler.max_num_seqs: must be <= 2147483647, got 2147483648"),
        ("cache.num_pages=2147483648", "cache.num_pages: must be <= 2147483647, got 2147483648"),
        ("cache.page_size=2147483648", "cache.page_size: must be <= 1073741824, got 2147483648"),
        ("model.max_position_embeddings=2147483648",
         "model.max_position_embeddings: must be <= 2147483647, got 2147483648"),
        ("executor.prefill_graph_max_tokens=2147483648",
         "executor.prefill_graph_max_tokens: must be <= 2147483647, got 2147483648"),
        ("executor.buckets=[1,2147483648]", "executor.buckets: element 1 must be <= 2147483647, got 2147483648"),
        (f"sampling.max_tokens={10**400}", None),  # no upper bound: generation stops at the context's end
    ],
)
def test_numeric_fields_have_the_bounds_torch_and_int32_metadata_take(override: str, line: str | None) -> None:
    if line is None:
        assert load_config([override]).sampling.max_tokens == 10**400
        return
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert line in e.value.lines()


@pytest.mark.parametrize(
    ("cache", "field"),
    [(CacheArgs(kv_size_gb=1e6), "cache.kv_size_gb"), (CacheArgs(num_pages=2**31 - 1), "cache.num_pages")],
)
def test_a_kv_cache_larger_than_memory_is_one_line_naming_the_field(llm: LLM, cache: CacheArgs, field: str) -> None:
    with pytest.raises(ValueError) as e:
        LLM(config(llm.engine.runner.checkpoint_dir or "", cache=cache))
    message = str(e.value)
    assert message.startswith(f"{field}: ") and len(message.splitlines()) == 1
    assert "GiB of available host memory" in message and message.endswith(f"lower {field}")


# -- `xrt run`: the same refusals as exit status 2 and one line, naming where the prompt was written -----------


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    rc = xrt_main(["run", "device=cpu", "cache.num_pages=64", "sampling.max_tokens=2", *args])
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.strip().splitlines() if not ln.startswith("[xrt] ")]  # log lines aside
    return rc, errors, captured.out


def test_cli_too_long_prompt(xrt_cache_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, out = run(["prompt=" + " ".join(["word"] * 1100)], capsys)
    assert rc == 2 and out == ""
    assert err == [
        "error: prompt: prompt has 2200 tokens; model.max_model_len=1024 leaves no room to generate "
        "(at most 1023 prompt tokens)"
    ]


def test_cli_kv_cache_larger_than_memory(xrt_cache_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, _ = run(["cache.num_pages=0", "cache.kv_size_gb=1000000"], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: cache.kv_size_gb: 1000000.0 GB of KV cache (")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"prompt": "ok"}\n{"prompt": "a\\ud800"}\n',
         "line 2: not valid Unicode: lone surrogate '\\ud800' at character 1"),
        (b'{"prompt": "ok"}\n{"prompt_token_ids": [1, 5000]}\n',
         "line 2: token ids must be integers in [0, 2048), got 5000 at position 1"),
        (b'{"prompt": "ok"}\n\n{"prompt": "bad \xff"}\n', "line 3: not UTF-8 text (byte 0xff at character 16)"),
    ],
)
def test_cli_bad_prompt_in_a_file_names_its_line(xrt_cache_dir: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str], content: bytes,
                                                 message: str) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    rc, err, out = run([f"prompts_file={path}"], capsys)
    assert rc == 2 and out == "" and err == [f"error: prompts_file: {path} {message}"]


# -- any input: outputs, or RequestError on one line with nothing queued ----------------------------------------

def _mostly(common: st.SearchStrategy, rare: st.SearchStrategy, p: float = 0.75) -> st.SearchStrategy:
    """common with probability ~p: one_of would flatten nested one_ofs, weighting every junk branch alike."""
    return st.floats(0.0, 1.0).flatmap(lambda x: common if x < p else rare)


_junk = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=3), st.text(max_size=3),
    st.lists(st.integers(-2, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
_token = st.one_of(st.integers(0, VOCAB - 1), st.integers(-3, VOCAB + 3), _junk)
_good_prompt = st.one_of(st.text(min_size=1, max_size=12), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6))
_bad_prompt = st.one_of(
    st.sampled_from(["\ud800", "ok\udfff", "", [], [[]]]),
    st.lists(_token, max_size=6),
    st.lists(st.integers(0, 50), min_size=58, max_size=66),  # around max_model_len: some run, some are refused
    _junk,
)
_prompt = _mostly(_good_prompt, _bad_prompt)
_prompts = _mostly(st.one_of(_prompt, st.lists(_prompt, max_size=4), st.tuples(_prompt, _prompt)), _junk, 0.9)
_good_sampling = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0.0, 2.0), "top_k": st.integers(0, 50), "top_p": st.floats(0.01, 1.0),
    "max_tokens": st.integers(1, 4), "seed": st.integers(0, SEED_MAX), "ignore_eos": st.booleans(),
    "stop": st.lists(st.text(max_size=3), max_size=2),
})
_field = st.sampled_from([a.name for a in attrs.fields(SamplingArgs)] + ["bogus"])
_any_value = st.one_of(st.integers(0, 4), st.floats(0.01, 1.0), st.booleans(), st.lists(st.text(max_size=2)), _junk)
_one_sampling = _mostly(
    st.one_of(st.none(), _good_sampling, st.builds(SamplingArgs, max_tokens=st.integers(1, 4))),
    st.one_of(st.dictionaries(_field, _any_value, max_size=3), _junk),
)


def _count(prompts: object) -> int:
    """How many prompts generate sees: one bare prompt (text, or a flat list of token ids), else each item."""
    if isinstance(prompts, str):
        return 1
    assert isinstance(prompts, (list, tuple))
    flat = prompts and not any(isinstance(p, (str, list, tuple)) for p in prompts)
    return 1 if flat else len(prompts)


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[object, object]:
    prompts = draw(_prompts)
    n = _count(prompts) if isinstance(prompts, (str, list, tuple)) else 1
    per_prompt = st.lists(_one_sampling, min_size=n, max_size=n)
    return prompts, draw(_mostly(st.one_of(_one_sampling, per_prompt), st.lists(_one_sampling, max_size=4), 0.9))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(inputs=_inputs())
def test_any_input_gives_outputs_or_one_refusal_line_and_an_empty_engine(
    llm: LLM, inputs: tuple[object, object]
) -> None:
    prompts, sampling = inputs
    try:
        outs = llm.generate(prompts, sampling, use_tqdm=False)  # type: ignore[arg-type]
    except RequestError as e:
        message = str(e)
        assert message and len(message.splitlines()) == 1 and message.isprintable()
        assert not llm.engine.has_unfinished()
        (again,) = llm.generate([[1, 2, 3]], {"max_tokens": 2})
        assert again.prompt_token_ids == [1, 2, 3] and len(again.token_ids) == 2
        return
    assert len(outs) == _count(prompts) and all(isinstance(o, RequestOutput) for o in outs)
    assert all(o.finish_reason in ("stop", "length", "context_length") for o in outs)
    assert not llm.engine.has_unfinished()
