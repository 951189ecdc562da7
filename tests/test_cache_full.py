"""A cache folder whose disk is full (its copies, or its state.sqlite) stops `cache sync` in one line naming the
cache's disk, its room and what to do, exit 2, rather than one failure per image (or a traceback), and leaves no
copy without its record; a ledger on a read-only mount says so.

Real parts: a small tmpfs mounted (root only) for the cache folder or the ledger's; CI runs as root.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gcis_etl.cache import CacheSource, CacheUnusable, prune, sync
from gcis_etl.ledger import Ledger, LedgerError
from tests.conftest import cache_settings
from tests.mounts import tmpfs
from tests.test_cache import cached, gcis, local_store, put

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")

IMAGE = 100_000
PAGE = 4096


@pytest.fixture
def tiny(tmp_path):
    with tmpfs(tmp_path / "tiny", "size=1m") as folder:
        yield folder


def grow(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=8m", str(folder)], check=True)


@pytest.fixture
def store(tmp_path):
    store = local_store(tmp_path / "store")
    for n in range(20):  # 2 MB: twice the cache's disk
        put(store, f"p/o{n:02}/a.tif", bytes([n]) * IMAGE)
    return store


def test_a_full_cache_disk_stops_the_sync_in_one_line_and_what_was_copied_is_recorded(tiny, store):
    """Each image was 'failed' with the store's path first ('cannot copy to .../incoming/<uuid>.partial: No space
    left on device'), on every run."""
    settings = cache_settings(tiny)
    source = CacheSource("p", store, "p/")
    with pytest.raises(CacheUnusable) as stopped:
        sync(settings, [source])

    message = str(stopped.value)
    assert message.startswith(f"cache {settings.dir}: cannot copy p/o")
    assert "(0.1 MB) into it: its disk is full (" in message
    assert " MB free of 1.0 MB): run `gcis-etl cache prune --max-bytes SIZE` (and set cache.max_bytes" in message
    assert message.endswith("or give the cache more room; sync stopped") and "\n" not in message
    assert list((settings.dir / "incoming").iterdir()) == []
    copied = cached(settings)
    assert 5 <= len(copied) < 10

    grow(tiny)
    result = sync(settings, [source])
    assert (len(result.copied), result.unchanged, result.adopted, result.failed) == (20 - len(copied), len(copied),
                                                                                     (), ())


def test_cli_a_full_cache_disk_is_one_line_and_exit_2(tiny, store, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"""
pipelines:
  p:
    source: {{kind: filesystem, root: {tmp_path}}}
    store: {{kind: local, root: {tmp_path / 'store'}}}
cache:
  dir: {tiny / 'cache'}
  server: {{run_dir: {tmp_path / 'run'}, access_log: {tmp_path / 'run' / 'access.log'}}}
""")

    done = gcis(config, "sync")
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: cache {tiny / 'cache'}: cannot copy p/o"), done.stderr
    assert "its disk is full" in done.stderr and "cache prune" in done.stderr


def test_a_state_its_disk_cannot_take_stops_the_sync_in_one_line_and_leaves_no_copy_unrecorded(tiny, store):
    """sqlite3.OperationalError 'database or disk is full' in _State.put was a traceback, every run; the copy just
    renamed into images/ had no record, so `cache prune` could not evict it."""
    settings = cache_settings(tiny)
    source = CacheSource("p", store, "p/o00/")
    assert sync(settings, [source]).copied == ("p/o00/a.tif",)
    put(store, "p/o00/b.tif", b"B" * IMAGE)
    # room for the copy and for the -shm SQLite makes opening the state (32 KB), none for its write-ahead log
    free = shutil.disk_usage(tiny).free
    (tiny / "filler").write_bytes(bytes(free - (IMAGE + PAGE - 1) // PAGE * PAGE - 8 * PAGE))

    with pytest.raises(CacheUnusable) as stopped:
        sync(settings, [source])

    message = str(stopped.value)
    assert message.startswith(f"cache {settings.dir}: its state {settings.dir / 'state.sqlite'} cannot be used "
                              f"(database or disk is full): its disk is full (0.1 MB free of 1.0 MB): run `gcis-etl "
                              f"cache prune"), message
    assert list(cached(settings)) == ["p/o00/a.tif"]  # the copy without its record is gone, its room back
    assert [e.key for e in prune(settings, max_bytes=0).evicted] == ["p/o00/a.tif"]
    (tiny / "filler").unlink()
    assert sync(settings, [source]).copied == ("p/o00/b.tif",)


def test_a_ledger_on_a_read_only_mount_says_so(tmp_path):
    """It said 'unable to open database file; is its folder ... there and writable by this user?'."""
    with tmpfs(tmp_path / "ro", "ro,size=64k") as folder, pytest.raises(LedgerError) as refused:
        Ledger(folder / "ledger.sqlite")

    assert str(refused.value) == (f"ledger {folder / 'ledger.sqlite'} cannot be opened (unable to open database "
                                  f"file): its folder {folder} is on a filesystem mounted read-only: mount it "
                                  f"read-write, or point state_dir (or ledger.path) at one that is")
