"""Shared fixtures: the corpus, and real servers (MinIO) started once per session."""
from __future__ import annotations

import csv
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import MinioServer, free_port

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
