"""A tensor-parallel script without the `if __name__ == "__main__":` guard (xrt/distributed/spawn_guard.py): rank 0
says which line to put under it before spawning anything; a worker re-running such a script leaves with one line."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xrt.distributed.spawn_guard import check_spawn

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """import xrt
cfg = xrt.load_config(["parallel.tp=2", "device=cpu", "model.load_format=dummy"])
{body}
"""


def test_an_unguarded_script_is_told_which_line_to_guard_and_nothing_is_spawned(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(body="llm = xrt.LLM(cfg)\nprint('built')"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "built" not in r.stdout
    assert r.stderr.splitlines()[-1] == (
        f"ValueError: parallel.tp=2: xrt starts 1 worker process with the spawn method, which runs {script} again "
        f'in each; put the code that builds the LLM ({script}:3) under `if __name__ == "__main__":`')
    assert "rank 1" not in r.stderr and "bootstrapping" not in r.stderr


def test_a_worker_re_running_the_script_leaves_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiprocessing.process.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(SystemExit) as e:
        check_spawn(4)
    assert str(e.value) == ("error: parallel.tp=4: this worker re-ran the main script, which builds the LLM outside "
                            '`if __name__ == "__main__":`; add that guard')
