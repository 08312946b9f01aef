"""Faults under cache.l2.backend=OBJ, through a real NIXL OBJ agent and moto's S3 server on 127.0.0.1: an endpoint
down at start-up, one going away mid-run, a corrupt object, credentials the store refuses, eviction by size. Every
request completes with cache=gpu's greedy output and the bucket never lists a chunk that does not verify."""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from kvstore_support import (
    CHUNK,
    LAYOUT,
    chunk_of,
    computed_keys,
    generate_each,
    key,
    put_chunk,
    reference,
    settle,
    tail,
    tier_cache,
    tiers_of,
    tokens,
)
from obj_support import (  # noqa: F401  (the s3 fixture)
    BUCKET,
    PREFIX,
    S3,
    bucket_chunks,
    dead_endpoint,
    obj_cache,
    object_names,
    s3_endpoint,
)

from xrt.config import KVTiers, L2LoadPolicy, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2
from xrt.kvstore.keys import chunk_keys
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2_objects import ObjStore
from xrt.kvstore.l2_transfer import L2Agent, L2Error
from xrt.kvstore.nixl_api import nixl_api
from xrt.kvstore.preflight import l2_path_warning, l2_problems


def obj_cfg(make_cfg: Callable[..., XrtConfig], s3: S3, l2_chunks: int | None = None, **params: str) -> XrtConfig:
    return make_cfg(cache=obj_cache(tier_cache(KVTiers.L1_L2, "", l2_chunks=l2_chunks), s3, **params))


def store_of(llm: LLM) -> ObjStore:
    l2 = tiers_of(llm).l2
    assert isinstance(l2, ObjStore)
    return l2


def test_endpoint_down_at_start_turns_l2_off_and_serves(
    diverse_cfg: Callable[..., XrtConfig], s3: S3, capfd: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(31)
    shared = tokens(rng, 2 * CHUNK + 1)
    prompts = [shared + tail(rng, 0, 4), shared + tail(rng, 1, 6)]
    want = reference(diverse_cfg, prompts)
    cfg = obj_cfg(diverse_cfg, s3, endpoint_override=dead_endpoint())
    assert l2_problems(cfg) == []  # not a configuration error: the run goes on
    warning = l2_path_warning(cfg)
    assert warning is not None and warning.startswith("cache.l2.backend_params: OBJ: cannot reach bucket ")
    capfd.readouterr()
    llm = LLM(cfg)
    assert generate_each(llm, prompts) == want
    said = [ln for ln in capfd.readouterr().err.splitlines() if "cache.l2.backend_params" in ln]
    assert len(said) == 1 and said[0].endswith("; the L2 tier stores nothing"), said
    tiers = tiers_of(llm)
    assert tiers.stats.hit_tokens == {GPU: 2 * CHUNK, L1: 0, L2: 0}  # the GPU prefix cache still serves
    settle(tiers, close=True)
    assert tiers.stats.l2_off.startswith("L2 stored nothing: cache.l2.backend_params")
    assert tiers.stats.stored_l2 == 0 and object_names(s3) == []


def test_endpoint_gone_mid_run_recomputes_and_publishes_nothing(diverse_cfg: Callable[..., XrtConfig],
                                                               s3: S3) -> None:
    rng = random.Random(32)
    shared = tokens(rng, 3 * CHUNK)
    first, second = shared + tail(rng, 0, 5), shared + tail(rng, 1, 2 * CHUNK)
    want = reference(diverse_cfg, [first, second])
    a = LLM(obj_cfg(diverse_cfg, s3))
    assert generate_each(a, [first]) == want[:1]
    settle(tiers_of(a), close=True)
    stored = bucket_chunks(s3)
    assert len(stored) == 3

    b = LLM(obj_cfg(diverse_cfg, s3))
    assert set(store_of(b).entries) == set(stored)  # listed at start-up
    s3.stop()
    assert generate_each(b, [second]) == want[1:]
    tiers = tiers_of(b)
    assert tiers.stats.hit_tokens == {GPU: 0, L1: 0, L2: 0} and tiers.stats.failed_loads >= 1
    assert b.engine.num_prefill_tokens == len(second)  # every token recomputed
    settle(tiers)
    assert tiers.stats.stored_l2 == 0 and tiers.stats.store_errors >= 1  # second's new chunks could not land
    assert set(store_of(b).entries) == set(stored)  # nothing published
    settle(tiers, close=True)
    s3.restart()
    assert bucket_chunks(s3) == stored  # and nothing written


def test_corrupt_object_is_a_checksum_miss_and_dropped(diverse_cfg: Callable[..., XrtConfig], s3: S3) -> None:
    rng = random.Random(33)
    shared = tokens(rng, 3 * CHUNK + 2)
    first, second = shared + tail(rng, 0, 4), shared + tail(rng, 1, 3)
    want = reference(diverse_cfg, [first, second])
    a = LLM(obj_cfg(diverse_cfg, s3))
    assert generate_each(a, [first]) == want[:1]
    ns = tiers_of(a).namespace
    settle(tiers_of(a), close=True)
    stored = bucket_chunks(s3)
    k0 = chunk_keys(shared, ns)[0].hex()
    name = next(n for n in object_names(s3) if f"/{k0}-" in n)
    client = s3.client()
    raw = bytearray(client.get_object(Bucket=BUCKET, Key=name)["Body"].read())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, the size unchanged
    client.put_object(Bucket=BUCKET, Key=name, Body=bytes(raw))

    b = LLM(obj_cfg(diverse_cfg, s3))
    assert generate_each(b, [second]) == want[1:]
    tiers = tiers_of(b)
    assert store_of(b).corrupt == 1 and tiers.stats.hit_tokens[L2] == 0  # the prefix's first chunk
    assert b.engine.num_prefill_tokens == len(second)
    assert b.stats()["tiers"].checksum_failures == 1
    settle(tiers, close=True)
    assert bucket_chunks(s3) == stored  # the bad bytes are gone: recomputed and stored again under the same name


@pytest.fixture
def auth(s3: S3, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """moto checking signatures from here on, with one IAM user allowed everything: its key."""
    import boto3
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    iam = boto3.client("iam", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id="a",
                       aws_secret_access_key="b")
    iam.create_user(UserName="xrt")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="xrt", PolicyName="all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="xrt")["AccessKey"]
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    yield {"access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}


def test_wrong_credentials_are_one_line_naming_backend_params(
    diverse_cfg: Callable[..., XrtConfig], s3: S3, auth: dict[str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    assert l2_problems(obj_cfg(diverse_cfg, s3, **auth)) == []  # the right key passes: the store does check
    wrong = {**auth, "secret_key": "not-" + auth["secret_key"]}
    problems = l2_problems(obj_cfg(diverse_cfg, s3, **wrong))
    assert len(problems) == 1 and problems[0][0] == "cache.l2.backend_params", problems
    assert "SignatureDoesNotMatch" in problems[0][1]

    from xrt.cli.main import main

    monkeypatch.chdir(tmp_path)
    args = ["device=cpu", "cache=l1_l2", "cache.l2.backend=OBJ", f"cache.l2.path={PREFIX}",
            *(f"+cache.l2.backend_params.{k}={v}" for k, v in s3.params(**wrong).items())]
    for command in (["config", "validate"], ["run"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([*command, *args])
        assert rc == 2 and out.getvalue() == "", command
        assert err.getvalue().startswith("error: cache.l2.backend_params: OBJ: the object store refused these "
                                         "credentials (SignatureDoesNotMatch)"), err.getvalue()
        assert err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue()


def test_eviction_by_size_stays_under_our_prefix(diverse_cfg: Callable[..., XrtConfig], s3: S3) -> None:
    """L2 of 3 chunks: storing 5 deletes the 2 least recently used of ours; another prefix's object and another
    namespace's, in the same bucket, stay."""
    client = s3.client()
    foreign = [f"{PREFIX}/xrt-kv-{'0' * 32}/{'ab' * 32}-00000000.kv", "other/thing.bin"]
    for name in foreign:
        client.put_object(Bucket=BUCKET, Key=name, Body=b"x" * 16)
    rng = random.Random(34)
    prompt = tokens(rng, 5 * CHUNK + 1)
    want = reference(diverse_cfg, [prompt])
    llm = LLM(obj_cfg(diverse_cfg, s3, l2_chunks=3))
    assert generate_each(llm, [prompt]) == want
    tiers = tiers_of(llm)
    settle(tiers, close=True)
    ours = [n for n in object_names(s3) if n not in foreign and not n.endswith("measurements.json")]
    assert len(ours) == 3 and set(foreign) <= set(object_names(s3))
    keys = computed_keys([prompt + want[0]], tiers.namespace)
    assert {n.rsplit("/", 1)[1].split("-")[0] for n in ours} <= keys


def test_an_object_deleted_by_another_process_is_dropped_after_its_failed_load(
    diverse_cfg: Callable[..., XrtConfig], s3: S3
) -> None:
    """B lists A's 3 chunks, then another process deletes the middle one: B's load of the prefix fails (one
    batch), it recomputes, finds by HEAD which object is gone and drops that entry, so its store puts the chunk
    back (a chunk still listed would have been skipped as stored)."""
    rng = random.Random(35)
    shared = tokens(rng, 3 * CHUNK)
    first, second = shared + tail(rng, 0, 5), shared + tail(rng, 1, 3)
    want = reference(diverse_cfg, [first, second])
    a = LLM(obj_cfg(diverse_cfg, s3))
    assert generate_each(a, [first]) == want[:1]
    ns = tiers_of(a).namespace
    settle(tiers_of(a), close=True)
    stored = bucket_chunks(s3)
    b = LLM(obj_cfg(diverse_cfg, s3))
    k1 = chunk_keys(shared, ns)[1].hex()
    s3.client().delete_object(Bucket=BUCKET, Key=next(n for n in object_names(s3) if f"/{k1}-" in n))
    assert generate_each(b, [second]) == want[1:]
    tiers = tiers_of(b)
    assert tiers.stats.failed_loads == 1 and tiers.stats.hit_tokens[L2] == 0
    settle(tiers, close=True)
    assert bucket_chunks(s3) == stored


def test_credentials_from_the_aws_environment_variables(
    diverse_cfg: Callable[..., XrtConfig], s3: S3, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key in cache.l2.backend_params: the preflight's listing (boto3) and a NIXL OBJ agent's transfers both
    sign with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, and a wrong secret there is refused by both. (An
    engine is not built here: moto 5.2.1 with signatures checked refuses every ListObjectsV2 whose prefix holds
    a '/', as a namespace's does, with SignatureDoesNotMatch; S3 does not.)"""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", auth["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", auth["secret_key"])
    cfg = obj_cfg(diverse_cfg, s3)
    params = {k: v for k, v in cfg.cache.l2.backend_params.items() if k not in ("access_key", "secret_key")}
    cfg.cache.l2.backend_params = params
    assert l2_problems(cfg) == []
    l1 = L1Cache(LAYOUT, 4 * LAYOUT.nbytes)
    assert put_chunk(l1, key(1), chunk_of(LAYOUT, 1))
    slot = l1.acquire(key(1))
    assert slot is not None
    api = nixl_api("OBJ")
    name = f"{PREFIX}/env-credentials.kv"
    agents = [L2Agent(api, f"env-{r.lower()}", r, "OBJ", params, l1) for r in ("WRITE", "READ")]
    agents[0].transfer([l1.slot_offset(slot[0])], [name], LAYOUT.nbytes)
    out = l1.reserve(key(2))
    assert out is not None
    agents[1].transfer([l1.slot_offset(out)], [name], LAYOUT.nbytes)
    assert torch.equal(l1.slot_view(out), chunk_of(LAYOUT, 1))  # the bytes came back through the store

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    assert [p[0] for p in l2_problems(cfg)] == ["cache.l2.backend_params"]
    agents.append(L2Agent(api, "env-bad", "WRITE", "OBJ", params, l1))
    with pytest.raises(L2Error):
        agents[2].transfer([l1.slot_offset(slot[0])], [name + "2"], LAYOUT.nbytes)
    for a in agents:
        a.close()


def test_an_obj_load_past_its_deadline_is_abandoned(diverse_cfg: Callable[..., XrtConfig], s3: S3) -> None:
    """The same deadline policy as files: a stalled OBJ read is abandoned at its deadline and the request
    prefilled, the next load does not queue behind it, and once it ends its L1 slots are free again."""
    rng = random.Random(37)
    p1, p2 = tokens(rng, 4 * CHUNK), tokens(rng, 3 * CHUNK)
    stored = [p1 + tail(rng, 0, 4), p2 + tail(rng, 1, 4)]
    again = [p1 + tail(rng, 2, 4), p2 + tail(rng, 3, 4)]  # each prefix in L2 only, for the new engine
    want = reference(diverse_cfg, stored + again)
    a = LLM(obj_cfg(diverse_cfg, s3))
    assert generate_each(a, stored) == want[:2]
    settle(tiers_of(a), close=True)
    cfg = obj_cfg(diverse_cfg, s3)
    cfg.cache.l2.load_policy = L2LoadPolicy.MEASURED
    llm = LLM(cfg)
    tiers = tiers_of(llm)
    # recomputing is instant: the deadline is the minimum; the bandwidth unknown, so the load is tried
    tiers.policy.prefill_rate, tiers.policy.l2_bandwidth = 1e9, None
    agent = store_of(llm)._agents["READ"]
    real_state = agent.agent.check_xfer_state
    stalled = True
    agent.agent.check_xfer_state = lambda h: "PROC" if stalled else real_state(h)
    assert generate_each(llm, again[:1]) == want[2:3]
    s = tiers.stats
    assert s.abandoned_loads == 1 and s.hit_tokens[L2] == 0 and s.failed_loads == 0 and agent.lock.locked()
    assert generate_each(llm, again[1:]) == want[3:]  # the agent is still busy: abandoned at once
    assert s.abandoned_loads == 2 and s.hit_tokens[L2] == 0
    stalled = False
    assert agent.lock.acquire(timeout=10)  # the late transfer finished and released everything
    agent.lock.release()
    settle(tiers, close=True)
    assert not any(tiers.l1._refs) and not tiers.l1._writing
    assert store_of(llm).late_transfers == 1
