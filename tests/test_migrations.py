"""Migration scripts, run as an operator runs them (`gcis-migrate NAME ...` in a subprocess) on a few tiny
masters: a filesystem source, a local store, and MinIO as the target of a move."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

import pytest
import yaml

from gcis_etl.ledger import Ledger
from gcis_etl.locks import RunLock
from gcis_etl.migration import MigrationReport, run_script, store_settings
from tests.conftest import CORPUS

BIN = Path(sys.executable).parent
MASTERS = {"a/p1.png": "png/png-rgb-64x56x8.png", "a/p2.jpg": "gray8/hopper_gray.jpg",
           "b/x.jpg": "metadata-rich/XMP.jpg", "c/y.tif": "palette/palette-1c-4b.tiff"}
MANIFESTS = {"manifest_base_url": "https://iiif.example.org/store",
             "image_service_base_url": "https://iiif.example.org/iiif"}
SERVICE = MANIFESTS["image_service_base_url"] + "/"
PIPELINE = "museum"


@dataclass
class Site:
    """A config.yaml with one pipeline over a folder of masters, and its state, in a temporary folder."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    def configure(self, store: dict, recipe: str = "ptiff-jpeg-q90", **settings) -> None:
        pipeline = {"source": {"kind": "filesystem", "root": "masters"}, "store": store, "manifests": MANIFESTS,
                    "recipe": recipe, **settings}
        self.config.write_text(yaml.safe_dump({"state_dir": "state", "defaults": {"concurrency": 1},
                                               "pipelines": {PIPELINE: pipeline}}))

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, cwd=self.root,
                              timeout=180, env={**os.environ, "GCIS_CONFIG": str(self.config)})

    def migrate(self, script: str, *args: str) -> subprocess.CompletedProcess:
        return self.run("gcis-migrate", script, *args)

    def ledger(self) -> Ledger:
        return Ledger(self.root / "state" / "ledger.sqlite")

    def items(self) -> dict[str, tuple[str, str, str]]:
        """item id -> (status, recipe, output key)"""
        with self.ledger() as ledger:
            return {r.item_id: (r.status, r.recipe, r.output_key) for r in ledger.items(PIPELINE)}

    def superseded(self) -> set[str]:
        with self.ledger() as ledger:
            return {s.key for s in ledger.superseded(PIPELINE)}

    def runs(self) -> int:
        with self.ledger() as ledger:
            return len(ledger.runs(PIPELINE, limit=1000))

    @property
    def store(self) -> Path:
        return self.root / "store"

    def stored(self, root: Path | None = None) -> dict[str, bytes]:
        """Every object in the local store, or in a local store at `root` (sidecars and temporary files aside)."""
        root = root or self.store
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def folder_site(tmp_path: Path) -> Site:
    """The masters in a folder source, a local store."""
    for name, corpus in MASTERS.items():
        (tmp_path / "masters" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CORPUS / corpus, tmp_path / "masters" / name)
    site = Site(tmp_path)
    site.configure({"kind": "local", "root": "store"})
    return site


@pytest.fixture
def site(tmp_path) -> Site:
    return folder_site(tmp_path)


def ok(proc: subprocess.CompletedProcess, code: int = 0) -> str:
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def report_of(out: str) -> dict:
    """The JSON report a script names on its last line."""
    return json.loads(Path(out.strip().rsplit("report: ", 1)[1]).read_text())


def image_references(stored: dict[str, bytes]) -> set[str]:
    """The store keys the deposited v3 manifests show as images."""
    keys = set()
    for key, data in stored.items():
        if key.endswith("manifest-v3.json"):
            for canvas in json.loads(data)["items"]:
                body = canvas["items"][0]["items"][0]["body"]
                keys.add(unquote(body["service"][0]["@id"].removeprefix(SERVICE)))  # ImageService2
    return keys


# ---------------------------------------------------------------------------------------------- scripts


@pytest.mark.parametrize("script, says", [("initial_load", "--ids"), ("reencode", "--from-recipe"),
                                          ("move_store", "--delete-source")])
def test_each_script_shows_its_usage(script, says, capsys):
    assert run_script(script, ["--help"]) == 0
    shown = capsys.readouterr().out
    assert f"Usage: gcis-migrate {script}" in shown and says in shown and "--dry-run" in shown
    assert "Exit codes" in shown


def test_a_migration_summary_counts_one_object_in_the_singular_and_keeps_its_report_keys(tmp_path):
    report = MigrationReport("initial_load", dry_run=True, directory=tmp_path)
    report.add("objects already loaded", 1)
    report.add("manifests published", 1)
    report.add("old access masters to delete", 2)
    report.add("deposited", 1)
    assert report.summary().splitlines()[0] == ("initial_load: dry-run: 1 object already loaded, 1 manifest "
                                                "published, 2 old access masters to delete, 1 deposited")
    assert set(report.to_dict()["counts"]) == {"objects already loaded", "manifests published",
                                               "old access masters to delete", "deposited"}


def test_an_unknown_script_is_a_usage_error_listing_the_scripts(site):
    proc = site.migrate("no_such_script")
    assert proc.returncode == 2
    assert "initial_load" in proc.stderr and "reencode" in proc.stderr and "move_store" in proc.stderr


def test_a_migration_never_overlaps_a_run_of_its_pipeline(site):
    with RunLock(site.root / "state" / "locks" / f"{PIPELINE}.lock", "a harvest"):
        for proc in (site.migrate("initial_load", "--pipeline", PIPELINE),
                     site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}")):
            assert proc.returncode == 3 and "is already running" in proc.stdout
    assert site.items() == {} and not site.store.exists() and not (site.root / "other").exists()


# ----------------------------------------------------------------------------------------- initial_load


def test_initial_load_dry_run_then_resumes_after_a_limit_and_sets_the_checkpoint(site):
    assert "4 would process" in ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--dry-run"))
    assert site.items() == {} and not site.store.exists()

    ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--limit", "2"))
    first = site.items()
    assert [status for status, _, _ in first.values()] == ["deposited", "deposited"]
    unloaded = {name.split("/")[0] for name in MASTERS} - {item.split("/")[0] for item in first}
    reached = min(max(datetime.fromtimestamp(p.stat().st_mtime, timezone.utc)  # as the source stamps objects
                          for p in (site.root / "masters" / obj).iterdir()) for obj in unloaded)
    with site.ledger() as ledger:  # cut short over a source listing oldest first: as far as its listing got
        checkpoint = ledger.checkpoint(PIPELINE)
        assert checkpoint is not None and checkpoint <= reached

    out = ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    assert "2 deposited, 2 skipped" in out
    with site.ledger() as ledger:
        assert ledger.counts(PIPELINE)["deposited"] == 4
        assert ledger.checkpoint(PIPELINE) is not None
        last = ledger.runs(PIPELINE, limit=1)[0]
        assert {i.item_id for i in ledger.run_items(last.run_id, "skipped")} == set(first)
    assert image_references(site.stored()) == {key for _, _, key in site.items().values()}
    assert "collections/museum-v3.json" in site.stored()

    assert "4 skipped" in ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    assert site.items().keys() == MASTERS.keys()


def test_a_budget_spent_before_a_harvest_run_stops_the_migration_and_says_so(site):
    out = ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--max-minutes", "0.000001"))
    assert out.startswith("initial_load: stopped: nothing done")
    report = report_of(out)
    assert report["status"] == "stopped" and report["harvest_runs"] == []
    assert report["notes"] == [f"--max-minutes 1e-06 spent before {PIPELINE}'s next harvest run: run again to continue"]
    assert site.items() == {}
    assert "4 deposited" in ok(site.migrate("initial_load", "--pipeline", PIPELINE))


def test_initial_load_takes_what_the_incremental_harvest_does_not_see(site):
    """A sidecar row's `modified` is its object's date, which editing the sidecar does not change: a row added
    for a master already there, dated before the checkpoint, is behind it (no overlap here, as the masters
    were copied in seconds before the first run)."""
    site.configure({"kind": "local", "root": "store"}, overlap_seconds=0)
    late = site.root / "masters" / "d" / "old.jpg"  # there from the start, but no row names it yet
    late.parent.mkdir()
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", late)
    sidecar = site.root / "masters" / "objects.csv"
    rows = "object_id,file,modified\n" + "".join(f"{name.split('/')[0]},{name},2001-01-01T00:00:00Z\n"
                                                  for name in MASTERS)
    sidecar.write_text(rows)
    ok(site.run("gcis-etl", "harvest"))
    with site.ledger() as ledger:
        checkpoint = ledger.checkpoint(PIPELINE)
    sidecar.write_text(rows + "d,d/old.jpg,2001-01-01T00:00:00Z\n")  # an object older than the checkpoint
    assert "0 deposited, 0 skipped" in ok(site.run("gcis-etl", "harvest"))
    assert "d/old.jpg" not in site.items()

    assert "1 deposited, 4 skipped" in ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    assert site.items()["d/old.jpg"][0] == "deposited"
    with site.ledger() as ledger:
        assert ledger.checkpoint(PIPELINE) > checkpoint


def test_initial_load_from_an_id_list(site):
    (site.root / "ids.csv").write_text("object_id,title\nb,Bee\nc,Sea\nb,Bee\n")
    ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.csv"))
    assert set(site.items()) == {"b/x.jpg", "c/y.tif"}
    with site.ledger() as ledger:
        assert ledger.checkpoint(PIPELINE) is None

    runs = site.runs()
    assert "2 objects already loaded" in ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.csv"))
    assert site.runs() == runs  # nothing asked of the source again

    (site.root / "ids.txt").write_text("# one per line\nzzz\na\n")
    proc = site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.txt", "--batch-size", "1")
    assert proc.returncode == 1 and "failed: zzz" in proc.stdout and "no object 'zzz'" in proc.stdout
    assert "2 deposited" in proc.stdout
    assert {"a/p1.png", "a/p2.jpg"} <= set(site.items())  # an unknown id fails alone: the run after it loads a

    (site.root / "wrong.csv").write_text("pid\nb\n")
    proc = site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "wrong.csv")
    assert proc.returncode == 2 and "no column 'object_id' (columns: pid)" in proc.stderr


@pytest.mark.parametrize("name, header", [("ids.txt", b""), ("ids.csv", b"object_id\r\n")])
def test_an_id_list_saved_with_a_byte_order_mark_loses_no_id_and_one_in_latin_1_is_a_usage_error(site, name,
                                                                                                 header):
    ids = site.root / name
    ids.write_bytes(b"\xef\xbb\xbf" + header + b"b\r\nc\r\n")  # as Windows Notepad saves UTF-8
    assert "2 would process" in ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", name, "--dry-run"))

    ids.write_bytes(header + b"b\ncaf\xe9\n")
    proc = site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", name)
    assert proc.returncode == 2, proc.stderr
    line = 3 if header else 2
    assert f"{name}: line {line} is not UTF-8 (byte 0xe9): save the id list as UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr and site.items() == {}


# --------------------------------------------------------------------------------------------- reencode


def test_reencode_with_the_same_extension_replaces_in_place_and_resumes(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    before = site.stored()
    args = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "ptiff-jpeg-q90-444")

    assert "4 would process" in ok(site.migrate("reencode", *args, "--dry-run"))
    assert site.stored() == before and {r for _, r, _ in site.items().values()} == {"ptiff-jpeg-q90"}

    ok(site.migrate("reencode", *args, "--limit", "1"))
    recipes = [recipe for _, recipe, _ in site.items().values()]
    assert sorted(recipes) == ["ptiff-jpeg-q90", "ptiff-jpeg-q90", "ptiff-jpeg-q90", "ptiff-jpeg-q90-444"]

    out = ok(site.migrate("reencode", *args))
    assert "3 deposited, 1 skipped" in out  # the item re-derived first is not done again
    items = site.items()
    assert {(status, recipe) for status, recipe, _ in items.values()} == {("deposited", "ptiff-jpeg-q90-444")}
    after = site.stored()
    assert after.keys() == before.keys()
    for _, _, key in items.values():
        assert after[key] != before[key]
        sidecar = json.loads((site.store / ".meta" / f"{key}.json").read_text())
        assert sidecar["provenance"]["recipe"] == "ptiff-jpeg-q90-444"
    assert "nothing to do" in ok(site.migrate("reencode", *args))
    misspelt = site.migrate("reencode", "--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q9")
    assert misspelt.returncode == 2 and "(it records: ptiff-jpeg-q90-444)" in misspelt.stderr, misspelt.stderr


def test_reencode_to_another_extension_deletes_old_keys_once_no_manifest_refers_to_them(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    args = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless")
    before = site.stored()
    assert "4 old access masters to delete" in ok(site.migrate("reencode", *args, "--dry-run", "--batch-size", "2"))
    assert site.stored() == before
    blocked = site.store / "museum" / "a" / "a~2Fp2.jpg.jp2"
    blocked.mkdir()  # the deposit of one item of object a fails

    ok(site.migrate("reencode", *args), code=1)
    stored = site.stored()
    assert {"museum/a/a~2Fp1.png.jp2", "museum/a/a~2Fp1.png.tif", "museum/a/a~2Fp2.jpg.tif"} <= stored.keys()
    assert image_references(stored) <= stored.keys()  # a's manifest still shows the old ones: they stay
    assert "museum/c/c~2Fy.tif.tif" not in stored and "museum/c/c~2Fy.tif.jp2" in stored
    assert site.superseded() == {"museum/a/a~2Fp1.png.tif"}  # waits for a's manifest to be republished
    status = site.run("gcis-etl", "status", PIPELINE)
    assert "superseded access masters: 1 wait until their objects' manifests are republished" in status.stdout
    assert json.loads(site.run("gcis-etl", "status", "--json", PIPELINE).stdout)["superseded_waiting"] == 1

    blocked.rmdir()
    out = ok(site.migrate("reencode", *args))
    assert "1 deposited" in out and "2 old access masters deleted" in out
    stored = site.stored()
    images = {key for key in stored if not key.endswith(".json")}
    assert images == {key for _, _, key in site.items().values()} and all(k.endswith(".jp2") for k in images)
    assert image_references(stored) == images
    assert site.superseded() == set()
    deleted = Path(report_of(out)["csv_path"]).read_text()
    assert "museum/a/a~2Fp1.png.tif,old access masters deleted" in deleted


def test_reencode_keep_old_leaves_the_old_keys_listed(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    out = ok(site.migrate("reencode", "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless",
                          "--keep-old"))
    assert "4 old access masters kept" in out
    assert Path(report_of(out)["csv_path"]).read_text().count("old access masters kept") == 4
    stored = site.stored()
    assert sum(key.endswith(".tif") for key in stored) == 4 and sum(key.endswith(".jp2") for key in stored) == 4
    assert all(key.endswith(".jp2") for key in image_references(stored))
    assert "set `recipe: jp2-openjpeg-lossless`" in out


def test_a_harvest_that_re_derives_under_another_key_deletes_the_old_one_once_the_manifest_is_republished(site):
    ok(site.run("gcis-etl", "harvest"))
    site.configure({"kind": "local", "root": "store"}, recipe="jp2-openjpeg-lossless")
    edited = site.root / "masters" / "b" / "x.jpg"
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", edited)  # edited in the source: re-derived by the next harvest
    os.utime(edited, (edited.stat().st_mtime + 5,) * 2)
    out = ok(site.run("gcis-etl", "harvest"))
    assert "1 deposited" in out
    stored = site.stored()
    assert "museum/b/b~2Fx.jpg.jp2" in stored and "museum/b/b~2Fx.jpg.tif" not in stored
    assert "museum/a/a~2Fp1.png.tif" in stored  # not re-derived: still the item's access master
    assert image_references(stored) == {key for _, _, key in site.items().values()}
    assert site.superseded() == set()

    ok(site.run("gcis-etl", "harvest", "--force", "--object", "a"))
    images = {key for key in site.stored() if not key.endswith(".json")}
    assert images == {key for _, _, key in site.items().values()}
    assert images == {"museum/a/a~2Fp1.png.jp2", "museum/a/a~2Fp2.jpg.jp2", "museum/b/b~2Fx.jpg.jp2",
                      "museum/c/c~2Fy.tif.tif"}


def test_a_reencode_trial_counts_each_key_once_and_a_reversed_reencode_leaves_no_orphan(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    to_jp2 = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless")
    ok(site.migrate("reencode", *to_jp2, "--limit", "1"))
    assert site.superseded() == {"museum/a/a~2Fp1.png.tif"}  # a is cut short: its manifest still shows it

    out = ok(site.migrate("reencode", *to_jp2, "--dry-run"))
    assert "4 old access masters to delete, 3 would process, 1 would skip" in out

    out = ok(site.migrate("reencode", "--pipeline", PIPELINE, "--from-recipe", "jp2-openjpeg-lossless",
                          "--to-recipe", "ptiff-jpeg-q90"))
    assert "1 old access master deleted, 1 deposited, 1 skipped" in out
    images = {key for key in site.stored() if not key.endswith(".json")}
    assert images == {key for _, _, key in site.items().values()} and all(k.endswith(".tif") for k in images)
    assert site.superseded() == set()


def test_reencode_takes_the_notes_of_an_older_version_into_the_ledger_once(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    to_jp2 = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless")
    ok(site.migrate("reencode", *to_jp2, "--limit", "1"))
    with site.ledger() as ledger:  # as an older version left it: the old keys in its file, not in the ledger
        ledger.forget_superseded(PIPELINE, "museum/a/a~2Fp1.png.tif")
    notes = site.root / "state" / "migrations" / f"reencode-{PIPELINE}.json"
    notes.parent.mkdir(parents=True)
    noted = [("a/p1.png", "museum/a/a~2Fp1.png.tif"), ("a/p2.jpg", "museum/a/a~2Fp2.jpg.tif")]
    notes.write_text(json.dumps([{"object_id": "a", "item_id": item, "sequence": n, "key": key}
                                 for n, (item, key) in enumerate(noted)]))
    assert "4 old access masters to delete" in ok(site.migrate("reencode", *to_jp2, "--dry-run"))
    assert notes.is_file()

    out = ok(site.migrate("reencode", *to_jp2))
    assert "4 old access masters deleted" in out and not notes.exists()
    images = {key for key in site.stored() if not key.endswith(".json")}
    assert images == {key for _, _, key in site.items().values()} and all(k.endswith(".jp2") for k in images)


# ------------------------------------------------------------------------------------------- move_store


def s3_store(minio, bucket: str) -> dict:
    return {"kind": "s3", "bucket": bucket, "prefix": "iiif", "endpoint_url": minio.endpoint, "region": "us-east-1",
            "addressing_style": "path"}


def bucket_objects(minio, bucket: str) -> dict[str, bytes]:
    client = minio.client()
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"].removeprefix("iiif/"): client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            for o in listed}


def test_a_relative_local_root_is_read_as_config_yaml_reads_it(tmp_path, monkeypatch):
    """In a store file: relative to the file's folder (as config.yaml's pipelines); inline: to the working
    directory; from the environment: the same."""
    (tmp_path / "sites").mkdir()
    given = tmp_path / "sites" / "new-store.yaml"
    given.write_text("store:\n  kind: local\n  root: ${NEW_ROOT}\n")
    monkeypatch.setenv("NEW_ROOT", "other")
    monkeypatch.chdir(tmp_path)
    assert store_settings(str(given), "--to-store").root == tmp_path / "sites" / "other"
    assert store_settings("{kind: local, root: other}", "--to-store").root == tmp_path / "other"
    assert store_settings("{kind: local, root: /abs/other}", "--to-store").root == Path("/abs/other")


def test_move_store_copies_verified_resumes_and_deletes_the_source_only_after_the_switch(site, minio, s3_bucket,
                                                                                       aws_env):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    local = site.stored()
    target = site.root / "new-store.yaml"
    target.write_text(yaml.safe_dump(s3_store(minio, s3_bucket)))

    assert "8 would copy" in ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", str(target),
                                             "--dry-run"))
    assert bucket_objects(minio, s3_bucket) == {}

    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", str(target), "--limit", "3"))
    assert out.startswith("move_store: stopped: 3 copied") and "stopped at the limit of 3 keys" in out
    assert "next:" not in out  # a trial is no reason to switch the pipeline yet
    assert len(bucket_objects(minio, s3_bucket)) == 3
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", str(target),
                          "--limit", "8"))  # every key: a limit nothing is left beyond stops nothing
    assert out.startswith("move_store: completed: 3 present, 5 copied")
    assert f"next: point pipelines.{PIPELINE}.store" in out and "--delete-source" in out
    assert bucket_objects(minio, s3_bucket) == local
    with site.ledger() as ledger:
        for record in ledger.items(PIPELINE):
            assert hashlib.sha256(local[record.output_key]).hexdigest() == record.sha256

    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", str(target), "--delete-source")
    assert proc.returncode == 2 and "store pipeline 'museum' uses" in proc.stderr
    assert site.stored() == local

    site.configure(s3_store(minio, s3_bucket))  # the switch: the ledger's keys stay valid in the new store
    assert "0 deposited, 4 skipped" in ok(site.run("gcis-etl", "harvest"))
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert "8 present, 8 deleted from the source" in out
    assert site.stored() == {} and bucket_objects(minio, s3_bucket) == local


def test_move_store_stops_starting_keys_when_max_minutes_are_spent_and_a_rerun_goes_on(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    target = "{kind: local, root: other}"
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target, "--max-minutes", "0.000001"))
    assert out.startswith("move_store: stopped: nothing done"), out
    assert report_of(out)["notes"] == ["stopped: --max-minutes 1e-06 spent: run again to go on"]
    assert [p for p in (site.root / "other").rglob("*") if p.is_file()] == []
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target, "--max-minutes", "60"))
    assert out.startswith("move_store: completed: 8 copied"), out


def test_move_store_refuses_an_object_whose_bytes_are_not_what_was_recorded(site, minio, s3_bucket, aws_env):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    damaged = site.store / "museum" / "b" / "b~2Fx.jpg.tif"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    with open(damaged, "r+b") as f:  # in place: same file, same size, the sidecar still vouches for it
        f.write(data)
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", json.dumps(s3_store(minio, s3_bucket)))
    assert proc.returncode == 1
    assert "failed: museum/b/b~2Fx.jpg.tif:" in proc.stdout and "not the recorded" in proc.stdout
    moved = bucket_objects(minio, s3_bucket)
    assert "museum/b/b~2Fx.jpg.tif" not in moved and len(moved) == 7


def test_delete_source_refuses_the_live_s3_store_however_it_is_written(site, minio, s3_bucket, aws_env):
    live = s3_store(minio, s3_bucket)
    site.configure(live)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    stored = bucket_objects(minio, s3_bucket)
    assert len(stored) == 8
    # the same server, bucket and prefix, without the region and addressing style config.yaml gives
    written_otherwise = {"kind": "s3", "bucket": s3_bucket, "prefix": "iiif/", "endpoint_url": minio.endpoint + "/",
                         "retry": {"max_attempts": 3}}
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", json.dumps(written_otherwise),
                        "--delete-source")
    assert proc.returncode == 2 and "the source and the target are the same store" in proc.stderr
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", json.dumps(written_otherwise),
                        "--to-store", "{kind: local, root: other}", "--delete-source")
    assert proc.returncode == 2 and "would delete from the store pipeline 'museum' uses" in proc.stderr
    assert not (site.root / "other").exists()

    # another host name for the same server: only an object written to the live store shows it
    aliased = {**live, "endpoint_url": minio.endpoint.replace("127.0.0.1", "localhost")}
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", json.dumps(aliased),
                        "--delete-source")
    assert proc.returncode == 2, proc.stdout
    assert "an object written to the source shows in the target" in proc.stderr
    assert "nothing was deleted" in proc.stderr
    assert bucket_objects(minio, s3_bucket) == stored  # every key still there, and no check object left behind
    with site.ledger() as ledger:
        assert ledger.counts(PIPELINE)["deposited"] == 4


def test_delete_source_refuses_the_live_local_store_through_a_symlink(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    stored = site.stored()
    (site.root / "link").symlink_to("store")
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: link}",
                        "--delete-source")
    assert proc.returncode == 2 and "the source and the target are the same store" in proc.stderr
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: link}",
                        "--to-store", "{kind: local, root: other}", "--delete-source")
    assert proc.returncode == 2 and "would delete from the store pipeline 'museum' uses" in proc.stderr
    assert site.stored() == stored and not (site.root / "other").exists()


def test_delete_source_after_the_switch_keeps_what_harvests_deposited_in_the_new_store(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    other = site.root / "other"
    (other / "museum" / "a").mkdir(parents=True)
    (other / "museum" / "a" / "manifest-v3.json").write_text("{}")  # before the switch the source is current
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}"))
    assert report_of(out)["counts"] == {"copied": 7, "replaced": 1}
    assert site.stored(other) == site.stored()

    site.configure({"kind": "local", "root": "other"})
    shutil.copy(CORPUS / "png/exif.png", site.root / "masters" / "a" / "p1.png")  # re-derived in the new store
    (site.root / "masters" / "d").mkdir()
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", site.root / "masters" / "d" / "new.jpg")  # and a new object
    assert "2 deposited" in ok(site.run("gcis-etl", "harvest"))
    current = site.stored(other)
    assert current["museum/a/a~2Fp1.png.tif"] != site.stored()["museum/a/a~2Fp1.png.tif"]

    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert report_of(out)["counts"] == {"present": 7, "newer in the target": 3, "deleted from the source": 8}
    assert "3 keys newer in the target" in out
    assert site.stored(other) == current and site.stored() == {}
    rows = Path(report_of(out)["csv_path"]).read_text().splitlines()
    assert sorted(row.split(",")[0] for row in rows if ",newer in the target," in row) == [
        "collections/museum-v3.json", "museum/a/a~2Fp1.png.tif", "museum/a/manifest-v3.json"]
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert report_of(out)["counts"] == {"present": 10}


def test_delete_source_reads_the_target_back_and_keeps_the_source_of_a_damaged_copy(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}"))
    site.configure({"kind": "local", "root": "other"})
    key = "museum/b/b~2Fx.jpg.tif"
    good = site.stored()[key]
    with open(site.root / "other" / key, "r+b") as f:  # in place: same file, same size, the sidecar vouches for it
        f.seek(len(good) // 2)
        f.write(b"XXXXXXXX")

    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                        "--delete-source")
    assert proc.returncode == 1, proc.stdout
    assert f"failed: {key}:" in proc.stdout and "read back with SHA-256" in proc.stdout
    assert report_of(proc.stdout)["counts"] == {"present": 7, "failed": 1, "deleted from the source": 7}
    assert site.stored() == {key: good}


def test_move_store_copies_the_superseded_keys_a_manifest_still_shows_and_deletes_them_from_the_source(site):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    blocked = site.store / "museum" / "a" / "a~2Fp2.jpg.jp2"
    blocked.mkdir()  # the deposit of one item of object a fails: a's manifest still shows its .tif keys
    to_jp2 = ("--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90", "--to-recipe", "jp2-openjpeg-lossless")
    ok(site.migrate("reencode", *to_jp2), code=1)
    blocked.rmdir()
    assert site.superseded() == {"museum/a/a~2Fp1.png.tif"}

    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}"))
    assert "9 copied" in out
    other = site.root / "other"
    moved = site.stored(other)
    assert moved == site.stored() and image_references(moved) <= moved.keys()  # no 404 after the switch

    site.configure({"kind": "local", "root": "other"})
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert "9 deleted from the source" in out and site.stored() == {}

    out = ok(site.migrate("reencode", *to_jp2))
    assert "2 old access masters deleted" in out
    images = {key for key in site.stored(other) if not key.endswith(".json")}
    assert images == {key for _, _, key in site.items().values()} and all(k.endswith(".jp2") for k in images)


def test_move_store_removes_what_a_killed_run_left(site, minio, s3_bucket, aws_env):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    client = minio.client()
    for key in ("iiif/museum/a/a~2Fp1.png.tif", "iiif/library/z/z.tif"):  # ours, and another pipeline's
        upload = client.create_multipart_upload(Bucket=s3_bucket, Key=key)
        client.upload_part(Bucket=s3_bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"part")
    leftover = site.root / "state" / "scratch" / f"move_store-{PIPELINE}" / "tmpkilled" / "object"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a copy")

    target = json.dumps(s3_store(minio, s3_bucket))
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target))
    assert "aborted 1 incomplete uploads to the target left by a killed run: museum/a/a~2Fp1.png.tif" in out
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])] == [
        "iiif/library/z/z.tif"]
    assert not leftover.parent.exists()
    assert bucket_objects(minio, s3_bucket) == site.stored()


def test_dry_runs_do_not_create_the_ledger(site):
    assert "4 would process" in ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--dry-run"))
    assert "nothing to do" in ok(site.migrate("move_store", "--pipeline", PIPELINE,
                                              "--to-store", "{kind: local, root: other}", "--dry-run"))
    ok(site.migrate("reencode", "--pipeline", PIPELINE, "--from-recipe", "ptiff-jpeg-q90",
                    "--to-recipe", "ptiff-jpeg-q90-444", "--dry-run"))
    assert list(site.root.rglob("ledger.sqlite*")) == [] and not site.store.exists()


def test_move_store_to_a_missing_bucket_stops_before_any_key(site, minio, aws_env):
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    target = json.dumps(s3_store(minio, "no-such-bucket"))
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NoSuchBucket" in proc.stdout and "gcis-etl never creates a bucket" in proc.stdout, proc.stdout
    assert report_of(proc.stdout)["counts"] == {}
    assert "no-such-bucket" not in [b["Name"] for b in minio.client().list_buckets()["Buckets"]]


def start_move(site: Site, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "gcis-migrate"), "move_store", "--pipeline", PIPELINE, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=site.root,
                            env={**os.environ, "GCIS_CONFIG": str(site.config)})


def first_key(site: Site) -> str:
    """The key a move starts with: the first item's access master."""
    with site.ledger() as ledger:
        return next(ledger.iter_items(PIPELINE, "output_key IS NOT NULL")).output_key


@dataclass
class HeldRead:
    """The first key of the local store, whose read by a move waits for the test: a FIFO in its place. The real
    file waits aside (with its inode, which its sidecar names) and is put back afterwards."""

    path: Path
    aside: Path

    @classmethod
    def first_key(cls, site: Site) -> HeldRead:
        held = cls(site.store / first_key(site), site.root / "held-aside")
        os.rename(held.path, held.aside)
        os.mkfifo(held.path)
        return held

    @contextmanager
    def reading(self, run: subprocess.Popen) -> Iterator[None]:
        """Once the move has opened the key (a key started: the ones after it wait in the pool's queue); on leaving,
        it reads the real bytes."""
        deadline = time.monotonic() + 60
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            assert run.poll() is None and time.monotonic() < deadline, "the move never read the held key"
            time.sleep(0.05)
        try:
            yield
        finally:
            os.set_blocking(fd, True)
            with open(fd, "wb") as gate:
                gate.write(self.aside.read_bytes())

    def put_back(self) -> None:
        os.replace(self.aside, self.path)


def test_move_store_stops_on_a_target_that_goes_down_and_a_rerun_goes_on(site, minio, s3_bucket, aws_env):
    """MinIO, the target, goes down while the first key is read (after the stores' checks): the move stops on that
    error (exit 1, the cause in the summary and the JSON) and starts no other key, rather than spend each key's
    retries to fail it; with MinIO back, a re-run copies every key."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    local = site.stored()
    held = HeldRead.first_key(site)
    target = json.dumps({**s3_store(minio, s3_bucket), "retry": {"max_attempts": 2}})
    run = start_move(site, "--to-store", target, "--concurrency", "1")
    try:
        with held.reading(run):
            minio.stop()
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
        minio.start()
        held.put_back()
    assert run.returncode == 1, out + err
    assert out.startswith("move_store: stopped on an error: nothing done"), out
    report = report_of(out)
    assert report["status"] == "stopped on an error" and report["counts"] == {}
    assert report["notes"][0].startswith(f"StoreUnavailable: s3://{s3_bucket}/iiif/museum/a/"), report["notes"]
    assert "failed after 2 attempts" in report["notes"][0]
    assert bucket_objects(minio, s3_bucket) == {}

    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target))
    assert out.startswith("move_store: completed: 8 copied"), out
    assert bucket_objects(minio, s3_bucket) == local


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_move_store_stops_on_a_full_target_before_any_manifest_and_a_rerun_goes_on(site):
    """A local target on a tmpfs with room for the first access master only: the move stops at the second (exit 1,
    StoreFull) and copies nothing after it, so no manifest arrives without its images; once there is room, a re-run
    copies the rest."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    full = site.root / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(full)], check=True)
    try:
        filler = full / "filler"
        filler.write_bytes(bytes(shutil.disk_usage(full).free - 28 * 1024))  # 16K + a sidecar, not 20K more
        out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", json.dumps(
            {"kind": "local", "root": str(full)}), "--concurrency", "1"), code=1)
        assert out.startswith("move_store: stopped on an error: 1 copied"), out
        assert "StoreFull: " in out and "No space left on device" in out
        assert report_of(out)["status"] == "stopped on an error"
        assert [key for key in site.stored(full) if key != "filler"] == [first_key(site)]

        filler.unlink()
        out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", json.dumps(
            {"kind": "local", "root": str(full)})))
        assert out.startswith("move_store: completed: 1 present, 7 copied"), out
        assert site.stored(full) == site.stored()
    finally:
        subprocess.run(["umount", str(full)], check=True)


@pytest.mark.parametrize("stop", ["Ctrl-C", "--max-minutes"])
def test_move_store_starts_no_queued_key_after_a_stop(site, stop):
    """The pool holds keys queued behind the one under way: after Ctrl-C, or once --max-minutes is spent, they are
    not started (nor counted); the key under way is finished."""
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    held = HeldRead.first_key(site)
    budget = ("--max-minutes", "0.05") if stop == "--max-minutes" else ()
    run = start_move(site, "--to-store", "{kind: local, root: other}", "--concurrency", "1", *budget)
    try:
        with held.reading(run):
            if stop == "Ctrl-C":
                run.send_signal(signal.SIGINT)
            else:
                time.sleep(0.05 * 60 + 0.5)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
        held.put_back()
    assert run.returncode == (130 if stop == "Ctrl-C" else 0), out + err
    assert out.startswith("move_store: stopped: 1 copied\n"), out
    assert report_of(out)["counts"] == {"copied": 1}
    assert list(site.stored(site.root / "other")) == [first_key(site)]


# ------------------------------------------------------------------------------- a migration's own report


def add_corrupt_objects(site: Site, n: int) -> list[str]:
    """`n` objects whose one master no decoder reads: each is rejected."""
    names = [f"bad{i:02}" for i in range(n)]
    for name in names:
        (site.root / "masters" / name).mkdir()
        (site.root / "masters" / name / "x.jpg").write_bytes(b"not a JPEG at all")
    return names


def test_a_migration_lists_every_problem_of_all_its_harvest_runs_in_its_csv_and_says_how_many_more(site):
    bad = add_corrupt_objects(site, 13)
    (site.root / "ids.txt").write_text("\n".join(["a", *bad]) + "\n")
    proc = site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.txt", "--batch-size", "5")
    out = ok(proc, 1)
    shown = [line for line in out.splitlines() if line.startswith("  rejected: ")]
    assert len(shown) == MigrationReport.SHOWN
    assert "  ... and 3 more (see " in out
    report = report_of(out)
    assert report["harvest_runs"] == [1, 2, 3]  # the problems of later runs count as much as the first's
    assert report["counts"]["rejected"] == 13 and report["problems_total"] == 13
    assert len(report["problems"]) == MigrationReport.SHOWN
    assert f"  ... and 3 more (see {report['csv_path']})" in out.splitlines()
    header, *rows = Path(report["csv_path"]).read_text().splitlines()
    assert header == "subject,outcome,reason,at"
    assert sorted(row.split(",")[:2] for row in rows) == [[f"{name}/x.jpg", "rejected"] for name in bad]


def test_a_harvest_run_cut_short_by_limit_names_the_limit_given(site):
    (site.root / "ids.txt").write_text("b\na\n")
    out = ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.txt", "--batch-size", "1",
                          "--limit", "2"))  # run 1 takes b's one item, leaving run 2 a limit of 1
    assert f"  note: {PIPELINE}: run 2: stopped at the migration's limit of 2 items; run again to continue" in out
    (site.root / "ids.txt").write_text("c\n")
    out = ok(site.migrate("initial_load", "--pipeline", PIPELINE, "--ids", "ids.txt", "--limit", "1"))
    assert f"  note: {PIPELINE}: run 3: stopped at the migration's limit of 1 item; run again to continue" in out


@pytest.fixture
def unwritable_reports(site) -> Path:
    """<state_dir>/reports, which nobody can write into: for root (CI), a read-only tmpfs over it."""
    folder = site.root / "state" / "reports"
    folder.mkdir(parents=True)
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


def test_a_reports_folder_that_cannot_be_written_is_a_warning_and_the_summary_still_comes(site, unwritable_reports):
    add_corrupt_objects(site, 1)
    proc = site.migrate("initial_load", "--pipeline", PIPELINE)
    out = ok(proc, 1)  # as the rejected item earns it, not a crash
    assert out.startswith("initial_load: completed: 4 deposited, 1 rejected"), out
    assert "  rejected: bad00/x.jpg: " in out and "report: " not in out
    assert "Traceback" not in proc.stderr
    warning = f"initial_load: the migration's report was not written under {unwritable_reports}: "
    assert proc.stderr.count(warning) == 1 and proc.stderr.count("the migration's report") == 1, proc.stderr

    (site.store / "museum" / "a" / "a~2Fp1.png.tif").unlink()  # a problem for move_store, met in a worker thread
    proc = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: other}")
    out = ok(proc, 1)
    assert out.startswith("move_store: completed: "), out
    assert "museum/a/a~2Fp1.png.tif" in out and "report: " not in out
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("move_store: the migration's report was not written under ") == 1, proc.stderr
