"""An OTMM asset moved to another group (its object number changed) leaves its old group too: the old group is
revisited, its manifests go out again without the asset, its record there is forgotten and its access master
there retired, over the emulator's HTTP and a real harvest into MinIO. A group left with no asset stays as a
withdrawal does, and is not revisited again; sources whose item ids are not their own (a folder's) ask the
ledger nothing; a ledger made before has the index the lookup needs once opened."""
from __future__ import annotations

import sqlite3

import numpy as np
import tifffile
import yaml

from connectors import open_source
from connectors.base import items_unique
from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, Progress, harvest
from gcis_etl.ledger import SCHEMA, Ledger
from gcis_etl.reports import RunReport
from gcis_etl.work import ItemResult, Outcome
from tests.emulators.otmm import OtmmEmulator
from tests.harvests import OTMM_PASSWORD, ROSETTA_PASSWORD, otmm_source, rosetta_source, serving
from tests.test_otmm_group_leave import GROUP, SINGLE, catalogue

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

NUMBER = "GTRUST.FIELD.OBJECT NUMBER"


class Notes(Progress):
    def __init__(self):
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


def run(config, pipeline: str) -> tuple[RunReport, list[str]]:
    """One harvest in this process, with the notes it gave."""
    notes = Notes()
    return harvest(load_config(config), pipeline, HarvestOptions(), notes), notes.notes


def move(emulator, asset_id: str, number: str) -> None:
    """A cataloguer gives the asset another object number (its date_last_updated moves with it)."""
    with emulator.app.catalogue.lock:
        emulator.app.catalogue.assets[asset_id].fields[NUMBER] = number
    emulator.app.catalogue.touch(asset_id)


def touch(emulator, asset_id: str) -> None:
    emulator.app.catalogue.touch(asset_id)


def revisits(notes: list[str]) -> list[str]:
    return [note for note in notes if note.startswith("revisiting")]


def test_an_asset_moved_to_another_group_leaves_the_old_groups_manifest_and_its_old_master_is_retired(rig):
    source = catalogue()
    a, b, single = (source.by_name(n).asset_id for n in ("2020_X_1_a.tif", "2020_X_1_b.png", "2020_X_2.tif"))
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url))
        first, _ = run(rig.config, rig.pipeline)
        assert first.counts == {"deposited": 3, "skipped": 0, "rejected": 0, "failed": 0}
        old_key = rig.image_key(GROUP, b)
        assert old_key in rig.keys()

        move(emulator, b, SINGLE)  # sequence 2: after the single's own asset
        second, notes = run(rig.config, rig.pipeline)
        assert second.counts == {"deposited": 1, "skipped": 2, "rejected": 0, "failed": 0}  # b anew; a and single
        assert revisits(notes) == [f"revisiting {GROUP}: its item {b} is now listed in {SINGLE}"]
        rig.check_manifests(GROUP, [a])
        rig.check_manifests(SINGLE, [single, b])
        rig.check_collections(sorted([GROUP, SINGLE]))
        assert rig.statuses() == {(GROUP, a): "deposited", (SINGLE, single): "deposited", (SINGLE, b): "deposited"}
        assert old_key not in rig.keys() and rig.image_key(SINGLE, b) in rig.keys()  # keys name their object
        assert any(note.startswith(f"deleted {old_key}") for note in notes), notes
        assert rig.peek("SELECT key FROM superseded") == []

        touch(emulator, single)  # the new group is listed again: nothing of b is left under the old one
        third, notes = run(rig.config, rig.pipeline)
        assert revisits(notes) == []
        assert {o for o, in rig.peek(f"SELECT object_id FROM run_items WHERE run_id={third.run_id}")} == {SINGLE}


def test_a_group_whose_last_asset_moved_away_stays_as_a_withdrawal_and_is_not_revisited_again(rig):
    source = catalogue()
    a, b, single = (source.by_name(n).asset_id for n in ("2020_X_1_a.tif", "2020_X_1_b.png", "2020_X_2.tif"))
    with serving(OtmmEmulator(source)) as emulator:
        rig.write(otmm_source(emulator.url))
        run(rig.config, rig.pipeline)
        left = rig.image_key(SINGLE, single)

        move(emulator, single, GROUP)
        second, notes = run(rig.config, rig.pipeline)
        assert second.counts == {"deposited": 1, "skipped": 2, "rejected": 0, "failed": 0}
        assert revisits(notes) == [f"revisiting {SINGLE}: its item {single} is now listed in {GROUP}"]
        assert any(note.startswith(f"not revisiting {SINGLE}: ") for note in notes), notes
        rig.check_manifests(SINGLE, [single])  # the withdrawn object's manifests stay, with their image
        assert left in rig.keys()
        assert rig.peek("SELECT object_id, item_id, key FROM superseded") == [(SINGLE, single, left)]  # waits
        assert (SINGLE, single) not in rig.statuses()

        touch(emulator, a)
        _, notes = run(rig.config, rig.pipeline)
        assert revisits(notes) == []
        assert left in rig.keys()


def test_only_a_grouped_otmm_source_says_its_item_ids_are_its_own():
    """Rosetta file PIDs never move to another IE; a folder's item ids are the store's paths, which a sidecar can
    give another object; a custom source that does not say is taken as not."""
    otmm = {"base_url": "http://127.0.0.1:9", "username": "u", "password": OTMM_PASSWORD}
    assert items_unique(open_source("otmm", {**otmm, "group": {"field_id": NUMBER}}, name="g")) is True
    assert items_unique(open_source("otmm", otmm, name="o")) is False
    rosetta = {k: v for k, v in rosetta_source("http://127.0.0.1:9").items() if k != "kind"}
    assert items_unique(open_source("rosetta", {**rosetta, "password": ROSETTA_PASSWORD}, name="r")) is False
    assert items_unique(object()) is False


def test_a_folder_pipeline_does_not_look_for_its_items_under_other_objects(tmp_path):
    """The ledger holds the folder's file under another object too, as an id two objects share would be: the
    folder listed again, that object is not revisited and the record stays."""
    page = tmp_path / "masters" / "print" / "page.tif"
    page.parent.mkdir(parents=True)
    tifffile.imwrite(page, np.full((8, 8, 3), 90, np.uint8), photometric="rgb")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(tmp_path / "state"), "defaults": {"concurrency": 1, "transfer_slots": 0},
        "pipelines": {"p": {"source": {"kind": "filesystem", "root": str(tmp_path / "masters"),
                                       "grouping": {"mode": "folder"}},
                            "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
    assert run(config, "p")[0].counts["deposited"] == 1
    with Ledger.open(load_config(config)) as ledger:
        ledger.record(0, ItemResult("p", "elsewhere", "print/page.tif", 1, Outcome.DEPOSITED, "f", "r", "d", 1,
                                    key="p/elsewhere/page.tif"), None)
    tifffile.imwrite(page, np.full((8, 8, 3), 60, np.uint8), photometric="rgb")  # listed again
    report, notes = run(config, "p")
    assert report.counts["deposited"] == 1 and revisits(notes) == []
    with Ledger.open(load_config(config), read_only=True) as ledger:
        assert [(r.object_id, r.item_id) for r in ledger.items("p")] == [("elsewhere", "print/page.tif"),
                                                                         ("print", "print/page.tif")]
        assert ledger.superseded_count("p") == 0


def test_a_ledger_made_before_gets_the_index_of_items_by_id_when_opened(tmp_path):
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA + "DROP INDEX IF EXISTS items_by_item;")  # as an older version made it
    db.close()
    with Ledger(path) as ledger:
        plan = ledger.db.execute("EXPLAIN QUERY PLAN SELECT * FROM items WHERE pipeline=? AND item_id IN "
                                 "(SELECT value FROM json_each(?)) AND object_id!=?", ("p", '["a"]', "o")).fetchall()
    assert any("USING INDEX items_by_item" in row[-1] for row in plan), plan
