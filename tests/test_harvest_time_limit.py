"""The harvest's time limit (--max-minutes, max_run_minutes) spans the command, as cron's interval does: each
pipeline gets an equal share of what is left when it starts (what one does not use passes to those after it),
or its own max_run_minutes where that is shorter, and one started with none left takes no item; its time counts
from when it was given its share, not from when it could open its ledger. An item that waited for a free slot
while the limit passed is not sent: the next run takes it.

Rosetta (OAI) through its emulator, each download held at a Gate until the test opens it, past the limit: what
a run took is decided by when the gate opened, never by how long anything took. Filesystem pipelines beside it
with one tiny TIFF. One item in flight at a time.
"""
from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pytest
import tifffile
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, PipelineOutcome, Progress, harvest, harvest_pipelines
from gcis_etl.ledger import Ledger
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, ROSETTA_PASSWORD, Gate, ie, rosetta_source, serving, wait_for

IES = ["IE7400", "IE7410", "IE7420"]
TIME_UP = "stopped at the run time limit"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """write(pipelines, **top) -> the config of `pipelines` ({name: source, or (source, its own settings)}), each
    into its own local store, one item in flight at a time; `top`: more top-level settings (ledger=...)."""
    monkeypatch.setenv("ROSETTA_PASSWORD", ROSETTA_PASSWORD)

    def write(pipelines: dict, **top):
        settings = {name: {"source": source, "store": {"kind": "local", "root": str(tmp_path / "store" / name)},
                           **own} for name, (source, own) in
                    ((name, spec if isinstance(spec, tuple) else (spec, {})) for name, spec in pipelines.items())}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({
            "state_dir": str(tmp_path / "state"), "defaults": {"concurrency": 1, "transfer_slots": 0},
            "pipelines": settings, **top}))
        return load_config(tmp_path / "config.yaml")
    return write


def held_rosetta() -> Gate:
    """Three single-image IEs, oldest first, whose downloads wait for the gate."""
    return Gate(RosettaEmulator(RosettaCatalogue([ie(7400, "2024-01-01 10:00:00", "png/png-rgb-64x56x8.png"),
                                                  ie(7410, "2024-01-02 10:00:00", "gray8/hopper_gray.jpg"),
                                                  ie(7420, "2024-01-03 10:00:00", "png/png-rgb-64x56x8.png")])),
                "DeliveryManagerServlet")


def folder(tmp_path, name: str, objects: int = 1) -> dict:
    """A filesystem source of `objects` folders of one tiny TIFF each (none: an empty root)."""
    root = tmp_path / "masters" / name
    root.mkdir(parents=True)
    for n in range(objects):
        (root / f"obj{n}").mkdir()
        tifffile.imwrite(root / f"obj{n}" / "page.tif", np.full((8, 8), 40 * n, np.uint8), photometric="minisblack")
    return {"kind": "filesystem", "root": str(root), "grouping": {"mode": "folder"}}


def items(cfg, run_id: int) -> dict[str, str]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return {i.object_id: i.outcome for i in ledger.run_items(run_id)}


def in_ledger(cfg, pipeline: str) -> set[str]:
    with Ledger.open(cfg, read_only=True) as ledger:
        return {i.object_id for i in ledger.items(pipeline)}


def opened_after(gate: Gate, run, seconds: float) -> list:
    """What `run()` returns, its first download held until `seconds` after it was seen held (so at least that
    long after the run, and its time limit, began)."""
    answers: list = []
    worker = threading.Thread(target=lambda: answers.append(run()))
    worker.start()
    wait_for(lambda: gate.held, "the first download is held")
    time.sleep(seconds)
    gate.open()
    worker.join(120)
    [answer] = answers
    return answer


class Handed(Progress):
    """The tasks a run handed its executor, by object (Progress.planned, said once the object's last task returned
    from submit), and whether `gate` was open by then: a task that waited in submit for the one slot, which the
    gate's held download kept, returned only once the gate opened."""

    def __init__(self, gate: Gate):
        self.gate = gate
        self.tasks: dict[str, tuple[int, bool]] = {}

    def planned(self, obj, tasks: int) -> None:
        self.tasks[obj.id] = tasks, self.gate.opened.is_set()


def every(cfg, names: list[str], minutes: float | None) -> dict[str, PipelineOutcome]:
    """What `gcis-etl harvest [--max-minutes minutes] names...` does, by pipeline."""
    return {o.name: o for o in harvest_pipelines(cfg, names, HarvestOptions(max_run_minutes=minutes))}


def test_an_item_that_waited_for_a_slot_while_the_time_ran_out_is_not_sent(site):
    """IE7410 is planned at once and waits in submit for the one slot, which IE7400's download holds past the
    run's time limit (1.2 s): it is left for the next run, unsent, as IE7420 is."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": (rosetta_source(server.url, retry=PATIENT_RETRY), {"max_run_minutes": 0.02})})
        handed = Handed(gate)
        run = opened_after(gate, lambda: harvest(cfg, "a", progress=handed), 1.5)
        assert handed.tasks.get("IE7410") == (1, True) and "IE7420" not in handed.tasks  # IE7410 waited for the slot
        assert items(cfg, run.run_id) == {"IE7400": "deposited"}
        assert in_ledger(cfg, "a") == {"IE7400"}  # IE7410 has no attempt spent: it was never tried
        assert run.status == "stopped" and run.note.startswith(TIME_UP), run.note
        assert run.exit_code == 0

        again = harvest(cfg, "a", HarvestOptions(max_run_minutes=10))
        assert items(cfg, again.run_id) == {"IE7400": "skipped", "IE7410": "deposited", "IE7420": "deposited"}
        assert again.status == "completed"


def test_a_pipeline_started_once_the_commands_time_is_spent_takes_no_item(site, tmp_path):
    """--max-minutes 0.02 (1.2 s) for both: a's first download is held past it, so b starts with none left."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": rosetta_source(server.url, retry=PATIENT_RETRY), "b": folder(tmp_path, "b")})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], 0.02), 1.5)
    a, b = runs["a"].report, runs["b"].report
    assert items(cfg, a.run_id) == {"IE7400": "deposited"} and a.note.startswith(TIME_UP)
    assert items(cfg, b.run_id) == {} and in_ledger(cfg, "b") == set()
    assert b.status == "stopped" and b.note.startswith(TIME_UP), b.note
    assert runs["b"].exit_code == runs["a"].exit_code == 0

    later = every(cfg, ["b"], None)["b"].report  # no limit: b's object is still there to take
    assert items(cfg, later.run_id) == {"obj0": "deposited"}


def test_each_pipeline_gets_an_equal_share_of_the_time_left(site, tmp_path):
    """--max-minutes 0.2 (12 s) for two pipelines: a gets 6 s. Its first download is held 7 s: by then a's share
    is spent, though not the command's, so a sends nothing more and b gets what is left."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": rosetta_source(server.url, retry=PATIENT_RETRY), "b": folder(tmp_path, "b")})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], 0.2), 7)
    a, b = runs["a"].report, runs["b"].report
    assert items(cfg, a.run_id) == {"IE7400": "deposited"} and a.note.startswith(TIME_UP), a.note
    assert items(cfg, b.run_id) == {"obj0": "deposited"}


def test_a_pipeline_keeps_its_own_max_run_minutes_where_it_is_shorter_than_its_share(site, tmp_path):
    """No --max-minutes: the command's limit is the longest max_run_minutes (b's 10), but a's own is 0.02 (1.2 s):
    its first download held past that, a sends nothing more; b takes what is left."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": (rosetta_source(server.url, retry=PATIENT_RETRY), {"max_run_minutes": 0.02}),
                    "b": (folder(tmp_path, "b"), {"max_run_minutes": 10})})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], None), 1.5)
    a, b = runs["a"].report, runs["b"].report
    assert items(cfg, a.run_id) == {"IE7400": "deposited"} and a.note.startswith(TIME_UP), a.note
    assert items(cfg, b.run_id) == {"obj0": "deposited"} and b.status == "completed"


def test_max_minutes_given_replaces_the_pipelines_own_limits(site, tmp_path):
    """--max-minutes 10 over a's own 0.02 (a catch-up run by hand): a's share is 5 minutes, so its first download
    held 1.5 s stops nothing, and a takes every IE."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": (rosetta_source(server.url, retry=PATIENT_RETRY), {"max_run_minutes": 0.02}),
                    "b": folder(tmp_path, "b")})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], 10), 1.5)
    a = runs["a"].report
    assert items(cfg, a.run_id) == dict.fromkeys(("IE7400", "IE7410", "IE7420"), "deposited")
    assert a.status == "completed", a.note


def test_the_time_a_pipeline_does_not_use_passes_to_the_ones_after_it(site, tmp_path):
    """--max-minutes 0.2 (12 s): a has nothing to do, so b gets nearly all of it, not half: its first download
    held 7 s, b still sends the next item."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": folder(tmp_path, "a", objects=0), "b": rosetta_source(server.url, retry=PATIENT_RETRY)})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], 0.2), 7)
    assert runs["a"].report.status == "completed"
    taken = items(cfg, runs["b"].report.run_id)
    assert taken["IE7400"] == taken["IE7410"] == "deposited"


def test_a_runs_time_counts_from_when_it_was_given_its_share_not_from_when_its_ledger_opened(site, tmp_path):
    """Another process holds the ledger (journal_mode delete: BEGIN EXCLUSIVE keeps readers out too) from before
    the command starts until 1.5 s after the run is given its share, the whole of --max-minutes 0.02 (1.2 s):
    the run's 1.2 s used to count from when it could open the ledger, so it took its item past the command's
    limit. Now none is left once it starts."""
    cfg = site({"p": folder(tmp_path, "p")}, ledger={"journal_mode": "delete"})
    Ledger.open(cfg).close()
    locked, given = threading.Event(), threading.Event()

    def hold() -> None:
        db = sqlite3.connect(cfg.ledger_path, isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            locked.set()
            given.wait(60)
            time.sleep(1.5)
        finally:
            db.close()

    def progress_for(name: str) -> Progress:
        given.set()  # asked for just before the run's share is measured
        return Progress()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        wait_for(locked.is_set, "the ledger is held")
        [outcome] = harvest_pipelines(cfg, ["p"], HarvestOptions(max_run_minutes=0.02), progress_for=progress_for)
    finally:
        holder.join(120)
    run = outcome.report
    assert items(cfg, run.run_id) == {} and in_ledger(cfg, "p") == set()
    assert (run.status, run.note, outcome.exit_code) == ("stopped", TIME_UP, 0)
