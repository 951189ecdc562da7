"""A run stopped by SIGINT or SIGTERM exits 128 + the signal's number (130, 143), never 0, after recording the
items that were in flight: cron, systemd or a wrapper must not take a run cut short for a success.

The Rosetta emulator runs in this process behind a Gate that holds the first object's downloads, so the run is
certainly still at work when the signal arrives; the store is a local folder.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, SECRETS, Gate, ie, peek, rosetta_source, serving, wait_for

BIN = Path(sys.executable).parent
HELD = ("IE7000", "FL7002"), ("IE7000", "FL7003")  # both slots (concurrency 2)


def catalogue() -> RosettaCatalogue:
    return RosettaCatalogue([
        ie(7000, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif", "jpeg-baseline/flowers.jpeg"),
        ie(7010, "2024-01-02 10:00:00", "gray8/gray.tif"),
        ie(7020, "2024-01-03 10:00:00", "png/png-rgb-64x56x8.png"),
    ])


@pytest.mark.parametrize("command, signum", [
    (["gcis-etl", "--config", "{config}", "harvest"], signal.SIGTERM),
    (["gcis-etl", "--config", "{config}", "harvest"], signal.SIGINT),
    (["gcis-migrate", "initial_load", "--config", "{config}", "--pipeline", "dam"], signal.SIGTERM),
], ids=["harvest-SIGTERM", "harvest-SIGINT", "initial_load-SIGTERM"])
def test_a_run_stopped_by_a_signal_records_what_was_in_flight_and_exits_128_plus_the_signal(tmp_path, command,
                                                                                           signum):
    config, ledger = tmp_path / "config.yaml", tmp_path / "state" / "ledger.sqlite"
    gate = Gate(RosettaEmulator(catalogue()), "dps_pid=FL700[23]&")
    with serving(gate) as emulator:
        config.write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 2, "transfer_slots": 0},
            "pipelines": {"dam": {"source": rosetta_source(emulator.url, retry=PATIENT_RETRY),
                                  "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        args = [str(BIN / command[0])] + [a.format(config=config) for a in command[1:]]
        run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **SECRETS})
        wait_for(lambda: gate.held == 2, "both workers are fetching", run)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True)
        reader.start()
        run.send_signal(signum)
        wait_for(lambda: any("stopping after the items in flight" in line for line in stderr), "the signal was taken")
        gate.open()  # the items in flight may now finish, as they should
        run.wait(120)
        reader.join(10)

    assert run.returncode == 128 + signum, (run.stdout.read(), stderr)
    assert peek(ledger, "SELECT status, note FROM runs") == [("stopped", "stopped on request")]
    settled = {(o, i): s for o, i, s in peek(ledger, "SELECT object_id, item_id, status FROM items")}
    assert {key: settled.get(key) for key in HELD} == {key: "deposited" for key in HELD}  # finished, recorded
    assert not any(object_id == "IE7020" for object_id, _ in settled)  # nothing new was started
