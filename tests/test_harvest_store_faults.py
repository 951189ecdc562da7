"""The store failing under a running harvest: an outage that begins after the run's store check stops the run
as the check would have (no item's attempt spent); a run killed between a deposit and its record leaves the
next run a ledger row about the deposited version, master fixity included."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tifffile
import yaml

from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator
from tests.harvests import PATIENT_RETRY, Gate, ie, peek, rosetta_source, serving, wait_for

pytest_plugins = ("tests.harvests",)  # the `rig` fixture
GCIS = str(Path(sys.executable).parent / "gcis-etl")


def test_a_store_outage_mid_run_stops_the_run_and_spends_no_attempt(rig):
    """MinIO goes down while the run fetches its first master (after the store check): that item's deposit
    fails past its retries and the run stops (exit 1) naming the store, with no item recorded, rather than
    failing every remaining item and spending their attempts; with MinIO back, the next run deposits them."""
    catalogue = RosettaCatalogue([ie(4100, "2024-01-01 10:00:00", "rgb8-tiff-uncompressed/hopper.tif"),
                                  ie(4110, "2024-01-01 11:00:00", "gray8/gray.tif")])
    gate = Gate(RosettaEmulator(catalogue), "DeliveryManagerServlet")
    with serving(gate) as emulator:
        rig.write(rosetta_source(emulator.url, retry=PATIENT_RETRY), store={"retry": {"max_attempts": 2}},
                  concurrency=1)
        run = rig.start("harvest")
        wait_for(lambda: gate.held, "the run is fetching", run)
        rig.minio.stop()
        try:
            gate.open()
            out, err = run.communicate(timeout=120)
        finally:
            rig.minio.start()

        assert run.returncode == 1, err
        assert "Traceback" not in err
        assert f"{rig.pipeline}: run stopped: depositing: s3://{rig.bucket}/" in err
        assert "failed after 2 attempts" in err and "run again once it is back (no item's attempt was counted)" in err
        (status, note), = rig.peek("SELECT status, note FROM runs")
        assert status == "failed" and note.startswith("RunHalted: depositing: "), note
        assert rig.peek("SELECT object_id, item_id, status, attempts FROM items") == []

        again = rig.cli("harvest")
        assert again.returncode == 0, again.stderr
        assert rig.statuses() == {("IE4100", "FL4102"): "deposited", ("IE4110", "FL4112"): "deposited"}

def test_a_deposit_recorded_by_the_next_run_keeps_the_masters_fixity(tmp_path):
    """A kill between the deposit of a master's new version and its record (made exact here by putting back the
    ledger as it was before that run) leaves the new access master in the store; the next run records it
    without converting again, with the new version's master SHA-256, not the one the ledger had."""
    master = tmp_path / "src" / "A" / "p1.tif"
    master.parent.mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"p": {
        "source": {"kind": "filesystem", "root": "src"}, "store": {"kind": "local", "root": "store"}}}}))
    ledger = tmp_path / "state" / "ledger.sqlite"

    def harvest() -> None:
        done = subprocess.run([GCIS, "--config", str(config), "harvest"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    tifffile.imwrite(master, np.full((200, 300, 3), 40, np.uint8), photometric="rgb")
    harvest()
    shutil.copy(ledger, tmp_path / "before.sqlite")
    time.sleep(1.1)  # a new modification time: the source's new version
    tifffile.imwrite(master, np.full((220, 340, 3), 90, np.uint8), photometric="rgb")
    harvest()
    for leftover in ledger.parent.glob("ledger.sqlite-*"):
        leftover.unlink()
    shutil.copy(tmp_path / "before.sqlite", ledger)  # the record of the deposit never made

    harvest()

    (width, master_sha256, warnings), = peek(ledger, "SELECT width, master_sha256, warnings FROM items")
    assert width == 340 and "already in the store from the same source version" in warnings
    assert master_sha256 == hashlib.sha256(master.read_bytes()).hexdigest()
