"""XRT_REQUIRE_TRITON=1 (CI) fails a pytest session whose Triton interpreter tests skipped: the guard of
tests/interpret_guard.py on a scratch suite, and CI's script and test extra that switch it on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

SCRATCH = {
    "conftest.py": f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
    "from interpret_guard import register\n\n\ndef pytest_configure(config):\n    register(config)\n",
    # as tests/interpret_support.py skips a module without triton
    "test_missing_interpret.py": "import pytest\npytest.skip('triton is not installed', allow_module_level=True)\n",
    # every test skipped one by one
    "test_skipped_interpret.py": "import pytest\n\n\n@pytest.mark.skip(reason='runs in process')\n"
    "def test_a():\n    pass\n",
    # in-process tests skipped, the subprocess rerun passed: it ran
    "test_ran_interpret.py": "import pytest\n\n\n@pytest.mark.skip(reason='triton already imported')\n"
    "def test_a():\n    pass\n\n\ndef test_in_subprocess():\n    pass\n",
    "test_plain.py": "def test_a():\n    pass\n",
}


def _pytest(root: Path, *args: str, require: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XRT_REQUIRE_TRITON"}
    if require:
        env["XRT_REQUIRE_TRITON"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name, text in SCRATCH.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_required_triton_fails_the_session_naming_each_interpreter_file_that_ran_nothing(scratch: Path) -> None:
    r = _pytest(scratch, require=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "XRT_REQUIRE_TRITON=1: the Triton interpreter tests did not run" in r.stdout
    assert "test_missing_interpret.py: skipped (triton is not installed)" in r.stdout
    assert "test_skipped_interpret.py: no test passed" in r.stdout
    assert "test_ran_interpret.py" not in r.stdout.split("did not run", 1)[1]


def test_without_the_variable_or_with_every_interpreter_file_run_the_session_passes(scratch: Path) -> None:
    assert _pytest(scratch, require=False).returncode == 0
    r = _pytest(scratch, "test_ran_interpret.py", "test_plain.py", require=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # a file whose tests were all deselected is not required (one that skipped whole at import still is)
    assert _pytest(scratch, "-k", "test_plain", "test_plain.py", "test_skipped_interpret.py",
                   require=True).returncode == 0


def test_ci_installs_triton_and_requires_it() -> None:
    tomllib = pytest.importorskip("tomllib")
    ci = (REPO / ".ci" / "run").read_text()
    assert "export XRT_REQUIRE_TRITON=1" in ci and '".[test]"' in ci
    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(d.startswith("triton") for d in test_extra)
