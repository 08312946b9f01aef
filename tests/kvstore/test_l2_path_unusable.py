"""An L2 path the engine cannot write, also when it runs as root (issue 23 item 8). test_faults.py's read-only-dir
case makes the directory 0o500, which root writes into all the same, so as root it skips. Here:

- paths no user can make a directory of (cache.l2.path a regular file, under one, a name too long for the
  filesystem): every request gets cache=gpu's tokens, the L2 tier is off with one clear line on stderr
  (`cache.l2.path: cannot create DIR: REASON; the L2 tier stores nothing`, REASON the OS's own words for that
  mkdir), L1 still serves, and nothing is written;
- a directory on a read-only mount, which root cannot write either (a private mount namespace: `unshare -m`
  and a read-only bind mount; skipped where that is not permitted), through `xrt run`: empty, it is the same
  clear line and tier-off behaviour; holding an earlier run's chunks, the chunks still load from it, the new
  ones fail to store without failing a request, and its files are left as they were.

Public behaviour only: RequestOutput.cached_tokens / token_ids, LLM.stats(), `xrt run`'s output and exit code."""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from kvstore_support import CHUNK, SAMPLING, reference, tail, tier_cache, tokens

import xrt
from xrt.config import KVTiers, XrtConfig
from xrt.config.compose import load_config
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput

PAGE = 4
PAGES = 32  # GPU KV of 128 tokens: one filler prompt takes every page (evicting the prefix cache)


def _line(path: Path, reason: str) -> re.Pattern[str]:
    return re.compile(
        rf"^\[xrt\] cache\.l2\.path: cannot create {re.escape(str(path))}/xrt-kv-[0-9a-f]+: {re.escape(reason)}; "
        r"the L2 tier stores nothing$"
    )


def _mkdir_error(path: Path) -> str:
    """What the OS says to making a directory under `path` (the reference for the engine's line)."""
    with pytest.raises(OSError) as e:
        os.makedirs(path / "xrt-kv-probe")
    return e.value.strerror


def _unusable(tmp_path: Path, where: str) -> tuple[Path, int]:
    """(cache.l2.path, the errno making a directory under it gives) for each kind of path."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    if where == "is-a-file":
        return blocker, errno.ENOTDIR
    if where == "under-a-file":
        return blocker / "sub", errno.ENOTDIR
    assert where == "name-too-long"
    return tmp_path / ("n" * 300), errno.ENAMETOOLONG  # NAME_MAX is 255 on Linux filesystems


def _run(llm: LLM, prompt: list[int]) -> RequestOutput:
    (out,) = llm.generate([prompt], SAMPLING, use_tqdm=False)
    return out


def _evict_gpu(llm: LLM, rng: random.Random) -> None:
    """A prompt that with its output takes every GPU page: the prefix cache keeps none of the earlier keys."""
    out = _run(llm, tokens(rng, PAGES * PAGE - SAMPLING.max_tokens))
    assert out.finish_reason == "length"


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file", "name-too-long"])
def test_an_l2_path_that_cannot_be_a_directory(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    path, code = _unusable(tmp_path, where)
    reason = _mkdir_error(path)
    assert reason == os.strerror(code)
    rng = random.Random(31)
    shared = tokens(rng, 3 * CHUNK + 1)
    first, second = shared + tail(rng, 0, 5), shared + tail(rng, 1, 8)
    want = reference(diverse_cfg, [first, second])
    before = sorted(os.listdir(tmp_path))
    capsys.readouterr()

    with LLM(diverse_cfg(cache=attrs.evolve(tier_cache(KVTiers.L1_L2, path), num_pages=PAGES))) as llm:
        err = capsys.readouterr().err.splitlines()
        said = [ln for ln in err if "cache.l2.path" in ln]
        assert len(said) == 1 and _line(path, reason).match(said[0]), err
        got = [_run(llm, first)]
        _evict_gpu(llm, rng)
        got.append(_run(llm, second))
        assert [o.token_ids for o in got] == want
        # L1 still serves the shared prefix (3 whole chunks); L2 neither stores nor fails
        assert got[0].cached_tokens == {"gpu": 0, "l1": 0, "l2": 0}
        assert got[1].cached_tokens == {"gpu": 0, "l1": 3 * CHUNK, "l2": 0}
        llm.close()  # the L2 writer through its queue before the counters are read
        tiers = llm.stats()["tiers"]
        stats = tiers.as_dict()
    # what `xrt run` prints at the end says why L2 holds nothing
    last = tiers.summary().splitlines()[-1]
    assert last.startswith(f"kv tiers: L2 stored nothing: cache.l2.path: cannot create {path}/xrt-kv-"), last
    assert last.endswith(f": {reason}")
    assert stats["stored_chunks_l1"] > 0
    assert stats["stored_chunks_l2"] == stats["store_errors"] == stats["failed_loads"] == 0
    assert "cache.l2.path" not in capsys.readouterr().err  # said once, at start
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "afile").read_text() == "not a directory"


# ---------------------------------------------------------------- a read-only mount, through `xrt run`

# Text of the tiny tokenizer: 34 tokens (2 whole chunks of 16), and a longer prompt starting with it.
PROMPT = ("The quick brown fox jumps over the lazy dog and then runs far away into the deep forest where nobody "
          "can find it ever again")
LONGER = PROMPT + " until the winter comes and the snow covers every path through the old trees on the hill"
GREEDY = ["sampling.max_tokens=4", "sampling.ignore_eos=true"]
RUN = ["cache=l1_l2", f"cache.chunk_tokens={CHUNK}", "cache.l2.load_policy=always", "cache.l2.prefetch=false", *GREEDY]


def _env() -> dict[str, str]:
    root = str(Path(xrt.__file__).resolve().parents[1])
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def _mount_read_only_cmd(d: Path, argv: list[str]) -> list[str]:
    """argv run in a private mount namespace where d is a read-only bind mount of itself."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(d), *argv]


@pytest.fixture
def read_only_mounts(tmp_path: Path) -> None:
    """Skips unless this process may make a private mount namespace with a read-only bind mount (root with
    CAP_SYS_ADMIN, e.g. on the dev machine), and one it makes there really refuses a write."""
    if shutil.which("unshare") is None or sys.platform != "linux":
        pytest.skip("needs Linux and unshare(1)")
    d = tmp_path / "probe"
    d.mkdir()
    probe = _mount_read_only_cmd(d, ["sh", "-c", 'touch "$0/x" 2>/dev/null && echo wrote || echo refused', str(d)])
    got = subprocess.run(probe, capture_output=True, text=True)
    if got.returncode != 0 or got.stdout.strip() != "refused":
        pytest.skip(f"cannot make a read-only bind mount here: {got.stderr.strip() or got.stdout.strip()}")
    assert os.listdir(d) == []
    d.rmdir()


def _xrt_run(checkpoint: str, l2: Path, prompt: str, read_only: bool) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "xrt", "run", f"model.path={checkpoint}", f"cache.l2.path={l2}", *RUN,
            f"prompt={prompt}"]
    cmd = _mount_read_only_cmd(l2, argv) if read_only else argv
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)


def _generation(checkpoint: str, prompt: str) -> str:
    """What cache=gpu generates for the text prompt, as `xrt run` prints it."""
    cfg = load_config([f"model.path={checkpoint}", "cache=gpu", *GREEDY])
    with LLM(cfg) as llm:
        (out,) = llm.generate(prompt, use_tqdm=False)
    return f"{out.text!r}  ({len(out.token_ids)} tokens, length)"


def _tier_figures(stdout: str) -> dict[str, int]:
    m = re.search(r"^kv tiers: prefix tokens cached gpu (\d+), l1 (\d+), l2 (\d+), computed (\d+)", stdout, re.M)
    s = re.search(r"^kv tiers: chunks stored l1 (\d+), l2 (\d+).*store errors (\d+)", stdout, re.M)
    assert m and s, stdout
    gpu, l1, l2, computed = map(int, m.groups())
    stored_l1, stored_l2, errors = map(int, s.groups())
    return dict(gpu=gpu, l1=l1, l2=l2, computed=computed, stored_l1=stored_l1, stored_l2=stored_l2, errors=errors)


def _files(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def test_an_empty_read_only_l2_directory(
    read_only_mounts: None, tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    l2 = tmp_path / "l2"
    l2.mkdir()
    got = _xrt_run(tiny_checkpoint_diverse, l2, PROMPT, read_only=True)
    assert got.returncode == 0, got.stderr
    said = [ln for ln in got.stderr.splitlines() if "cache.l2.path" in ln]
    assert len(said) == 1 and _line(l2, os.strerror(errno.EROFS)).match(said[0]), got.stderr
    assert f" -> {_generation(tiny_checkpoint_diverse, PROMPT)}" in got.stdout
    fig = _tier_figures(got.stdout)
    assert fig["stored_l1"] == 2 and fig["stored_l2"] == fig["errors"] == fig["l2"] == 0  # L1 on, L2 off
    assert os.listdir(l2) == []


def test_a_read_only_l2_directory_with_chunks_still_serves_them(
    read_only_mounts: None, tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    """A first run (writable) stores PROMPT's two chunks; a second, with the directory mounted read-only, loads
    them for LONGER, which starts with PROMPT, and computes the rest: its new chunks cannot be stored, which is
    counted, and every request still gets cache=gpu's tokens."""
    l2 = tmp_path / "l2"
    l2.mkdir()
    first = _xrt_run(tiny_checkpoint_diverse, l2, PROMPT, read_only=False)
    assert first.returncode == 0, first.stderr
    assert _tier_figures(first.stdout)["stored_l2"] == 2
    files = _files(l2)
    assert len([f for f in files if f.endswith(".kv")]) == 2

    got = _xrt_run(tiny_checkpoint_diverse, l2, LONGER, read_only=True)
    assert got.returncode == 0, got.stderr
    assert f" -> {_generation(tiny_checkpoint_diverse, LONGER)}" in got.stdout
    fig = _tier_figures(got.stdout)
    assert fig["l2"] == 2 * CHUNK and fig["gpu"] == fig["l1"] == 0  # PROMPT's chunks, from the read-only mount
    assert fig["stored_l1"] > 0 and fig["stored_l2"] == 0 and fig["errors"] >= 1
    assert "Traceback" not in got.stderr
    assert _files(l2) == files  # nothing written, nothing removed
