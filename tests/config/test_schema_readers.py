"""The schema is honest: every field has a reader in xrt/ (a field nothing reads is removed until an issue
builds it), every environment variable xrt reads is listed in --help, and pyproject's dependencies are exactly
the third-party packages xrt imports."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

from xrt.cli.help_text import ENVIRONMENT
from xrt.config import XrtConfig
from xrt.reflect import walk

REPO = Path(__file__).resolve().parents[2]


def code_of(path: Path) -> str:
    """The file without comments and plain strings (docstrings name fields without reading them); f-strings
    stay, they may read a field."""
    out, end = [], (1, 0)
    for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        plain_string = t.type == tokenize.STRING and not t.string.lower().startswith(("f", "rf"))
        if t.type != tokenize.COMMENT and not plain_string:
            out.append(("" if t.start == end else " ") + t.string)
        end = t.end
    return "".join(out)


SOURCES = {
    p: code_of(p) for p in sorted((REPO / "xrt").rglob("*.py"))
    # the schema and the generic reflection name every field without acting on it
    if p.relative_to(REPO / "xrt").parts[0] not in ("config", "reflect")
}
# Fields whose reader lands with another branch of the same issue; each must lose its entry once read.
PENDING: dict[str, str] = {}


def readers(path: str) -> list[str]:
    """Files that read the field: `.section.name` (or a root field off a config), or `.name` in a file that
    reaches the section (`.section`, or takes the section's class, e.g. ModelArgs, as an argument)."""
    *parents, name = path.split(".")
    if not parents:
        direct = re.compile(rf"\b(cfg|config|self\.cfg)\.{name}\b")
        return [str(p) for p, text in SOURCES.items() if direct.search(text)]
    section = parents[-1]
    owner = type(next(f for f in walk(XrtConfig, groups=True) if f.path == ".".join(parents)).default).__name__
    direct = re.compile(rf"\.{section}\.{name}\b")
    leaf = re.compile(rf"\.{name}\b")
    reach = re.compile(rf"\.{section}\b|\b{owner}\b")
    return [str(p) for p, text in SOURCES.items()
            if direct.search(text) or (leaf.search(text) and reach.search(text))]


@pytest.mark.parametrize("path", [f.path for f in walk(XrtConfig)])
def test_every_field_has_a_reader(path: str) -> None:
    found = readers(path)
    if path in PENDING:
        assert not found, f"{path} is read now ({found[0]}): remove it from PENDING"
    else:
        assert found, f"{path}: nothing in xrt/ reads it; remove it until an issue builds it"


def test_environment_variables_are_the_documented_lookups() -> None:
    """Behaviour switches are fields; os.environ is read only for paths, debugging and the interpreter."""
    lookup = re.compile(r"os\.environ(?:\.get\(|\[)\"(\w+)\"")
    read = {m for p in (REPO / "xrt").rglob("*.py") for m in lookup.findall(p.read_text())}
    assert read - {"XDG_CACHE_HOME"} == set(ENVIRONMENT)
    assert "XRT_PDL" not in read


# import name -> distribution, where they differ
DISTRIBUTIONS = {"yaml": "pyyaml", "hydra": "hydra-core", "nixl_cu12": "nixl-cu12",
                 "prometheus_client": "prometheus-client"}
# imported only where their extra is installed (CUDA kernels, the benchmark's peer and plot, the Hub cache lookup)
EXTRAS = {"triton": "cuda", "flashinfer": "cuda", "transformers": "bench", "matplotlib": "bench",
          "huggingface_hub": "hub", "nixl_cu12": "kv", "boto3": "kv", "botocore": "kv", "fastapi": "serve",
          "uvicorn": "serve", "prometheus_client": "serve", "pydantic": "serve", "aiohttp": "bench", "optuna": "sweep",
          "uvloop": "serve"}  # uvloop: also the serve benchmark client's, when installed
# tried before / after the kv extra's wheel (xrt/kvstore/nixl_api.py): what a GPU user installs in its place
ALTERNATIVES = {"nixl", "nixl_cu13"}


def imported_packages() -> set[str]:
    out: set[str] = set()
    for p in (REPO / "xrt").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return {m for m in out if m not in sys.stdlib_module_names and m not in ("xrt", "__future__")}


def test_dependencies_are_exactly_what_xrt_imports() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    imported = imported_packages()
    required = {DISTRIBUTIONS.get(m, m) for m in imported if m not in EXTRAS and m not in ALTERNATIVES}
    assert ALTERNATIVES <= imported, "an alternative NIXL import is gone: drop it from ALTERNATIVES"
    # omegaconf is Hydra's own; it is pinned because xrt imports it directly too
    assert declared == required
    for module, extra in EXTRAS.items():
        assert module in imported, f"{module} is no longer imported: drop it from the {extra} extra"
        extra_names = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0] for d in project["optional-dependencies"][extra]}
        assert DISTRIBUTIONS.get(module, module) in {n.replace("-python", "") for n in extra_names}
