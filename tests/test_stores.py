"""Stores: the local filesystem store and the S3 store against a real MinIO, integrity checked end to end."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError, IntegrityError, StoreError, StoreRefused
from gcis_etl.keys import UnsafeKey
from gcis_etl.settings import parse
from gcis_etl.manifests import MEDIA_TYPES
from gcis_etl.stores import (DOCUMENT_CACHE_CONTROL, LocalStore, LocalStoreSettings, Provenance, S3Store,
                             S3StoreSettings, open_store)

from tests.conftest import MiB, s3_settings
from tests.emulators.faults import Fault
from tests.servers import s3_fault_proxy
REPO = Path(__file__).resolve().parents[1]
PROVENANCE = Provenance(source_id="IE 42/ü\nnext-line\udcff", source_checksum="md5:9e107d9d372bb6826bd81d3542a419d6",
                        recipe="ptiff-jpeg-q90", recipe_digest="sha256:" + "ab" * 32, width=6000, height=4000)
HOSTILE_KEYS = ["../escape.tif", "/etc/passwd", "a/../../b.tif", "p/o/x_pyr_1.tif", "p/o/a b.tif", "p/.meta/x.json",
                "p//o.tif", "p/o/\x00.tif", "p/o/%2e%2e.tif"]


def write(path: Path, data: bytes) -> tuple[Path, str]:
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def random_file(path: Path, size: int) -> tuple[Path, str]:
    """A file of random bytes, written in pieces so a 100 MB one does not need 100 MB twice."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MiB))
            digest.update(block)
            f.write(block)
            left -= len(block)
    return path, digest.hexdigest()


@pytest.fixture
def s3_store(minio, s3_bucket, aws_env) -> S3Store:
    return open_store(s3_settings(minio, s3_bucket))


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return open_store(LocalStoreSettings(root=tmp_path / "store"))


@pytest.fixture(params=["local", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


# ------------------------------------------------------------------------------------------- both stores


def test_put_then_head_get_list_delete(store, tmp_path):
    path, sha = write(tmp_path / "a.tif", b"II*\x00 pretend tiff")
    stored = store.put("demo/IE1/FL1.tif", path, sha256=sha, provenance=PROVENANCE)
    assert (stored.key, stored.size, stored.sha256, stored.unchanged) == ("demo/IE1/FL1.tif", 17, sha, False)

    head = store.head("demo/IE1/FL1.tif")
    assert (head.size, head.sha256, head.content_type) == (17, sha, "image/tiff")
    assert head.provenance == PROVENANCE
    assert store.get_bytes("demo/IE1/FL1.tif") == path.read_bytes()

    store.put_bytes("demo/IE1/manifest-v3.json", b"{}", content_type="application/ld+json")
    store.put_bytes("demo/IE10/manifest-v3.json", b"{}", content_type="application/ld+json")
    store.put_bytes("other/IE1/manifest-v3.json", b"{}", content_type="application/ld+json")
    assert [o.key for o in store.list("demo/IE1/")] == ["demo/IE1/FL1.tif", "demo/IE1/manifest-v3.json"]
    assert [o.key for o in store.list("demo/IE1")] == ["demo/IE1/FL1.tif", "demo/IE1/manifest-v3.json",
                                                       "demo/IE10/manifest-v3.json"]
    assert [o.size for o in store.list("demo/IE1/")] == [17, 2]
    assert len(list(store.list())) == 4

    assert store.exists("demo/IE1/FL1.tif")
    assert store.delete("demo/IE1/FL1.tif") is True
    assert store.delete("demo/IE1/FL1.tif") is False
    assert not store.exists("demo/IE1/FL1.tif") and store.head("demo/IE1/FL1.tif") is None
    with pytest.raises(StoreError):
        store.get_bytes("demo/IE1/FL1.tif")


def test_same_content_again_is_a_noop_and_new_content_replaces(store, tmp_path):
    path, sha = write(tmp_path / "a.tif", b"first version")
    store.put("demo/IE1/FL1.tif", path, sha256=sha, provenance=PROVENANCE)
    again = store.put("demo/IE1/FL1.tif", path)  # no digest given: computed while reading, same content
    assert again.unchanged and again.sha256 == sha
    assert again.provenance == PROVENANCE  # nothing was rewritten, not even the metadata

    path2, sha2 = write(tmp_path / "b.tif", b"second, longer version")
    replaced = store.put("demo/IE1/FL1.tif", path2, sha256=sha2)
    assert not replaced.unchanged
    assert store.head("demo/IE1/FL1.tif").sha256 == sha2
    assert store.get_bytes("demo/IE1/FL1.tif") == b"second, longer version"


def test_a_checksum_mismatch_stores_nothing_and_keeps_the_old_content(store, tmp_path):
    path, sha = write(tmp_path / "a.tif", b"good content")
    store.put("demo/IE1/FL1.tif", path, sha256=sha)
    path.write_bytes(b"corrupted after the digest was taken")
    with pytest.raises(IntegrityError, match="demo/IE1/FL1.tif"):
        store.put("demo/IE1/FL1.tif", path, sha256=hashlib.sha256(b"what the encoder wrote").hexdigest())
    with pytest.raises(IntegrityError):
        store.put("demo/IE1/FL2.tif", path, sha256=sha)
    assert store.get_bytes("demo/IE1/FL1.tif") == b"good content"
    assert store.head("demo/IE1/FL2.tif") is None


def test_download_streams_to_a_file_and_returns_what_reached_the_disk(store, tmp_path):
    """Above the multipart threshold (8 MiB here), so S3 downloads in ranged parts."""
    path, sha = random_file(tmp_path / "big.tif", 20 * MiB + 7)
    store.put("demo/IE1/big.tif", path, sha256=sha)
    copy = tmp_path / "copy.tif"
    assert store.download("demo/IE1/big.tif", copy) == sha
    assert copy.stat().st_size == 20 * MiB + 7 and hashlib.sha256(copy.read_bytes()).hexdigest() == sha
    with pytest.raises(StoreError, match="demo/IE1/absent.tif"):
        store.download("demo/IE1/absent.tif", tmp_path / "absent.tif")


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_keys_are_refused_by_every_operation(store, tmp_path, key):
    (tmp_path / "store").mkdir()  # the local store's root: an empty store, not a missing one
    path, sha = write(tmp_path / "a.tif", b"data")
    for operation in (lambda: store.put(key, path, sha256=sha), lambda: store.head(key),
                      lambda: store.exists(key), lambda: store.delete(key), lambda: store.get_bytes(key),
                      lambda: store.download(key, tmp_path / "copy"),
                      lambda: store.put_bytes(key, b"x", content_type="text/plain"), lambda: list(store.list(key))):
        with pytest.raises(UnsafeKey):
            operation()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [path]
    assert list(store.list()) == []


def test_a_missing_source_file_is_a_store_error(store, tmp_path):
    with pytest.raises(StoreError, match="cannot read"):
        store.put("demo/IE1/FL1.tif", tmp_path / "missing.tif")


# ------------------------------------------------------------------------------------------- local store


def test_local_store_writes_atomically_and_hides_its_bookkeeping(local_store, tmp_path):
    path, sha = write(tmp_path / "a.tif", b"content")
    local_store.put("demo/IE1/FL1.tif", path, sha256=sha)
    with pytest.raises(IntegrityError):
        local_store.put("demo/IE1/FL1.tif", path, sha256="0" * 64)
    directory = tmp_path / "store" / "demo" / "IE1"
    assert sorted(p.name for p in directory.iterdir()) == ["FL1.tif"]  # no temporary file left behind
    assert [o.key for o in local_store.list()] == ["demo/IE1/FL1.tif"]  # sidecars are not objects


def unlistable_folder(folder: Path) -> None:
    """A folder below `folder` whose path is too long to be read (ENAMETOOLONG), made through directory
    descriptors: an unreadable folder even for root, whom chmod 000 does not stop."""
    folder.mkdir(parents=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(20):
        os.mkdir("d" * 250, dir_fd=fd)
        inner = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def test_a_local_listing_that_cannot_be_read_is_an_error_never_a_shorter_listing(local_store, tmp_path):
    """The cache sync takes what a listing leaves out for deleted from the store."""
    with pytest.raises(StoreError, match=r"store: cannot list: the store's root folder is missing"):
        local_store.list("demo/")
    path, sha = write(tmp_path / "a.tif", b"content")
    local_store.put("demo/IE1/FL1.tif", path, sha256=sha)
    assert list(local_store.list("other/")) == []  # nothing deposited under that prefix yet: empty
    unlistable_folder(tmp_path / "store" / "demo" / "IE2")
    with pytest.raises(StoreError, match=r"/dddd+: cannot list: File name too long"):
        local_store.list("demo/")
    assert [o.key for o in local_store.list("demo/IE1/")] == ["demo/IE1/FL1.tif"]
    (tmp_path / "store").rename(tmp_path / "unmounted")
    with pytest.raises(StoreError, match=r"store: cannot list: the store's root folder is missing"):
        local_store.list("demo/")


def test_local_store_ignores_a_sidecar_describing_older_content(local_store, tmp_path):
    """A sidecar whose data file was replaced since (by a crash between the two renames, or by hand) must
    not make its digest look current."""
    path, sha = write(tmp_path / "a.tif", b"content")
    local_store.put("demo/IE1/FL1.tif", path, sha256=sha)
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"other!!")  # same size, different bytes, new inode
    os.replace(replacement, tmp_path / "store" / "demo" / "IE1" / "FL1.tif")
    assert local_store.head("demo/IE1/FL1.tif").sha256 is None
    again = local_store.put("demo/IE1/FL1.tif", path, sha256=sha)
    assert not again.unchanged
    assert local_store.get_bytes("demo/IE1/FL1.tif") == b"content"


FULL_DISK_CHILD = """
import resource, signal, sys
from pathlib import Path
from gcis_etl.errors import StoreError
from gcis_etl.stores import LocalStore, LocalStoreSettings, Provenance
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
try:
    LocalStore(LocalStoreSettings(root=sys.argv[1])).put(sys.argv[2], Path(sys.argv[3]),
                                                         provenance=Provenance(source_id="x" * 4096))
except StoreError as exc:
    print(exc)
"""


def test_a_sidecar_that_cannot_be_written_leaves_the_key_as_it_was_and_no_temporary(local_store, tmp_path):
    """The child may write files of 1 KiB at most: the new data fits, its sidecar (a long source id) does not."""
    old, old_sha = write(tmp_path / "old.tif", b"old content")
    local_store.put("demo/IE1/FL1.tif", old, sha256=old_sha, provenance=PROVENANCE)
    new, _ = write(tmp_path / "new.tif", b"new content, longer")
    child = subprocess.run([sys.executable, "-c", FULL_DISK_CHILD, str(local_store.root), "demo/IE1/FL1.tif",
                            str(new)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert child.stdout == f"{local_store.root / 'demo/IE1/FL1.tif'}: cannot write: File too large\n", child.stderr
    assert local_store.get_bytes("demo/IE1/FL1.tif") == b"old content"
    head = local_store.head("demo/IE1/FL1.tif")
    assert (head.sha256, head.provenance) == (old_sha, PROVENANCE)
    assert [p.name for p in local_store.root.rglob("*.tmp")] == []


# ---------------------------------------------------------------------------------------------- S3 store


def test_s3_object_carries_checksum_metadata_and_content_type(s3_store, minio, s3_bucket, tmp_path):
    path, sha = write(tmp_path / "a.jp2", b"\x00\x00\x00\x0cjP  pretend jp2")
    s3_store.put("demo/IE1/FL1.jp2", path, sha256=sha, provenance=PROVENANCE)
    raw = minio.client().head_object(Bucket=s3_bucket, Key="iiif/access/demo/IE1/FL1.jp2", ChecksumMode="ENABLED")
    assert raw["ContentType"] == "image/jp2"
    assert raw["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(sha)).decode()
    assert raw["Metadata"]["sha256"] == sha
    assert raw["Metadata"]["recipe"] == "ptiff-jpeg-q90" and raw["Metadata"]["width"] == "6000"
    assert all(v.isascii() and v.isprintable() for v in raw["Metadata"].values())


def test_multipart_upload_of_100_mb_is_verified_end_to_end(s3_store, minio, s3_bucket, tmp_path):
    path, sha = random_file(tmp_path / "big.tif", 100 * MiB + 12345)
    stored = s3_store.put("demo/IE1/big.tif", path, sha256=sha, provenance=PROVENANCE)
    assert (stored.size, stored.sha256, stored.unchanged) == (100 * MiB + 12345, sha, False)

    # What S3 itself reports: a composite of the SHA-256 of every 8 MiB part, which the test recomputes.
    parts = []
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * MiB), b""):
            parts.append(hashlib.sha256(block).digest())
    composite = base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode() + f"-{len(parts)}"
    client = minio.client()
    raw = client.head_object(Bucket=s3_bucket, Key="iiif/access/demo/IE1/big.tif", ChecksumMode="ENABLED")
    assert len(parts) == 13
    assert (raw["ChecksumSHA256"], raw["ChecksumType"]) == (composite, "COMPOSITE")
    assert raw["Metadata"]["sha256"] == sha

    downloaded = hashlib.sha256()
    for block in client.get_object(Bucket=s3_bucket, Key="iiif/access/demo/IE1/big.tif")["Body"].iter_chunks(MiB):
        downloaded.update(block)
    assert downloaded.hexdigest() == sha
    assert s3_store.put("demo/IE1/big.tif", path, sha256=sha).unchanged


def test_a_pipelines_items_in_flight_upload_at_once_without_dropping_connections(minio, s3_bucket, aws_env,
                                                                                 tmp_path, caplog):
    """A harvest's default 4 items in flight (concurrency 2, as many transfer slots), each uploading its parts
    4 at a time: the client's pool of 8 dropped connections as they came back ("Connection pool is full") and
    reconnected for the next part."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"pipelines": {"demo": {
        "source": {"kind": "filesystem", "root": "masters"},
        "store": {"kind": "s3", "bucket": s3_bucket, "endpoint_url": minio.endpoint, "region": "us-east-1",
                  "addressing_style": "path", "multipart_threshold": 5 * MiB, "multipart_chunksize": 5 * MiB}}}}))
    store = load_config(tmp_path / "config.yaml").pipeline("demo").store
    files = [random_file(tmp_path / f"output-{n}", 21 * MiB) for n in range(4)]
    caplog.set_level(logging.WARNING)
    with ThreadPoolExecutor(4) as pool:
        stored = list(pool.map(lambda n: store.put(f"k{n}", files[n][0], sha256=files[n][1]), range(4)))
    assert [s.sha256 for s in stored] == [sha256 for _, sha256 in files]
    assert [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()] == []


def test_multipart_mismatch_aborts_the_upload_and_keeps_the_old_object(s3_store, minio, s3_bucket, tmp_path):
    path, sha = random_file(tmp_path / "big.tif", 40 * MiB)
    s3_store.put("demo/IE1/big.tif", path, sha256=sha)
    other, _ = random_file(tmp_path / "other.tif", 40 * MiB)
    with pytest.raises(IntegrityError, match="upload was aborted"):
        s3_store.put("demo/IE1/big.tif", other, sha256=hashlib.sha256(b"what the encoder wrote").hexdigest())
    client = minio.client()
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []  # no orphan parts
    assert s3_store.head("demo/IE1/big.tif").sha256 == sha
    raw = client.head_object(Bucket=s3_bucket, Key="iiif/access/demo/IE1/big.tif", ChecksumMode="ENABLED")
    assert raw["ContentLength"] == 40 * MiB and raw["Metadata"]["sha256"] == sha


def test_the_server_checks_the_single_put_checksum(s3_store, minio, s3_bucket, tmp_path):
    """The digest given is sent as x-amz-checksum-sha256 without re-reading: MinIO itself refuses the bytes."""
    path, _ = write(tmp_path / "a.tif", b"bytes on disk")
    with pytest.raises(IntegrityError, match="XAmzContentChecksumMismatch|BadDigest"):
        s3_store.put("demo/IE1/FL1.tif", path, sha256=hashlib.sha256(b"bytes the encoder wrote").hexdigest())
    assert minio.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


CHILD = """
import sys
from pathlib import Path
from gcis_etl.stores import S3Store, S3StoreSettings
S3Store(S3StoreSettings.model_validate_json(sys.argv[1])).put(sys.argv[2], Path(sys.argv[3]))
print("finished")
"""


def wait_for_parts(client, bucket: str, key: str, timeout: float = 30.0) -> str:
    """The upload id of `key` once the server holds at least one of its parts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            if upload["Key"] == key and client.list_parts(Bucket=bucket, Key=key,
                                                          UploadId=upload["UploadId"]).get("Parts"):
                return upload["UploadId"]
        time.sleep(0.02)
    raise AssertionError(f"no part of {key} reached the server within {timeout}s")


def test_a_killed_upload_leaves_no_object(s3_store, minio, s3_bucket, tmp_path):
    path, _ = random_file(tmp_path / "big.tif", 48 * MiB)
    settings = s3_settings(minio, s3_bucket, max_bandwidth=8 * MiB, max_concurrency=1)  # ~6 s to upload
    child = subprocess.Popen([sys.executable, "-c", CHILD, settings.model_dump_json(), "demo/IE1/big.tif", str(path)],
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = minio.client()
    try:
        upload_id = wait_for_parts(client, s3_bucket, "iiif/access/demo/IE1/big.tif")
    finally:
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate()
    assert child.returncode == -signal.SIGKILL and "finished" not in out, err

    assert s3_store.head("demo/IE1/big.tif") is None
    assert list(s3_store.list()) == []
    # The parts are invisible but billed until aborted; a fresh upload would be too young to touch.
    assert s3_store.abort_incomplete_uploads(older_than=timedelta(hours=1)) == []
    assert s3_store.abort_incomplete_uploads(older_than=timedelta(0)) == ["demo/IE1/big.tif"]
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    with pytest.raises(client.exceptions.NoSuchUpload):
        client.list_parts(Bucket=s3_bucket, Key="iiif/access/demo/IE1/big.tif", UploadId=upload_id)


LOCAL_CHILD = """
import sys
from pathlib import Path
from gcis_etl.stores import LocalStore, LocalStoreSettings
LocalStore(LocalStoreSettings(root=sys.argv[1])).put(sys.argv[2], Path(sys.argv[3]))
print("finished")
"""


def test_a_killed_local_write_leaves_only_a_temporary_that_abort_removes(tmp_path):
    """The master arrives through a FIFO, so the child is certainly mid-write when it is killed."""
    fifo = tmp_path / "incoming.fifo"
    os.mkfifo(fifo)
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    child = subprocess.Popen([sys.executable, "-c", LOCAL_CHILD, str(store.root), "demo/IE1/big.tif", str(fifo)],
                             cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "wb") as feed:
            feed.write(os.urandom(4 * MiB))
            feed.flush()
            deadline = time.monotonic() + 30
            while not list((store.root / "demo" / "IE1").glob(".big.tif.*.tmp")) and time.monotonic() < deadline:
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            out, err = child.communicate()
    except BrokenPipeError:
        out, err = child.communicate()
    assert child.returncode == -signal.SIGKILL and "finished" not in out, err

    assert store.head("demo/IE1/big.tif") is None and list(store.list()) == []
    (temporary,) = (store.root / "demo" / "IE1").glob(".big.tif.*.tmp")
    assert store.abort_incomplete_uploads(older_than=timedelta(hours=1)) == []  # could still be writing
    assert store.abort_incomplete_uploads(older_than=timedelta(0), keys="other/") == []
    sidecar = store.root / ".meta" / "demo" / "IE2" / ".FL2.tif.json.k2x_9q.tmp"  # as mkstemp names them
    sidecar.parent.mkdir(parents=True)
    sidecar.write_text("{")
    assert store.abort_incomplete_uploads(older_than=timedelta(0), keys="demo/") == ["demo/IE1/big.tif",
                                                                                      "demo/IE2/FL2.tif"]
    assert not temporary.exists() and not sidecar.exists()
    assert [p for p in store.root.rglob("*") if p.is_file()] == []


def test_abort_takes_several_prefixes_in_one_listing(s3_store, minio, s3_bucket, tmp_path):
    """A run's clean-up covers its images and each collection it publishes: one listing of the bucket's uploads
    serves them all (it was one per prefix), and another pipeline's uploads are left alone."""
    client = minio.client()
    for key in ("demo/IE1/a.tif", "collections/demo-v3.json", "other/IE9/b.tif", "collections/other-v3.json"):
        client.create_multipart_upload(Bucket=s3_bucket, Key=f"iiif/access/{key}")
    listings = []
    s3_store.client.meta.events.register("before-call.s3.ListMultipartUploads", lambda **kw: listings.append(1))
    aborted = s3_store.abort_incomplete_uploads(older_than=timedelta(0),
                                                keys=("demo/", "collections/demo-v3.json"))
    assert sorted(aborted) == ["collections/demo-v3.json", "demo/IE1/a.tif"]
    assert len(listings) == 1
    left = sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []))
    assert left == ["iiif/access/collections/other-v3.json", "iiif/access/other/IE9/b.tif"]


def test_abort_of_whole_keys_leaves_the_keys_they_are_a_prefix_of(s3_store, minio, s3_bucket, tmp_path):
    """Item "a"'s key is a prefix of item "a.tif"'s ("a.tif", "a.tif.tif"): the try after a pool process died
    aborts its own key's upload, never the other's, which may be going on."""
    client = minio.client()
    for key in ("demo/IE1/a.tif", "demo/IE1/a.tif.tif"):
        client.create_multipart_upload(Bucket=s3_bucket, Key=f"iiif/access/{key}")
    assert s3_store.abort_incomplete_uploads(older_than=timedelta(0), keys="demo/IE1/a.tif", exact=True) \
        == ["demo/IE1/a.tif"]
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])] == [
        "iiif/access/demo/IE1/a.tif.tif"]
    local = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    left = {key: local.root / "demo" / "IE1" / f".{key.rpartition('/')[2]}.k2x_9q.tmp"
            for key in ("demo/IE1/a.tif", "demo/IE1/a.tif.tif")}
    for path in left.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    assert local.abort_incomplete_uploads(older_than=timedelta(0), keys="demo/IE1/a.tif", exact=True) \
        == ["demo/IE1/a.tif"]
    assert [key for key, path in left.items() if path.exists()] == ["demo/IE1/a.tif.tif"]


def test_a_local_store_aborts_under_several_prefixes(tmp_path):
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    left = {"demo/IE1/a.tif": store.root / "demo" / "IE1" / ".a.tif.k2x_9q.tmp",
            "collections/demo-v3.json": store.root / "collections" / ".demo-v3.json.k2x_9q.tmp",
            "other/IE9/b.tif": store.root / "other" / "IE9" / ".b.tif.k2x_9q.tmp"}
    for path in left.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    assert store.abort_incomplete_uploads(older_than=timedelta(0), keys=("demo/", "collections/demo-v3.json")) \
        == ["collections/demo-v3.json", "demo/IE1/a.tif"]
    assert [key for key, path in left.items() if path.exists()] == ["other/IE9/b.tif"]

def test_an_outage_mid_upload_is_retried_and_the_upload_succeeds(minio, s3_bucket, aws_env, tmp_path):
    path, sha = random_file(tmp_path / "big.tif", 32 * MiB)
    store = S3Store(s3_settings(minio, s3_bucket, max_bandwidth=16 * MiB, max_concurrency=2,
                                retry={"mode": "standard", "max_attempts": 12, "connect_timeout": 2,
                                       "read_timeout": 10}))
    failures = []
    store.client.meta.events.register(
        "needs-retry.s3", lambda caught_exception=None, **kw: failures.append(caught_exception)
        if caught_exception is not None else None)
    outage_over = threading.Event()

    def outage():
        try:
            wait_for_parts(minio.client(), s3_bucket, "iiif/access/demo/IE1/big.tif")
        except AssertionError:  # the upload was over before it could be interrupted: the test fails below
            outage_over.set()
            return
        minio.stop()
        try:
            time.sleep(2)
        finally:
            minio.start()
            outage_over.set()

    threading.Thread(target=outage, daemon=True).start()
    try:
        stored = store.put("demo/IE1/big.tif", path, sha256=sha)
    finally:
        assert outage_over.wait(60), "MinIO was not restarted"
    assert failures, "no request failed: the outage did not happen during the upload"
    assert stored.sha256 == sha and store.head("demo/IE1/big.tif").sha256 == sha
    assert minio.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


# ---------------------------------------------------------------------------------------- configuration


def test_credentials_cannot_be_configured_and_never_appear_in_errors(minio, s3_bucket, aws_env, monkeypatch,
                                                                   tmp_path):
    with pytest.raises(ConfigError, match="store.aws_secret_access_key"):
        parse(S3StoreSettings, {"bucket": s3_bucket, "aws_secret_access_key": "x"}, "config.yaml", "store")
    with pytest.raises(ConfigError, match="store.endpoint_url"):
        parse(S3StoreSettings, {"bucket": s3_bucket, "endpoint_url": "http://user:pw@127.0.0.1:9000"},
              "config.yaml", "store")

    secret = "wrong-secret-that-must-not-leak"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    path, sha = write(tmp_path / "a.tif", b"data")
    store = S3Store(s3_settings(minio, s3_bucket))
    with pytest.raises(StoreError) as err:
        store.put("demo/IE1/FL1.tif", path, sha256=sha)
    assert "403" in str(err.value) and secret not in str(err.value)


@pytest.mark.parametrize("override, key", [
    ({"bucket": "Bad_Bucket"}, "store.bucket"),
    ({"prefix": "iiif/../x"}, "store.prefix"),
    ({"multipart_chunksize": 1024}, "store.multipart_chunksize"),
    ({"retry": {"mode": "forever"}}, "store.retry.mode"),
    ({"addressing_style": "dns"}, "store.addressing_style"),
])
def test_bad_s3_settings_name_the_key(minio, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        s3_settings(minio, **{"bucket": "bucket", **override})


def test_max_bandwidth_holds_for_a_put_below_the_multipart_threshold(minio, s3_bucket, tmp_path, aws_env):
    """s3transfer throttles multipart uploads only, so an access master under multipart_threshold (64 MiB: most
    of them) went at full speed whatever max_bandwidth said. 3 MiB at 1 MiB/s cannot arrive in under 2 s however
    fast the machine is (a floor, never a ceiling: a slow machine only makes it longer)."""
    path, sha256 = random_file(tmp_path / "master.tif", 3 * MiB)
    store = S3Store(s3_settings(minio, s3_bucket, max_bandwidth=MiB))
    started = time.monotonic()
    store.put("demo/IE1/master.tif", path)
    assert time.monotonic() - started >= 2
    assert hashlib.sha256(store.get_bytes("demo/IE1/master.tif")).hexdigest() == sha256
    started = time.monotonic()
    store.put_bytes("demo/IE1/manifest.json", bytes(3 * MiB), content_type="application/json")
    assert time.monotonic() - started >= 2


def test_settings_round_trip_through_json_for_worker_processes(minio):
    settings = s3_settings(minio, "bucket", max_bandwidth=1000)
    assert S3StoreSettings.model_validate(json.loads(settings.model_dump_json())) == settings


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_store_is_told_from_other_failures(tmp_path, aws_env):
    """A store that takes no more data (StoreFull) stops a harvest rather than failing every item: a local
    store's disk full, and MinIO's drive past its free-space threshold (507 XMinioStorageFull). Each is found on
    its real filesystem, a small tmpfs. MinIO's drive is filled before it starts: it checks free space against a
    cached figure, so a drive filled by puts in quick succession can pass the check and run out mid-body, which
    MinIO answers with IncompleteBody (one CI run in many)."""
    from gcis_etl.errors import StoreFull
    from tests.servers import MinioServer, free_port
    master, _ = random_file(tmp_path / "master.bin", 4 * MiB)
    disks = [tmp_path / "local", tmp_path / "minio"]
    for disk in disks:
        disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    (disks[1] / "filler").write_bytes(bytes(21 * MiB))  # leaves less than the 4 MiB put needs
    server = MinioServer(data_dir=disks[1], port=free_port())
    try:
        local = LocalStore(LocalStoreSettings(root=disks[0]))
        with pytest.raises(StoreFull, match=r"local/p/o/\d\.tif: cannot write: No space left on device \(\d"):
            for n in range(10):
                local.put(f"p/o/{n}.tif", master)
        assert not list(disks[0].rglob("*.tmp"))  # what the refused put began is gone

        server.start()
        server.client().create_bucket(Bucket="full")
        store = S3Store(s3_settings(server, "full"))
        with pytest.raises(StoreFull, match="XMinioStorageFull"):
            store.put("p/o/0.tif", master)
        with pytest.raises(StoreError) as other:
            S3Store(s3_settings(server, "no-such-bucket")).put("p/o/x.tif", master)
        assert not isinstance(other.value, StoreFull)
    finally:
        server.stop()
        for disk in disks:
            subprocess.run(["umount", str(disk)], check=True)


def test_a_request_the_server_cut_off_while_stopping_is_retried(minio, s3_bucket, aws_env, tmp_path):
    """MinIO answers 499 with no body to the requests it cuts off as it stops; botocore's retry modes do not
    count 499 as transient, so one such part used to fail the whole upload ("refused by the server: 499")."""
    path, sha = random_file(tmp_path / "big.tif", 20 * MiB)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"mode": "standard", "max_attempts": 4}))
        proxy.faults.inject(r"^PUT .*partNumber=2", Fault.http(499), times=2)
        proxy.faults.inject(r"^HEAD ", Fault.http(499), times=1)
        stored = store.put("demo/IE1/big.tif", path, sha256=sha)
        assert store.head("demo/IE1/big.tif").sha256 == sha == stored.sha256
    assert sorted(line.split()[0] for line in proxy.answered) == ["HEAD", "PUT", "PUT"]


def test_a_request_cut_off_every_time_fails_within_the_attempts(minio, s3_bucket, aws_env, tmp_path):
    path, sha = random_file(tmp_path / "small.tif", MiB)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"mode": "standard", "max_attempts": 3}))
        proxy.faults.inject(r"^PUT ", Fault.http(499), times=None)
        with pytest.raises(StoreError, match="499"):
            store.put("demo/IE1/small.tif", path, sha256=sha)
    assert len(proxy.answered) == 3


def test_a_download_cut_short_every_time_is_a_store_error_and_leaves_no_file(minio, s3_bucket, aws_env, tmp_path):
    """s3transfer retries a body cut short by itself and then raises its own RetriesExceededError, which no
    caller catches: the cache sync and move_store stopped with a traceback instead of failing the one key."""
    path, sha = random_file(tmp_path / "small.tif", MiB)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"mode": "standard", "max_attempts": 3}))
        store.put("demo/IE1/small.tif", path, sha256=sha)
        proxy.faults.inject(r"^GET ", Fault.truncate(0.5), times=None)
        with pytest.raises(StoreError, match=r"demo/IE1/small\.tif.*download"):
            store.download("demo/IE1/small.tif", tmp_path / "copy.tif")
        assert [line.split()[-1] for line in proxy.answered if line.startswith("GET")] == ["truncate"] * 3
    assert not (tmp_path / "copy.tif").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="remounting a tmpfs read-only needs root")
def test_a_local_delete_the_filesystem_refuses_is_a_store_refusal_naming_the_key(tmp_path):
    """It was a bare PermissionError/OSError, which the harvest's supersession (waiting keys on a StoreError)
    did not catch: one read-only store folder stopped the run with a traceback."""
    root = tmp_path / "store"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    try:
        store = LocalStore(LocalStoreSettings(root=root))
        path, sha = random_file(tmp_path / "a.tif", 1000)
        store.put("demo/IE1/a.tif", path, sha256=sha)
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        with pytest.raises(StoreRefused, match=r"demo/IE1/a\.tif: cannot delete: Read-only file system"):
            store.delete("demo/IE1/a.tif")
        assert store.head("demo/IE1/a.tif").sha256 == sha
    finally:
        subprocess.run(["umount", str(root)], check=True)


def test_a_document_stored_without_its_cache_control_is_put_again_then_left(minio, s3_bucket, aws_env):
    """A manifest deposited before DOCUMENT_CACHE_CONTROL (or by another tool, its metadata kept) kept no
    Cache-Control for ever: same bytes, same size, 'unchanged' (walk finding 3)."""
    store = open_store(s3_settings(minio, s3_bucket))
    data = b'{"id": "m"}\n'
    sha256 = hashlib.sha256(data).hexdigest()
    minio.client().put_object(Bucket=s3_bucket, Key="iiif/access/museum/a/manifest-v3.json", Body=data,
                              ContentType=MEDIA_TYPES["3.0"], Metadata={"sha256": sha256},
                              ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())
    assert isinstance(store, S3Store) and store.head("museum/a/manifest-v3.json").doubt is None
    put = store.put_bytes("museum/a/manifest-v3.json", data, content_type=MEDIA_TYPES["3.0"])
    assert not put.unchanged
    served = minio.client().head_object(Bucket=s3_bucket, Key="iiif/access/museum/a/manifest-v3.json")
    assert served["CacheControl"] == DOCUMENT_CACHE_CONTROL and served["ContentType"] == MEDIA_TYPES["3.0"]
    assert store.put_bytes("museum/a/manifest-v3.json", data, content_type=MEDIA_TYPES["3.0"]).unchanged
    # another type than the one a put gives: put again as well
    assert not store.put_bytes("museum/a/manifest-v3.json", data, content_type="application/json").unchanged


def test_a_local_documents_recorded_type_follows_the_put(tmp_path):
    store = LocalStore(LocalStoreSettings(root=tmp_path))
    store.put_bytes("collections/museum-v3.json", b"{}", content_type="application/json")
    assert not store.put_bytes("collections/museum-v3.json", b"{}", content_type=MEDIA_TYPES["3.0"]).unchanged
    assert store.head("collections/museum-v3.json").content_type == MEDIA_TYPES["3.0"]
    assert store.put_bytes("collections/museum-v3.json", b"{}", content_type=MEDIA_TYPES["3.0"]).unchanged
    # an access master's type alone is not worth its bytes again
    (tmp_path / "m.tif").write_bytes(b"II*\0")
    store.put("museum/a/p1.tif", tmp_path / "m.tif", content_type="image/x-tiff")
    assert store.put("museum/a/p1.tif", tmp_path / "m.tif").unchanged
