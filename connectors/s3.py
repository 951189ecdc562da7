"""A bucket/prefix of masters (migrations from an existing bucket), grouped like a folder tree (grouping.py).

LastModified drives `changes(since)`. A single-part upload's ETag is its MD5, which is then verified
on download (`etag_is_md5`; turn it off for buckets encrypted with SSE-KMS/SSE-C, whose ETags are not
MD5s; multipart ETags, "…-N", are never taken for one). Requests are retried by botocore's
"standard" mode with the policy's attempts and timeouts; interrupted or unverifiable downloads are
retried by fetching.py under the same policy.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal

import boto3
import botocore.exceptions
from botocore.config import Config
from pydantic import Field, field_validator, model_validator
from urllib3.exceptions import HTTPError as Urllib3Error

from connectors.base import SourceItem
from connectors.errors import (AuthenticationFailed, ObjectNotFound, PermissionDenied, SourceRequestFailed,
                               SourceUnavailable, TransferInterrupted)
from connectors.fetching import CHUNK_SIZE, Body, fixity
from connectors.grouping import GroupedSource, GroupingSettings, StoredFile
from connectors.http import VerifyTls
from connectors.redaction import Secret, register, scrub
from connectors.retry import RetryBudget, RetryPolicy
from gcis_etl.settings import Settings

_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired"}
_INTERRUPTED = (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ResponseStreamingError,
                botocore.exceptions.IncompleteReadError, botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.FlexibleChecksumError, Urllib3Error, ConnectionError)


class S3Settings(Settings):
    bucket: str = Field(min_length=3)
    prefix: str = Field("", description="key prefix of the source root; a trailing / is implied")
    endpoint_url: str | None = Field(None, pattern=r"^https?://")
    region: str = "us-east-1"
    access_key_id: Secret | None = Field(None, description="None: boto3's default chain (env, profile, role)")
    secret_access_key: Secret | None = None
    session_token: Secret | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    verify_tls: VerifyTls = True
    etag_is_md5: bool = True
    grouping: GroupingSettings = GroupingSettings()
    retry: RetryPolicy = RetryPolicy()

    @field_validator("prefix")
    @classmethod
    def _folder(cls, value: str) -> str:
        value = value.strip("/")
        return f"{value}/" if value else ""

    @model_validator(mode="after")
    def _key_pair(self) -> "S3Settings":
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together (or neither, for boto3's default chain)")
        return self


class S3Source(GroupedSource):
    # Settings that change how the bucket is reached, not what it lists (gcis_etl.pipelines.TRANSPORT).
    transport_settings = ("access_key_id", "secret_access_key", "session_token", "region", "addressing_style")
    def __init__(self, settings: S3Settings, name: str = "s3"):
        self.name = name
        self.settings = settings
        self.grouping = settings.grouping
        self.retry = settings.retry
        register(*(s.get_secret_value() for s in
                            (settings.access_key_id, settings.secret_access_key, settings.session_token) if s))
        self._client: Any = None
        self._pid = 0

    @property
    def client(self):
        """One client per process (its connection pool must not cross a fork)."""
        if self._client is None or self._pid != os.getpid():
            s = self.settings
            session = boto3.session.Session(aws_access_key_id=_reveal(s.access_key_id),
                                            aws_secret_access_key=_reveal(s.secret_access_key),
                                            aws_session_token=_reveal(s.session_token), region_name=s.region)
            self._client = session.client("s3", endpoint_url=s.endpoint_url, verify=s.verify_tls, config=Config(
                connect_timeout=s.retry.connect_timeout_seconds, read_timeout=s.retry.read_timeout_seconds,
                retries={"total_max_attempts": s.retry.max_attempts, "mode": "standard"},
                s3={"addressing_style": s.addressing_style}))
            self._pid = os.getpid()
        return self._client

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """Run a boto3 call, turning its exceptions into SourceErrors that name the bucket and key only."""
        where = f"{self.name}: {what} s3://{self.settings.bucket}/"
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            message = scrub(f"{where}: {code} {error.get('Message', '')}".strip())
            if code in _AUTH_CODES:
                raise AuthenticationFailed(f"{message}: check access_key_id/secret_access_key") from None
            if code == "AccessDenied" or status == 403:
                raise PermissionDenied(message) from None
            if code in ("NoSuchKey", "NotFound", "404"):
                raise ObjectNotFound(message) from None
            if status >= 500 or code in ("SlowDown", "RequestTimeout", "ServiceUnavailable"):
                raise SourceUnavailable(message) from None
            raise SourceRequestFailed(message, status or None) from None
        except botocore.exceptions.NoCredentialsError:
            raise AuthenticationFailed(f"{where}: no credentials (set access_key_id/secret_access_key "
                                       "or provide them through boto3's default chain)") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise SourceUnavailable(f"{where}: {type(exc).__name__} after "
                                    f"{self.settings.retry.max_attempts} attempt(s)") from None

    def _files(self) -> Iterator[StoredFile]:
        prefix = self.settings.prefix
        pages = self._call("list", lambda: self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.settings.bucket, Prefix=prefix))
        iterator = iter(pages)
        while True:
            page = self._call("list", lambda: next(iterator, None))
            if page is None:
                return
            for entry in page.get("Contents", []):
                if entry["Key"].endswith("/"):
                    continue
                yield StoredFile(entry["Key"][len(prefix):], entry["Size"], entry["LastModified"],
                                 self._etag_fixity(entry.get("ETag", "")))

    def _etag_fixity(self, etag: str):
        etag = etag.strip('"').lower()
        if self.settings.etag_is_md5 and re.fullmatch(r"[0-9a-f]{32}", etag):
            return fixity("md5", etag)
        return None

    def _read(self, path: str) -> bytes:
        key = self.settings.prefix + path
        return self._call(f"read {key} from", lambda: self.client.get_object(
            Bucket=self.settings.bucket, Key=key)["Body"].read())

    def _locate(self, path: str) -> str:
        return self.settings.prefix + path

    @contextmanager
    def _open(self, item: SourceItem, budget: RetryBudget) -> Iterator[Body]:
        response = self._call(f"get {item.locator} from", lambda: self.client.get_object(
            Bucket=self.settings.bucket, Key=item.locator))
        stream = response["Body"]
        try:
            yield Body(self._chunks(stream, item.locator), response.get("ContentLength"))
        finally:
            stream.close()

    def _chunks(self, stream, key: str) -> Iterator[bytes]:
        try:
            yield from stream.iter_chunks(CHUNK_SIZE)
        except _INTERRUPTED as exc:
            raise TransferInterrupted(f"s3://{self.settings.bucket}/{key}: {type(exc).__name__}") from None


def _reveal(secret) -> str | None:
    return secret.get_secret_value() if secret else None
