"""Harvests over a folder source into a local store, stopped, failed or killed at chosen points: a signal to the
whole process group while exiftool inspects, a signal while the run's last item is in flight, a store error
while the collection is updated, a kill -9 after a killed write of the collection.

exiftool is held inside the inspection of the master named "flowers" by a composite tag of its own config
file (EXIFTOOL_HOME), which waits for a file: the run is certainly at that point when the test acts.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.harvests import peek, wait_for

GCIS = str(Path(sys.executable).parent / "gcis-etl")
CORPUS = Path(__file__).parent / "corpus"
SAMPLES = {"obj0": "jpeg-baseline/flowers.jpeg", "obj1": "gray8/gray.tif", "obj2": "png/png-rgb-64x56x8.png"}


@dataclass
class FolderHarvest:
    root: Path

    def __post_init__(self) -> None:
        home = self.root / "exiftool"
        home.mkdir()
        (home / ".ExifTool_config").write_text(
            "%Image::ExifTool::UserDefined = ('Image::ExifTool::Composite' => { GcisHeld => {\n"
            f"    Require => 'FileName', ValueConv => q{{ if ($val =~ /flowers/) {{ open(my $f, '>', '{self.held}');\n"
            f"    close($f); select(undef, undef, undef, 0.05) until -e '{self.released}' }} 1 }} }} }});\n1;\n")
        self.env = {**os.environ, "EXIFTOOL_HOME": str(home)}
        (self.root / "config.yaml").write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 1, "transfer_slots": 0},
            "pipelines": {"dam": {"source": {"kind": "filesystem", "root": str(self.root / "src")},
                                  "store": {"kind": "local", "root": str(self.root / "store")},
                                  "manifests": {"manifest_base_url": "http://127.0.0.1:8182/store",
                                                "image_service_base_url": "http://127.0.0.1:8182/iiif",
                                                "versions": ["3.0"], "label": ["title"],
                                                "collection_label": "Durability"}}}}))

    @property
    def held(self) -> Path:
        return self.root / "held"

    @property
    def released(self) -> Path:
        return self.root / "released"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def add(self, *objects: str) -> None:
        """Objects in listing order (the folder source lists oldest first)."""
        for object_id in objects:
            folder = self.root / "src" / object_id
            folder.mkdir(parents=True)
            shutil.copy(CORPUS / SAMPLES[object_id], folder)
            time.sleep(0.01)

    def argv(self, *args: str) -> list[str]:
        return [GCIS, "--config", str(self.root / "config.yaml"), *args]

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env, timeout=120)

    def start_held(self) -> tuple[subprocess.Popen, list[str]]:
        """A harvest in a process group of its own, once exiftool is held; and its stderr, as it comes."""
        run = subprocess.Popen(self.argv("harvest"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=self.env, start_new_session=True)
        stderr: list[str] = []
        threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True).start()
        wait_for(self.held.exists, "exiftool inspects the master", run)
        return run, stderr

    def signal_and_release(self, run: subprocess.Popen, stderr: list[str], send) -> None:
        """`send` the signal, let exiftool go once the harvest took it, and wait for the harvest's end."""
        send()
        wait_for(lambda: any("stopping after the items in flight" in line for line in stderr), "the signal was taken")
        self.released.touch()
        try:
            run.wait(120)  # a hang guard, not a timing assertion
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
            raise AssertionError(f"the harvest hung after the signal: {stderr}") from None

    def runs(self) -> list[tuple]:
        return peek(self.root / "state" / "ledger.sqlite", "SELECT run_id, status, note FROM runs")

    def items(self) -> dict[str, str]:
        return dict(peek(self.root / "state" / "ledger.sqlite", "SELECT item_id, status FROM items"))


def test_a_signal_to_the_process_group_while_exiftool_inspects_stops_the_run(tmp_path):
    """A terminal's Ctrl-C goes to the whole process group: the threads' exiftool processes, which inspect
    masters in the harvest itself, must not get it. One killed mid-answer left its thread waiting for ever, and
    the harvest with it. The item being inspected finishes, the run stops and exits 130, the next run does the
    rest."""
    rig = FolderHarvest(tmp_path)
    rig.add("obj0", "obj1", "obj2")
    run, stderr = rig.start_held()
    rig.signal_and_release(run, stderr, lambda: os.killpg(run.pid, signal.SIGINT))

    assert run.returncode == 130, stderr
    assert rig.runs() == [(1, "stopped", "stopped on request")]
    settled = rig.items()
    assert settled.get("obj0/flowers.jpeg") == "deposited", settled  # the item being inspected finished
    assert set(settled.values()) == {"deposited"} and "obj2/png-rgb-64x56x8.png" not in settled, settled
    again = rig.cli("harvest")
    assert again.returncode == 0, again.stderr
    assert rig.items() == {"obj0/flowers.jpeg": "deposited", "obj1/gray.tif": "deposited",
                           "obj2/png-rgb-64x56x8.png": "deposited"}


def test_a_signal_while_the_last_item_is_in_flight_lets_the_run_complete_and_exit_0(tmp_path):
    """SIGTERM while the run's only item is in flight: the item finishes and nothing was left undone, so the
    run completes, moves the checkpoint, and exits as a completed run does, not 143 ('stopped by the signal
    before its end'), which would contradict its own report."""
    rig = FolderHarvest(tmp_path)
    rig.add("obj0")
    run, stderr = rig.start_held()
    rig.signal_and_release(run, stderr, run.terminate)

    assert rig.runs() == [(1, "completed", None)]
    assert rig.items() == {"obj0/flowers.jpeg": "deposited"}
    assert run.returncode == 0, stderr
    assert rig.cli("report").returncode == 0


def test_a_store_error_while_the_collection_is_updated_records_the_run_as_failed(tmp_path):
    """The collection is updated after every item is settled: an error there (a collection document of another's
    making, a store down at that moment) must end the run as failed, with the reason, not leave it 'running' for
    status and report to call killed."""
    rig = FolderHarvest(tmp_path)
    rig.released.touch()
    rig.add("obj0", "obj1")
    assert rig.cli("harvest").returncode == 0
    collection = rig.store / "collections" / "dam-v3.json"
    collection.write_text('{"not": "a collection"}')  # JSON of another's making (one not JSON is written again)
    shutil.copy(CORPUS / SAMPLES["obj1"], tmp_path / "src" / "obj0")  # a page added: the object is published again

    second = rig.cli("harvest")
    assert second.returncode == 1, second.stderr
    (run_id, status, note), = [run for run in rig.runs() if run[0] == 2]
    assert status == "failed" and str(collection) in note, note
    report = rig.cli("report")
    assert "run 2 failed" in report.stdout and "killed" not in report.stdout, report.stdout
    collection.unlink()  # repaired: the next run lists the object again
    third = rig.cli("harvest")
    assert third.returncode == 0, third.stderr
    assert "killed" not in third.stdout + third.stderr


def test_the_run_after_a_kill_removes_a_killed_write_of_the_collection(tmp_path):
    """A kill -9 inside a write of the collection leaves its hidden temporary file under collections/, outside
    the pipeline's folder: the next run removes it with the others the killed run left."""
    rig = FolderHarvest(tmp_path)
    rig.add("obj1")
    rig.released.touch()
    assert rig.cli("harvest").returncode == 0
    rig.released.unlink()
    left = [rig.store / "collections" / ".dam-v3.json.k1ll3d.tmp",
            rig.store / ".meta" / "collections" / ".dam-v3.json.json.k1ll3d.tmp"]
    for path in left:  # what a kill inside LocalStore._write of the collection and of its sidecar leaves
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    rig.add("obj0")
    run, _ = rig.start_held()
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    rig.released.touch()

    after = rig.cli("harvest", "-v")
    assert after.returncode == 0, after.stderr
    assert "collections/dam-v3.json" in after.stdout + after.stderr  # said what it aborted
    assert not [path for path in left if path.exists()]
