"""Generic reflection over attrs config classes (the Python analogue of xLLM's
PROPERTY/REFLECT_PROPERTIES). Knows nothing of xrt's own classes."""

from xrt.reflect.field import field, help_of, hf_key_of, unit_of
from xrt.reflect.validators import each, ge, gt, in_range, le, power_of_two

__all__ = ["field", "help_of", "hf_key_of", "unit_of", "each", "ge", "gt", "in_range", "le", "power_of_two"]
