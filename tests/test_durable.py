"""fsync_path makes a file's bytes or a folder's entries durable; convert() makes its output survive a crash
where it is the destination, and spends no fsync on scratch output that a store deposits (and makes durable
itself) before it is deleted."""
from __future__ import annotations

import os
from pathlib import Path

import pyvips
import pytest

from gcis_etl.conversion import convert
from gcis_etl.durable import fsync_path
from gcis_etl.stores import LocalStore, LocalStoreSettings


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The paths this process fsyncs (through to the real fsync)."""
    paths, real = [], os.fsync
    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    return paths


@pytest.fixture
def master(tmp_path) -> Path:
    path = tmp_path / "master.tif"
    pyvips.Image.black(600, 400, bands=3).draw_circle([200, 80, 40], 300, 200, 150, fill=True).tiffsave(str(path))
    return path


def test_fsync_path_flushes_files_and_directories(tmp_path, synced):
    out = tmp_path / "out.jp2"
    out.write_bytes(b"x" * 1000)
    fsync_path(out)
    fsync_path(tmp_path)
    assert synced == [str(out), str(tmp_path)]


def test_a_converted_destination_is_made_durable(tmp_path, master, synced):
    out = tmp_path / "access" / "a.tif"
    assert convert(master, out).ok
    assert str(out.parent) in synced and any(Path(p).name.startswith(".a.tif.") for p in synced)


def test_scratch_output_is_not_synced_but_its_deposit_is(tmp_path, master, synced):
    scratch = tmp_path / "scratch" / "access.tif"
    result = convert(master, scratch, durable=False)
    assert result.ok and synced == []
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    store.put("demo/a.tif", scratch, sha256=result.sha256)
    assert str(tmp_path / "store" / "demo") in synced
    assert any(Path(p).name.startswith(".a.tif.") and Path(p).parent == tmp_path / "store" / "demo" for p in synced)
