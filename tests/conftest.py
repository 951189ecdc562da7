"""Shared fixtures: the corpus, and real servers (MinIO) started once per session."""
from __future__ import annotations

import csv
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import MinioServer, free_port

MiB = 1024 * 1024

CORPUS = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class CorpusEntry:
    path: Path
    expected: str
    category: str
    notes: str
    row: dict


def corpus_entries() -> list[CorpusEntry]:
    with open(CORPUS / "MANIFEST.csv", newline="") as f:
        return [CorpusEntry(CORPUS / r["local_path"], r["expected"], r["category"], r["notes"], r)
                for r in csv.DictReader(f)]


@pytest.fixture(scope="session")
def minio(tmp_path_factory) -> MinioServer:
    server = MinioServer(data_dir=tmp_path_factory.mktemp("minio"), port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(minio) -> str:
    """A fresh, empty bucket per test."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def aws_env(minio, monkeypatch, tmp_path):
    """Credentials reach boto3 the normal way (the environment); no shared config file interferes."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def s3_settings(minio, bucket: str, **overrides):
    """Settings of an S3 store on the test MinIO, validated as config.yaml would be."""
    from gcis_etl.settings import parse
    from gcis_etl.stores import S3StoreSettings
    data = {"kind": "s3", "bucket": bucket, "prefix": "iiif/access", "endpoint_url": minio.endpoint,
            "region": "us-east-1", "addressing_style": "path",
            "multipart_threshold": 8 * MiB, "multipart_chunksize": 8 * MiB, **overrides}
    return parse(S3StoreSettings, data, "test-config.yaml", "store")
