"""Prompts as users type them: string fields compose to the text given (xrt.config.verbatim), Hydra's quoting
still works, -m still sweeps, and the prompt can be a positional argument or stdin (xrt.cli.prompt_args)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from xrt.cli.main import main
from xrt.config import XrtConfig
from xrt.config.compose import compose_overrides, load_config
from xrt.config.sweep import plan_sweep
from xrt.config.verbatim import looks_quoted, string_fields
from xrt.reflect import ConfigError, walk

REPO = Path(__file__).resolve().parents[2]


def xrt(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("XRT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "xrt", *args], cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=120)


def cli(*args: str) -> tuple[int, str, str]:
    """`python -m xrt ...` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def shown(*args: str) -> dict:
    rc, out, err = cli("config", "show", "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def shown_jobs(*args: str) -> list[dict]:
    """`config show --json -m ...`: one config per job (each printed after a `# job i/n: ...` line)."""
    rc, out, err = cli("config", "show", "--json", "-m", *args)
    assert rc == 0, err
    return [json.loads(block.split("\n", 1)[1]) for block in out.split("# job ")[1:]]


def problems(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    return dict(e.value.problems)


LITERAL = [  # (override, field, composed value): the cases first
    ("prompt=Hello, world", "prompt", "Hello, world"),
    ("prompt=Hi!", "prompt", "Hi!"),
    ("prompt=It's fine", "prompt", "It's fine"),
    ("prompt=3.10", "prompt", "3.10"),
    ("output=2.50", "output", "2.50"),
    ("prompt=${model.name}", "prompt", "${model.name}"),
    ("prompt=null", "prompt", "null"),
    ("prompt=true", "prompt", "true"),
    ("prompt=[a, b]", "prompt", "[a, b]"),
    ("prompt=1+1=2?", "prompt", "1+1=2?"),
    ("prompt= two  spaces ", "prompt", " two  spaces "),
    ("prompt=é\n\t#\\", "prompt", "é\n\t#\\"),
    ("prompt=", "prompt", ""),
    ("++prompt=x,y", "prompt", "x,y"),
    ("model.name=[oops", "model.name", "[oops"),
    ("bench.out_dir=out, v2", "bench.out_dir", "out, v2"),
    ("prompts_file=a'b.txt", "prompts_file", "a'b.txt"),
]
HYDRA_QUOTED = [  # Hydra's own quoting keeps working: one quoted value follows Hydra's rules
    ("prompt='Hello, world'", "Hello, world"),
    ('prompt="Hello, world"', "Hello, world"),
    ("prompt='It\\'s fine'", "It's fine"),
    ("prompt='3.10'", "3.10"),
    ("prompt='${model.name}'", "qwen3-tiny"),  # interpolation only inside Hydra quotes
]


def value_of(cfg: object, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("override,field,expected", LITERAL, ids=[c[0] for c in LITERAL])
def test_string_fields_compose_to_the_text_typed(override: str, field: str, expected: str) -> None:
    assert value_of(load_config([override]), field) == expected


@pytest.mark.parametrize("override,expected", HYDRA_QUOTED, ids=[c[0] for c in HYDRA_QUOTED])
def test_hydra_quoting_still_works(override: str, expected: str) -> None:
    assert load_config([override]).prompt == expected


def test_the_string_fields_are_the_schemas() -> None:
    assert string_fields() == {f.path for f in walk(XrtConfig) if f.type is str}
    assert {"prompt", "output", "prompts_file", "model.name", "model.path", "bench.out_dir"} <= string_fields()


def test_other_fields_keep_hydras_grammar() -> None:
    assert problems(["seed=3.10"])["seed"] == "must be an integer, got 3.1"
    assert "add -m" in problems(["sampling.temperature=0,0.8"])["sampling.temperature"]
    assert load_config(["sampling.stop=[a,b]"]).sampling.stop == ["a", "b"]


def test_a_quoted_value_hydra_cannot_read_is_refused_naming_the_field() -> None:
    message = problems(["prompt='It's fine'"])["prompt"]
    assert message.startswith("cannot parse the quoted value 'It's fine'") and "\\'" in message
    assert "add -m" in problems(["prompt='a','b'"])["prompt"]  # a quoted sweep without -m


@pytest.mark.parametrize("overrides,prompts", [
    (["prompt=a,b"], ["a", "b"]),
    (["prompt='Hello, world',Bye"], ["Hello, world", "Bye"]),
    (["prompt=3.10,2.50"], ["3.10", "2.50"]),
    (["prompt=true,null"], ["true", "null"]),
    (["prompt=a\\,b,c"], ["a,b", "c"]),
    (["prompt='It\\'s',x"], ["It's", "x"]),
    (["prompt=Hi!,It's, 3.10"], ["Hi!", "It's", "3.10"]),  # Hydra cannot parse this; the commas still sweep
    (["prompt=Hello, world"], ["Hello", "world"]),  # the documented price of -m
    (["prompt=range(1,3)"], ["1", "2"]),  # Hydra's sweep functions keep their meaning
    (["prompt=f(x),g"], ["f(x)", "g"]),  # ... and other text is text
    (["prompt=Hi!"], ["Hi!"]),  # no comma: one literal job
    (["prompt='Hello, world'"], ["Hello, world"]),
])
def test_with_m_commas_sweep_unless_quoted(overrides: list[str], prompts: list[str]) -> None:
    # Hydra's basic sweeper makes the jobs from the overrides rewritten for it (`sweep_overrides`).
    jobs = plan_sweep(overrides, "config", "run").jobs
    assert [compose_overrides(job, "config").prompt for job in jobs] == prompts


def test_sweep_order_is_the_order_given() -> None:
    jobs = plan_sweep(["seed=1,2", "output=o.jsonl", "prompt=a,b"], "config", "run").jobs
    assert jobs == [["seed=1", "output='o.jsonl'", "prompt='a'"], ["seed=1", "output='o.jsonl'", "prompt='b'"],
                    ["seed=2", "output='o.jsonl'", "prompt='a'"], ["seed=2", "output='o.jsonl'", "prompt='b'"]]


def test_config_show_keeps_the_text_and_multirun_labels_the_jobs() -> None:
    assert shown("prompt=Hello, world")["prompt"] == "Hello, world"
    assert shown("Hello, world")["prompt"] == "Hello, world"  # positional
    assert [job["prompt"] for job in shown_jobs("prompt=3.10")] == ["3.10"]
    rc, out, err = cli("config", "validate", "-m", "prompt=Hi!,It's")
    assert (rc, out.splitlines()) == (0, ["job #0 of 2: prompt=Hi!: ok", "job #1 of 2: prompt=It's: ok"]), err


def test_a_positional_prompt_never_sweeps() -> None:
    jobs = shown_jobs("Hello, world", "seed=1,2")
    assert [(job["prompt"], job["seed"]) for job in jobs] == [("Hello, world", 1), ("Hello, world", 2)]


@pytest.mark.parametrize("args,text", [
    (("run", "Hello", "world"), "one prompt expected, got 'Hello' and 'world'"),
    (("run", "Hello", "prompt=Bye"), "prompt given twice"),
    (("run", "sampling.max_tokens"), "'sampling.max_tokens' is a field: write sampling.max_tokens=VALUE"),
    (("config", "schema", "Hello"), "takes no overrides"),
])
def test_positional_mistakes_are_one_usage_line(args: tuple[str, ...], text: str) -> None:
    rc, out, err = cli(*args)
    assert rc == 2 and out == "" and err.startswith("error: ") and text in err.splitlines()[0]


def test_prompt_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("It's fine, ${x}!\n\n"))
    assert shown("prompt=-")["prompt"] == "It's fine, ${x}!"
    monkeypatch.setattr(sys, "stdin", io.StringIO("a,b\n"))
    assert [job["prompt"] for job in shown_jobs("-")] == ["a,b"]  # stdin never sweeps
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    rc, _, err = cli("config", "show", "prompt=-")
    assert rc == 2 and err.strip() == ("error: prompt: read from stdin (-), which was empty; pipe the prompt in "
                                       "or give prompt=TEXT")


def test_help_states_the_rule() -> None:
    rc, out, _ = cli("--help")
    for text in ("take the text as typed", "prompt=Hello, world", "with -m each comma separates choices",
                 "('Hello, world',Bye)", 'run "Hello, world"', "prompt=-", "o.0.jsonl, o.1.jsonl"):
        assert text in out, text


def test_load_config_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError, match=r"got the string 'a=b'; write load_config\(\['a=b'\]\)"):
        load_config("a=b")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got 3"):
        load_config([3])  # type: ignore[list-item]


def test_run_a_positional_prompt_end_to_end(tiny_checkpoint: str, tmp_path: Path) -> None:
    r = xrt("run", "Hello, world", "sampling.max_tokens=2", "output=o.jsonl", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[0] 'Hello, world' -> " in r.stdout
    (record,) = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert record["prompt"] == "Hello, world" and len(record["token_ids"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl"]


def test_run_a_prompt_from_stdin(tiny_checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("It's fine, 3.10!\n"))
    rc, out, err = cli("run", "-", "sampling.max_tokens=2")
    assert rc == 0, err
    assert "[0] \"It's fine, 3.10!\" -> " in out


# Fuzz: any text on a string field composes to exactly that text (or, when it looks Hydra-quoted, to Hydra's
# reading or one clean error); random overrides never end in a traceback or touch a file.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
# Pieces of Hydra's and OmegaConf's syntax, so that escapes, quotes and interpolations meet often.
hydraish = st.lists(st.sampled_from(["${", "}", "model.name", "\\", "'", '"', ",", " ", "\n", "=", "[", "]", "(",
                                     ")", "!", "#", "3.10", "null", "a", "range(1,3)", "~", "+"]),
                    max_size=8).map("".join)
keys = st.sampled_from(sorted(string_fields()) + [f.path for f in walk(XrtConfig)][:12]
                       + ["nope", "model.hiden_size", "+prompt", "++output", "~prompt"])


FUZZED = sorted(string_fields() - {"model.path"})  # model.path would read a checkpoint
# prompt and prompts_file together are refused whatever their text (one of them is dropped otherwise), so each
# example composes twice, each time without one of them.
APART = ("prompt", "prompts_file")


@settings(max_examples=20, deadline=None)
@given(st.lists(st.one_of(texts, hydraish), min_size=len(FUZZED), max_size=len(FUZZED)))
def test_fuzz_string_fields_compose_to_the_text(values: list[str]) -> None:
    # Every string field at once: one composition checks every text but one.
    for left_out in APART:
        given = {field: text for field, text in zip(FUZZED, values, strict=True) if field != left_out}
        try:
            cfg = load_config([f"{field}={text}" for field, text in given.items()])
        except ConfigError as e:
            refused = {path for path, _ in e.problems}
            # only a value written in Hydra quotes can be refused, and the error names its field
            assert refused and all(looks_quoted(given[path]) for path in refused), e
            continue
        for field, text in given.items():
            if not looks_quoted(text):
                assert value_of(cfg, field) == text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(keys, st.one_of(texts, hydraish)), max_size=4), st.booleans(), st.sampled_from(
    ["show", "validate"]))
@example([("bench.out_dir", "range(1,3),model.name")], True, "show")  # a sweep Hydra parses but cannot expand
def test_fuzz_config_overrides_exit_0_or_2_and_touch_nothing(pairs: list[tuple[str, str]], multirun: bool,
                                                             action: str) -> None:
    overrides = [key if key.startswith("~") else f"{key}={value}" for key, value in pairs]
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        rc, out, err = cli("config", action, *(["-m"] if multirun else []), "--", *overrides)
        assert rc in (0, 2), err
        assert "Traceback" not in err and (rc == 0 or err.startswith("error: "))
        assert os.listdir(d) == []


@settings(max_examples=25, deadline=None)
@given(st.one_of(texts, hydraish).filter(lambda t: not t.startswith(("/", "~")) and ".." not in t), texts)
def test_fuzz_run_outputs_and_prompts_stop_cleanly_and_write_nothing(output: str, prompt: str) -> None:
    # prompts_file is missing, so the run stops before loading a model: whatever `output` is, the path checks
    # or the prompts_file check answer with exit 2, and nothing is created.
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        rc, out, err = cli("run", "device=cpu", "prompts_file=missing.txt", "--", f"output={output}",
                           f"prompt={prompt}")
        assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err
        assert os.listdir(d) == []
