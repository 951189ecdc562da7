"""A second Ctrl-C, a signal sent twice at once, SIGHUP, and `convert` under SIGTERM: each ends the command with
128 + the signal's number, its run recorded (as stopped), nothing half-written left behind, nothing lost for the
next run.

The harvests run against the Rosetta emulator behind a Gate holding the first object's downloads (as in
test_run_stop), so the run is certainly at work when the signals arrive.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from gcis_etl.ledger import ABANDONED
from tests.emulators.rosetta import RosettaEmulator
from tests.harvests import GCIS, PATIENT_RETRY, SECRETS, Gate, peek, rosetta_source, serving, wait_for, write_noise_tiff
from tests.test_run_stop import HELD, catalogue

ITEMS = {("IE7000", "FL7002"), ("IE7000", "FL7003"), ("IE7010", "FL7012"), ("IE7020", "FL7022")}
MIGRATE = str(Path(GCIS).with_name("gcis-migrate"))


def _as_from_a_terminal() -> None:
    """The command's signals as a terminal starts it, whatever the test runner inherited (started under nohup,
    or in the background without job control, it has SIGHUP or SIGINT ignored, and so would the command)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


class Harvest:
    """`gcis-etl harvest` (or `command`) of the catalogue in its own process; its stderr read as it comes."""

    def __init__(self, tmp_path: Path, url: str, command: tuple[str, ...] = (GCIS, "harvest")):
        self.ledger = tmp_path / "state" / "ledger.sqlite"
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 2, "transfer_slots": 0},
            "pipelines": {"dam": {"source": rosetta_source(url, retry=PATIENT_RETRY),
                                  "store": {"kind": "local", "root": str(tmp_path / "store")}}}}))
        self.proc = subprocess.Popen(list(command), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, **SECRETS}, preexec_fn=_as_from_a_terminal)
        self.stderr: list[str] = []
        self.reader = threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def said(self, text: str) -> bool:
        return any(text in line for line in self.stderr)

    def end(self, timeout: float) -> tuple[int, str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)
        return self.proc.returncode, self.proc.stdout.read()

    def settled(self) -> dict[tuple[str, str], str]:
        return {(o, i): s for o, i, s in peek(self.ledger, "SELECT object_id, item_id, status FROM items")}


def test_a_second_ctrl_c_abandons_the_items_in_flight_records_the_run_as_stopped_and_the_next_run_redoes_them(
        tmp_path):
    gate = Gate(RosettaEmulator(catalogue()), "dps_pid=FL700[23]&")
    with serving(gate) as emulator:
        run = Harvest(tmp_path, emulator.url)
        wait_for(lambda: gate.held == 2, "both workers are fetching", run.proc)
        run.proc.send_signal(signal.SIGINT)
        wait_for(lambda: run.said("stopping after the items in flight"), "the signal was taken")
        time.sleep(1)
        run.proc.send_signal(signal.SIGINT)  # the downloads are still held: only abandoning them ends the run
        code, out = run.end(timeout=60)
        assert code == 130, (out, run.stderr)
        assert run.said("abandoning the items in flight"), run.stderr
        assert peek(run.ledger, "SELECT status, note FROM runs") == [("stopped", ABANDONED)]
        assert not set(HELD) & set(run.settled())  # nothing was recorded of them: they are to do
        report = subprocess.run([GCIS, "report", "1"], cwd=tmp_path, capture_output=True, text=True)
        assert report.returncode == 1 and "run 1 stopped" in report.stdout, report  # cut short, as on one signal
        gate.open()
        again = Harvest(tmp_path, emulator.url)
        code, out = again.end(timeout=120)
    assert code == 0, (out, again.stderr)
    assert again.settled() == {key: "deposited" for key in ITEMS}
    assert [status for status, in peek(run.ledger, "SELECT status FROM runs ORDER BY run_id")] == ["stopped",
                                                                                                "completed"]
    assert not list((tmp_path / "store").rglob(".*.tmp"))


def test_a_signal_sent_twice_at_once_is_one_request_to_stop(tmp_path):
    """coreutils `timeout` and some supervisors signal the process, then its process group: two SIGINTs a few ms
    apart, which must not read as a second Ctrl-C."""
    gate = Gate(RosettaEmulator(catalogue()), "dps_pid=FL700[23]&")
    with serving(gate) as emulator:
        run = Harvest(tmp_path, emulator.url)
        wait_for(lambda: gate.held == 2, "both workers are fetching", run.proc)
        run.proc.send_signal(signal.SIGINT)
        time.sleep(0.01)
        run.proc.send_signal(signal.SIGINT)
        wait_for(lambda: run.said("stopping after the items in flight"), "the signal was taken")
        time.sleep(0.5)  # the second signal has been taken, whatever it did
        gate.open()  # the items in flight may now finish, as they should
        code, out = run.end(timeout=120)
    assert code == 130, (out, run.stderr)
    assert not run.said("abandoning"), run.stderr
    assert peek(run.ledger, "SELECT status, note FROM runs") == [("stopped", "stopped on request")]
    assert {key: run.settled().get(key) for key in HELD} == {key: "deposited" for key in HELD}


@pytest.mark.parametrize("command", [(GCIS, "harvest"),
                                     (MIGRATE, "initial_load", "--config", "config.yaml", "--pipeline", "dam")],
                         ids=["harvest", "initial_load"])
def test_sighup_stops_a_run_as_sigterm_does(tmp_path, command):
    """A terminal closed or an ssh session dropped: SIGHUP ended the process on the spot (129) with no summary,
    the items in flight unrecorded and the run left as "ended without finishing (killed?)"."""
    gate = Gate(RosettaEmulator(catalogue()), "dps_pid=FL700[23]&")
    with serving(gate) as emulator:
        run = Harvest(tmp_path, emulator.url, command)
        wait_for(lambda: gate.held == 2, "both workers are fetching", run.proc)
        run.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: run.said("stopping after the items in flight"), "the signal was taken", run.proc)
        gate.open()  # the items in flight may now finish, as they should
        code, out = run.end(timeout=120)
    assert code == 128 + signal.SIGHUP == 129, (out, run.stderr)
    assert peek(run.ledger, "SELECT status, note FROM runs") == [("stopped", "stopped on request")]
    assert {key: run.settled().get(key) for key in HELD} == {key: "deposited" for key in HELD}, run.stderr
    assert "stopped on request" in out and "report: " in out, out  # the summary, the report written


def test_a_run_started_under_nohup_keeps_ignoring_sighup(tmp_path):
    gate = Gate(RosettaEmulator(catalogue()), "dps_pid=FL700[23]&")
    with serving(gate) as emulator:
        run = Harvest(tmp_path, emulator.url, ("nohup", GCIS, "harvest"))
        wait_for(lambda: gate.held == 2, "both workers are fetching", run.proc)
        run.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert run.proc.poll() is None and not run.said("stopping"), run.stderr
        gate.open()
        code, out = run.end(timeout=120)
    assert code == 0, (out, run.stderr)
    assert peek(run.ledger, "SELECT status FROM runs") == [("completed",)]
    assert run.settled() == {key: "deposited" for key in ITEMS}


@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice at once, as timeout sends it"])
def test_convert_stopped_by_sigterm_removes_its_partial_output_and_exits_143(tmp_path, signals):
    master = write_noise_tiff(tmp_path / "master.tif", 6000)
    out = tmp_path / "out"
    proc = subprocess.Popen([GCIS, "convert", str(master), str(out / "access.tif")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: out.is_dir() and list(out.glob(".access.tif.*.partial")), "the output is being written", proc)
    for n in range(signals):
        time.sleep(0.01 * n)  # the second lands during the cleanup the first started
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, (stdout, stderr)
    assert "stopped by SIGTERM" in stderr
    assert list(out.iterdir()) == []
