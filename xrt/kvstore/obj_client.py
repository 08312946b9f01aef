"""The OBJ backend's side that NIXL does not do: NIXL's OBJ plugin only puts and gets whole objects, so listing a
namespace, HEAD, deletes and the small measurements object go through boto3, configured from the same
`cache.l2.backend_params` NIXL gets (its names mapped to boto3's; credentials left out fall back, in both, to the
usual AWS environment variables and files, and so do AWS_RETRY_MODE / AWS_MAX_ATTEMPTS).

An endpoint down at start-up or a wrong key are told apart here (`probe`): the first is a warning (L2 off, the
requests still served), the second a configuration error naming cache.l2.backend_params."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

# NIXL 1.5.1's OBJ plugin lists no parameters (get_plugin_params gives {}), so the ones its README and library
# name are listed here: a misspelt key would otherwise be ignored by NIXL without a word.
OBJ_PARAMS = frozenset({
    "access_key", "secret_key", "session_token", "bucket", "create_bucket", "endpoint_override", "scheme", "region",
    "use_virtual_addressing", "req_checksum", "resp_checksum", "ca_bundle", "crtMinLimit", "accelerated", "type",
})
# S3's answers to credentials it does not accept
CREDENTIAL_ERRORS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                               "ExpiredToken", "InvalidClientTokenId", "403"})
DELETE_BATCH = 1000  # DeleteObjects takes at most this many keys


def bucket_of(params: Mapping[str, str]) -> str:
    """The bucket NIXL's OBJ plugin uses: backend_params' `bucket`, else AWS_DEFAULT_BUCKET ('' for none)."""
    return params.get("bucket") or os.environ.get("AWS_DEFAULT_BUCKET", "")


def endpoint_of(params: Mapping[str, str]) -> str | None:
    """The endpoint URL: endpoint_override as given when it has a scheme, else with `scheme` (NIXL's default
    https); None: AWS's own."""
    endpoint = params.get("endpoint_override")
    if not endpoint:
        return None
    return endpoint if "://" in endpoint else f"{params.get('scheme', 'https')}://{endpoint}"


def s3_client(params: Mapping[str, str]) -> Any:
    """A boto3 S3 client that addresses what NIXL's OBJ agent does (same endpoint, region, addressing and
    credentials)."""
    import boto3
    from botocore.config import Config

    virtual = params.get("use_virtual_addressing", "false").strip().lower() in ("true", "1", "yes")
    # short timeouts: a listing at start-up or a delete must not hold an engine for minutes on a dead endpoint
    config = Config(s3={"addressing_style": "virtual" if virtual else "path"}, connect_timeout=5, read_timeout=30)
    kwargs: dict[str, Any] = {"endpoint_url": endpoint_of(params), "region_name": params.get("region", "us-east-1"),
                              "config": config}
    if params.get("access_key"):
        kwargs["aws_access_key_id"] = params["access_key"]
    if params.get("secret_key"):
        kwargs["aws_secret_access_key"] = params["secret_key"]
    if params.get("session_token"):
        kwargs["aws_session_token"] = params["session_token"]
    if params.get("ca_bundle"):
        kwargs["verify"] = params["ca_bundle"]
    return boto3.session.Session().client("s3", **kwargs)


def error_code(e: BaseException) -> str:
    """S3's error code of a botocore ClientError ('' for anything else: a connection that failed)."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", "")) or str(response.get("ResponseMetadata", {})
                                                                  .get("HTTPStatusCode", ""))


def describe(e: BaseException) -> str:
    code = error_code(e)
    return f"{code}: {e}" if code else str(e) or type(e).__name__


def probe(params: Mapping[str, str], prefix: str) -> tuple[str, str] | None:
    """One listing of at most one key under `prefix`: None when the store answers; ("problem", line) for a
    configuration it refuses (credentials, no such bucket); ("unreachable", line) when nothing answers."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket = bucket_of(params)
    if not bucket:
        return ("problem", "OBJ needs a bucket: +cache.l2.backend_params.bucket=NAME (or AWS_DEFAULT_BUCKET)")
    where = f"bucket {bucket} at {endpoint_of(params) or 'AWS S3'}"
    try:
        s3_client(params).list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except ClientError as e:
        code = error_code(e)
        if code in CREDENTIAL_ERRORS:
            return ("problem", f"OBJ: the object store refused these credentials ({code}) for {where}: check "
                               "access_key / secret_key (or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
        if code == "NoSuchBucket":
            return ("problem", f"OBJ: no {where} (bucket names are 3-63 characters; create it first)")
        return ("problem", f"OBJ: the object store refused a listing of {where}: {describe(e)}")
    except (BotoCoreError, OSError, ValueError) as e:  # no connection, a bad URL, a TLS failure
        return ("unreachable", f"OBJ: cannot reach {where}: {describe(e)}")
    return None


def list_objects(client: Any, bucket: str, prefix: str) -> Iterator[tuple[str, int, float]]:
    """(key, size, last modified as unix time) of every object under prefix (ListObjectsV2, paged)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            yield o["Key"], int(o["Size"]), o["LastModified"].timestamp()


def delete_objects(client: Any, bucket: str, keys: list[str]) -> None:
    """Delete these objects (keys absent already are fine: S3 deletes are idempotent)."""
    for start in range(0, len(keys), DELETE_BATCH):
        batch = keys[start : start + DELETE_BATCH]
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})


def exists(client: Any, bucket: str, key: str) -> bool | None:
    """Whether the object exists (HEAD): None when the store could not say."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        return False if error_code(e) in ("404", "NoSuchKey", "NotFound") else None
    except (BotoCoreError, OSError):
        return None
    return True


def get_json(client: Any, bucket: str, key: str) -> dict[str, Any]:
    """A small JSON object's content, {} when missing or unreadable."""
    try:
        data = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception:  # noqa: BLE001  any failure means: nothing measured before
        return {}
    return data if isinstance(data, dict) else {}


def put_json(client: Any, bucket: str, key: str, data: dict[str, Any]) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(data, sort_keys=True).encode())
