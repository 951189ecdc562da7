"""Listings that change while a harvest reads them, and objects revisited by id, at the harvest's level: an object
leaving an offset-paged listing between two pages makes the run hold its checkpoint so the one it passed over is
taken next run; a batch of objects asked for by id costs one listing of a grouped source, not one per object.

Local store, real HTTP emulators, masters from the corpus.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from connectors.filesystem import FilesystemSource
from gcis_etl.config import load_config
from gcis_etl.harvesting import OBJECT, HarvestOptions, harvest
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS
from tests.emulators.otmm import ARCHIVE, ROOT, OtmmEmulator
from tests.emulators.rosetta import SRU_DATE_INDEX, RosettaCatalogue, RosettaEmulator
from tests.emulators.server import EmulatorServer
from tests.harvests import OTMM_PASSWORD, ROSETTA_PASSWORD, ie, rosetta_source


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.setenv("OTMM_PASSWORD", OTMM_PASSWORD)
    monkeypatch.setenv("ROSETTA_PASSWORD", ROSETTA_PASSWORD)

    def write(source: dict):
        config = {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "source": source, "store": {"kind": "local", "root": str(tmp_path / "store")}}}}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        return load_config(tmp_path / "config.yaml")
    return write


def ledger_state(cfg) -> tuple[set[str], object]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return {i.object_id for i in ledger.items("p") if i.status == "deposited"}, ledger.checkpoint("p")


def test_an_asset_leaving_the_search_between_two_pages_holds_the_checkpoint_for_the_one_passed_over(site):
    """Sorted by name, paged by two: 2019_M_10 (first) leaves the folder once page 1 is read, everything after it
    moves back one place and 2019_M_1_recto slides onto page 1. total_hit_count went from 5 to 4: the run holds
    its checkpoint, and the next run lists the window again. The pages overlap by one asset (page 2 is asked for
    from after=1), so page 2, not starting with page 1's last asset, is taken whole: the recto is served at once."""
    with EmulatorServer(OtmmEmulator()) as server:
        catalogue = server.app.catalogue
        moved, recto = catalogue.by_name("2019_M_10.tif"), catalogue.by_name("2019_M_1_recto.tif")
        cfg = site({"kind": "otmm", "base_url": server.url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
                    "retry": FAST_RETRY,
                    "search": {"method": "GET", "page_size": 2, "folder_filter": ROOT, "sort": "asc_NAME"}})
        server.before(r"GET /otmmapi/v6/search/text\?.*after=1", lambda: setattr(moved, "folder", ARCHIVE))

        first = harvest(cfg, "p")
        assert first.status == "completed" and first.checkpoint_after is None
        assert first.note.startswith("the search's total_hit_count went from 5 to 4 between two pages (at after=2)")
        deposited, checkpoint = ledger_state(cfg)
        assert recto.asset_id in deposited and moved.asset_id in deposited and checkpoint is None

        second = harvest(cfg, "p")
        assert second.counts == {"deposited": 0, "skipped": 4, "rejected": 0, "failed": 0}  # settled stay settled
        assert second.note is None and second.checkpoint_after is not None
        deposited, checkpoint = ledger_state(cfg)
        assert recto.asset_id in deposited and checkpoint is not None


def test_an_ie_deleted_between_two_sru_pages_holds_the_checkpoint_for_the_one_passed_over(site):
    """SRU pages by startRecord over IEs in modification order; IE6000 is deleted once page 1 is read, IE6020
    moves back onto it and is never served. numberOfRecords went from 3 to 2: the next run takes IE6020."""
    catalogue = RosettaCatalogue([ie(6000, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png"),
                                  ie(6010, "2024-01-02 10:00:00", "gray8/hopper_gray.jpg"),
                                  ie(6020, "2024-01-03 10:00:00", "rgb8-tiff-lzw/hopper_lzw.tif")])
    with EmulatorServer(RosettaEmulator(catalogue)) as server:
        cfg = site(rosetta_source(server.url, discovery="sru", sru={"modified_index": SRU_DATE_INDEX,
                                                                     "page_size": 2}))
        server.before(r"GET /search/permanent/ie/sru\?.*startRecord=3",
                      lambda: setattr(catalogue.entities["IE6000"], "deleted", True))

        first = harvest(cfg, "p")
        assert first.checkpoint_after is None
        assert first.note.startswith("SRU numberOfRecords went from 3 to 2 between two pages (at startRecord=3)")
        assert ledger_state(cfg) == ({"IE6000", "IE6010"}, None)

        second = harvest(cfg, "p")
        assert second.counts == {"deposited": 1, "skipped": 1, "rejected": 0, "failed": 0}
        assert second.note is None
        deposited, checkpoint = ledger_state(cfg)
        assert deposited == {"IE6000", "IE6010", "IE6020"} and checkpoint is not None


def test_objects_asked_for_by_id_cost_one_listing_of_a_grouped_source(site, tmp_path, monkeypatch):
    """--object, retry and the revisit of failed objects ask the source for a batch; a filesystem source walks its
    tree once for it (it walked it once per object). An object it does not have fails alone, and the walk is not
    done again for the ones after it (it was, once per object gone)."""
    masters = tmp_path / "masters"
    for n, relative in enumerate(["png/png-rgb-64x56x8.png", "gray8/hopper_gray.jpg", "rgb8-tiff-lzw/hopper_lzw.tif",
                                  "jpeg-baseline/flowers.jpeg"]):
        (masters / f"obj-{n}").mkdir(parents=True)
        shutil.copy(CORPUS / relative, masters / f"obj-{n}" / Path(relative).name)
        os.utime(masters / f"obj-{n}" / Path(relative).name, (time.time() - 86400,) * 2)
    cfg = site({"kind": "filesystem", "root": str(masters), "grouping": {"mode": "folder"}})
    walks = []
    walk = FilesystemSource._files
    monkeypatch.setattr(FilesystemSource, "_files", lambda self: walks.append(1) or walk(self))

    report = harvest(cfg, "p", HarvestOptions(object_ids=("obj-0", "obj-1", "obj-2", "obj-3")))
    assert report.counts["deposited"] == 4 and len(walks) == 1

    walks.clear()
    report = harvest(cfg, "p", HarvestOptions(object_ids=("obj-3", "obj-9", "obj-1"), force=True))
    assert len(walks) == 1
    with Ledger.open(cfg, read_only=True) as ledger:
        outcomes = {(i.object_id, i.item_id): (i.outcome, i.reason) for i in ledger.run_items(report.run_id)}
    assert outcomes[("obj-9", OBJECT)] == ("failed", "p: no object 'obj-9'")
    assert {key[0] for key, (outcome, _) in outcomes.items() if outcome == "deposited"} == {"obj-3", "obj-1"}


def test_an_ie_leaving_the_set_between_two_oai_pages_holds_the_checkpoint_for_the_one_passed_over(site):
    """OAI-PMH pages by resumptionToken, an offset in many providers (as in the emulator): IE7000 leaves the set
    once page 1 is read, IE7020 moves back onto page 1 and is never served. completeListSize went from 3 to 2:
    the next run takes IE7020."""
    catalogue = RosettaCatalogue([ie(7000, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png"),
                                  ie(7010, "2024-01-02 10:00:00", "gray8/hopper_gray.jpg"),
                                  ie(7020, "2024-01-03 10:00:00", "rgb8-tiff-lzw/hopper_lzw.tif")])
    with EmulatorServer(RosettaEmulator(catalogue, oai_page_size=2)) as server:
        cfg = site(rosetta_source(server.url))
        server.before(r"GET /oaiprovider/request\?.*resumptionToken",
                      lambda: setattr(catalogue.entities["IE7000"], "sets", {"other"}))

        first = harvest(cfg, "p")
        assert first.checkpoint_after is None
        assert first.note.startswith("OAI-PMH completeListSize went from 3 to 2 between two pages")
        assert ledger_state(cfg) == ({"IE7000", "IE7010"}, None)

        second = harvest(cfg, "p")
        assert second.counts == {"deposited": 1, "skipped": 1, "rejected": 0, "failed": 0}
        assert second.note is None and ledger_state(cfg)[0] == {"IE7000", "IE7010", "IE7020"}
