"""Runs cut short (--limit, the run time limit, a signal) over a window bigger than one run's reach: where the
source lists oldest first the checkpoint moves to where the listing stopped, so the next run starts there
instead of re-listing and re-skipping all that is settled, and nothing is ever passed over; where it does not,
the checkpoint stays and the run says why and what to do.

Filesystem source into a local store with tiny TIFFs made here; OTMM and Rosetta SRU through their emulators.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
import tifffile
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, harvest
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.otmm import MODIFIED_FIELD, OtmmEmulator
from tests.emulators.rosetta import SRU_DATE_INDEX, RosettaCatalogue, RosettaEmulator
from tests.emulators.server import EmulatorServer
from tests.harvests import OTMM_PASSWORD, ROSETTA_PASSWORD, ie, rosetta_source

STEP_NS = 100_000_000  # 0.1 s between two objects' listing times


@pytest.fixture
def site(tmp_path, monkeypatch):
    """write(source) -> the config of pipeline `p` from `source` into a local store."""
    monkeypatch.setenv("OTMM_PASSWORD", OTMM_PASSWORD)
    monkeypatch.setenv("ROSETTA_PASSWORD", ROSETTA_PASSWORD)

    def write(source: dict | None = None):
        source = source or {"kind": "filesystem", "root": str(tmp_path / "masters"), "grouping": {"mode": "folder"}}
        # No overlap: the masters' times are a fraction of a second apart, and a run re-lists only what it must.
        config = {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "source": source, "store": {"kind": "local", "root": str(tmp_path / "store")}, "concurrency": 1,
            "overlap_seconds": 0}}}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        return load_config(tmp_path / "config.yaml")
    return write


def masters(root: Path, steps: list[int]) -> tuple[list[str], list[int]]:
    """One object per step (obj00, obj01, ...), each one small grey TIFF, and the times (ns) the source lists
    them at, `step` STEP_NS apart: equal for equal steps. The folder source lists a file by the newest of its
    modification and status-change times, and the latter is when the file was made or touched: so each file's
    modification time is set a little ahead of now, which is then waited for, and is its listing time."""
    ids = []
    for n in range(len(steps)):
        folder = root / f"obj{n:02d}"
        folder.mkdir(parents=True)
        tifffile.imwrite(folder / "page.tif", np.full((16, 16), n * 10, np.uint8), photometric="minisblack")
        ids.append(folder.name)
    ahead = (time.time_ns() // 10**9 + 2) * 10**9  # a whole second, more than one second from now
    stamps = [ahead + step * STEP_NS for step in steps]
    for object_id, stamp in zip(ids, stamps):
        os.utime(root / object_id / "page.tif", ns=(stamp, stamp))
    time.sleep((max(stamps) - time.time_ns()) / 1e9 + 0.05)  # listed by a run that begins after them all
    return ids, stamps


def at(stamp: int) -> datetime:
    """A time in ns, exactly (as the checkpoint is compared)."""
    return datetime.fromtimestamp(stamp // 10**9, timezone.utc) + timedelta(microseconds=stamp % 10**9 // 1000)


def run_items(cfg, run_id: int) -> dict[str, str]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return {i.object_id: i.outcome for i in ledger.run_items(run_id)}


def state(cfg) -> tuple[set[str], datetime | None]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return {i.object_id for i in ledger.items("p") if i.status == "deposited"}, ledger.checkpoint("p")


def test_a_run_cut_by_its_limit_moves_the_checkpoint_to_the_first_object_it_did_not_reach(site, tmp_path):
    ids, stamps = masters(tmp_path / "masters", list(range(10)))
    cfg = site()

    first = harvest(cfg, "p", HarvestOptions(limit=4))
    assert first.status == "stopped" and run_items(cfg, first.run_id) == dict.fromkeys(ids[:4], "deposited")
    assert state(cfg) == (set(ids[:4]), at(stamps[4]))  # obj04 was in hand when the run stopped
    assert first.note == (f"stopped at the limit of 4 items; the checkpoint moved to {at(stamps[4]).isoformat()}, "
                          "where the listing stopped")

    second = harvest(cfg, "p", HarvestOptions(limit=4))  # from obj04: nothing settled before it is listed again
    assert run_items(cfg, second.run_id) == dict.fromkeys(ids[4:8], "deposited")
    assert state(cfg) == (set(ids[:8]), at(stamps[8]))

    third = harvest(cfg, "p")
    assert third.status == "completed" and run_items(cfg, third.run_id) == dict.fromkeys(ids[8:], "deposited")
    deposited, checkpoint = state(cfg)
    assert deposited == set(ids) and checkpoint > at(stamps[-1])


def test_an_item_that_failed_before_the_cut_holds_the_checkpoint_at_its_object(site, tmp_path):
    ids, stamps = masters(tmp_path / "masters", list(range(8)))
    cfg = site()
    blocker = tmp_path / "store" / "p" / ids[2]  # a file where obj02's folder must go: its deposit fails
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"")

    first = harvest(cfg, "p", HarvestOptions(limit=4))
    assert run_items(cfg, first.run_id) == {ids[0]: "deposited", ids[1]: "deposited", ids[2]: "failed",
                                            ids[3]: "deposited"}
    assert state(cfg) == ({ids[0], ids[1], ids[3]}, at(stamps[2]))  # not obj04's: obj02 has attempts left

    blocker.unlink()
    second = harvest(cfg, "p")
    assert run_items(cfg, second.run_id) == {ids[2]: "deposited", ids[3]: "skipped",
                                             **dict.fromkeys(ids[4:], "deposited")}
    assert state(cfg)[0] == set(ids)


def test_objects_sharing_the_time_where_the_run_stopped_are_all_taken(site, tmp_path):
    ids, stamps = masters(tmp_path / "masters", [0, 1, 3, 3, 3, 3, 5])
    same = stamps[2]
    cfg = site()

    first = harvest(cfg, "p", HarvestOptions(limit=3))  # obj02 is the last taken, obj03 of the same time in hand
    assert run_items(cfg, first.run_id) == dict.fromkeys(ids[:3], "deposited")
    assert state(cfg)[1] == at(same)

    second = harvest(cfg, "p", HarvestOptions(limit=2))  # obj02 comes again with its time, skipped
    assert run_items(cfg, second.run_id) == {ids[2]: "skipped", ids[3]: "deposited", ids[4]: "deposited"}
    assert state(cfg)[1] == at(same)  # obj05, still of that time, was in hand

    third = harvest(cfg, "p")
    assert run_items(cfg, third.run_id) == {**dict.fromkeys(ids[2:5], "skipped"), ids[5]: "deposited",
                                            ids[6]: "deposited"}
    assert third.status == "completed" and state(cfg)[0] == set(ids)


def test_a_run_that_stops_once_its_listing_is_done_moves_the_checkpoint_to_the_windows_end(site, tmp_path):
    ids, _ = masters(tmp_path / "masters", [0, 1])
    cfg = site()
    before = datetime.now(timezone.utc)
    run = harvest(cfg, "p", HarvestOptions(limit=2))  # the limit is reached on the last item listed
    assert run.status == "stopped" and run_items(cfg, run.run_id) == dict.fromkeys(ids, "deposited")
    deposited, checkpoint = state(cfg)
    assert deposited == set(ids) and checkpoint == datetime.fromisoformat(run.until) and checkpoint >= before


def otmm(url: str, ordered: bool) -> dict:
    """Each asset an object; searched on the modified field, sorted ascending on it."""
    return {"kind": "otmm", "base_url": url, "username": "tsuper", "password": "${OTMM_PASSWORD}",
            "retry": FAST_RETRY, "search": {"page_size": 2, "modified_field_id": MODIFIED_FIELD,
                                            "modified_operator_id": "ARTESIA.OPERATOR.DATE.IS ON OR AFTER",
                                            "sort": f"asc_{MODIFIED_FIELD}", "modified_order": ordered}}


def sru(url: str, ordered: bool) -> dict:
    return rosetta_source(url, discovery="sru", sru={"modified_index": SRU_DATE_INDEX, "page_size": 2,
                                                     "sort_by": f"{SRU_DATE_INDEX}/sort.ascending",
                                                     "modified_order": ordered})


def rosetta() -> RosettaEmulator:
    return RosettaEmulator(RosettaCatalogue([ie(6000, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png"),
                                             ie(6010, "2024-01-02 10:00:00", "gray8/hopper_gray.jpg"),
                                             ie(6020, "2024-01-03 10:00:00", "rgb8-tiff-lzw/hopper_lzw.tif"),
                                             ie(6030, "2024-01-04 10:00:00", "gray8/gray.tif")]))


# The object in hand when a run limited to two items stops: the third one listed, oldest first.
DAMS = {"otmm": (OtmmEmulator, otmm, datetime(2024, 2, 1, 10, tzinfo=timezone.utc)),
        "rosetta-sru": (rosetta, sru, datetime(2024, 1, 3, 10, tzinfo=timezone.utc))}


@pytest.mark.parametrize("dam", DAMS)
def test_a_dam_listing_in_modified_order_moves_the_checkpoint_of_a_run_cut_short(site, dam):
    emulator, source, third = DAMS[dam]
    with EmulatorServer(emulator()) as server:
        cfg = site(source(server.url, ordered=True))
        first = harvest(cfg, "p", HarvestOptions(limit=2))
        assert first.counts["deposited"] == 2 and state(cfg)[1] == third
        second = harvest(cfg, "p")
        assert second.status == "completed" and set(run_items(cfg, second.run_id)).isdisjoint(
            run_items(cfg, first.run_id))  # what the first run settled is not listed again


@pytest.mark.parametrize("dam", DAMS)
def test_a_dam_not_known_to_list_in_modified_order_keeps_the_checkpoint_and_says_what_to_do(site, dam, caplog):
    emulator, source, _ = DAMS[dam]
    with EmulatorServer(emulator()) as server:
        cfg = site(source(server.url, ordered=False))
        first = harvest(cfg, "p", HarvestOptions(limit=2))
        assert first.status == "stopped" and first.checkpoint_after is None and state(cfg)[1] is None
        assert first.note.startswith("stopped at the limit of 2 items; the checkpoint stays where it was, so the "
                                     "next run lists the same window again from its start")
        for advice in ("raise max_run_minutes or --max-minutes", "modified_order: true under pipelines.p.source",
                       "`gcis-migrate initial_load`"):
            assert advice in first.note
        assert caplog.text.count("the next run lists the same window again") == 1
        second = harvest(cfg, "p")  # lists the window again: what the first run settled comes again, skipped
        again = run_items(cfg, second.run_id)
        assert {o: again[o] for o in run_items(cfg, first.run_id)} == dict.fromkeys(run_items(cfg, first.run_id),
                                                                                   "skipped")
