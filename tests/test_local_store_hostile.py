"""A local store and a scratch space that are hostile after the run began (what a walk found): an access master
made immutable, a folder where a sidecar goes, a read-only sidecar tree or store, a file or an immutable folder
where the scratch folder goes. Real files and mounts: tmpfs (which takes chattr +i), `mount -o remount,ro`, read-only
bind mounts, each undone in a finally; harvests are real `gcis-etl` processes (tests.test_cron_operation.Night)."""
from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from gcis_etl.errors import StoreError, StoreFull, StoreRefused
from gcis_etl.stores import LocalStore, LocalStoreSettings, Provenance
from tests.harvests import peek
from tests.test_cron_operation import Night

KEY = "demo/IE1/FL1.tif"
OLD = Provenance(source_id="IE1/FL1", source_checksum="md5:" + "0" * 32, recipe="ptiff-jpeg-q90", width=2, height=1)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting and chattr +i need root")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


@contextmanager
def tmpfs(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"chattr +i is not supported here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def deposited(store: LocalStore, tmp_path: Path, content: bytes, provenance: Provenance = OLD) -> str:
    master = tmp_path / "master.tif"
    master.write_bytes(content)
    return store.put(KEY, master, provenance=provenance).sha256


# ------------------------------------------------------------------------- a failed deposit keeps the old record


@root_only
def test_a_deposit_the_filesystem_refuses_keeps_the_record_of_the_access_master_still_there(tmp_path):
    """The sidecar was written before the rename, which the immutable master refused: it described the new content,
    head() ignored it, and the old master, still valid, had no SHA-256 (`cache sync` refused it as not ours)."""
    with tmpfs(tmp_path / "store") as root:
        store = LocalStore(LocalStoreSettings(root=root))
        old_sha = deposited(store, tmp_path, b"old access master")
        with immutable(root / KEY):
            with pytest.raises(StoreError) as refused:
                deposited(store, tmp_path, b"new access master, changed at the source", Provenance(source_id="new"))
        assert type(refused.value) is StoreError  # this key's alone: the run goes on
        assert str(refused.value) == (f"{root / KEY}: cannot write: Operation not permitted (check its attributes "
                                      f"and its folder's, which lsattr shows: immutable, append-only)")
        head = store.head(KEY)
        assert (head.sha256, head.provenance, store.get_bytes(KEY)) == (old_sha, OLD, b"old access master")
        assert [p.name for p in root.rglob("*.tmp")] == []


# ------------------------------------------------------------------ store errors name what failed and what to do


def test_a_folder_where_the_sidecar_goes_is_named_with_what_to_do(tmp_path):
    """It named the key's file, which was fine: the folder in the way is under .meta."""
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    sidecar = tmp_path / "store" / ".meta" / f"{KEY}.json"
    sidecar.mkdir(parents=True)
    with pytest.raises(StoreError) as refused:
        deposited(store, tmp_path, b"access master")
    assert str(refused.value) == f"{sidecar}: cannot write: Is a directory (a folder is in the way: remove it)"
    assert [p.name for p in (tmp_path / "store").rglob("*.tmp")] == []


@root_only
def test_a_read_only_sidecar_tree_is_named_and_stops_the_run_with_remount_not_make_room(tmp_path):
    """It named the key's file, and said 'N MB free in the store's filesystem … make room there'."""
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    old_sha = deposited(store, tmp_path, b"old access master")
    meta = tmp_path / "store" / ".meta"
    mount("--bind", str(meta), str(meta))
    try:
        mount("-o", "remount,bind,ro", str(meta))
        with pytest.raises(StoreRefused) as refused:
            deposited(store, tmp_path, b"new access master")
    finally:
        subprocess.run(["umount", str(meta)], check=True)
    assert str(refused.value) == (f"{meta / 'demo/IE1'}: cannot write: Read-only file system (remount the store's "
                                  f"filesystem read-write)")
    assert (store.head(KEY).sha256, store.get_bytes(KEY)) == (old_sha, b"old access master")


@root_only
def test_a_read_only_store_is_refused_not_full(tmp_path):
    with tmpfs(tmp_path / "store") as root:
        store = LocalStore(LocalStoreSettings(root=root))
        deposited(store, tmp_path, b"old access master")
        mount("-o", "remount,ro", str(root))
        with pytest.raises(StoreRefused) as refused:
            deposited(store, tmp_path, b"new access master")
    assert not isinstance(refused.value, StoreFull)
    assert str(refused.value) == (f"{root / 'demo/IE1'}: cannot write: Read-only file system (remount the store's "
                                  f"filesystem read-write)")


# --------------------------------------------------------------------- a scratch folder that cannot be made


def _file_at_the_pipelines_folder(scratch: Path) -> Path:
    (scratch / "dam").write_bytes(b"")
    return scratch / "dam"


def _file_at_the_scratch_space(scratch: Path) -> Path:
    scratch.rmdir()
    scratch.write_bytes(b"")
    return scratch


@pytest.mark.parametrize("block", [_file_at_the_pipelines_folder, _file_at_the_scratch_space], ids=["dam", "scratch"])
def test_a_file_where_the_scratch_folder_goes_stops_the_run_and_spends_no_attempt(tmp_path, block):
    """Every item failed with 'FileExistsError: [Errno 17] File exists' (or NotADirectoryError), spending its
    attempts, and the checkpoint moved past them."""
    night = Night(tmp_path)
    night.add("a")
    assert night.harvest().returncode == 0
    night.add("b", "c")
    scratch = tmp_path / "state" / "scratch"
    scratch.mkdir(exist_ok=True)
    for left in scratch.iterdir():
        left.rmdir()
    blocker = block(scratch)
    checkpoint = peek(night.ledger, "SELECT checkpoint FROM checkpoints")

    stopped = night.harvest()

    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr
    why = "File exists" if blocker.name == "dam" else "Not a directory"
    reason = (f"fetching: cannot write {scratch / 'dam'} (the scratch space: state_dir sets where it is): {why}: "
              f"{blocker} is a file, where a folder should be: remove it: then run again (no item's attempt was "
              f"counted)")
    assert f"dam: run stopped: {reason}" in stopped.stderr, stopped.stderr
    assert night.runs()[-1] == (2, "failed", f"RunHalted: {reason}")
    assert night.items() == {"a/a/master.tif": ("deposited", 0)}
    assert peek(night.ledger, "SELECT checkpoint FROM checkpoints") == checkpoint

    blocker.unlink()
    again = night.harvest()
    assert again.returncode == 0, again.stderr
    assert night.items() == {f"{o}/{o}/master.tif": ("deposited", 0) for o in "abc"}


@root_only
def test_an_immutable_scratch_folder_stops_the_run_and_spends_no_attempt(tmp_path):
    night = Night(tmp_path)
    night.add("a")
    folder = tmp_path / "state" / "scratch" / "dam"
    folder.mkdir(parents=True)
    with immutable(folder):
        stopped = night.harvest()
    assert stopped.returncode == 1, stopped.stderr
    reason = (f"fetching: cannot write {folder} (the scratch space: state_dir sets where it is): Operation not "
              f"permitted: check the permissions and attributes (lsattr) of {folder} and its folders: then run "
              f"again (no item's attempt was counted)")
    assert f"dam: run stopped: {reason}" in stopped.stderr, stopped.stderr
    assert night.items() == {}
