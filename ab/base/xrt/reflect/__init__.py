"""Generic reflection over attrs config classes (the Python analogue of xLLM's
PROPERTY/REFLECT_PROPERTIES). Knows nothing of xrt's own classes."""

from xrt.reflect.build import build
from xrt.reflect.dump import to_dict, to_json, to_plain, to_yaml
from xrt.reflect.errors import ConfigError, Problem
from xrt.reflect.field import field, help_of, hf_key_of, hf_keys_of, unit_of
from xrt.reflect.flat import flat
from xrt.reflect.help import help_rows, help_table
from xrt.reflect.hf import from_hf, hf_missing, hf_values, merge
from xrt.reflect.schema import json_schema
from xrt.reflect.validators import each, ge, gt, in_range, le, power_of_two
from xrt.reflect.walk import FieldInfo, find, walk

__all__ = [
    "ConfigError", "FieldInfo", "Problem", "build", "each", "field", "find", "flat", "from_hf", "ge", "gt",
    "help_of", "help_rows", "help_table", "hf_key_of", "hf_keys_of", "hf_missing", "hf_values", "in_range",
    "json_schema", "le", "merge", "power_of_two", "to_dict", "to_json", "to_plain", "to_yaml", "unit_of", "walk",
]
