"""A store that lost its deposits (a changed or mistyped S3 prefix, a local root that is a volume's empty mount
point) stops a harvest before any item and is not taken by the cache for "every image gone"; a local store
copied with its times (cp -a, rsync -a, a restore) keeps the records of its objects, while a sidecar a crash left
describing another file is still ignored. Real MinIO, real folders, real harvests and cache syncs."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gcis_etl.cache import CacheSource, purge, sync
from gcis_etl.errors import StoreError
from gcis_etl.stores import LocalStore, LocalStoreSettings, Provenance, S3Store
from tests.conftest import CORPUS, cache_settings, s3_settings

pytest_plugins = ("tests.harvests",)  # the `rig` fixture
GCIS = str(Path(sys.executable).with_name("gcis-etl"))
REPO = Path(__file__).resolve().parents[1]
MASTER = CORPUS / "gray8/hopper_gray.jpg"
PROVENANCE = Provenance(source_id="IE 42", source_checksum="md5:9e107d9d372bb6826bd81d3542a419d6",
                        recipe="ptiff-jpeg-q90", recipe_digest="sha256:" + "ab" * 32, width=60, height=40)


def masters(root: Path, *objects: str) -> None:
    """One master per object, as the filesystem source groups them (a folder each)."""
    for name in objects:
        (root / name).mkdir(parents=True)
        shutil.copy(MASTER, root / name / "p1.jpg")


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------- the store check


def test_the_check_refuses_a_store_holding_nothing_only_when_deposits_are_recorded(minio, s3_bucket, aws_env,
                                                                                     tmp_path):
    s3 = S3Store(s3_settings(minio, s3_bucket, prefix="museum"))
    s3.check()
    s3.check(create=True)  # a first run
    with pytest.raises(StoreError) as err:
        s3.check(create=False)
    assert one_line(err).startswith(f"s3://{s3_bucket}/museum/: the store holds no object, yet the ledger records "
                                    f"deposits into it: if store.prefix ('museum') or store.bucket changed, set it "
                                    f"back (`gcis-migrate move_store --to-store NEW` moves")
    assert "emptied on purpose, only a fresh ledger" in str(err.value)
    minio.client().put_object(Bucket=s3_bucket, Key="museum-old/x.tif", Body=b"x")  # not under "museum/"
    with pytest.raises(StoreError, match="holds no object"):
        s3.check(create=False)
    minio.client().put_object(Bucket=s3_bucket, Key="museum/p/o/x.tif", Body=b"x")
    s3.check(create=False)

    root = tmp_path / "mnt"  # a mount point, the volume not mounted: what the store leaves and a folder aside
    (root / ".meta" / "p").mkdir(parents=True)
    (root / ".meta" / "p" / "x.tif.json").write_text("{}")
    (root / "p" / "o").mkdir(parents=True)
    (root / "p" / "o" / ".x.tif.k2x_9q.tmp").write_bytes(b"x")
    local = LocalStore(LocalStoreSettings(root=root))
    local.check()
    local.check(create=True)
    with pytest.raises(StoreError) as err:
        local.check(create=False)
    assert one_line(err).startswith(f"{root}: the store holds no object, yet the ledger records deposits into it: "
                                    f"if its volume is not mounted, mount it; if store.root changed, set it back")
    local.put_bytes("p/o/x.tif", b"x", content_type="image/tiff")
    local.check(create=False)


def harvest(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, "--config", str(config), "harvest"], capture_output=True, text=True, timeout=300)


def test_a_harvest_into_an_s3_prefix_changed_after_deposits_stops_and_deposits_nothing(rig, tmp_path):
    """The first run deposits into an empty prefix (the ledger records nothing yet). With the prefix mistyped
    after that, the next run, with a new object to deposit, stops before any item (exit 1): no manifest naming
    images not under the new prefix, no collection of the new object alone, nothing recorded."""
    masters(tmp_path / "masters", "a", "b")
    source = {"kind": "filesystem", "root": str(tmp_path / "masters")}
    rig.write(source)
    first = harvest(rig.config)
    assert first.returncode == 0 and "2 deposited" in first.stdout, first.stdout + first.stderr

    def bucket() -> list[str]:
        return sorted(o["Key"] for o in rig.client.list_objects_v2(Bucket=rig.bucket).get("Contents", []))

    deposited, recorded = bucket(), rig.statuses()
    assert "iiif/collections/dam-v3.json" in deposited and len(recorded) == 2

    masters(tmp_path / "masters", "c")
    rig.write(source, store={"prefix": "iifi"})
    second = harvest(rig.config)
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"dam: run stopped: s3://{rig.bucket}/iifi/: the store holds no object, yet the ledger records deposits " \
           f"into it: if store.prefix ('iifi') or store.bucket changed, set it back" in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    assert bucket() == deposited and rig.statuses() == recorded


def test_a_harvest_into_a_local_root_left_empty_stops_and_writes_nothing_there(tmp_path):
    """The store's root is a volume's mount point itself: unmounted, the folder is there and empty."""
    masters(tmp_path / "masters", "a")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"p": {
        "source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "volume"}}}}))
    first = harvest(config)
    assert first.returncode == 0 and "1 deposited" in first.stdout, first.stdout + first.stderr

    (tmp_path / "volume").rename(tmp_path / "unmounted")
    (tmp_path / "volume").mkdir()
    masters(tmp_path / "masters", "b")
    second = harvest(config)
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"p: run stopped: {tmp_path / 'volume'}: the store holds no object, yet the ledger records deposits into " \
           f"it: if its volume is not mounted, mount it" in second.stderr, second.stderr
    assert list((tmp_path / "volume").iterdir()) == []


# ----------------------------------------------------------------------------------------------- the cache


def test_cache_sync_and_purge_take_no_image_for_gone_from_a_store_that_lists_none(minio, s3_bucket, aws_env,
                                                                                  tmp_path):
    store = S3Store(s3_settings(minio, s3_bucket, prefix="museum"))
    for name in ("a", "b", "c"):
        store.put_bytes(f"p/o/{name}.tif", name.encode() * 100, content_type="image/tiff")
    settings = cache_settings(tmp_path)
    assert len(sync(settings, [CacheSource("p", store, "p/")]).copied) == 3
    images = sorted(p.name for p in (settings.images_dir / "p" / "o").iterdir())

    mistyped = CacheSource("p", S3Store(s3_settings(minio, s3_bucket, prefix="musuem")), "p/")
    result = sync(settings, [mistyped], purge_gone=True)
    (failure,) = result.failed
    assert (failure.source, failure.key) == ("p", None) and failure.reason.startswith(
        f"s3://{s3_bucket}/musuem/p/: lists no access master, yet the cache holds 3 images of pipeline 'p': none is "
        f"taken for gone"), failure.reason
    assert result.gone == () and sorted(p.name for p in (settings.images_dir / "p" / "o").iterdir()) == images
    with pytest.raises(StoreError, match=r"lists no access master, .*; nothing was purged$"):
        purge(settings, [mistyped])
    assert sorted(p.name for p in (settings.images_dir / "p" / "o").iterdir()) == images

    store.delete("p/o/a.tif")  # gone for real, from the store that still lists the others
    assert sync(settings, [CacheSource("p", store, "p/")], purge_gone=True).gone == ("p/o/a.tif",)


# -------------------------------------------------------------------------------------- local store records


def put_file(store: LocalStore, key: str, data: bytes, tmp_path: Path):
    path = tmp_path / "upload"
    path.write_bytes(data)
    return store.put(key, path, sha256=hashlib.sha256(data).hexdigest(), provenance=PROVENANCE)


def test_a_local_store_copied_with_its_times_keeps_its_records(tmp_path):
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    image = put_file(store, "p/o/a.tif", b"II*\x00 pretend tiff", tmp_path)
    store.put_bytes("p/o/manifest-v3.json", b"{}", content_type="application/json")
    shutil.copytree(store.root, tmp_path / "copy", copy_function=shutil.copy2)  # as cp -a, rsync -a do
    copy = LocalStore(LocalStoreSettings(root=tmp_path / "copy"))
    assert (copy.root / "p/o/a.tif").stat().st_ino != (store.root / "p/o/a.tif").stat().st_ino

    assert copy.head("p/o/a.tif") == image
    assert copy.head("p/o/manifest-v3.json") == store.head("p/o/manifest-v3.json")
    assert copy.head("p/o/manifest-v3.json").sha256 == hashlib.sha256(b"{}").hexdigest()
    assert put_file(copy, "p/o/a.tif", b"II*\x00 pretend tiff", tmp_path).unchanged  # not converted again
    result = sync(cache_settings(tmp_path), [CacheSource("p", copy, "p/")])
    assert (result.copied, result.failed) == (("p/o/a.tif",), ())


def test_a_sidecar_written_before_mtimes_were_recorded_still_counts_by_inode(tmp_path):
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    image = put_file(store, "p/o/a.tif", b"content", tmp_path)
    sidecar = store.root / ".meta" / "p/o/a.tif.json"
    body = json.loads(sidecar.read_text())
    del body["mtime_ns"]
    sidecar.write_text(json.dumps(body))
    assert store.head("p/o/a.tif") == image


CRASH_CHILD = """
import os, sys
from pathlib import Path
from gcis_etl.stores import LocalStore, LocalStoreSettings
rename = os.replace
renames = []
def dies_before_the_second(src, dst):  # a put renames its data, then its sidecar
    renames.append(dst)
    if len(renames) == 2:
        os._exit(9)
    rename(src, dst)
os.replace = dies_before_the_second
LocalStore(LocalStoreSettings(root=sys.argv[1])).put(sys.argv[2], Path(sys.argv[3]))
"""


def test_a_sidecar_a_crash_left_describing_the_old_file_is_ignored_in_the_store_and_its_copy(tmp_path):
    """Killed between the put's two renames, at once after the first put and with content of the same size: the
    old sidecar describes bytes no longer under the key, in the store and in a copy of it."""
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    put_file(store, "p/o/a.tif", b"old content", tmp_path)
    (tmp_path / "new").write_bytes(b"new content")
    child = subprocess.run([sys.executable, "-c", CRASH_CHILD, str(store.root), "p/o/a.tif", str(tmp_path / "new")],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert child.returncode == 9, child.stderr
    assert json.loads((store.root / ".meta/p/o/a.tif.json").read_text())["sha256"] == \
        hashlib.sha256(b"old content").hexdigest()
    assert store.get_bytes("p/o/a.tif") == b"new content"

    shutil.copytree(store.root, tmp_path / "copy", copy_function=shutil.copy2)
    copy = LocalStore(LocalStoreSettings(root=tmp_path / "copy"))
    for each in (store, copy):
        assert each.head("p/o/a.tif").sha256 is None
        assert not put_file(each, "p/o/a.tif", b"new content", tmp_path).unchanged
        assert each.get_bytes("p/o/a.tif") == b"new content"
