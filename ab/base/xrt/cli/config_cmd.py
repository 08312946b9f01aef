"""`xrt config show|validate|schema|fields`: the composed config as YAML/JSON, a check, the JSON
Schema, or the reflected field table."""

from __future__ import annotations

import json

from xrt.config import XrtConfig
from xrt.reflect import help_table, json_schema, to_json, to_yaml

ACTIONS = {
    "show": "print the validated config as YAML (--json: as JSON)",
    "validate": "check the config; prints ok",
    "schema": "print the JSON Schema of the config",
    "fields": "print every field: dotted path, type, default, help",
}


def show(cfg: XrtConfig, *, as_json: bool = False) -> str:
    return to_json(cfg) if as_json else to_yaml(cfg).rstrip("\n")


def schema() -> str:
    return json.dumps(json_schema(XrtConfig), indent=2)


def fields() -> str:
    return help_table(XrtConfig)
