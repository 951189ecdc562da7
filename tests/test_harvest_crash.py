"""kill -9 of `gcis-etl harvest` at distinct points of a run, then a run to completion: the final state is
complete, nothing is duplicated, no orphan object or multipart upload is left, no item is skipped.

The emulator runs in this process behind a Gate that holds chosen downloads until the test opens it, so the
killed run is certainly still at work when the signal arrives (no timing guesses).
"""
from __future__ import annotations

import json
import signal
import threading
from dataclasses import dataclass
from typing import Callable

import pytest

from gcis_etl.ledger import COUNTED
from gcis_etl.reports import counted
from tests.conftest import MiB
from tests.emulators.rosetta import Entity, RosettaCatalogue, RosettaEmulator
from tests.harvests import (PATIENT_RETRY, Gate, GeneratedFile, Rig, ie, kill, rosetta_expected,
                            rosetta_source, serving, wait_for, write_noise_tiff)

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

LAST_DOWNLOAD = "dps_pid=FL3042"  # the first file of the last IE listed


def entities(*extra: Entity) -> RosettaCatalogue:
    """Four IEs listed oldest first (one holds a corpus reject), `extra` ones listed before the last."""
    return RosettaCatalogue([
        ie(3000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif", "jpeg-baseline/flowers.jpeg"),
        ie(3010, "2024-01-02 10:00:00", "truncated/truncated.jpg", "png/png-rgb-64x56x8.png"),
        ie(3020, "2024-01-03 10:00:00", "gray8/gray.tif"),
        *extra,
        ie(3040, "2024-01-06 10:00:00", "gray8/hopper_gray.jpg", "jpeg-progressive/bentheim_pulver_turm.jpg"),
    ])


@dataclass(frozen=True)
class KillPoint:
    held: str                           # downloads the gate holds
    reached: Callable[[Rig, Gate], object]
    big_master: bool = False            # an access master large enough for a multipart upload


def fetching(rig: Rig, gate: Gate) -> bool:
    return bool(rig.peek("SELECT run_id FROM runs WHERE status='running'")) and gate.held > 0


def first_item_recorded(rig: Rig, gate: Gate) -> bool:
    return bool(rig.statuses())


def uploading(rig: Rig, gate: Gate) -> bool:
    return bool(rig.uploads())


def first_manifest(rig: Rig, gate: Gate) -> bool:
    return any(key.endswith("/manifest-v3.json") for key in rig.keys())


POINTS = {
    "fetch": KillPoint("DeliveryManagerServlet", fetching),
    "conversion": KillPoint(LAST_DOWNLOAD, first_item_recorded),
    "upload": KillPoint(LAST_DOWNLOAD, uploading, big_master=True),
    "manifest": KillPoint(LAST_DOWNLOAD, first_manifest),
}


@pytest.mark.parametrize("point", POINTS)
def test_a_run_killed_mid_way_is_completed_by_the_next(rig, point, tmp_path_factory):
    kill_point = POINTS[point]
    extra, store = (), {}
    if kill_point.big_master:
        big = write_noise_tiff(tmp_path_factory.mktemp("masters") / "noise.tif", 2400)  # ~6.7 MB access master
        extra = (ie(3050, "2024-01-05 10:00:00", GeneratedFile(str(big))),)
        store = {"multipart_threshold": 5 * MiB, "multipart_chunksize": 5 * MiB, "max_bandwidth": 2 * MiB}
    catalogue = entities(*extra)
    expected = rosetta_expected(catalogue)
    gate = Gate(RosettaEmulator(catalogue), kill_point.held)
    with serving(gate) as emulator:
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY), store=store)
        killed = rig.start("harvest")
        wait_for(lambda: kill_point.reached(rig, gate), f"the {point} point was reached", killed)
        kill(killed)

        assert rig.peek("SELECT status FROM runs") == [("running",)]
        assert rig.peek("SELECT * FROM checkpoints") == []  # an unfinished run never moves the checkpoint
        settled_before = rig.statuses()
        assert len(settled_before) < len(expected.outcomes)
        recorded = {name: sum(status == name for status in settled_before.values()) for name in COUNTED}
        last_run = json.loads(rig.cli("status", "--json").stdout)["last_run"]  # still 'running' in the ledger
        assert {name: last_run[name] for name in COUNTED} == recorded
        if point == "upload":
            assert rig.uploads()  # the kill left parts behind: the next run must clear them
        # the objects whose manifests run 1 recorded (at the manifest point, maybe none: one is in the store first)
        (published,), = rig.peek("SELECT count(*) FROM objects")
        if point == "manifest":
            assert 0 < sum(k.endswith("/manifest-v3.json") for k in rig.keys()) < len(expected.order)

        gate.open()
        rerun = rig.cli("harvest")
        rejected_now = any(status == "rejected" and key not in settled_before
                           for key, status in expected.outcomes.items())
        assert rerun.returncode == (1 if rejected_now else 0), rerun.stderr
        assert f"{rig.pipeline}: run 2 completed" in rerun.stdout

        rig.check_final_state(expected)
        with rig.ledger() as ledger:
            assert [(r.run_id, r.status) for r in reversed(ledger.runs(rig.pipeline))] == [(1, "crashed"),
                                                                                          (2, "completed")]
            redone = {(i.object_id, i.item_id): i.outcome for i in ledger.run_items(2)}
            crashed = ledger.run(1)
        # the killed run never wrote its counts: they are those of the items it recorded
        assert crashed.counts == recorded and crashed.manifests == published
        assert "killed" in crashed.note
        report = rig.cli("report", "1")
        assert report.returncode == 1, report.stderr  # a killed run did not complete
        assert f"run 1 crashed: {crashed.counts['deposited']} deposited" in report.stdout
        assert f"; {counted(published, 'manifest')} published" in report.stdout
        assert set(redone) == set(expected.outcomes)  # no item left out
        assert {key: redone[key] for key in settled_before} == {key: "skipped" for key in settled_before}
        assert {key: outcome for key, outcome in redone.items() if key not in settled_before} == \
            {key: outcome for key, outcome in expected.outcomes.items() if key not in settled_before}
        assert rig.peek("SELECT run_id FROM checkpoints") == [(2,)]
        assert [p for p in (rig.root / "state" / "scratch").rglob("*") if p.is_file()] == []


def test_sigterm_stops_after_the_items_in_flight_and_the_next_run_finishes(rig):
    catalogue = entities()
    expected = rosetta_expected(catalogue)
    gate = Gate(RosettaEmulator(catalogue), "dps_pid=FL300[23]&")  # both items of the first IE hold both slots
    with serving(gate) as emulator:
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY))
        stopped = rig.start("harvest")
        wait_for(lambda: gate.held == 2, "both workers are fetching", stopped)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: [stderr.append(line) for line in stopped.stderr], daemon=True)
        reader.start()
        stopped.send_signal(signal.SIGTERM)
        wait_for(lambda: any("stopping after the items in flight" in line for line in stderr), "the run took the signal")
        gate.open()  # the items in flight may now finish, as they should
        stopped.wait(120)
        reader.join(10)

        assert rig.peek("SELECT status, note, checkpoint_after FROM runs") == [("stopped", "stopped on request", None)]
        settled = rig.statuses()
        assert settled[("IE3000", "FL3002")] == settled[("IE3000", "FL3003")] == "deposited"  # finished, recorded
        assert not any(object_id == "IE3040" for object_id, _ in settled)  # nothing new was started
        assert stopped.returncode == 143, stderr  # 128 + SIGTERM: a supervisor sees the run was cut short

        rerun = rig.cli("harvest")
        assert f"{rig.pipeline}: run 2 completed" in rerun.stdout, rerun.stderr
        rig.check_final_state(expected)
        assert rig.peek("SELECT run_id FROM checkpoints") == [(2,)]
