"""The access-master cache (gcis_etl.cache): sync from real stores (local and MinIO), prune by last access,
purge, and the `gcis-etl cache` commands. The consumer serving the cache is tested in test_iipsrv_e2e.py."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gcis_etl.cache import CacheSettings, CacheSource, prune, purge, sync
from gcis_etl.config import load_config
from gcis_etl.errors import ConfigError, StoreError
from gcis_etl.keys import UnsafeKey
from gcis_etl.locks import LockHeld, RunLock
from gcis_etl.settings import parse
from gcis_etl.stores import LocalStore, LocalStoreSettings, S3Store
from tests.conftest import cache_settings, s3_settings
from tests.servers import free_port

GCIS = str(Path(sys.executable).with_name("gcis-etl"))


def local_store(root: Path) -> LocalStore:
    return LocalStore(LocalStoreSettings(root=root))


def put(store, key: str, data: bytes) -> None:
    store.put_bytes(key, data, content_type="image/tiff")


def cached(settings: CacheSettings) -> dict[str, bytes]:
    images = settings.images_dir
    return {p.relative_to(images).as_posix(): p.read_bytes() for p in images.rglob("*") if p.is_file()}


def log_line(settings: CacheSettings, key: str, at: float, status: int = 200) -> str:
    """A line as deploy/iipsrv/lighttpd.conf's accesslog.format writes it."""
    return f'{int(at)} 127.0.0.1 "GET {settings.server.prefix}/{key}/info.json HTTP/1.1" {status} 700\n'


@pytest.fixture
def setup(tmp_path):
    store = local_store(tmp_path / "store")
    put(store, "p/o1/a.tif", b"A" * 1000)
    put(store, "p/o1/b.jp2", b"B" * 2000)
    put(store, "p/o1/manifest-v3.json", b"{}")
    put(store, "q/o9/c.tif", b"C" * 10)  # another pipeline's image: not this source's prefix
    return store, CacheSource("p", store, "p/"), cache_settings(tmp_path)


# ---------------------------------------------------------------------------------------------------- sync


def test_sync_mirrors_the_access_masters_at_their_keys_and_nothing_else(setup):
    store, source, settings = setup
    result = sync(settings, [source])
    assert sorted(result.copied) == ["p/o1/a.tif", "p/o1/b.jp2"] and result.bytes_copied == 3000
    assert cached(settings) == {"p/o1/a.tif": b"A" * 1000, "p/o1/b.jp2": b"B" * 2000}
    assert (result.replaced, result.failed, result.unchanged) == ((), (), 0)
    assert list((settings.dir / "incoming").iterdir()) == []
    assert oct((settings.images_dir / "p/o1/a.tif").stat().st_mode & 0o777) == "0o644"  # iipsrv's user reads it


def test_only_what_changed_is_copied_and_a_replacement_is_a_new_file_renamed_into_place(setup):
    store, source, settings = setup
    sync(settings, [source])
    again = sync(settings, [source])
    assert (again.copied, again.unchanged) == ((), 2)
    path = settings.images_dir / "p/o1/a.tif"
    before = path.stat()
    put(store, "p/o1/a.tif", b"a" * 1000)  # same size, new content
    result = sync(settings, [source])
    assert result.copied == result.replaced == ("p/o1/a.tif",) and result.unchanged == 1
    assert path.read_bytes() == b"a" * 1000
    after = path.stat()
    assert after.st_ino != before.st_ino  # never rewritten in place: iipsrv sees the old file or the new one
    assert int(after.st_mtime) > int(before.st_mtime)  # Last-Modified moves on, even within the same second
    assert result.reloaded is False  # no lighttpd running to restart


def test_a_cached_file_changed_on_disk_is_copied_again(setup):
    store, source, settings = setup
    sync(settings, [source])
    (settings.images_dir / "p/o1/b.jp2").write_bytes(b"junk")
    assert sync(settings, [source]).copied == ("p/o1/b.jp2",)
    assert cached(settings)["p/o1/b.jp2"] == b"B" * 2000


def lose_state(settings: CacheSettings) -> None:
    for name in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm"):
        (settings.dir / name).unlink(missing_ok=True)


def test_a_lost_state_is_rebuilt_from_the_files_without_copying_them(setup):
    store, source, settings = setup
    sync(settings, [source])
    lose_state(settings)
    result = sync(settings, [source])
    assert sorted(result.adopted) == ["p/o1/a.tif", "p/o1/b.jp2"] and result.copied == ()
    assert sync(settings, [source]).unchanged == 2


def _corrupt_in_place(store: LocalStore, key: str) -> None:
    """Bit rot: the bytes change, the size, inode and recorded SHA-256 do not."""
    with open(store.root / key, "r+b") as f:
        f.write(b"X")


def test_a_copy_that_does_not_match_the_recorded_sha256_is_refused_and_the_previous_one_keeps_serving(setup):
    store, source, settings = setup
    sync(settings, [source])
    put(store, "p/o1/a.tif", b"v" * 1000)
    _corrupt_in_place(store, "p/o1/a.tif")
    put(store, "p/o2/new.tif", b"N" * 50)
    _corrupt_in_place(store, "p/o2/new.tif")
    result = sync(settings, [source])
    assert sorted(f.key for f in result.failed) == ["p/o1/a.tif", "p/o2/new.tif"]
    reasons = {f.key: f.reason for f in result.failed}
    assert "SHA-256" in reasons["p/o1/a.tif"] and "keeps its previous copy" in reasons["p/o1/a.tif"]
    assert "keeps no copy" in reasons["p/o2/new.tif"]
    assert cached(settings) == {"p/o1/a.tif": b"A" * 1000, "p/o1/b.jp2": b"B" * 2000}
    assert list((settings.dir / "incoming").iterdir()) == []


def test_a_partial_copy_left_by_a_killed_sync_is_removed(setup):
    store, source, settings = setup
    sync(settings, [source])
    leftover = settings.dir / "incoming" / "0123.partial"
    leftover.write_bytes(b"half")
    sync(settings, [source])
    assert not leftover.exists()


def test_whatever_is_left_in_incoming_is_removed_folders_too(setup):
    """A folder there made every sync fail with a traceback (IsADirectoryError)."""
    store, source, settings = setup
    incoming = settings.dir / "incoming"
    incoming.mkdir(parents=True)
    (incoming / "by-hand" / "deeper").mkdir(parents=True)
    (incoming / "by-hand" / "deeper" / "x.partial").write_bytes(b"half")
    (incoming / "link").symlink_to(settings.images_dir)  # removed, not followed
    result = sync(settings, [source])
    assert (len(result.copied), result.failed) == (2, ()) and list(incoming.iterdir()) == []
    assert settings.images_dir.is_dir()


def test_keys_must_be_unique_across_the_stores_one_iipsrv_serves(setup, tmp_path):
    store, source, settings = setup
    other = local_store(tmp_path / "other")
    put(other, "p/o1/a.tif", b"Z" * 10)
    result = sync(settings, [source, CacheSource("other", other, "p/")])
    assert [f.key for f in result.failed] == ["p/o1/a.tif"]
    assert "also cached from 'p'" in result.failed[0].reason
    assert cached(settings)["p/o1/a.tif"] == b"A" * 1000


def test_one_cache_command_at_a_time(setup):
    store, source, settings = setup
    with RunLock(settings.dir / "lock", "test"):
        with pytest.raises(LockHeld):
            sync(settings, [source])
        with pytest.raises(LockHeld):
            prune(settings, max_bytes=0)


def test_a_deposit_cut_short_in_the_store_is_named_damaged_not_foreign(setup):
    """A JP2 truncated in place (its inode, so its sidecar, kept) read "has no SHA-256 recorded (not deposited by
    gcis-etl)": the operator was sent after a foreign file. The sync names the change; the cache keeps its copy."""
    store, source, settings = setup
    sync(settings, [source])
    os.truncate(store.root / "p/o1/b.jp2", 500)
    result = sync(settings, [source])
    [failure] = result.failed
    assert failure.key == "p/o1/b.jp2"
    assert "b.jp2 changed since its deposit (500 bytes, recorded 2000): a copy could not be verified" \
        in failure.reason, failure.reason
    assert cached(settings)["p/o1/b.jp2"] == b"B" * 2000


def test_sync_from_s3_verifies_against_the_sha256_recorded_at_deposit(minio, s3_bucket, aws_env, tmp_path):
    store = S3Store(s3_settings(minio, s3_bucket))
    put(store, "p/o/good.tif", b"G" * 5000)
    client, prefix = minio.client(), store.settings.prefix
    client.put_object(Bucket=s3_bucket, Key=f"{prefix}/p/o/foreign.tif", Body=b"F" * 10)  # no sha256 metadata
    client.put_object(Bucket=s3_bucket, Key=f"{prefix}/p/o/lying.tif", Body=b"L" * 10,
                      Metadata={"sha256": hashlib.sha256(b"something else").hexdigest()})
    settings = cache_settings(tmp_path)
    result = sync(settings, [CacheSource("p", store, "p/")])
    assert result.copied == ("p/o/good.tif",)
    reasons = {f.key: f.reason for f in result.failed}
    assert "no SHA-256 recorded" in reasons["p/o/foreign.tif"]
    assert "the store recorded 10 bytes with" in reasons["p/o/lying.tif"]
    assert cached(settings) == {"p/o/good.tif": b"G" * 5000}


def test_an_object_another_tool_overwrote_keeping_its_metadata_is_not_taken_for_the_cached_one(
        minio, s3_bucket, aws_env, tmp_path):
    """Same size, our SHA-256 in its metadata, only its date changed: the store's record said "unchanged", so
    the cache kept serving the old image while the store held another. Now the copy is checked: the same bytes
    again are fine, other bytes are a failure naming the doubt, and the cache keeps its verified copy."""
    store = S3Store(s3_settings(minio, s3_bucket))
    put(store, "p/o/same.tif", b"S" * 5000)
    put(store, "p/o/other.tif", b"O" * 5000)
    settings, source = cache_settings(tmp_path), CacheSource("p", store, "p/")
    assert sorted(sync(settings, [source]).copied) == ["p/o/other.tif", "p/o/same.tif"]
    client, full = minio.client(), f"{store.settings.prefix}/p/o/"
    for name, body in (("same.tif", b"S" * 5000), ("other.tif", b"X" * 5000)):
        kept = client.head_object(Bucket=s3_bucket, Key=full + name)["Metadata"]
        client.put_object(Bucket=s3_bucket, Key=full + name, Body=body, Metadata=kept)
    result = sync(settings, [source])
    assert [f.key for f in result.failed] == ["p/o/other.tif"]
    assert "another tool" in result.failed[0].reason and "keeps its previous copy" in result.failed[0].reason
    assert cached(settings) == {"p/o/same.tif": b"S" * 5000, "p/o/other.tif": b"O" * 5000}


def test_a_store_that_cannot_be_listed_fails_that_source_only(setup, minio, tmp_path, monkeypatch):
    store, source, settings = setup
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    broken = S3Store(s3_settings(minio, "no-such-bucket", retry={"max_attempts": 1}))
    result = sync(settings, [CacheSource("s3", broken, "p/"), source])
    assert [(f.source, f.key) for f in result.failed] == [("s3", None)]
    assert "listing failed" in result.failed[0].reason and "wrong" not in result.failed[0].reason
    assert len(result.copied) == 2


def test_a_store_that_cannot_be_listed_loses_none_of_its_cached_images(setup, tmp_path):
    """An unmounted volume lists as nothing: that must not read as "every image was deleted"."""
    store, source, settings = setup
    sync(settings, [source])
    (tmp_path / "store").rename(tmp_path / "unmounted")
    result = sync(settings, [source], purge_gone=True)
    assert [(f.source, f.key) for f in result.failed] == [("p", None)] and result.gone == ()
    assert "listing failed" in result.failed[0].reason and "root folder is missing" in result.failed[0].reason
    with pytest.raises(StoreError, match="root folder is missing.*; nothing was purged"):
        purge(settings, [source])
    assert cached(settings) == {"p/o1/a.tif": b"A" * 1000, "p/o1/b.jp2": b"B" * 2000}
    (tmp_path / "unmounted").rename(tmp_path / "store")
    assert sync(settings, [source], purge_gone=True).unchanged == 2  # the records were kept too


# --------------------------------------------------------------------------------------------------- purge


def test_images_deleted_from_the_store_are_reported_by_sync_and_removed_by_purge(setup):
    store, source, settings = setup
    sync(settings, [source])
    store.delete("p/o1/a.tif")
    result = sync(settings, [source])
    assert result.gone == ("p/o1/a.tif",) and "p/o1/a.tif" in cached(settings)  # sync never deletes
    purged = purge(settings, [source])
    assert purged.removed == ("p/o1/a.tif",) and purged.freed_bytes == 1000
    assert cached(settings) == {"p/o1/b.jp2": b"B" * 2000}
    assert sync(settings, [source]).gone == ()


def test_sync_can_purge_what_is_gone_in_the_same_listing(setup):
    store, source, settings = setup
    sync(settings, [source])
    store.delete("p/o1/b.jp2")
    result = sync(settings, [source], purge_gone=True)
    assert result.gone == ("p/o1/b.jp2",) and result.reloaded is False  # no lighttpd running
    assert cached(settings) == {"p/o1/a.tif": b"A" * 1000}
    assert sync(settings, [source]).gone == ()


def test_after_a_lost_state_images_deleted_from_the_store_meanwhile_are_gone_and_foreign_files_stay(setup, tmp_path):
    """Only records used to count: after a lost state.sqlite, a deleted image was never reported nor removed,
    and iipsrv served it for ever. Files under no source's prefix, or not access masters, are not the cache's
    to remove."""
    store, source, settings = setup
    sync(settings, [source])
    for key in ("q/o9/by-hand.tif", "p/o1/notes.txt", "p/o1/not a key.tif"):
        (settings.images_dir / key).parent.mkdir(parents=True, exist_ok=True)
        (settings.images_dir / key).write_bytes(b"F" * 7)
    lose_state(settings)
    pruned = prune(settings, max_bytes=0)  # nothing recorded yet: prune cannot tell what the files are
    assert (pruned.evicted, pruned.kept_bytes, pruned.unrecorded, pruned.unrecorded_bytes) == ((), 0, 5, 3021)
    store.delete("p/o1/a.tif")

    unlistable = CacheSource("gone-volume", local_store(tmp_path / "unmounted"), "p/o1/")
    result = sync(settings, [source, unlistable])
    assert result.adopted == ("p/o1/b.jp2",) and [f.source for f in result.failed] == ["gone-volume"]
    assert result.gone == ()  # a.tif may be the unlistable source's

    result = sync(settings, [source])
    assert (result.gone, result.foreign) == (("p/o1/a.tif",), 3)
    assert "p/o1/a.tif" in cached(settings)  # sync without --purge never deletes
    assert purge(settings, [source]).removed == ("p/o1/a.tif",)
    assert sorted(cached(settings)) == ["p/o1/b.jp2", "p/o1/not a key.tif", "p/o1/notes.txt", "q/o9/by-hand.tif"]

    (settings.images_dir / "p/o1/a.tif").write_bytes(b"A" * 1000)  # back, and lost again
    lose_state(settings)
    result = sync(settings, [source], purge_gone=True)
    assert (result.gone, result.foreign) == (("p/o1/a.tif",), 3) and "p/o1/a.tif" not in cached(settings)


def test_after_a_lost_state_a_store_that_lists_no_image_loses_none_of_the_files(setup):
    store, source, settings = setup
    sync(settings, [source])
    lose_state(settings)
    store.delete("p/o1/a.tif")
    store.delete("p/o1/b.jp2")  # as a changed prefix would list
    result = sync(settings, [source], purge_gone=True)
    assert result.gone == () and "lists no access master, yet the cache holds 2 images" in result.failed[0].reason
    with pytest.raises(StoreError, match="lists no access master.*; nothing was purged"):
        purge(settings, [source])
    assert sorted(cached(settings)) == ["p/o1/a.tif", "p/o1/b.jp2"]


def test_purge_given_keys_or_iiif_identifiers(setup):
    store, source, settings = setup
    sync(settings, [source])
    result = purge(settings, [source], ["p%2Fo1%2Fb.jp2", "p/o1/none.tif"])
    assert result.removed == ("p/o1/b.jp2",) and result.not_cached == ("p/o1/none.tif",)
    assert not (settings.images_dir / "p/o1/b.jp2").exists()
    with pytest.raises(UnsafeKey):
        purge(settings, [source], ["../../etc/passwd"])
    assert sync(settings, [source]).copied == ("p/o1/b.jp2",)  # still in the store: back at the next sync


def test_purge_removes_the_folders_it_empties(setup):
    store, source, settings = setup
    sync(settings, [source])
    purge(settings, [source], ["p/o1/a.tif", "p/o1/b.jp2"])
    assert list(settings.images_dir.iterdir()) == []


# --------------------------------------------------------------------------------------------------- prune


def _accessed(settings: CacheSettings, key: str, at: float) -> None:
    """What the kernel does to atime when iipsrv reads the file (mtime kept: the cache checks it)."""
    path = settings.images_dir / key
    os.utime(path, ns=(int(at * 1e9), path.stat().st_mtime_ns))


def test_prune_to_max_bytes_evicts_the_least_recently_accessed_first(setup):
    store, source, settings = setup
    put(store, "p/o1/c.tif", b"c" * 500)
    sync(settings, [source])
    now = time.time()
    _accessed(settings, "p/o1/b.jp2", now + 10)
    _accessed(settings, "p/o1/a.tif", now + 20)
    _accessed(settings, "p/o1/c.tif", now + 30)
    result = prune(settings, max_bytes=1600)
    assert [e.key for e in result.evicted] == ["p/o1/b.jp2"]
    assert (result.kept, result.kept_bytes, result.freed_bytes) == (2, 1500, 2000)
    assert sorted(cached(settings)) == ["p/o1/a.tif", "p/o1/c.tif"]


def test_prune_by_age(setup):
    store, source, settings = setup
    sync(settings, [source])
    day = 86400
    _accessed(settings, "p/o1/a.tif", time.time() + 2 * day)
    from datetime import timedelta
    result = prune(settings, max_age=timedelta(days=1), now=time.time() + 2.5 * day)
    assert [e.key for e in result.evicted] == ["p/o1/b.jp2"]


def test_the_access_log_decides_when_atime_cannot(setup):
    """noatime, or tiles iipsrv serves from memory: the access log still knows (read incrementally)."""
    store, source, settings = setup
    sync(settings, [source])
    now = time.time()
    log = settings.server.access_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(log_line(settings, "p/o1/a.tif", now + 100)
                   + f'{int(now) + 200} 127.0.0.1 "GET {settings.server.prefix}/p%2Fo1%2Fb.jp2/0,0,256,256/256,/0/'
                     f'default.jpg HTTP/1.1" 200 9000\n'
                   + f'{int(now) + 300} 127.0.0.1 "GET {settings.server.prefix}/p/o1/a.tif/info.json')  # unfinished
    assert [e.key for e in prune(settings, max_bytes=2000).evicted] == ["p/o1/a.tif"]
    with open(log, "a") as f:
        f.write(' HTTP/1.1" 200 700\n')  # the line completes: a is now the most recent (but already evicted)
    assert [e.key for e in prune(settings, max_bytes=0).evicted] == ["p/o1/b.jp2"]


def test_an_evicted_image_stays_out_until_it_is_requested_again(setup):
    store, source, settings = setup
    sync(settings, [source])
    prune(settings, max_bytes=0)
    assert cached(settings) == {}
    result = sync(settings, [source])
    assert (result.copied, result.evicted) == ((), 2)  # a sync does not undo a prune
    log = settings.server.access_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(log_line(settings, "p/o1/b.jp2", time.time(), status=404))  # iipsrv: not there
    assert sync(settings, [source]).copied == ("p/o1/b.jp2",)
    log.rename(log.with_suffix(".1"))  # rotated: the new file is read from its start
    log.write_text(log_line(settings, "p/o1/a.tif", time.time(), status=404))
    assert sync(settings, [source]).copied == ("p/o1/a.tif",)


def test_a_changed_image_that_iipsrv_may_hold_triggers_the_reload_command(setup, tmp_path):
    store, source, _ = setup
    marker = tmp_path / "reloaded"
    settings = cache_settings(tmp_path, reload_command=["touch", str(marker)])
    result = sync(settings, [source])
    assert result.copied and not result.reloaded and not marker.exists()  # new images: nothing to reload
    put(store, "p/o1/a.tif", b"2" * 1000)
    assert sync(settings, [source]).reloaded and marker.exists()
    marker.unlink()
    assert purge(settings, [source], ["p/o1/b.jp2"]).reloaded and marker.exists()
    failing = cache_settings(tmp_path, reload_command=["false"])
    put(store, "p/o1/a.tif", b"3" * 1000)
    result = sync(failing, [source])
    assert [f.source for f in result.failed] == ["iipsrv"] and "reload_command" in result.failed[0].reason


def test_a_file_the_state_did_not_record_that_a_sync_overwrites_or_adopts_triggers_the_reload_command(
        setup, tmp_path):
    """iipsrv keeps an image's size in memory: it reported the old size, and crashed on full/full, when a
    sync wrote over a file it had no record of, or adopted the copy a killed sync had renamed into place."""
    store, source, _ = setup
    marker = tmp_path / "reloaded"
    settings = cache_settings(tmp_path, reload_command=["touch", str(marker)])
    sync(settings, [source])
    assert not marker.exists()

    put(store, "p/o1/a.tif", b"2" * 1000)
    lose_state(settings)  # what a.tif was is unknown: it is copied over the file iipsrv may hold
    result = sync(settings, [source])
    assert (result.copied, result.replaced, result.adopted) == (("p/o1/a.tif",), ("p/o1/a.tif",), ("p/o1/b.jp2",))
    assert result.reloaded and marker.exists()
    marker.unlink()

    (settings.images_dir / "p/o2").mkdir()
    (settings.images_dir / "p/o2/late.tif").write_bytes(b"by hand")  # a file at a key deposited later
    put(store, "p/o2/late.tif", b"L" * 300)
    result = sync(settings, [source])
    assert (result.copied, result.replaced, result.adopted) == (("p/o2/late.tif",), ("p/o2/late.tif",), ())
    assert result.reloaded and marker.exists()
    marker.unlink()

    put(store, "p/o1/b.jp2", b"3" * 2000)  # a sync killed after renaming the new copy into place, before its record
    renamed = settings.dir / "incoming" / "killed.partial"
    renamed.write_bytes(b"3" * 2000)
    os.replace(renamed, settings.images_dir / "p/o1/b.jp2")
    result = sync(settings, [source])
    assert (result.copied, result.adopted) == ((), ("p/o1/b.jp2",)) and result.reloaded and marker.exists()


# ------------------------------------------------------------------------------------------------ settings


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"config.yaml: cache.extensions: .*lower-case extension"):
        parse(CacheSettings, {"extensions": ["tif"]}, "config.yaml", "cache")
    with pytest.raises(ConfigError, match=r"cache.max_bytes: .*\(got 'lots'\)"):
        parse(CacheSettings, {"max_bytes": "lots"}, "config.yaml", "cache")
    with pytest.raises(ConfigError, match=r"cache.server.port: "):
        parse(CacheSettings, {"server": {"port": 70000}}, "config.yaml", "cache")
    with pytest.raises(ConfigError, match=r"cache.server.prefix: "):
        parse(CacheSettings, {"server": {"prefix": "iiif/"}}, "config.yaml", "cache")
    ok = parse(CacheSettings, {"max_bytes": "500G", "max_age": "30d", "server": {"base_url": "https://x.org/iiif"}},
               "config.yaml", "cache")
    assert ok.max_bytes == 500 * 10**9 and ok.max_age.days == 30 and ok.server.base_url == "https://x.org/iiif/"


# ----------------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def configured(tmp_path):
    """A config.yaml with one pipeline on a local store and a cache, and that store filled."""
    (tmp_path / "masters").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"""
pipelines:
  samples:
    source: {{kind: filesystem, root: masters}}
    store: {{kind: local, root: store}}
cache:
  dir: {tmp_path / 'cache'}
  max_bytes: 1500
  server: {{run_dir: {tmp_path / 'run'}, access_log: {tmp_path / 'run' / 'access.log'}}}
""")
    store = local_store(tmp_path / "store")
    put(store, "samples/o/a.tif", b"A" * 1000)
    put(store, "samples/o/b.tif", b"B" * 1000)
    return config, store


def gcis(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, "--config", str(config), "cache", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_sync_prune_purge(configured, tmp_path):
    config, store = configured
    done = gcis(config, "sync")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("copied 2 (2.0 kB), unchanged 0")
    again = json.loads(gcis(config, "sync", "--json").stdout)
    assert again["copied"] == [] and again["unchanged"] == 2
    foreign = tmp_path / "cache" / "images" / "by-hand" / "x.tif"  # under no pipeline's prefix
    foreign.parent.mkdir()
    foreign.write_bytes(b"F" * 10)
    assert ("1 file(s) in the cache's images/ are not its own (no record, under no synced pipeline's prefix, or "
            "not access masters): left alone") in gcis(config, "sync").stdout
    assert "not recorded, not evicted: 1 file(s) (10 B)" in gcis(config, "prune", "--max-bytes", "1M").stdout
    foreign.unlink()
    pruned = json.loads(gcis(config, "prune", "--json").stdout)  # cache.max_bytes: 1500
    assert len(pruned["evicted"]) == 1 and pruned["kept_bytes"] == 1000
    assert "evicted 1 (1.0 kB)" in gcis(config, "prune", "--max-bytes", "0").stdout  # the option wins
    store.delete("samples/o/a.tif")
    assert "removed 1 cached image(s) no longer in their store" in gcis(config, "sync", "--purge").stdout
    store.delete("samples/o/b.tif")  # the store now lists no image at all: as an unmounted volume or a changed prefix
    refused = gcis(config, "purge")
    assert refused.returncode == 1 and "lists no access master" in refused.stderr, refused.stderr
    assert "nothing was purged" in refused.stderr
    assert gcis(config, "purge", "samples/o/b.tif").stdout.startswith("removed 1")


def test_cli_prune_max_age_takes_the_spans_harvest_since_takes(configured):
    config, store = configured
    assert gcis(config, "sync").returncode == 0
    for span in ("36h", "2w", "P1DT12H"):
        kept = gcis(config, "prune", "--max-bytes", "1G", "--max-age", span, "--json")
        assert kept.returncode == 0 and json.loads(kept.stdout)["kept"] == 2, kept.stderr  # both synced just now
    refused = gcis(config, "prune", "--max-age", "12:00:00")  # 12 hours, or since noon? refused, not guessed
    assert refused.returncode == 2 and "'12:00:00' is not a span of time: write 90m, 36h" in refused.stderr
    assert sorted(cached(load_config(config).cache)) == ["samples/o/a.tif", "samples/o/b.tif"]



def test_a_pipeline_whose_recipe_writes_what_the_cache_does_not_copy_is_a_configuration_error(configured):
    """A JP2 recipe with .jp2 left out of cache.extensions: every sync copied nothing of it, said nothing and
    exited 0, while its manifests named the images on the server."""
    config, store = configured
    text = config.read_text().replace("store: {kind: local, root: store}",
                                      "store: {kind: local, root: store}\n    recipe: jp2-openjpeg-lossy")
    config.write_text(text.replace("  max_bytes: 1500", "  max_bytes: 1500\n  extensions: [.tif, .tiff]"))
    put(store, "samples/o/c.jp2", b"C" * 1000)
    refused = gcis(config, "sync")
    assert refused.returncode == 2, refused.stderr
    assert ("cache.extensions (.tif, .tiff) does not list .jp2, what pipeline samples's recipe jp2-openjpeg-lossy "
            "writes") in refused.stderr
    assert not (load_config(config).cache.images_dir / "samples").exists()


def test_an_htj2k_pipeline_is_refused_unless_the_server_decodes_its_regions(configured):
    """Debian's iipsrv (OpenJPEG 2.5.0) answered every full-resolution tile of an HTJ2K access master with a flat
    grey JPEG, 200 OK (a walk measured 6-16 dB against the PTIFF), which the JP2's verification, decoding whole
    tiles, cannot see: the cache refuses such a pipeline, and `config check` warns, until the server is said to
    decode HTJ2K regions."""
    config, store = configured
    text = config.read_text().replace("store: {kind: local, root: store}",
                                      "store: {kind: local, root: store}\n    recipe: jp2-grok-htj2k")
    config.write_text(text)
    put(store, "samples/o/c.jp2", b"C" * 1000)
    refused = gcis(config, "sync")
    assert refused.returncode == 2, refused.stderr
    assert ("pipeline samples's recipe jp2-grok-htj2k writes HTJ2K, which Debian 12's iipsrv (OpenJPEG 2.5.0) "
            "serves as flat grey tiles") in " ".join(refused.stderr.split())
    assert not (load_config(config).cache.images_dir / "samples").exists()
    checked = subprocess.run([GCIS, "--config", str(config), "config", "check"], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0 and "would refuse this" in checked.stderr and "HTJ2K" in checked.stderr, checked
    config.write_text(text.replace("server: {run_dir:", "server: {decodes_htj2k: true, run_dir:"))
    assert gcis(config, "sync").returncode == 0
    assert (load_config(config).cache.images_dir / "samples/o/c.jp2").is_file()


def test_cli_usage_errors_and_exit_codes(configured):
    config, store = configured
    bad = gcis(config, "prune", "--max-bytes", "lots")
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr
    assert gcis(config, "sync", "--pipeline", "nope").returncode == 2
    _corrupt_in_place(store, "samples/o/a.tif")
    failed = gcis(config, "sync")
    assert failed.returncode == 1 and "failed: samples: samples/o/a.tif:" in failed.stderr
    unsafe = gcis(config, "purge", "../x.tif")
    assert unsafe.returncode == 1 and "error:" in unsafe.stderr
    both = gcis(config, "purge", "-p", "samples", "samples/o/b.tif")
    assert both.returncode == 2 and "KEYS or --pipeline, not both" in both.stderr
    assert "samples/o/b.tif" in cached(load_config(config).cache)


def test_cli_sync_and_purge_of_a_store_that_cannot_be_listed_fail_and_remove_nothing(configured, tmp_path):
    config, store = configured
    assert gcis(config, "sync").returncode == 0
    (tmp_path / "store").rename(tmp_path / "unmounted")
    synced = gcis(config, "sync", "--purge")
    assert synced.returncode == 1 and "failed: samples: (whole source): listing failed" in synced.stderr
    assert "removed" not in synced.stdout
    purged = gcis(config, "purge")
    assert purged.returncode == 1 and "nothing was purged" in purged.stderr
    assert sorted(cached(load_config(config).cache)) == ["samples/o/a.tif", "samples/o/b.tif"]


def served(config: Path, port: int) -> str:
    """What `cache serve --port PORT` says until it serves (stdout and stderr), then stopped as systemd does."""
    proc = subprocess.Popen([GCIS, "--config", str(config), "cache", "serve", "--no-sync", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops"):
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    return "".join(lines)


def test_serve_stopped_while_lighttpd_starts_leaves_no_lighttpd_behind(configured):
    """systemd stopping the service right after it started: lighttpd (and iipsrv) go with the command. The SIGTERM
    handler used to be set only once the server listened, so a SIGTERM before killed the command and left
    lighttpd serving, orphaned."""
    config, _ = configured
    proc = subprocess.Popen([GCIS, "--config", str(config), "cache", "serve", "--no-sync", "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (started := [c for c in psutil.Process(proc.pid).children() if c.name() == "lighttpd"]):
        assert proc.poll() is None and time.monotonic() < deadline, "lighttpd never started"
        time.sleep(0.005)
    proc.terminate()
    proc.wait(timeout=60)
    _, alive = psutil.wait_procs(started, timeout=10)
    for process in alive:
        process.kill()
    assert alive == []
    # nor an iipsrv lighttpd was spawning as it was stopped (one outlived it, orphaned, in a CI run)
    cache = str(config.parent)
    assert [p.pid for p in psutil.process_iter(["name", "environ"]) if p.info["name"] == "iipsrv.fcgi"
            and cache in (p.info["environ"] or {}).get("FILESYSTEM_PREFIX", "")] == []


def test_serve_on_another_port_than_the_manifests_name_warns_which_keys_to_change(configured):
    """The printed viewer URL loads the manifest from manifest_base_url: on another port nothing answers."""
    config, _ = configured
    port = free_port()
    manifests = {"manifest_base_url": f"http://127.0.0.1:{port}/store",
                 "image_service_base_url": f"http://localhost:{port}/iiif"}
    config.write_text(config.read_text().replace("store: {kind: local, root: store}\n",
                                                 f"store: {{kind: local, root: store}}\n    manifests: {manifests}\n")
                      .replace("server: {", "server: {documents_root: store, "))  # this server serves them
    assert "manifests:" in config.read_text() and "documents_root" in config.read_text()
    elsewhere = served(config, 0)
    assert "Ctrl-C stops" in elsewhere, elsewhere
    assert (f"warning: pipelines.samples.manifests.manifest_base_url, pipelines.samples.manifests."
            f"image_service_base_url name port {port} of this host, but this server listens on ") in elsewhere
    assert f"Serve on port {port} (--port, or cache.server.port)" in elsewhere
    same = served(config, port)
    assert "Ctrl-C stops" in same and "warning" not in same, same


def test_serve_does_not_warn_about_manifests_another_local_server_publishes(configured):
    """Manifests in a bucket of a MinIO on this host: its port is theirs, not one this server should take.
    The images this server does serve are still checked."""
    config, _ = configured
    port, minio_port = free_port(), free_port()
    manifests = {"manifest_base_url": f"http://127.0.0.1:{minio_port}/access/museum",
                 "image_service_base_url": f"http://127.0.0.1:{port}/iiif"}
    store = {"kind": "s3", "bucket": "access", "prefix": "museum", "endpoint_url": f"http://127.0.0.1:{minio_port}",
             "region": "us-east-1", "addressing_style": "path"}
    config.write_text(config.read_text().replace("store: {kind: local, root: store}\n",
                                                 f"store: {store}\n    manifests: {manifests}\n"))
    assert "'kind': 's3'" in config.read_text()
    same = served(config, port)
    assert "Ctrl-C stops" in same and "warning" not in same, same
    elsewhere = served(config, 0)
    assert (f"warning: pipelines.samples.manifests.image_service_base_url name port {port} of this host, but this "
            f"server listens on ") in elsewhere, elsewhere


@pytest.mark.parametrize("command", ["sync", "prune", "purge", "serve"])
def test_cli_help_teaches_with_an_example(command):
    done = subprocess.run([GCIS, "cache", command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Example:" in done.stdout and "gcis-etl cache" in done.stdout


def test_the_cron_line_for_prune_in_cache_help_runs_on_the_shipped_configuration(tmp_path):
    """As copied into a crontab: the shipped config.yaml sets no prune limits, so the line must give them."""
    (tmp_path / "config.yaml").write_text((Path(__file__).resolve().parent.parent / "config.yaml").read_text())
    shown = subprocess.run([GCIS, "cache", "--help"], capture_output=True, text=True, timeout=60).stdout
    [line] = [line for line in shown.splitlines() if " cache prune" in line]
    args = line.split("gcis-etl ", 1)[1].replace("/etc/gcis/config.yaml", str(tmp_path / "config.yaml")).split()
    done = subprocess.run([GCIS, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and "evicted 0" in done.stdout, done.stdout + done.stderr
