"""What a checkpoint covers: the listing of one set of source settings, taken by a run that listed something.

A first run over an empty listing (a set nothing was assigned to yet, a typo) leaves no checkpoint, so the backlog
is listed once it is there; a checkpoint is recorded with the digest of the settings deciding what the source
lists (Pipeline.listing_digest), and a run under others lists everything once and says so, as `status` does
before it; transport settings and credentials do not count, and a checkpoint an older version took (no digest)
is taken as made under the settings of now. Also: a run whose listing ended is not made a stopped one by the
time limit passing while its last item waited for a slot, and an object touched only (its modified time) has
no manifest counted as published.

Rosetta (OAI) through its emulator and a filesystem source, into a local store.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
import time
import typing
from datetime import datetime

import numpy as np
import pytest
import tifffile
import yaml
from pydantic import BaseModel

from gcis_etl.config import load_config
from gcis_etl.harvesting import LISTING_CHANGED, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.locks import pipeline_lock
from gcis_etl.reports import pipeline_status
from tests.emulators import FAST_RETRY
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.emulators.server import EmulatorServer
from tests.harvests import GCIS, PATIENT_RETRY, ROSETTA_PASSWORD, Gate, ie, rosetta_source, serving, wait_for
from tests.test_harvest_time_limit import Handed

PNG, JPG = "png/png-rgb-64x56x8.png", "gray8/hopper_gray.jpg"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """write(source, **pipeline) -> the config of pipeline `p` reading `source` into a local store, one item in
    flight at a time."""
    monkeypatch.setenv("ROSETTA_PASSWORD", ROSETTA_PASSWORD)

    def write(source: dict, **pipeline):
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({
            "state_dir": str(tmp_path / "state"), "defaults": {"concurrency": 1, "transfer_slots": 0},
            "pipelines": {"p": {"source": source, "store": {"kind": "local", "root": str(tmp_path / "store")},
                                **pipeline}}}))
        return load_config(tmp_path / "config.yaml")
    return write


def catalogue(sets: dict[int, set[str]]) -> RosettaCatalogue:
    """One single-image IE a number, modified long ago, in the OAI sets given."""
    entities = [ie(number, f"2024-01-0{n + 1} 10:00:00", (PNG, JPG)[n % 2]) for n, number in enumerate(sets)]
    for entity, named in zip(entities, sets.values()):
        entity.sets = set(named)
    return RosettaCatalogue(entities)


def deposited(cfg, run_id: int) -> list[str]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return sorted(i.object_id for i in ledger.run_items(run_id, "deposited"))


def checkpoint(cfg) -> tuple[object, str | None]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return ledger.checkpoint("p"), ledger.checkpoint_listing("p")


def status(cfg):
    with Ledger.open(cfg, read_only=True) as ledger:
        return pipeline_status(ledger, "p", pipeline_lock(cfg.state_dir, "p"),
                               listing=cfg.pipeline("p").listing_digest)


def test_a_first_run_over_an_empty_listing_leaves_no_checkpoint_so_the_backlog_is_listed_once_it_is_there(site):
    source = catalogue({7000: {"later"}, 7010: {"later"}})
    with EmulatorServer(RosettaEmulator(source)) as server:
        cfg = site(rosetta_source(server.url))
        first = harvest(cfg, "p")  # nothing is in the set yet
        assert first.status == "completed" and sum(first.counts.values()) == 0
        assert first.checkpoint_after is None and checkpoint(cfg) == (None, None)

        for entity in source.entities.values():  # assigned to the set: their modified dates do not change
            entity.sets.add("gcis")
        second = harvest(cfg, "p")
        assert deposited(cfg, second.run_id) == ["IE7000", "IE7010"] and second.note is None
        assert checkpoint(cfg) == (datetime.fromisoformat(second.checkpoint_after), cfg.pipeline("p").listing_digest)


def test_another_set_is_listed_whole_once_and_the_run_and_status_say_why(site):
    source = catalogue({7100: {"gcis"}, 7110: {"other"}, 7120: {"other"}})
    with EmulatorServer(RosettaEmulator(source)) as server:
        cfg = site(rosetta_source(server.url))
        first = harvest(cfg, "p")
        assert deposited(cfg, first.run_id) == ["IE7100"]
        assert status(cfg).listing_changed is False

        cfg = site(rosetta_source(server.url, oai={"set": "other"}))  # its IEs are older than the checkpoint
        before = status(cfg)
        assert before.listing_changed and before.to_dict()["listing_changed"] is True
        assert "the source's listing settings changed since: the next run lists everything" in before.summary()
        environment = {k: v for k, v in os.environ.items() if k != "ROSETTA_PASSWORD"}  # status needs no secret
        shown = subprocess.run([GCIS, "--config", str(cfg.source_file), "status"], capture_output=True, text=True,
                               env=environment, timeout=60)
        assert shown.returncode == 0 and "the next run lists everything" in shown.stdout, shown.stdout + shown.stderr

        second = harvest(cfg, "p")
        assert second.since is None and second.status == "completed"
        assert deposited(cfg, second.run_id) == ["IE7110", "IE7120"] and second.note == LISTING_CHANGED
        assert checkpoint(cfg)[1] == cfg.pipeline("p").listing_digest and status(cfg).listing_changed is False
        assert LISTING_CHANGED in status(cfg).summary()  # the last run's note

        third = harvest(cfg, "p")  # incremental again
        assert third.since is not None and third.note is None and sum(third.counts.values()) == 0


def test_transport_settings_and_credentials_keep_the_checkpoint(site, monkeypatch):
    source = catalogue({7200: {"gcis"}})
    with EmulatorServer(RosettaEmulator(source)) as server:
        cfg = site(rosetta_source(server.url))
        digest = cfg.pipeline("p").listing_digest
        harvest(cfg, "p")

        monkeypatch.setenv("ROSETTA_PASSWORD", "rotated-Secret-2")
        assert site(rosetta_source(server.url)).pipeline("p").listing_digest == digest
        monkeypatch.setenv("ROSETTA_PASSWORD", ROSETTA_PASSWORD)
        cfg = site(rosetta_source(server.url, retry={**FAST_RETRY, "read_timeout_seconds": 30}, verify_tls=False,
                                  user_agent="gcis-etl (night run)"))
        assert cfg.pipeline("p").listing_digest == digest
        second = harvest(cfg, "p")
        assert second.since is not None and second.note is None and checkpoint(cfg)[1] == digest

        for other in ({"base_url": server.url.replace("127.0.0.1", "localhost")}, {"oai": {"set": "gcsi"}},
                      {"discovery": "sru", "sru": {"modified_index": "IE.modificationDate"}}):
            assert site(rosetta_source(server.url, **other)).pipeline("p").listing_digest != digest, other


def test_a_checkpoint_an_older_version_took_is_taken_as_made_under_the_settings_of_now(site):
    source = catalogue({7300: {"gcis"}})
    with EmulatorServer(RosettaEmulator(source)) as server:
        cfg = site(rosetta_source(server.url))
        harvest(cfg, "p")
        db = sqlite3.connect(cfg.ledger_path)  # as a version before listing digests left it
        db.execute("ALTER TABLE checkpoints DROP COLUMN listing")
        db.commit()
        db.close()

        assert checkpoint(cfg)[1] is None and status(cfg).listing_changed is False  # read as it is
        second = harvest(cfg, "p")
        assert second.since is not None and second.note is None
        assert checkpoint(cfg)[1] == cfg.pipeline("p").listing_digest


def test_a_run_whose_time_limit_passed_while_its_last_item_waited_for_a_slot_leaves_that_item_to_the_next(site):
    """One slot: the last IE's item waits in submit for it while the first one's download is held past the
    time limit: it is not sent (a run takes no item after its limit), and the next run takes it."""
    gate = Gate(RosettaEmulator(catalogue({7400: {"gcis"}, 7410: {"gcis"}})), "DeliveryManagerServlet")
    with serving(gate) as server:
        cfg = site(rosetta_source(server.url, retry=PATIENT_RETRY), max_run_minutes=0.05)  # 3 s
        progress, reports = Handed(gate), []
        began = time.monotonic()
        run = threading.Thread(target=lambda: reports.append(harvest(cfg, "p", progress=progress)))
        run.start()
        wait_for(lambda: gate.held, "the first download is held")
        time.sleep(max(0.0, began + 3.3 - time.monotonic()))  # past the time limit
        gate.open()
        run.join(120)
        [report] = reports
        assert progress.tasks.get("IE7410") == (1, True)  # the last one waited in submit for its slot
        assert report.status == "stopped" and report.note.startswith("stopped at the run time limit"), report.note
        assert deposited(cfg, report.run_id) == ["IE7400"] and report.checkpoint_after is None
        again = harvest(cfg, "p")
        assert deposited(cfg, again.run_id) == ["IE7410"] and again.status == "completed"


def test_an_object_touched_only_has_no_manifest_counted_and_its_collection_is_not_rewritten(site, tmp_path):
    masters = tmp_path / "masters" / "print"
    masters.mkdir(parents=True)
    page = masters / "page.tif"
    tifffile.imwrite(page, np.full((8, 8, 3), 90, np.uint8), photometric="rgb")
    cfg = site({"kind": "filesystem", "root": str(tmp_path / "masters"), "grouping": {"mode": "folder"}},
               manifests={"manifest_base_url": "https://iiif.example.org/store",
                          "image_service_base_url": "https://iiif.example.org/iiif", "versions": ["3.0"]})
    first = harvest(cfg, "p")
    assert first.manifests == 1
    written = {path: path.stat().st_mtime_ns for path in (tmp_path / "store").rglob("*") if path.is_file()}
    assert {"manifest-v3.json", "p-v3.json"} <= {path.name for path in written}

    os.utime(page, (time.time() + 5,) * 2)  # touched: the same bytes
    second = harvest(cfg, "p")
    assert second.manifests == 0 and second.status == "completed"
    assert {path: path.stat().st_mtime_ns for path in written} == written  # the item's deposit found it there
    with Ledger.open(cfg, read_only=True) as ledger:
        assert ledger.object("p", "print").modified > ledger.run(first.run_id).finished  # what the next run sees

    tifffile.imwrite(page, np.full((8, 16, 3), 90, np.uint8), photometric="rgb")  # a change a manifest shows
    third = harvest(cfg, "p")
    assert third.manifests == 1


@pytest.mark.parametrize("kind", ["rosetta", "otmm", "s3", "filesystem"])
def test_every_transport_setting_a_connector_declares_is_one_of_its_settings(kind):
    """A misspelt name would leave that setting counted as a listing one: a change of it a full listing."""
    from connectors import connector
    found = connector(kind)
    for dotted in getattr(found.source, "transport_settings", ()):
        model = found.settings
        for part in dotted.split("."):
            assert model is not None and part in model.model_fields, f"{kind}: {dotted}"
            annotation = model.model_fields[part].annotation
            model = next((t for t in typing.get_args(annotation) or (annotation,)
                          if isinstance(t, type) and issubclass(t, BaseModel)), None)
