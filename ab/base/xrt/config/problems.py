"""The shape of a cross-field check's result, shared by the schema's classes."""

from __future__ import annotations

# (dotted field relative to the class, message); `xrt.reflect.build` prefixes the path.
Problems = list[tuple[str, str]]
