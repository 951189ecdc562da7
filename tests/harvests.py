"""Test rig for harvest runs over the real parts: a config file in tmp_path naming an emulated DAM (served from
this process) and a fresh MinIO bucket, `gcis-etl` as a subprocess or `harvest()` in process, and what the
ledger and the bucket must hold once the run is done — derived from the emulator's catalogue and the corpus
MANIFEST.csv, never from the code under test.
"""
from __future__ import annotations

import csv
import json
import mimetypes
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote

import numpy as np
import pytest
import tifffile
import yaml

from gcis_etl.iiif_validation import validate
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS, CorpusFile, utc
from tests.emulators.otmm import OtmmCatalogue
from tests.emulators.rosetta import Entity, Representation, RosettaCatalogue, RosettaFile
from tests.emulators.server import App, EmulatorServer, Request, Response
from tests.servers import MinioServer

GCIS = str(Path(sys.executable).with_name("gcis-etl"))
PREFIX = "iiif"
VERSIONS = ("3", "2")
MANIFEST_BASE = f"http://127.0.0.1:8182/store/{PREFIX}"  # where the bucket's prefix is published
ROSETTA_PASSWORD = "harvest-Secret-1"
OTMM_PASSWORD = "otmm-Secret-3"
SECRETS = {"ROSETTA_PASSWORD": ROSETTA_PASSWORD, "OTMM_PASSWORD": OTMM_PASSWORD}
PATIENT_RETRY = {**FAST_RETRY, "read_timeout_seconds": 120}  # a download held at a Gate is not a timeout


# ------------------------------------------------------------------------------------------- sources


IMAGE_SERVICE = "http://127.0.0.1:8182/iiif"


@lru_cache(maxsize=1)
def corpus_verdicts() -> dict[str, str]:
    with open(CORPUS / "MANIFEST.csv", newline="") as f:
        return {row["local_path"]: row["expected"] for row in csv.DictReader(f)}


@dataclass(frozen=True)
class GeneratedFile(CorpusFile):
    """A master outside the corpus (`relative` is its absolute path) that a harvest accepts: one the test wrote,
    or the IIIF validator's test image. Its MIME type follows its extension."""

    @property
    def path(self) -> Path:
        return Path(self.relative)

    @property
    def mime(self) -> str:
        return mimetypes.guess_type(self.relative)[0] or "application/octet-stream"


def outcome(file: CorpusFile) -> str:
    """What the ledger must end up saying about a master, from the corpus MANIFEST.csv."""
    if isinstance(file, GeneratedFile):
        return "deposited"
    return "rejected" if corpus_verdicts()[file.relative] == "reject" else "deposited"


def ie(number: int, modified: str, *files: RosettaFile | CorpusFile | str, title: str | None = None,
       **entity) -> Entity:
    """An IE numbered from `number` (IE, REP then FL PIDs follow on) whose modified master holds `files`; a
    RosettaFile keeps its own PID and label."""
    masters = [f if isinstance(f, RosettaFile) else
               RosettaFile(f"FL{number + 2 + n}", f if isinstance(f, CorpusFile) else CorpusFile(f), f"Image {n + 1}")
               for n, f in enumerate(files)]
    return Entity(f"IE{number}", [("dc:title", title or f"Object {number}", "en")], utc("2023-01-01 00:00:00"),
                  utc(modified), [Representation(f"REP{number + 1}", "MODIFIED_MASTER", masters)], **entity)


def rosetta_listing(catalogue: RosettaCatalogue, oai_set: str = "gcis") -> dict[str, list[RosettaFile]]:
    """What a Rosetta harvest must cover: live IEs of the set, the files of their modified master in order."""
    return {e.pid: next(r for r in e.reps if r.preservation_type == "MODIFIED_MASTER").files
            for e in catalogue.entities.values() if not e.deleted and oai_set in e.sets}


@dataclass(frozen=True)
class Expected:
    """The end state of a complete harvest: each object's items in display order, and each item's outcome."""

    order: dict[str, list[str]]
    outcomes: dict[tuple[str, str], str]


def rosetta_expected(catalogue: RosettaCatalogue, oai_set: str = "gcis") -> Expected:
    listing = rosetta_listing(catalogue, oai_set)
    return Expected({pid: [f.pid for f in files] for pid, files in listing.items()},
                    {(pid, f.pid): outcome(f.source) for pid, files in listing.items() for f in files})


def otmm_expected(catalogue: OtmmCatalogue, group: str = "GTRUST.FIELD.OBJECT NUMBER",
                  sequence: str = "GTRUST.FIELD.SEQUENCE") -> Expected:
    """Assets grouped by object number, in the order of their sequence field."""
    assets = sorted(catalogue.assets.values(), key=lambda a: (a.fields[group], int(a.fields[sequence])))
    order: dict[str, list[str]] = {}
    for asset in assets:
        order.setdefault(asset.fields[group], []).append(asset.asset_id)
    return Expected(order, {(a.fields[group], a.asset_id): outcome(a.master) for a in assets})


def rosetta_source(url: str, **overrides) -> dict:
    return {"kind": "rosetta", "base_url": url, "username": "harvester", "institution_code": "INS00",
            "password": "${ROSETTA_PASSWORD}", "oai": {"set": "gcis"}, "retry": FAST_RETRY, **overrides}


def otmm_source(url: str, **overrides) -> dict:
    return {"kind": "otmm", "base_url": url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
            "retry": FAST_RETRY, "search": {"page_size": 2},
            "group": {"field_id": "GTRUST.FIELD.OBJECT NUMBER", "sequence_field_id": "GTRUST.FIELD.SEQUENCE"},
            "metadata_map": {"GTRUST.FIELD.TITLE": "title"}, **overrides}


class Gate:
    """Wraps an emulator so that the requests whose path and query match `pattern` (a regex) wait until the test
    opens the gate: a run that is certainly still fetching, without guessing how long anything takes."""

    def __init__(self, app: App, pattern: str):
        self.app = app
        self.pattern = re.compile(pattern)
        self.opened = threading.Event()
        self.held = 0
        self._lock = threading.Lock()

    def handle(self, request: Request) -> Response:
        if self.pattern.search(request.target) and not self.opened.is_set():
            with self._lock:
                self.held += 1
            self.opened.wait(120)
        return self.app.handle(request)

    def control(self, name: str, request: Request) -> Response:
        return self.app.control(name, request)

    def open(self) -> None:
        self.opened.set()


@contextmanager
def serving(app: App) -> Iterator[EmulatorServer]:
    with EmulatorServer(app) as server:
        try:
            yield server
        finally:
            if isinstance(app, Gate):
                app.open()  # let held handler threads finish before the server closes


def write_noise_tiff(path: Path, side: int) -> Path:
    """An uncompressed RGB TIFF of noise: its access master stays big (JPEG cannot squeeze noise)."""
    pixels = np.random.default_rng(6).integers(0, 256, (side, side, 3), dtype=np.uint8)
    tifffile.imwrite(path, pixels, photometric="rgb")
    return path


# ----------------------------------------------------------------------------------------------- the rig


@dataclass
class Rig:
    """One pipeline (`dam`) in its own folder and bucket: config.yaml, state/ (ledger, locks, reports)."""

    root: Path
    minio: MinioServer
    bucket: str
    pipeline: str = "dam"
    manifest_base: str = MANIFEST_BASE
    image_service: str = IMAGE_SERVICE
    extension: str = "tif"  # of the pipeline recipe's access masters
    client: object = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.minio.client()

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def ledger_path(self) -> Path:
        return self.root / "state" / "ledger.sqlite"

    def write(self, source: dict, store: dict | None = None, **settings) -> Path:
        """config.yaml with this rig's pipeline alone."""
        return self.write_config({self.pipeline: self.pipeline_config(source, store, **settings)})

    def pipeline_config(self, source: dict, store: dict | None = None, **settings) -> dict:
        """A pipeline from `source` into this rig's bucket, with both manifest versions; `settings` are its run
        settings (recipe, concurrency, max_attempts, ...)."""
        return {"source": source,
                "store": {"kind": "s3", "bucket": self.bucket, "prefix": PREFIX, "endpoint_url": self.minio.endpoint,
                          "region": "us-east-1", "addressing_style": "path", **(store or {})},
                "manifests": {"manifest_base_url": self.manifest_base,
                              "image_service_base_url": self.image_service, "versions": ["3.0", "2.1"],
                              "label": ["title", "dc:title"], "collection_label": "Harvest test"},
                **settings}

    def write_config(self, pipelines: dict[str, dict], **sections) -> Path:
        """config.yaml with these pipelines (from pipeline_config) and other top-level `sections` (cache, ...)."""
        self.config.write_text(yaml.safe_dump({"state_dir": "state", "defaults": {"concurrency": 2},
                                               "pipelines": pipelines, **sections}, sort_keys=False))
        return self.config

    # ---------------------------------------------------------------------------------------- running

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([GCIS, "--config", str(self.config), *args], capture_output=True, text=True,
                              timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([GCIS, "--config", str(self.config), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def harvest(self, **options):
        """One run in this process (the library entry point)."""
        from gcis_etl.config import load_config
        from gcis_etl.harvesting import HarvestOptions, harvest
        return harvest(load_config(self.config), self.pipeline, HarvestOptions(**options))

    # ------------------------------------------------------------------------------------ observing

    @contextmanager
    def ledger(self) -> Iterator[Ledger]:
        with Ledger(self.ledger_path) as ledger:
            yield ledger

    def peek(self, sql: str) -> list[tuple]:
        return peek(self.ledger_path, sql)

    def statuses(self) -> dict[tuple[str, str], str]:
        return {(o, i): s for o, i, s in self.peek("SELECT object_id, item_id, status FROM items")}

    def keys(self) -> list[str]:
        """Every key in the bucket below the store prefix (a list: a duplicate would show)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        assert all(k.startswith(PREFIX + "/") for k in keys), keys
        return sorted(k[len(PREFIX) + 1:] for k in keys)

    def uploads(self) -> list[dict]:
        return self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])

    def document(self, key: str) -> dict:
        return json.loads(self.client.get_object(Bucket=self.bucket, Key=f"{PREFIX}/{key}")["Body"].read())

    # --------------------------------------------------------------------------------- expectations

    def image_key(self, object_id: str, item_id: str) -> str:
        return f"{self.pipeline}/{object_id}/{item_id}.{self.extension}"

    def expected_keys(self, expected: Expected) -> list[str]:
        """The documented layout (keys.py's default templates): images, two manifests per object with at least
        one deposited image, and the pipeline's two collections."""
        published = published_objects(expected)
        keys = [self.image_key(o, i) for (o, i), status in expected.outcomes.items() if status == "deposited"]
        keys += [f"{self.pipeline}/{o}/manifest-v{v}.json" for o in published for v in VERSIONS]
        keys += [f"collections/{self.pipeline}-v{v}.json" for v in VERSIONS] if published else []
        return sorted(keys)

    def check_final_state(self, expected: Expected) -> None:
        """Ledger, bucket, manifests and collections are exactly what a complete harvest must leave."""
        with self.ledger() as ledger:
            records = {(r.object_id, r.item_id): r for r in ledger.items(self.pipeline)}
        assert {k: r.status for k, r in records.items()} == expected.outcomes
        for key, record in records.items():
            if record.status == "rejected":
                assert record.reason and record.reason.strip() and "\n" not in record.reason, record
                assert record.sha256 is None and record.output_key is None, record
            else:
                assert record.output_key == self.image_key(*key) and record.width > 0 and record.height > 0
                head = self.client.head_object(Bucket=self.bucket, Key=f"{PREFIX}/{record.output_key}")
                assert head["Metadata"]["sha256"] == record.sha256 and head["ContentLength"] == record.bytes
        assert self.keys() == self.expected_keys(expected)
        assert self.uploads() == []
        published = published_objects(expected)
        for object_id in published:
            self.check_manifests(object_id, [i for i in expected.order[object_id]
                                             if expected.outcomes[(object_id, i)] == "deposited"])
        self.check_collections(published)

    def check_manifests(self, object_id: str, items: list[str]) -> None:
        """Both versions valid, one canvas per deposited image, in order, each naming its access master."""
        v3 = self.document(f"{self.pipeline}/{object_id}/manifest-v3.json")
        assert validate(v3, "3.0").errors == ()
        services = [canvas["items"][0]["items"][0]["body"]["service"][0]["@id"] for canvas in v3["items"]]
        assert [unquote(s.removeprefix(self.image_service + "/")) for s in services] == \
            [self.image_key(object_id, i) for i in items]
        v2 = self.document(f"{self.pipeline}/{object_id}/manifest-v2.json")
        assert validate(v2, "2.1").errors == ()
        services = [c["images"][0]["resource"]["service"]["@id"] for c in v2["sequences"][0]["canvases"]]
        assert [unquote(s.removeprefix(self.image_service + "/")) for s in services] == \
            [self.image_key(object_id, i) for i in items]

    def check_collections(self, published: list[str]) -> None:
        """Each collection lists every published manifest exactly once, and nothing else."""
        for version, items, id_name in (("3", "items", "id"), ("2", "manifests", "@id")):
            collection = self.document(f"collections/{self.pipeline}-v{version}.json")
            assert validate(collection, "3.0" if version == "3" else "2.1").errors == ()
            listed = [item[id_name] for item in collection[items]]
            assert listed == sorted(f"{self.manifest_base}/{self.pipeline}/{o}/manifest-v{version}.json"
                                    for o in published)


def published_objects(expected: Expected) -> list[str]:
    """Objects with at least one deposited image: those that get a manifest."""
    return sorted({o for (o, _), status in expected.outcomes.items() if status == "deposited"})


def harvest_environment(monkeypatch: pytest.MonkeyPatch, minio: MinioServer, tmp_path: Path) -> None:
    """Credentials reach boto3 and the config's ${...} references through the environment, in this process and
    in the `gcis-etl` subprocesses it starts; no AWS profile or GCIS_CONFIG of the machine interferes."""
    for name, value in {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key,
                        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"), **SECRETS}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("GCIS_CONFIG", raising=False)


@contextmanager
def harvest_credentials(minio: MinioServer, tmp_path: Path) -> Iterator[None]:
    """harvest_environment for one block, where no monkeypatch fixture is at hand (session fixtures)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        harvest_environment(monkeypatch, minio, tmp_path)
        yield


@pytest.fixture
def rig(tmp_path, minio, monkeypatch) -> Rig:
    harvest_environment(monkeypatch, minio, tmp_path)
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    minio.client().create_bucket(Bucket=bucket)
    return Rig(tmp_path, minio, bucket)


def wait_for(condition: Callable[[], object], what: str, proc: subprocess.Popen | None = None,
             timeout: float = 60) -> object:
    """Poll until `condition()` is truthy; fail with the process's output if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


def kill(proc: subprocess.Popen) -> None:
    """kill -9, and make sure it was the kill that ended the process (the run did not finish on its own)."""
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def peek(ledger: Path, sql: str) -> list[tuple]:
    """A read-only look at the ledger while a run writes it (no schema set-up, no write lock)."""
    if not ledger.exists():
        return []
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the run has not created the tables yet
        return []
    finally:
        db.close()
