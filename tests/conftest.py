"""Shared fixtures: the corpus, and real servers (MinIO) started once per session."""
from __future__ import annotations

import contextlib
import csv
import importlib
import os
import pty
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.harvests")  # before any test module imports it: its checks explain failures

from tests.servers import MinioServer, free_port  # noqa: E402

MiB = 1024 * 1024

CORPUS = Path(__file__).parent / "corpus"


def run_on_a_terminal(argv: list[str], **popen) -> tuple[subprocess.Popen, str]:
    """`argv` run with its stderr on a pseudo-terminal (as a live line needs) and its stdout piped: the process,
    ended but not waited for, and all the terminal showed."""
    main, terminal = pty.openpty()
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=terminal, **popen)
    os.close(terminal)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the run has closed the terminal
        while chunk := os.read(main, 65536):
            shown += chunk
    os.close(main)
    return run, shown.decode()


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


@pytest.fixture
def declare(tmp_path, monkeypatch):
    """declare("my-connectors", flat="module:Class"): a distribution declaring connectors, installed on sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(distribution: str, **kinds: str) -> Path:
        info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[gcis_etl.connectors]\n" +
                                               "".join(f"{kind} = {target}\n" for kind, target in kinds.items()))
        importlib.invalidate_caches()
        return site
    return install


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


# ---------------------------------------------------------------------------------------------------------
# Celery worker pool (gcis_etl.worker): real brokers (Redis, RabbitMQ) and real worker processes.


@pytest.fixture
def redis_server(tmp_path_factory):
    """redis-server on 127.0.0.1, random port, no persistence; .restart() loses everything, like a crash."""
    from tests.broker import RedisServer
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"), port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def rabbitmq_server(tmp_path_factory):
    """A private RabbitMQ node (and its epmd) on 127.0.0.1, random ports; stopped at teardown."""
    from tests.broker import RabbitMQServer
    server = RabbitMQServer(tmp_path_factory.mktemp("rabbitmq"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def celery_workers(tmp_path):
    """start(name, config, env, *options) -> a ready CeleryWorker; every node is killed at teardown."""
    from tests.broker import CeleryWorker
    started = []

    def start(name: str, config: Path, env: dict[str, str], *options: str) -> CeleryWorker:
        worker = CeleryWorker(name, config, tmp_path / f"{name}.log", env, options)
        started.append(worker)
        worker.start()
        return worker

    yield start
    for worker in started:
        worker.kill()
# ---------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------
# iipsrv consumer (issue #8; helpers in tests/consumer.py): images and manifests deposited in MinIO, the
# access-master cache synced from there, and lighttpd + iipsrv serving it on 127.0.0.1.


@pytest.fixture(scope="session")
def iiif_port() -> int:
    """Chosen before anything is deposited: the manifests name the image service's URL."""
    return free_port()


@pytest.fixture(scope="session")
def deposited(minio, tmp_path_factory, iiif_port):
    """`gcis-etl harvest` over the emulated Rosetta into a public-read MinIO bucket (tests/consumer.py
    deposit_by_harvest); its config.yaml also holds the `cache:` the consumer fixtures sync and serve."""
    import json

    from tests.consumer import deposit_by_harvest
    from tests.harvests import PREFIX, Rig, harvest_credentials
    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    client = minio.client()
    client.create_bucket(Bucket=bucket)
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": ["*"]}, "Action": ["s3:GetObject"],
                       "Resource": [f"arn:aws:s3:::{bucket}/*"]}]}))
    root = tmp_path_factory.mktemp("harvest")
    rig = Rig(root, minio, bucket, manifest_base=f"{minio.endpoint}/{bucket}/{PREFIX}",
              image_service=f"http://127.0.0.1:{iiif_port}/iiif")
    with harvest_credentials(minio, root):  # the store's client keeps them; the rest of the session does not
        return deposit_by_harvest(rig, cache_config(tmp_path_factory.mktemp("consumer"), iiif_port))


def cache_config(root: Path, port: int = 0, **server) -> dict:
    """config.yaml `cache:` below `root`: the cache, and the server on `port`."""
    return {"dir": str(root / "cache"), "server": {
        "port": port, "run_dir": str(root / "run"), "access_log": str(root / "run" / "access.log"), **server}}


def cache_settings(root: Path, port: int = 0, **server):
    """Cache and server settings below `root`, validated as config.yaml `cache:` would be."""
    from gcis_etl.cache import CacheSettings
    from gcis_etl.settings import parse
    return parse(CacheSettings, cache_config(root, port, **server), "test-config.yaml", "cache")


@pytest.fixture(scope="session")
def synced_cache(deposited, minio):
    """The cache after one `gcis-etl cache sync` with the harvest's config.yaml (nothing failed)."""
    import json

    from gcis_etl.config import load_config
    from tests.harvests import harvest_credentials
    with harvest_credentials(minio, deposited.rig.root):
        run = deposited.rig.cli("cache", "sync", "--json")
        assert run.returncode == 0, f"cache sync exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
        settings = load_config(deposited.rig.config).cache
    copied = json.loads(run.stdout)["copied"]
    assert sorted(copied) == sorted(image.key for image in deposited.images)
    return settings


@pytest.fixture(scope="session")
def consumer(synced_cache):
    """lighttpd + iipsrv (deploy/iipsrv/demo.conf, which includes lighttpd.conf) serving the synced cache."""
    from gcis_etl.iipsrv import Consumer
    with Consumer(synced_cache.server, synced_cache.images_dir, demo=True) as running:
        yield running
# ---------------------------------------------------------------------------------------------------------
