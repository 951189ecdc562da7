"""Warnings are recorded, not only logged: what an item's conversion warned of (the corpus policy's misnamed
extension) and what building an object's manifests warned of (a source URL that is no http(s) URL) are in the
ledger, by run and for the current deposit, and `gcis-etl report` shows them; a ledger made before they were
recorded is upgraded in place, and still reads for `report` when it is opened read-only."""
from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import yaml

from gcis_etl.ledger import MANIFEST, Ledger
from gcis_etl.reports import RunReport, Warned
from gcis_etl.work import ItemResult, Outcome
from tests.emulators.catalogue import CorpusFile
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import GCIS, ie, rosetta_source, serving

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

MISNAMED = "wrong-extension/jpg-incorrect-extension.png"  # a JPEG named .png: accepted, with a warning recorded
MISNAMED_WARNING = "extension .png does not match the content (JPEG); processed as JPEG"  # as README.md shows it
NOT_HTTP = "ftp://records.example.org/{id}"


def warnings_of(rig, table: str, where: str) -> list[tuple]:
    return rig.peek(f"SELECT object_id, warnings FROM {table} WHERE {where} ORDER BY object_id")


def test_a_misnamed_master_and_a_source_url_that_is_no_url_are_recorded_reported_and_cleared_by_a_clean_deposit(rig):
    source = RosettaCatalogue([ie(6000, "2024-01-10 09:00:00", "jpeg-baseline/flowers.jpeg", MISNAMED)])
    with serving(RosettaEmulator(source)) as emulator:
        rig.write(rosetta_source(emulator.url, source_url_template=NOT_HTTP))
        first = rig.harvest()
        assert first.counts == {"deposited": 2, "skipped": 0, "rejected": 0, "failed": 0}
        url_warning = ("source URL 'ftp://records.example.org/IE6000' is not an http(s) URL: the manifests go out "
                       "without the link to the source record")
        with rig.ledger() as ledger:
            items = {i.item_id: i.warnings for i in ledger.items(rig.pipeline)}
            run_items = {i.item_id: i.warnings for i in ledger.run_items(first.run_id)}
            assert ledger.object(rig.pipeline, "IE6000").warnings == (url_warning,)
        assert items["FL6002"] == run_items["FL6002"] == ()
        assert MISNAMED_WARNING in items["FL6003"] and items["FL6003"] == run_items["FL6003"]

        text = rig.cli("report", str(first.run_id))
        assert text.returncode == 0, text.stderr  # warnings do not make a run fail
        assert "1 item deposited with warnings, 1 manifest published with warnings" in text.stdout
        assert f"warning: IE6000/FL6003: {MISNAMED_WARNING}" in text.stdout
        assert f"warning: IE6000/{MANIFEST}: {url_warning}\n" in text.stdout
        assert "FL6002" not in text.stdout
        document = json.loads(rig.cli("report", str(first.run_id), "--json").stdout)
        assert {(w["object_id"], w["item_id"]): w["warnings"] for w in document["warned"]} == {
            ("IE6000", "FL6003"): list(items["FL6003"]), ("IE6000", MANIFEST): [url_warning]}

        # The master is replaced by one its name fits, and the source's record URL is mended.
        source.entities["IE6000"].reps[0].files[1].source = CorpusFile("png/png-rgb-64x56x8.png")
        source.touch("IE6000")
        rig.write(rosetta_source(emulator.url))
        second = rig.harvest()
        assert second.counts == {"deposited": 1, "skipped": 1, "rejected": 0, "failed": 0}

    assert warnings_of(rig, "items", "warnings IS NOT NULL") == []
    assert warnings_of(rig, "objects", "warnings IS NOT NULL") == []
    assert warnings_of(rig, "run_items", f"run_id={second.run_id} AND warnings IS NOT NULL") == []
    assert "with warnings" not in rig.cli("report", str(second.run_id)).stdout
    again = json.loads(rig.cli("report", str(first.run_id), "--json").stdout)
    assert again["warned"] == document["warned"]  # a past run's report stays as it was


# The ledger as the version before warnings were recorded made it (its CREATE statements, copied here).
OLD_SCHEMA = """
CREATE TABLE items (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL, sequence INTEGER NOT NULL,
    fingerprint TEXT NOT NULL, source_modified TEXT, master_sha256 TEXT,
    recipe TEXT NOT NULL, recipe_digest TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('deposited', 'skipped', 'rejected', 'failed')),
    output_key TEXT, sha256 TEXT, bytes INTEGER, width INTEGER, height INTEGER,
    reason TEXT, attempts INTEGER NOT NULL DEFAULT 0, transient INTEGER NOT NULL DEFAULT 0,
    first_seen TEXT NOT NULL, updated TEXT NOT NULL, last_run INTEGER,
    PRIMARY KEY (pipeline, object_id, item_id)
);
CREATE INDEX items_status ON items (pipeline, status);
CREATE TABLE objects (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, modified TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '[]', manifest_fingerprint TEXT, published TEXT,
    in_collection INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pipeline, object_id)
);
CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL,
    started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'stopped', 'failed', 'crashed', 'dry-run')),
    since TEXT, until TEXT, checkpoint_after TEXT, options TEXT NOT NULL DEFAULT '{}',
    deposited INTEGER NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    manifests INTEGER NOT NULL DEFAULT 0, note TEXT
);
CREATE TABLE run_items (
    run_id INTEGER NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL,
    outcome TEXT NOT NULL, reason TEXT, seconds REAL, at TEXT NOT NULL,
    PRIMARY KEY (run_id, object_id, item_id)
);
CREATE TABLE manifest_problems (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, reason TEXT NOT NULL, run_id INTEGER NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY (pipeline, object_id)
);
CREATE TABLE superseded (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL, key TEXT NOT NULL,
    run_id INTEGER, at TEXT NOT NULL,
    PRIMARY KEY (pipeline, key)
);
CREATE TABLE checkpoints (
    pipeline TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, run_id INTEGER, updated TEXT NOT NULL
);
INSERT INTO runs (run_id, pipeline, started, finished, status, deposited, rejected, manifests)
    VALUES (3, 'p', '2025-01-01T00:00:00+00:00', '2025-01-01T00:01:00+00:00', 'completed', 1, 1, 1);
INSERT INTO items (pipeline, object_id, item_id, sequence, fingerprint, recipe, recipe_digest, status, output_key,
                   sha256, bytes, width, height, first_seen, updated, last_run)
    VALUES ('p', 'a', 'a/1.jpg', 1, 'size:1', 'default', 'd1', 'deposited', 'p/a/a~2F1.tif', 'ab', 10, 64, 56, 't', 't',
            3);
INSERT INTO run_items (run_id, object_id, item_id, outcome, reason, seconds, at)
    VALUES (3, 'a', 'a/1.jpg', 'deposited', NULL, 1.5, '2025-01-01T00:00:30+00:00'),
           (3, 'b', 'b/1.tif', 'rejected', 'corrupt', 0.5, '2025-01-01T00:00:40+00:00');
INSERT INTO objects (pipeline, object_id, modified, label, manifest_fingerprint, published, in_collection)
    VALUES ('p', 'a', '2025-01-01T00:00:00+00:00', '[["A", null]]', 'f1', '2025-01-01T00:00:50+00:00', 1);
"""


def old_site(tmp_path: Path) -> Path:
    """A config.yaml whose state_dir holds a ledger in the old schema."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"p": {
        "source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "store"}}}}))
    (tmp_path / "state").mkdir()
    db = sqlite3.connect(tmp_path / "state" / "ledger.sqlite")
    db.executescript(OLD_SCHEMA)
    db.close()
    return tmp_path / "state" / "ledger.sqlite"


def columns(path: Path, table: str) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
    finally:
        db.close()


def test_a_ledger_made_before_warnings_were_recorded_reads_for_report_and_is_upgraded_keeping_its_rows(tmp_path):
    path = old_site(tmp_path)
    before = path.read_bytes()
    shown = subprocess.run([GCIS, "--config", str(tmp_path / "config.yaml"), "report", "3"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 1, shown.stderr  # its rejected item, as before
    assert "p: run 3 completed: 1 deposited, 0 skipped, 1 rejected, 0 failed" in shown.stdout
    assert "rejected: b/1.tif: corrupt" in shown.stdout and "with warnings" not in shown.stdout
    assert path.read_bytes() == before and "warnings" not in columns(path, "items")  # read-only: unchanged

    with Ledger(path) as ledger:
        [item] = ledger.items("p")
        assert (item.item_id, item.status, item.sha256, item.last_run, item.warnings) == \
            ("a/1.jpg", "deposited", "ab", 3, ())
        assert [(i.item_id, i.outcome, i.reason, i.warnings) for i in ledger.run_items(3)] == [
            ("a/1.jpg", "deposited", None, ()), ("b/1.tif", "rejected", "corrupt", ())]
        assert ledger.object("p", "a").label == '[["A", null]]' and ledger.run(3).deposited == 1
        run_id = ledger.begin_run("p", None, None, {})
        deposit = ItemResult("p", "a", "a/1.jpg", 1, Outcome.DEPOSITED, "size:2", "default", "d1", 1,
                             key="p/a/a~2F1.tif", sha256="cd", bytes=11, width=64, height=56,
                             warnings=(MISNAMED_WARNING,))
        # as a Celery worker hands it over: through the result backend's JSON
        ledger.record(run_id, ItemResult.from_dict(json.loads(json.dumps(deposit.to_dict()))), None)
        assert ledger.item("p", "a", "a/1.jpg").warnings == (MISNAMED_WARNING,)
        assert [i.warnings for i in ledger.run_items(run_id)] == [(MISNAMED_WARNING,)]
    for table in ("items", "run_items", "objects"):
        assert columns(path, table)[-1] == "warnings"
    with Ledger(path) as ledger:  # opened again: nothing more to change
        assert ledger.item("p", "a", "a/1.jpg").warnings == (MISNAMED_WARNING,)


def test_a_failure_or_rejection_after_a_deposit_keeps_the_warnings_of_the_deposit_the_item_still_has(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run_id = ledger.begin_run("p", None, None, {})
        common = ("p", "a", "1", 1)
        ledger.record(run_id, ItemResult(*common, Outcome.DEPOSITED, "v1", "default", "d1", 1, key="p/a/1.tif",
                                         sha256="ab", bytes=1, width=2, height=2, warnings=("old",)), None)
        ledger.record(run_id, ItemResult(*common, Outcome.REJECTED, "v2", "default", "d1", 1, reason="corrupt",
                                         warnings=("new",)), None)
        assert ledger.item("p", "a", "1").warnings == ("old",)
        assert [i.warnings for i in ledger.run_items(run_id)] == [("new",)]


def test_the_summary_shows_ten_warned_items_and_counts_the_rest():
    warned = [Warned("o", f"i{n}", ("w",)) for n in range(11)] + [Warned("o", MANIFEST, ("m1", "m2"))]
    report = RunReport("p", 1, "completed", None, None, None, None, None, {"deposited": 11}, 1, warned=warned,
                       json_path="/r/p-run1.json")
    lines = report.summary().splitlines()
    assert "  11 items deposited with warnings, 1 manifest published with warnings" in lines
    assert [line for line in lines if line.startswith("  warning: ")] == [f"  warning: o/i{n}: w" for n in range(10)]
    assert "  ... and 2 more (see /r/p-run1.json)" in lines
    assert report.exit_code == 0
