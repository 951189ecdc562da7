"""Two overlapping harvests of one pipeline (cron started the next before the last ended): one runs, the other
exits 3 at once, saying so, and touches nothing."""
from __future__ import annotations

import fcntl
import os
from datetime import datetime, timezone

import pytest

from gcis_etl.locks import LockHeld, RunLock
from tests.emulators.faults import Fault
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, Gate, ie, rosetta_source, serving, wait_for

pytest_plugins = ("tests.harvests",)  # the `rig` fixture


def test_a_second_harvest_of_a_running_pipeline_exits_3_and_changes_nothing(rig):
    catalogue = RosettaCatalogue([ie(4000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif")])
    gate = Gate(RosettaEmulator(catalogue), "DeliveryManagerServlet")  # the first run stays busy fetching
    with serving(gate) as emulator:
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY))
        first = rig.start("harvest")
        wait_for(lambda: gate.held, "the first run is fetching", first)
        requests = len(emulator.requests())

        second = rig.cli("harvest")
        assert second.returncode == 3
        assert f"pipeline '{rig.pipeline}' is already running (pid {first.pid}; lock " in second.stderr
        assert "nothing was done" in second.stderr and second.stdout == ""
        assert rig.peek("SELECT run_id, status FROM runs") == [(1, "running")]
        assert len(emulator.requests()) == requests  # the second run did not even list the source

        gate.open()
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        assert f"{rig.pipeline}: run 1 completed: 1 deposited" in out
        assert rig.statuses() == {("IE4000", "FL4002"): "deposited"}

        third = rig.cli("harvest")  # the lock went with the first run
        assert third.returncode == 0, third.stderr
        assert rig.peek("SELECT run_id, status FROM runs") == [(1, "completed"), (2, "completed")]


def test_retry_during_a_harvest_exits_3_and_leaves_the_attempts_alone(rig):
    catalogue = RosettaCatalogue([ie(4010, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif")])
    gate = Gate(RosettaEmulator(catalogue), "dps_pid=FL4022")  # only the object added later is held
    with serving(gate) as emulator:
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY), max_attempts=1)
        emulator.inject("dps_pid=FL4012", Fault.http(503), times=None)
        assert rig.cli("harvest").returncode == 1  # FL4012 failed and is out of attempts

        catalogue.entities["IE4020"] = ie(4020, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                                          "gray8/gray.tif")
        running = rig.start("harvest")
        wait_for(lambda: gate.held, "the second run is fetching", running)
        retry = rig.cli("retry")
        assert retry.returncode == 3 and "is already running" in retry.stderr, retry.stderr
        with rig.ledger() as ledger:
            assert ledger.item(rig.pipeline, "IE4010", "FL4012").attempts == 1  # still out of attempts

        gate.open()
        running.communicate(timeout=120)
        assert running.returncode == 1  # FL4012, out of attempts, still counts as failed
        emulator.faults.clear()
        retry = rig.cli("retry")
        assert retry.returncode == 0 and "1 deposited" in retry.stdout, retry.stderr


def test_a_lock_held_by_a_process_that_wrote_no_pid_says_so(tmp_path):
    """A lock taken by hand (flock(1), another tool) holds no pid: the message says that, not 'pid another
    process'."""
    path = tmp_path / "p.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LockHeld, match=r"already running \(lock .*p\.lock, held by a process that did not "
                                           r"record its pid\): nothing was done"):
            with RunLock(path, "pipeline 'p'"):
                pass
    finally:
        os.close(fd)
