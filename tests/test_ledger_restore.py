"""A ledger that no longer says what the store holds: put back from a backup taken before a reencode retired the
access masters it records, or a key deleted by hand. An object whose manifests go out again must refer only to
keys the store holds: its items whose recorded access master is gone are processed again (the reencode's access
master reused, or converted anew). Real files in a folder source, a local store, the CLI as cron runs it."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import CORPUS
from tests.test_migrations import PIPELINE, Site, folder_site, image_references, ok
from tests.test_sequence_keys import PAGES, shown, size
from tests.test_sequence_keys import run as sequence_run
from tests.test_sequence_keys import site as sequence_site

TO_JP2 = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossy")


@pytest.fixture
def site(tmp_path) -> Site:
    return folder_site(tmp_path)  # objects a (p1.png, p2.jpg), b (x.jpg), c (y.tif)


def edit(site: Site, name: str, corpus: str) -> None:
    """A master added or replaced in the source, a few seconds newer than anything harvested."""
    path = site.root / "masters" / name
    shutil.copy(CORPUS / corpus, path)
    os.utime(path, (path.stat().st_mtime + 5,) * 2)


def planned(site: Site) -> dict[str, str]:
    """What a dry run would do with each item, by its label (models.item_label: a folder source's item id):
    `process: <reason>` or `skip: <reason>`."""
    out = ok(site.run("gcis-etl", "harvest", "--dry-run"))
    lines = [line.split(maxsplit=1) for line in out.splitlines() if not line.startswith(f"{PIPELINE}:")]
    return {subject: f"{action}: {reason}" for action, (subject, reason) in
            ((action, rest.split(": ", 1)) for action, rest in lines)}


def test_a_ledger_put_back_from_before_a_reencode_publishes_no_manifest_naming_a_retired_key(site):
    ok(site.run("gcis-etl", "harvest"))
    backup = site.root / "backup.sqlite"
    shutil.copy(site.root / "state" / "ledger.sqlite", backup)
    edit(site, "a/p3.jpg", "gray8/hopper_gray.jpg")  # a gets a page, b a new version of its master
    edit(site, "b/x.jpg", "gray8/hopper_gray.jpg")
    ok(site.run("gcis-etl", "harvest"))
    ok(site.migrate("reencode", *TO_JP2))  # every .tif retired
    site.configure({"kind": "local", "root": "store"}, recipe="jp2-openjpeg-lossy")
    for ledger in (site.root / "state").glob("ledger.sqlite*"):
        ledger.unlink()
    shutil.copy(backup, site.root / "state" / "ledger.sqlite")
    assert not any(key.endswith(".tif") for key in site.stored())

    plan = planned(site)
    assert plan["a/p1.png"] == "process: its access master museum/a/a~2Fp1.png.tif is no longer in the store"
    assert plan["a/p3.jpg"] == "process: new"
    assert plan["c/y.tif"].startswith("skip: unchanged; deposited with recipe ptiff-jpeg-q90")

    ok(site.run("gcis-etl", "harvest"))
    stored = site.stored()
    assert image_references(stored) <= stored.keys()
    # c, unchanged, is not looked at: its ledger record alone names its retired key, its manifests do not
    assert {key for _, _, key in site.items().values()} - stored.keys() == {"museum/c/c~2Fy.tif.tif"}
    assert site.items()["a/p1.png"][1:] == ("jp2-openjpeg-lossy", "museum/a/a~2Fp1.png.jp2")
    assert set(planned(site).values()) == {"skip: unchanged"} | {plan["c/y.tif"]}


def test_a_key_deleted_by_hand_is_converted_again_when_its_object_changes(site):
    ok(site.run("gcis-etl", "harvest"))
    (site.store / "museum" / "a" / "a~2Fp1.png.tif").unlink()
    (site.store / "museum" / "b" / "b~2Fx.jpg.tif").unlink()  # b does not change: no request is made for it
    edit(site, "a/p2.jpg", "metadata-rich/XMP.jpg")

    plan = planned(site)
    assert plan["a/p1.png"] == "process: its access master museum/a/a~2Fp1.png.tif is no longer in the store"
    assert plan["b/x.jpg"] == "skip: unchanged"

    out = ok(site.run("gcis-etl", "harvest"))
    assert "2 deposited" in out
    stored = site.stored()
    assert "museum/a/a~2Fp1.png.tif" in stored
    assert image_references(stored) - stored.keys() == {"museum/b/b~2Fx.jpg.tif"}  # left until b changes


def test_a_page_put_back_where_another_page_went_meanwhile_is_converted_again(tmp_path):
    """`{sequence}` keys: a withdrawn page keeps its record and its key, which the page after it takes when it
    moves up; put back unchanged (its file's time kept), it is not shown with that page's image."""
    cfg = sequence_site(tmp_path, sorted(PAGES))
    book = tmp_path / "masters" / "book"
    shutil.copy2(book / "p2.tif", tmp_path / "p2.tif")
    (book / "p2.tif").unlink()
    assert sequence_run(cfg) == {"p1.png": "skipped: unchanged", "p3.tif": "deposited: None"}  # p3 to 2.tif
    shutil.copy2(tmp_path / "p2.tif", book / "p2.tif")

    assert sequence_run(cfg) == {"p1.png": "skipped: unchanged", "p2.tif": "deposited: None",
                                 "p3.tif": "deposited: None"}

    assert shown(tmp_path) == [size(page) for page in sorted(PAGES)]
