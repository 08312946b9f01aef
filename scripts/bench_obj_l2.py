"""`xrt bench bench.scenario=prefix` with L2 in files (POSIX) and in objects (OBJ) in one run, the OBJ one against
moto's S3 server started here on 127.0.0.1 (a free port, in this process; the bench runs as a child process and
reaches it over loopback). Prints both runs' L2 load bandwidth side by side and writes `summary.md` in OUT.

    python scripts/bench_obj_l2.py OUT [extra bench overrides ...]

Each bench writes its own results under OUT/posix and OUT/obj (results.jsonl, results.md, bench.log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BUCKET = "xrt-kv-bench"
REPO = Path(__file__).resolve().parents[1]  # the xrt the bench runs: this checkout's
DEFAULTS = ["bench.scenario=prefix", "device=cpu", "bench.prefix_lens=[1024]", "bench.iters=1", "bench.warmup=0",
            "bench.peer=none"]


def start_endpoint() -> tuple[object, str]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1", aws_access_key_id="bench",
                 aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)
    return server, f"{host}:{port}"


def run_bench(out: Path, overrides: list[str]) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "xrt", "bench", *overrides, f"bench.out_dir={out}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(out / "bench.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=out, env=env)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return rows[-1]


def _cell(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    extra = sys.argv[2:]
    server, endpoint = start_endpoint()
    try:
        posix = run_bench(out / "posix", [*DEFAULTS, *extra])
        params = {"bucket": BUCKET, "endpoint_override": endpoint, "scheme": "http", "region": "us-east-1",
                  "access_key": "bench", "secret_key": "bench", "use_virtual_addressing": "false"}
        obj = run_bench(out / "obj", [*DEFAULTS, *extra, "cache.l2.backend=OBJ", "cache.l2.path=bench",
                                      "bench.disk_probe_mb=0",
                                      *(f"+cache.l2.backend_params.{k}={v}" for k, v in params.items())])
    finally:
        server.stop()  # type: ignore[attr-defined]
    keys = ["prefix_len", "l2_load_gbps", "l2_choice", "cold_ttft_ms", "l1_ttft_ms", "l2_ttft_ms",
            "outputs_identical", "restored_outputs_identical", "git_commit"]
    lines = ["| L2 backend | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, row in (("POSIX (local disk)", posix), (f"OBJ (moto on {endpoint.split(':')[0]})", obj)):
        lines.append(f"| {name} | " + " | ".join(_cell(row.get(k)) for k in keys) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "summary.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
