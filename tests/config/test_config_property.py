"""Property: any overrides give either a valid config (that round-trips and fits its JSON Schema)
or one clean ConfigError, never another exception."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
jsonschema = pytest.importorskip("jsonschema")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from xrt.config import XrtConfig  # noqa: E402
from xrt.config.compose import group_options, load_config  # noqa: E402
from xrt.reflect import ConfigError, build, json_schema, to_dict, walk  # noqa: E402
from xrt.reflect.types import is_enum, optional_inner  # noqa: E402

LEAVES = list(walk(XrtConfig))
PATHS = [f.path for f in LEAVES] + ["model.hiden_size", "nope", "cache.l1", "cache.l1.size_gb.x", "bench"]
GROUPS = group_options()
SCHEMA = json_schema(XrtConfig)


def enum_values() -> list[str]:
    out = []
    for f in LEAVES:
        tp = optional_inner(f.type) or f.type
        if is_enum(tp):
            out += [str(m.value) for m in tp]
    return out


scalars = st.one_of(
    st.integers(-3, 5000).map(str),
    st.sampled_from(["0", "1", "16", "-1", "0.5", "1e-6", "2.5", "true", "false", "null", "inf", "nan"]),
    st.sampled_from(enum_values()),
    st.text(alphabet="ab=,[]{}$'\" :.+~-_0", max_size=8),
)
values = st.one_of(scalars, st.lists(st.integers(-2, 300).map(str), max_size=4).map(lambda xs: f"[{','.join(xs)}]"))
field_override = st.builds(lambda plus, p, v: f"{plus}{p}={v}", st.sampled_from(["", "", "+", "++"]),
                           st.sampled_from(PATHS), values)
group_override = st.sampled_from([f"{g}={o}" for g, opts in sorted(GROUPS.items()) for o in opts]) | st.builds(
    lambda g, o: f"{g}={o}", st.sampled_from(sorted(GROUPS)), st.sampled_from(["nope", "tp3", "Eager", "qwen3 "]))


def typed_value(tp: object) -> st.SearchStrategy[str]:
    """Values of the field's own type, mostly in range, so many examples compose."""
    tp = optional_inner(tp) or tp
    if is_enum(tp):
        return st.sampled_from([str(m.value) for m in tp])
    if tp is bool:
        return st.sampled_from(["true", "false"])
    if tp is int:
        return st.sampled_from(["0", "1", "2", "4", "8", "16", "64", "256", "1024"])
    if tp is float:
        return st.sampled_from(["0.1", "0.5", "1.0", "2.0"])
    if tp is str:
        return st.sampled_from(["x", "abc", "'a b'"])
    return st.sampled_from(["[]", "[1,2]", "{}"])


typed_override = st.sampled_from(LEAVES).flatmap(lambda f: typed_value(f.type).map(lambda v: f"{f.path}={v}"))
overrides = st.lists(st.one_of(field_override, group_override, typed_override, typed_override), max_size=5)


def assert_valid(cfg: XrtConfig) -> None:
    dumped = to_dict(cfg)
    assert build(XrtConfig, dumped) == cfg
    jsonschema.validate(dumped, SCHEMA)


def assert_clean(e: ConfigError) -> None:
    assert e.problems
    for path, message in e.problems:
        assert isinstance(path, str) and isinstance(message, str) and message
        assert "\n" not in path + message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides)
def test_random_overrides_give_a_valid_config_or_a_clean_error(ovr: list[str]) -> None:
    try:
        cfg = load_config(ovr)
    except ConfigError as e:
        assert_clean(e)
    else:
        assert_valid(cfg)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 5000) | st.floats(allow_nan=True) | st.text(max_size=6)
    | st.sampled_from(enum_values()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["l1", "size_gb", "x"]), inner,
                                                                max_size=2),
    max_leaves=6,
)


@st.composite
def nested_mappings(draw: st.DrawFn) -> dict:
    out: dict = {}
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=6)):
        node = out
        *head, last = path.split(".")
        for part in head:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = node[part] = {}
            node = nxt
        node[last] = draw(json_values)
    return out


@settings(max_examples=300, deadline=None)
@given(nested_mappings())
def test_random_mappings_build_or_fail_cleanly(mapping: dict) -> None:
    try:
        cfg = build(XrtConfig, mapping)
    except ConfigError as e:
        assert_clean(e)
    else:
        assert_valid(cfg)
