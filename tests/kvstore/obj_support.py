"""The object-store tests' S3 endpoint: moto's server on 127.0.0.1 (a free port, started by the test, in this
process), a bucket, and the cache.l2 sections that point an engine's L2 at it (cache.l2.backend=OBJ with NIXL's
own parameters). The bucket's content is read back through boto3 as the independent reference: every object's
name, size and crc32 against its bytes."""

from __future__ import annotations

import socket
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from kvstore_support import ENGINE_LAYOUT

from xrt.config import CacheArgs, L2Backend
from xrt.kvstore.index import parse_data_name

BUCKET = "xrt-kv-test"
PREFIX = "kvtest"  # cache.l2.path: the key prefix of the chunk objects
KEY, SECRET = "testing", "testing"  # moto accepts any key unless its auth is switched on (test_l2_obj_faults)


@attrs.define
class S3:
    server: Any
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def params(self, **over: str) -> dict[str, str]:
        """cache.l2.backend_params for this endpoint: NIXL's OBJ parameter names, as a user writes them."""
        p = {"bucket": BUCKET, "endpoint_override": f"{self.host}:{self.port}", "scheme": "http",
             "region": "us-east-1", "access_key": KEY, "secret_key": SECRET, "use_virtual_addressing": "false"}
        return {**p, **over}

    def client(self, **over: str) -> Any:
        import boto3

        p = self.params(**over)
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=p["access_key"], aws_secret_access_key=p["secret_key"])

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """The same port again (moto's store lives in this process, so the bucket's objects are still there)."""
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self.server.start()


def start_s3() -> S3:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return S3(server, host, port)


@pytest.fixture(name="s3")
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """A fresh endpoint and an empty bucket. AWS's SDKs (NIXL's C++ one and boto3) retry a refused connection
    for ~25 s per transfer in their default retry mode: a test whose endpoint goes away would wait that long for
    every batch, so they are told to fail at once, through the usual AWS variables."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    from xrt.kvstore.nixl_api import _plugin_loads

    if not any(_plugin_loads(n, "OBJ") for n in ("nixl_cu12", "nixl_cu13", "nixl")):
        pytest.skip("no installed NIXL wheel's OBJ plugin loads here (the kv extra's nixl-cu12 does)")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    from moto.s3.models import s3_backends  # moto's store lives in this process: emptied per test

    s3_backends.reset()
    s = start_s3()
    s.client().create_bucket(Bucket=BUCKET)
    try:
        yield s
    finally:
        s.stop()
        s3_backends.reset()


def obj_cache(cache: CacheArgs, s3: S3, **over: str) -> CacheArgs:
    """The engine tests' cache (kvstore_support.tier_cache) with its L2 in the bucket under PREFIX."""
    l2 = attrs.evolve(cache.l2, backend=L2Backend.OBJ, path=PREFIX, backend_params=s3.params(**over))
    return attrs.evolve(cache, l2=l2)


def dead_endpoint() -> str:
    """host:port on 127.0.0.1 where nothing listens (a port the kernel just handed out and took back)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def bucket_chunks(s3: S3, nbytes: int = ENGINE_LAYOUT.nbytes) -> dict[str, int]:
    """Asserts the bucket holds, under PREFIX, one namespace of whole chunks whose bytes match the crc32 in their
    names (the measurements object aside). Returns {key hex: crc32}."""
    client = s3.client()
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/"):
        for o in page.get("Contents", []):
            ns, _, name = o["Key"][len(PREFIX) + 1:].partition("/")
            assert ns.startswith("xrt-kv-"), o["Key"]
            if name == "measurements.json":
                continue
            parsed = parse_data_name(name)
            assert parsed is not None, o["Key"]
            raw = client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            assert len(raw) == nbytes and zlib.crc32(raw) == parsed[1], o["Key"]
            found[parsed[0]] = parsed[1]
    return found


def object_names(s3: S3) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))
