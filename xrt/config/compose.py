"""Compose an `XrtConfig` from conf/ and command-line overrides with Hydra's Compose API.

Hydra only merges YAML and parses overrides here: no working-directory change, no `outputs/`,
no logging setup. The merged dict is then validated by `xrt.reflect.build`, so every problem
(Hydra's or ours) comes out as one `ConfigError` line naming its dotted field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xrt.checkpoint.errors import CheckpointError
from xrt.checkpoint.hub import checkpoint_dir, checkpoint_name
from xrt.config import ModelArgs, XrtConfig
from xrt.config.shape_keys import missing_message, missing_shape_keys
from xrt.config.verbatim import hydra_parser, literal_overrides
from xrt.reflect import ConfigError, Problem, build, find, hf_values, to_dict, walk
from xrt.reflect.suggest import closest
from xrt.reflect.types import dict_types, field_types, is_config_class, list_item

SCHEMA_NODE = "xrt_schema"
UNBUILT = "_unbuilt"
# In _fill_from_checkpoint's {field: file}: a shape field config.json lacks.
MISSING = ""


def conf_dir() -> Path:
    """conf/ as shipped in the wheel (xrt/conf) or at the top of a source checkout; XRT_CONF_DIR wins."""
    package = Path(__file__).resolve().parents[1]
    candidates = [package / "conf", package.parent / "conf"]
    given = os.environ.get("XRT_CONF_DIR")
    if given:
        # Set, it is the conf/ used: falling back to the shipped one would run a config the user did not mean.
        if not (Path(given) / "config.yaml").is_file():
            what = "does not exist" if not Path(given).exists() else "holds no config.yaml"
            raise ConfigError([("", f"XRT_CONF_DIR={given}: {what}; point it at a conf/ directory (with "
                                    "config.yaml) or unset it")])
        return Path(given)
    for c in candidates:
        if (c / "config.yaml").is_file():
            return c
    raise ConfigError([("", f"cannot find xrt's conf/ directory (looked in {', '.join(map(str, candidates))})")])


def group_options(conf: Path | None = None) -> dict[str, list[str]]:
    """{group: [options]} from the conf/ folders, e.g. {"model": ["qwen3", ...], ...}."""
    conf = conf or conf_dir()
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(conf.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def unbuilt_options(conf: Path | None = None) -> set[tuple[str, str]]:
    """(group, option) pairs whose yaml marks a part not built yet (`_unbuilt: ...`, see `_reject_unbuilt`)."""
    conf = conf or conf_dir()
    return {
        (group, option)
        for group, options in group_options(conf).items()
        for option in options
        if any(ln.startswith(f"{UNBUILT}:") for ln in (conf / group / f"{option}.yaml").read_text().splitlines())
    }


def config_names(conf: Path | None = None) -> list[str]:
    """Primary configs selectable with --config-name (config, bench)."""
    return sorted(p.stem for p in (conf or conf_dir()).glob("*.yaml"))


def load_config(overrides: list[str] | None = None, *, config_name: str = "config") -> XrtConfig:
    """The validated `XrtConfig` for these Hydra overrides, e.g. `["model=qwen3-0.6b", "executor=cudagraph",
    "sampling.max_tokens=32"]`: conf/'s defaults and groups, then the overrides, then (with model.path set) the
    checkpoint's config.json. Library API, exported as `xrt.load_config`; the CLI composes through it too.
    `config_name`: the primary config in conf/ ("config", or "bench" for the benchmark protocol). Raises
    `ConfigError` listing every problem with its dotted field. Changes no global state (working directory,
    logging): `log_level` and the executor's switches apply when a runner is built from the config.
    String fields take their text literally (`prompt=Hello, world`); see `xrt.config.verbatim`."""
    problems: list[Problem] = []
    return compose_overrides(literal_overrides(_as_list(overrides), problems), config_name, problems)


def compose_overrides(overrides: list[str], config_name: str, problems: list[Problem] | None = None) -> XrtConfig:
    """`load_config` for overrides already in Hydra's syntax (string fields quoted as `literal_overrides` or a
    sweeper writes them): the jobs of a multirun. `problems`: found earlier, reported with these."""
    conf = conf_dir()
    problems = list(problems or [])
    parsed = parse_overrides(overrides, problems)
    rewritten = precheck(parsed, group_options(conf), config_names(conf), config_name, problems)
    # Unknown keys and sweeps are dropped and the rest still checked, so one run reports every
    # mistake. A bad group option or unparsable value would change what the rest is checked against.
    if not problems or all(m.startswith(("unknown field", "is a sweep")) for _, m in problems):
        try:
            cfg = config_from_raw(_compose(conf, config_name, rewritten), explicit_keys(parsed))
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def config_from_raw(raw: dict[str, Any], explicit: set[str]) -> XrtConfig:
    """The validated `XrtConfig` from a composed dict (Hydra's compose API here, a multirun job's config in
    `xrt.cli.multirun`): unbuilt parts refused, the checkpoint's shape filled in, then `build`. `explicit`: the
    keys set on the command line (they win over config.json). Raises `ConfigError` with every problem."""
    found: list[Problem] = []
    from_file: dict[str, str] = {}
    try:
        _reject_unbuilt(raw)
        from_file = _fill_from_checkpoint(raw, explicit, found)
        cfg = build(XrtConfig, raw)
    except ConfigError as e:
        found.extend(_blame_file(e.problems, from_file))
    if not found and "prompt" in explicit and cfg.prompts_file:
        # run reads prompts_file when it is set: a prompt given as well would be dropped without a word.
        found.append(("prompt", f"given together with prompts_file={cfg.prompts_file!r}, whose lines are the prompts; "
                                "give one of them"))
    if found:
        raise ConfigError(found)
    return cfg


def explicit_keys(parsed: list[Any]) -> set[str]:
    """The keys (and groups) these parsed overrides set."""
    return {o.key_or_group for o in parsed if not o.is_delete()}


def _as_list(overrides: list[str] | None) -> list[str]:
    # A bare string would be iterated character by character: refuse it rather than guess at a split.
    if isinstance(overrides, str):
        raise TypeError(f"load_config: overrides must be a list of 'key=value' strings, got the string "
                        f"{overrides!r}; write load_config([{overrides!r}])")
    out = list(overrides or [])
    wrong = [o for o in out if not isinstance(o, str)]
    if wrong:
        raise TypeError(f"load_config: overrides must be 'key=value' strings, got {wrong[0]!r}")
    return out


def parse_overrides(overrides: list[str], problems: list[Problem]) -> list[Any]:
    """Hydra `Override` objects; every unparsable override is left out and reported, naming its key."""
    from hydra.errors import HydraException

    parsed = []
    for s in overrides:
        try:
            parsed.append(hydra_parser().parse_override(s))
        except HydraException as e:
            key = s.split("=", 1)[0].lstrip("+~").strip() or s
            value = s.split("=", 1)[1] if "=" in s else ""
            what = f"cannot parse {s!r}" if "=" not in s else f"cannot parse value {value!r}"
            hint = "expected key=value" if "=" not in s else "quote values with spaces or special characters"
            problems.append((key, f"{what} ({_first_line(str(e))}); {hint}"))
    return parsed


def precheck(
    parsed: list[Any], groups: dict[str, list[str]], names: list[str], config_name: str, problems: list[Problem],
    *, sweeps: bool = False,
) -> list[str]:
    """Check every override against the schema and the group options before Hydra sees them, so all
    mistakes are reported at once with a suggestion; bad overrides are left out. Returns the overrides
    to hand to Hydra: entries of dict fields (and `+` on existing fields) become `++`, which sets or adds.
    `sweeps` (a multirun): sweep overrides are checked as the others (each option of a group sweep) and kept;
    otherwise they are reported (add -m). Hydra's own settings (`hydra.*`, `hydra/launcher=...`) pass as given."""
    if config_name not in names:
        problems.append(("--config-name", f"no config {config_name!r}; available: {', '.join(names)}"))
    out: list[str] = []
    for o in parsed:
        key, line = o.key_or_group, o.input_line
        value_text = line.split("=", 1)[1] if "=" in line else ""
        if o.package is not None or key == "hydra" or o.is_hydra_override():
            out.append(line)
            continue
        sweep = o.is_sweep_override()
        if sweep and not sweeps:
            info = None if key in groups else find(XrtConfig, key)
            as_list = f", or write {key}=[{value_text}] for a list" if info and list_item(info.type) else ""
            problems.append((key, f"is a sweep ({value_text}): add -m to run one job per value{as_list}"))
            continue
        if key in groups:
            if not o.is_delete():
                for value in _group_choices(o) if sweep else [o.value()]:
                    problems.extend(_check_option(key, value, groups[key]))
            out.append(line)
            continue
        where, message = _locate(key)
        if where == "unknown":
            problems.append((key, message))
        elif o.is_delete():
            out.append(line)
        elif where == "entry" or o.is_add():
            out.append("++" + line.lstrip("+"))
        else:
            out.append(line)
    return out


def _group_choices(o: Any) -> list[Any]:
    """The options a group sweep names (a glob's patterns match options by construction, so none are checked)."""
    if o.is_choice_sweep() and o.value_type.name != "GLOB_CHOICE_SWEEP":
        return list(o.sweep_iterator())
    return []


def _check_option(group: str, value: Any, options: list[str]) -> list[Problem]:
    if isinstance(value, str) and value in options:
        return []
    hint = closest(str(value), options)
    suggestion = f"; did you mean {hint}?" if hint else ""
    return [(group, f"no option {value!r} in group {group!r}; available: {', '.join(options)}{suggestion}")]


def _locate(key: str) -> tuple[str, str]:
    """("field" | "entry" | "unknown", message) for a dotted key: a schema field (or group of fields),
    an entry inside a dict field, or unknown (with a 'did you mean')."""
    cls: Any = XrtConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        types = field_types(cls)
        if part not in types:
            return "unknown", _unknown_message(key, ".".join(parts[:i]), list(types))
        tp = types[part]
        rest = parts[i + 1:]
        if not rest:
            return "field", ""
        if is_config_class(tp):
            cls = tp
            continue
        if dict_types(tp) is not None:
            return "entry", ""
        if list_item(tp) is not None and len(rest) == 1 and rest[0].isdigit():
            return "field", ""
        return "unknown", f"unknown field: {'.'.join(parts[: i + 1])} is a single value, not a group"
    return "field", ""


def _unknown_message(key: str, parent: str, siblings: list[str]) -> str:
    paths = [f.path for f in walk(XrtConfig, groups=True)]
    hit = closest(key, paths)
    if hit is None:
        leaf = key.rsplit(".", 1)[-1]
        same = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]
        hit = same[0] if same else None
    if hit is None and parent:
        hit = closest(f"{parent}.{key.rsplit('.', 1)[-1]}", [f"{parent}.{s}" for s in siblings])
    if hit is not None:
        return f"unknown field; did you mean {hit}?"
    where = f"in {parent}" if parent else "at the top level"
    return f"unknown field; fields {where}: {', '.join(siblings)}"


def _compose(conf: Path, config_name: str, overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from xrt.config.hydra_errors import hydra_problems

    ConfigStore.instance().store(name=SCHEMA_NODE, node=to_dict(XrtConfig()))
    # Called from inside someone's own Hydra app, Hydra is already initialized: step aside and restore it.
    outer = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    if outer is not None:
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="xrt"):
            cfg = compose(config_name=config_name, overrides=overrides)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException, ValueError, KeyError) as e:
        raise ConfigError(hydra_problems(e, overrides)) from e
    finally:
        if outer is not None:
            restore_gh_from_backup(outer)
    assert isinstance(raw, dict)
    return raw


def _reject_unbuilt(raw: dict[str, Any]) -> None:
    """A group option for a part not built yet (conf/cache/l1_l2.yaml) holds `_unbuilt: "<why>"` in place of
    its fields: selecting it stops with that line rather than running without the part."""
    found = [str(s.pop(UNBUILT)) for s in raw.values() if isinstance(s, dict) and UNBUILT in s]
    if found:
        raise ConfigError([("", message) for message in found])


def _fill_from_checkpoint(raw: dict[str, Any], explicit: set[str], problems: list[Problem]) -> dict[str, str]:
    """When model.path is set, the checkpoint's config.json gives the shape fields (HF keys from ModelArgs'
    metadata) and the checkpoint names the model (its Hub id or directory name); a field set explicitly on the
    command line still wins. A shape key missing from config.json is an error (not the group's value, silently);
    other missing keys take transformers' defaults. max_model_len, unless set there, becomes the composed value
    capped by the checkpoint's max_position_embeddings (a 512-position checkpoint under model=qwen3 serves 512
    tokens, not an error about a value the user never wrote). model.path may be a Hub id in the local Hugging
    Face cache; it becomes the snapshot's directory. Missing shape keys are appended to `problems`. Returns
    {dotted field: config.json} for the fields read from the file, so problems with their values can name it."""
    model = raw.get("model")
    if not isinstance(model, dict) or not model.get("path"):
        return {}
    given = str(model["path"])
    try:
        path = checkpoint_dir(given)
    except CheckpointError as e:
        raise ConfigError([("model.path", str(e))]) from None
    model["path"] = path
    if "model.name" not in explicit:
        model["name"] = checkpoint_name(given, path)
    file = os.path.join(path, "config.json")
    data = _read_config_json(path)
    missing = missing_shape_keys(data, explicit)
    if missing:  # reported with any problems of the values that are there
        problems.append(("model.path", missing_message(file, missing)))
    present = hf_values(ModelArgs, data)
    # A missing field keeps the group's value; problems with it are not this checkpoint's (MISSING drops them).
    from_file: dict[str, str] = {f"model.{info.path}": MISSING for info in missing}
    for name, value in hf_values(ModelArgs, data, defaults=True).items():
        if f"model.{name}" in explicit:
            continue
        model[name] = value
        if name in present:
            from_file[f"model.{name}"] = file
    positions = model.get("max_position_embeddings")
    if "model.max_model_len" not in explicit and isinstance(positions, int) and isinstance(
        model.get("max_model_len"), int
    ):
        model["max_model_len"] = min(model["max_model_len"], positions)
    return from_file


def _blame_file(problems: list[Problem], from_file: dict[str, str]) -> list[Problem]:
    """Problems with values read from config.json (a bad type, a failed validator, a cross-field rule) say so;
    those of shape fields config.json lacks (already reported) are dropped."""
    out = []
    for path, message in problems:
        file = from_file.get(path)
        if file == MISSING:
            continue
        out.append((path, f"{message} (in {file})" if file and file not in message else message))
    return out


def _read_config_json(path: str) -> dict[str, Any]:
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ConfigError([("model.path", f"{file}: not found (an HF checkpoint directory holds config.json)")])
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError([("model.path", f"{file}: not valid JSON ({e.msg} at line {e.lineno})")]) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([("model.path", f"{file}: cannot read ({e})")]) from e
    if not isinstance(data, dict):
        raise ConfigError([("model.path", f"{file}: must hold a JSON object, got {type(data).__name__}")])
    return data


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


__all__ = [
    "compose_overrides", "conf_dir", "config_from_raw", "config_names", "explicit_keys", "group_options",
    "load_config", "parse_overrides", "precheck", "unbuilt_options",
]
