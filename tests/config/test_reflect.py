"""xrt.reflect on small classes of its own: it must know nothing of xrt's schema."""

from __future__ import annotations

import enum
import json

import attrs
import pytest

from xrt.reflect import (
    ConfigError,
    build,
    each,
    field,
    find,
    flat,
    from_hf,
    ge,
    gt,
    help_table,
    hf_values,
    in_range,
    json_schema,
    le,
    power_of_two,
    to_dict,
    to_json,
    to_yaml,
    walk,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.define
class Inner:
    size_gb: float = field(1.0, help="capacity", unit="GB", validator=ge(0))
    enabled: bool = field(False, help="on or off")
    params: dict[str, int] = field(factory=dict, help="extra")


@attrs.define
class Shape:
    width: int = field(8, help="width", hf="hidden_size", validator=gt(0))
    heads: int = field(2, help="heads", hf="num_heads", validator=gt(0))
    theta: float = field(10.0, help="rope base", hf=("rope_theta", "rope_parameters.rope_theta"))

    def check(self) -> list[tuple[str, str]]:
        if self.width % self.heads:
            return [("heads", f"must divide width={self.width}, got {self.heads}")]
        return []


@attrs.define
class Root:
    color: Color = field(Color.RED, help="a color")
    sizes: list[int] = field(factory=lambda: [1, 2], help="sizes", validator=each(ge(1)))
    ratio: float = field(0.5, help="ratio", validator=in_range(0.0, 1.0, lo_open=True))
    pages: int = field(16, help="pages", validator=power_of_two())
    limit: int = field(10, help="limit", validator=le(100))
    seed: int | None = field(None, help="seed")
    name: str = field("x", help="name")
    inner: Inner = field(factory=Inner, help="inner group")
    shape: Shape = field(factory=Shape, help="shape group")

    def check(self) -> list[tuple[str, str]]:
        if self.inner.enabled and self.limit < 5:
            return [("limit", "must be >= 5 when inner.enabled")]
        return []


def problems(mapping: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        build(Root, mapping)
    return e.value.problems


def test_walk_yields_dotted_paths_types_defaults_and_metadata() -> None:
    infos = {i.path: i for i in walk(Root)}
    assert list(infos)[:3] == ["color", "sizes", "ratio"]
    assert "inner.size_gb" in infos and "shape.theta" in infos and "inner" not in infos
    assert infos["inner.size_gb"].unit == "GB" and infos["inner.size_gb"].default == 1.0
    assert infos["shape.width"].hf_key == "hidden_size"
    assert infos["shape.theta"].hf == ("rope_theta", "rope_parameters.rope_theta")
    assert infos["sizes"].default == [1, 2] and infos["seed"].type == (int | None)
    assert [i.path for i in walk(Root, groups=True)].index("inner") < [i.path for i in walk(Root, groups=True)].index(
        "inner.size_gb"
    )
    assert find(Root, "inner.enabled").help == "on or off"
    assert find(Root, "inner.nope") is None and find(Root, "color.x") is None


def test_build_converts_types() -> None:
    r = build(
        Root,
        {"color": "BLUE", "sizes": 8, "ratio": "0.25", "pages": 32.0, "seed": "null", "name": 12,
         "inner": {"enabled": "yes", "params": {"a": "3"}}, "shape": {"width": "16"}},
    )
    assert r.color is Color.BLUE
    assert r.sizes == [8]  # a scalar for a list field becomes a one-element list
    assert r.ratio == 0.25 and r.pages == 32 and isinstance(r.pages, int)
    assert r.seed is None and r.name == "12"
    assert r.inner.enabled is True and r.inner.params == {"a": 3}
    assert r.shape.width == 16 and r.shape.heads == 2


def test_build_reports_every_problem_with_its_dotted_path() -> None:
    found = dict(
        problems(
            {"colr": "red", "color": "green", "sizes": [1, "x", 0], "ratio": 0, "pages": 12, "limit": 101,
             "seed": 1.5, "inner": {"size_gb": -1, "enabled": "maybe", "extra": 1}, "shape": 3}
        )
    )
    assert found["colr"] == "unknown field; did you mean color?"
    assert found["color"] == "must be one of red, blue, got 'green'"
    assert found["sizes[1]"] == "must be an integer, got 'x'"
    assert found["ratio"] == "must be in (0.0, 1.0], got 0"
    assert found["pages"] == "must be a power of two, got 12"
    assert found["limit"] == "must be <= 100, got 101"
    assert found["seed"] == "must be an integer, got 1.5"
    assert found["inner.size_gb"] == "must be >= 0, got -1"
    assert found["inner.enabled"] == "must be true or false, got 'maybe'"
    assert found["inner.extra"].startswith("unknown field")
    assert found["shape"].startswith("must be a group of fields")
    assert len(found) == 11


def test_error_text_is_one_line_per_problem() -> None:
    with pytest.raises(ConfigError) as e:
        build(Root, {"inner": {"size_gb": -1}, "limit": 1000})
    assert str(e.value).splitlines() == ["limit: must be <= 100, got 1000", "inner.size_gb: must be >= 0, got -1"]


def test_list_elements_are_validated() -> None:
    assert dict(problems({"sizes": [2, 0]}))["sizes"] == "element 1 must be >= 1, got 0"


def test_checks_run_with_parent_path_and_only_on_valid_fields() -> None:
    assert problems({"shape": {"width": 9, "heads": 2}}) == [("shape.heads", "must divide width=9, got 2")]
    assert problems({"inner": {"enabled": True}, "limit": 1}) == [("limit", "must be >= 5 when inner.enabled")]
    # heads=0 is a field error; the cross-field check (which would divide by zero) is not run.
    assert problems({"shape": {"heads": 0}}) == [("shape.heads", "must be > 0, got 0")]


def test_round_trip_dump_build() -> None:
    r = build(Root, {"color": "blue", "sizes": [3, 4], "seed": 7, "inner": {"params": {"k": 1}}})
    assert build(Root, to_dict(r)) == r
    d = to_dict(r)
    assert d["color"] == "blue" and d["inner"]["params"] == {"k": 1}
    assert json.loads(to_json(r)) == d
    import yaml

    assert yaml.safe_load(to_yaml(r)) == d
    assert build(Root, r) == r  # an instance is re-validated too


def test_json_schema_types_bounds_and_closed_objects() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    s = json_schema(Root)
    props = s["properties"]
    assert s["additionalProperties"] is False
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "a color", "default": "red"}
    assert props["sizes"]["items"] == {"type": "integer", "minimum": 1}
    assert props["ratio"]["exclusiveMinimum"] == 0.0 and props["ratio"]["maximum"] == 1.0
    assert props["limit"]["maximum"] == 100
    assert props["seed"]["anyOf"][1] == {"type": "null"}
    assert props["inner"]["properties"]["size_gb"]["description"] == "capacity [GB]"
    assert props["inner"]["properties"]["params"]["additionalProperties"] == {"type": "integer"}
    jsonschema.validate(to_dict(Root()), s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**to_dict(Root()), "bogus": 1}, s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**to_dict(Root()), "limit": 101}, s)


def test_help_table_lists_every_leaf() -> None:
    table = help_table(Root)
    lines = table.splitlines()
    assert lines[0].split() == ["field", "type", "default", "help"]
    assert len(lines) == 1 + len(list(walk(Root)))
    row = next(line for line in lines if line.startswith("inner.size_gb"))
    assert row.split()[:3] == ["inner.size_gb", "float", "1.0"] and "capacity [GB]" in row
    assert "red|blue" in table and "(HF: hidden_size)" in table


def test_from_hf_maps_keys_alternatives_and_keeps_the_rest() -> None:
    hf = {"hidden_size": 32, "num_heads": 4, "rope_parameters": {"rope_theta": 5e5}, "unrelated": 1}
    assert hf_values(Shape, hf) == {"width": 32, "heads": 4, "theta": 5e5}
    assert hf_values(Root, hf) == {"shape": {"width": 32, "heads": 4, "theta": 5e5}}
    s = from_hf(Shape, {"hidden_size": 12, "rope_theta": 7}, base={"heads": 3})
    assert s == Shape(width=12, heads=3, theta=7.0)
    with pytest.raises(ConfigError) as e:
        from_hf(Shape, {"hidden_size": 10, "num_heads": 4})
    assert e.value.problems == [("heads", "must divide width=10, got 4")]


def test_flat_gives_one_class_scalar_fields() -> None:
    r = Root()
    f = flat(r)
    assert "inner" not in f and "shape" not in f and f["color"] is Color.RED and f["sizes"] == [1, 2]
    assert flat(r, enums_as_values=True)["color"] == "red"
    assert flat(r.shape) == {"width": 8, "heads": 2, "theta": 10.0}
