"""What a user's walk through the migrations found: a reencode whose source lost an object and a file, the CSV
of a reencode killed while it deleted old access masters, and a migration whose harvest run the signal reached
during its last item.

The folder source's master named "flowers" is held inside exiftool's inspection until the test releases it
(tests/test_harvest_durability.FolderHarvest), so a run is certainly at that point when the test acts.
"""
from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import CORPUS
from tests.harvests import peek, wait_for
from tests.test_harvest_durability import FolderHarvest
from tests.test_migrations import BIN, MASTERS, PIPELINE, Site, folder_site, image_references, ok, report_of

TO_JP2 = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless")


@pytest.fixture
def site(tmp_path) -> Site:
    return folder_site(tmp_path)


def rows(csv_path: str | Path, outcome: str) -> set[str]:
    with open(csv_path, newline="") as f:
        return {row["subject"] for row in csv.DictReader(f) if row["outcome"] == outcome}


def test_reencode_lists_what_the_source_lost_leaves_its_access_masters_and_finishes(site):
    """An object and a file moved out of the source after they were loaded: each run lists their items (no longer
    in the source), leaves their access masters as they are and re-derives the rest, exit 0; the dry run counts
    only what it would do. Asked for by id, the gone object failed every run, and the file was passed over
    silently."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    aside = site.root / "aside"
    aside.mkdir()
    shutil.move(site.root / "masters" / "b", aside / "b")
    shutil.move(site.root / "masters" / "a" / "p2.jpg", aside / "p2.jpg")
    left = {"museum/b/b~2Fx.jpg.tif", "museum/a/a~2Fp2.jpg.tif"}

    out = ok(site.migrate("reencode", *TO_JP2, "--dry-run"))
    assert "2 no longer in the source" in out and "2 old access masters to delete" in out, out

    for _ in range(2):  # a re-run lists them again, and still has nothing to fail
        out = ok(site.migrate("reencode", *TO_JP2))
        assert "2 no longer in the source" in out and "failed" not in out, out
        assert rows(report_of(out)["csv_path"], "no longer in the source") == {"b/x.jpg", "a/p2.jpg"}
        stored = site.stored()
        images = {key for key in stored if not key.endswith(".json")}
        assert images == left | {"museum/a/a~2Fp1.png.jp2", "museum/c/c~2Fy.tif.jp2"}
        assert image_references(stored) == images - {"museum/a/a~2Fp2.jpg.tif"}  # a's manifest lost p2.jpg
    assert "2 old access masters deleted" not in out and "deposited" not in out, out  # the first run did them

    shutil.move(aside / "b", site.root / "masters" / "b")  # back: re-derived like the others
    out = ok(site.migrate("reencode", *TO_JP2))
    assert "1 deposited" in out and "1 old access master deleted" in out and "1 no longer in the source" in out, out


def test_reencode_lists_the_waiting_old_key_of_an_object_the_source_lost_and_stops_asking_to_run_again(site):
    """A trial leaves an old key waiting for its object's manifest; the object then leaves the source. It is
    neither counted as to delete nor harvested (which failed), and the summary does not ask for another run."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    ok(site.migrate("reencode", *TO_JP2, "--limit", "1"))
    assert site.superseded() == {"museum/a/a~2Fp1.png.tif"}
    shutil.rmtree(site.root / "masters" / "a")

    out = ok(site.migrate("reencode", *TO_JP2, "--dry-run"))
    assert "2 no longer in the source" in out and "2 old access masters to delete" in out, out  # b and c
    out = ok(site.migrate("reencode", *TO_JP2))
    assert rows(report_of(out)["csv_path"], "no longer in the source") == {"a/p1.png", "a/p2.jpg"}
    assert "wait until their objects" not in out and "2 old access masters deleted" in out, out
    assert site.superseded() == {"museum/a/a~2Fp1.png.tif"}  # a's manifest still shows it


@pytest.fixture
def held(site) -> FolderHarvest:
    """exiftool holds the master named flowers (its config in the site's exiftool folder) until released."""
    rig = FolderHarvest(site.root)
    site.configure({"kind": "local", "root": "store"})  # the site's, not the rig's
    return rig


def migrate(site: Site, held: FolderHarvest, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gcis-migrate"), *args], capture_output=True, text=True, cwd=site.root,
                          timeout=180, env={**held.env, "GCIS_CONFIG": str(site.config)})


def start(site: Site, held: FolderHarvest, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """A migration in a process group of its own, once exiftool holds the flowers; and its stderr, as it comes."""
    run = subprocess.Popen([str(BIN / "gcis-migrate"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=site.root, env={**held.env, "GCIS_CONFIG": str(site.config)},
                           start_new_session=True)
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True).start()
    wait_for(held.held.exists, "exiftool inspects the flowers", run)
    return run, stderr


def add_flowers(site: Site) -> None:
    """Object z, listed last by the folder source (the newest) and by reencode (ids in order)."""
    (site.root / "masters" / "z").mkdir()
    shutil.copy(CORPUS / "jpeg-baseline/flowers.jpeg", site.root / "masters" / "z" / "flowers.jpeg")


def test_a_killed_reencode_lists_in_its_csv_every_old_access_master_it_deleted(site, held):
    """kill -9 while the last object is re-derived, after the others' old access masters were deleted: the killed
    run's CSV lists each of them (it got them only once its harvest run returned), and with the next run's CSV
    every deleted key is listed once."""
    add_flowers(site)
    held.released.touch()
    ok(migrate(site, held, "initial_load", "--pipeline", PIPELINE))
    tifs = {key for key in site.stored() if key.endswith(".tif")}
    first = {key for key in tifs if not key.startswith("museum/z/")}
    held.released.unlink()
    held.held.unlink()

    run, stderr = start(site, held, "reencode", *TO_JP2, "-v")
    try:
        wait_for(lambda: all(any(f"deleted {key}, superseded by" in line for line in stderr) for key in first),
                 "the old access masters of a, b and c are deleted", run)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert not first & site.stored().keys()
    [killed] = sorted((site.root / "state" / "reports").glob("reencode-*.csv"))
    assert rows(killed, "old access masters deleted") == first

    held.released.touch()
    out = ok(migrate(site, held, "reencode", *TO_JP2))
    assert rows(report_of(out)["csv_path"], "old access masters deleted") == {"museum/z/z~2Fflowers.jpeg.tif"}
    assert not tifs & site.stored().keys()


@pytest.mark.parametrize("ids, code, says", [(None, 0, "initial_load: completed: "),
                                             ("z\na\n", 130, "initial_load: stopped: ")])
def test_a_migration_whose_run_completes_after_ctrl_c_exits_as_completed_unless_it_has_another_run_to_make(
        site, held, ids, code, says):
    """Ctrl-C while a harvest run's last item is in flight: the item finishes and the run completes. The migration
    made its only run, so it completed too (exit 0, no 'run again'), as `gcis-etl report` says of the run; with
    --ids a further batch was left (exit 130, 'run again')."""
    shutil.rmtree(site.root / "masters")
    (site.root / "masters" / "a").mkdir(parents=True)
    shutil.copy(CORPUS / MASTERS["a/p1.png"], site.root / "masters" / "a" / "p1.png")
    add_flowers(site)
    os.utime(site.root / "masters" / "a" / "p1.png", (1_000_000_000,) * 2)  # the older: listed first
    args = ("initial_load", "--pipeline", PIPELINE)
    if ids:
        (site.root / "ids.txt").write_text(ids)
        args += ("--ids", "ids.txt", "--batch-size", "1")
    run, stderr = start(site, held, *args)
    held.signal_and_release(run, stderr, lambda: run.send_signal(signal.SIGINT))
    out = run.stdout.read()

    assert run.returncode == code, (out, stderr)
    assert out.startswith(says), out
    assert ("run again" in out) == bool(ids), out
    ledger = site.root / "state" / "ledger.sqlite"
    assert peek(ledger, "SELECT status FROM runs") == [("completed",)]
    assert dict(peek(ledger, "SELECT item_id, status FROM items")) == (
        {"z/flowers.jpeg": "deposited"} if ids else {"a/p1.png": "deposited", "z/flowers.jpeg": "deposited"})
