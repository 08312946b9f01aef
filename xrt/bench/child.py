"""A part of a benchmark in a process of its own (`python -m <module>`): its spec as JSON on stdin, its result as
JSON on stdout, its progress on this process's stderr. The serve scenario's client runs so (its event loop never
takes the GIL from the server), and each invocation of the throughput scenario (a fresh interpreter and CUDA
context)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import xrt


def run_child(module: str, spec: dict[str, Any], what: str) -> dict[str, Any]:
    """The child's JSON result, or {"error": line} when it printed none. what: the child, for that line."""
    # Run from the directory holding the xrt this process runs (`-m` looks there first), also from a source tree.
    root = Path(xrt.__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root)
    try:
        out, _ = proc.communicate(json.dumps(spec).encode())
    finally:
        if proc.poll() is None:  # interrupted: the child must not outlive the run
            proc.kill()
            proc.wait()
    try:
        return json.loads(out)
    except ValueError:
        return {"error": f"{what} exited with status {proc.returncode} and no result"}
