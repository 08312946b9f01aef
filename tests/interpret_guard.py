"""The pytest plugin behind XRT_REQUIRE_TRITON=1 (set by .ci/run): the session fails when an interpreter test
file (tests/**/*_interpret.py) ran no test, for instance because triton is not installed and every one of them
skipped. Without the variable (a developer's machine, a CUDA machine, where the `*_gpu.py` files cover the kernels) the
interpreter files may skip as they do today. tests/conftest.py registers it."""

from __future__ import annotations

import os

import pytest

ENV = "XRT_REQUIRE_TRITON"
SUFFIX = "_interpret.py"


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class InterpretGuard:
    def __init__(self) -> None:
        self.skipped: dict[str, str] = {}  # file -> why the whole module skipped at collection
        self.selected: set[str] = set()  # files with tests left to run after -k / deselection
        self.passed: set[str] = set()  # files with at least one test that passed

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and _file(report.nodeid).endswith(SUFFIX):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped[_file(report.nodeid)] = reason.removeprefix("Skipped: ")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = {_file(item.nodeid) for item in session.items if _file(item.nodeid).endswith(SUFFIX)}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed and _file(report.nodeid).endswith(SUFFIX):
            self.passed.add(_file(report.nodeid))

    def problems(self) -> list[str]:
        out = [f"{f}: skipped ({why})" for f, why in sorted(self.skipped.items())]
        out += [f"{f}: no test passed" for f in sorted(self.selected - self.passed - set(self.skipped))]
        return out

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.problems() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        problems = self.problems()
        if problems:
            terminalreporter.section(f"{ENV}=1: the Triton interpreter tests did not run", red=True)
            for line in problems:
                terminalreporter.line(line, red=True)


def register(config: pytest.Config) -> None:
    """From tests/conftest.py's pytest_configure: active only where the environment asks for it."""
    if os.environ.get(ENV) == "1":
        config.pluginmanager.register(InterpretGuard(), "xrt_interpret_guard")
