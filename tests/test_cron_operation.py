"""A harvest as cron runs it, night after night: a full disk under the ledger or the scratch space, what the night's
log says of each run, and the reports folder, which must not grow for ever.

Harvests are real `gcis-etl` processes over a folder source into a local store. A disk that refuses writes is
made without root: the harvest process gets a file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored, so that a
write past it fails with EFBIG, as a full disk fails with ENOSPC), under which the ledger's rollback journal
(ledger.journal_mode: delete) for a transaction of several pages cannot be written, while one of a page or two
can.
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import yaml

from tests.harvests import peek

GCIS = str(Path(sys.executable).parent / "gcis-etl")
UNWRITABLE = ("dam: run stopped: ledger {ledger}: disk I/O error; check its filesystem (full, read-only, unmounted?), "
              "then run again (what was settled is recorded; what was deposited since is found in the store)")


class Night:
    """A state_dir, a folder source and a local store; `harvest` runs gcis-etl as cron would."""

    def __init__(self, root: Path, pipeline: dict | None = None, **config):
        """`pipeline`: settings of the pipeline `dam`; `config`: top-level ones."""
        self.root = root
        self.ledger = root / "state" / "ledger.sqlite"
        self.reports = root / "state" / "reports"
        (root / "config.yaml").write_text(yaml.safe_dump({
            "state_dir": "state", "defaults": {"concurrency": 1},
            "pipelines": {"dam": {"source": {"kind": "filesystem", "root": str(root / "src")},
                                  "store": {"kind": "local", "root": str(root / "store")}, **(pipeline or {})}},
            **config}))
        self.added = 0

    def add(self, *objects: str) -> None:
        """Small masters made here, each a new object (the folder source lists oldest first)."""
        for object_id in objects:
            folder = self.root / "src" / object_id
            folder.mkdir(parents=True)
            pixels = np.random.default_rng(self.added).integers(0, 256, (32, 32, 3), dtype=np.uint8)
            tifffile.imwrite(folder / "master.tif", pixels, photometric="rgb")
            self.added += 1

    def harvest(self, *args: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
        def limited() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # kept across exec: a write past the limit fails
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

        return subprocess.run([GCIS, "--config", str(self.root / "config.yaml"), "harvest", *args],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                              preexec_fn=limited if file_size_limit is not None else None)

    def offset_of_run_items(self) -> int:
        """Where the pages of run_items begin, which every item's record writes: a limit there lets a run begin
        (it writes the runs table and the sequence, which come before it in a ledger made by this version) and
        refuses every record."""
        pages = dict(peek(self.ledger, "SELECT name, rootpage FROM sqlite_master WHERE rootpage > 0"))
        begins = max(pages["runs"], pages["sqlite_sequence"])
        records = min(pages["run_items"], pages["sqlite_autoindex_run_items_1"])
        assert begins < records, pages
        (page_size,), = peek(self.ledger, "PRAGMA page_size")
        return (records - 1) * page_size

    def runs(self) -> list[tuple]:
        return peek(self.ledger, "SELECT run_id, status, note FROM runs ORDER BY run_id")

    def items(self) -> dict[str, tuple]:
        return {f"{o}/{i}": (s, a) for o, i, s, a in peek(self.ledger, "SELECT object_id, item_id, status, attempts "
                                                                      "FROM items")}


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("WARNING ")]  # the run's own end line


# --------------------------------------------------------------------- the ledger's disk refuses writes


def test_a_ledger_that_cannot_be_written_when_the_run_begins_is_one_line_and_exit_2(tmp_path):
    """Cron must tell a ledger it cannot write (nothing can run until its disk is put right) from a rejected
    master (1): exit 2, as for a ledger that cannot be opened, and one line naming the ledger, no traceback."""
    night = Night(tmp_path, ledger={"journal_mode": "delete"})
    night.add("a")
    assert night.harvest().returncode == 0
    night.add("b")

    refused = night.harvest(file_size_limit=16384)  # begin_run's journal does not fit

    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    assert _error_lines(refused.stderr) == [UNWRITABLE.format(ledger=night.ledger)]
    assert night.harvest().returncode == 0  # space back: the next night does the work
    assert night.items() == {"a/a/master.tif": ("deposited", 0), "b/b/master.tif": ("deposited", 0)}


def test_a_ledger_that_cannot_be_written_mid_run_stops_it_and_loses_nothing_converted(tmp_path):
    """The first item's record does not fit: the run stops (exit 2, one line); it cannot be recorded as failed
    either, so it is taken for killed, as before; the next night finds the deposit in the store."""
    night = Night(tmp_path, {"overlap_seconds": 0}, ledger={"journal_mode": "delete"})
    night.add("a")
    assert night.harvest().returncode == 0  # no overlap: the next run lists only b and c, not a (made before it)
    night.add("b", "c")

    refused = night.harvest(file_size_limit=night.offset_of_run_items())

    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    assert _error_lines(refused.stderr) == [UNWRITABLE.format(ledger=night.ledger)]
    assert (tmp_path / "store" / "dam" / "b").is_dir()  # converted and deposited before the record failed

    again = night.harvest()  # space back (it rolls back what the failed write left, then marks run 2 crashed)
    assert again.returncode == 0, again.stderr
    assert [run[:2] for run in night.runs()] == [(1, "completed"), (2, "crashed"), (3, "completed")]
    warned = dict(peek(night.ledger, "SELECT object_id, warnings FROM run_items WHERE run_id=3"))
    assert "already in the store" in warned["b"] and "already in the store" in warned["c"], warned


# ------------------------------------------------------------------- a full scratch space or store


def fill(folder: Path) -> None:
    """Write into `folder` until its filesystem is full."""
    filler = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(filler, b"\0" * 4096)
    finally:
        os.close(filler)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the scratch space needs root")
def test_a_full_scratch_space_stops_the_run_and_spends_no_attempt(tmp_path):
    """Like a store that cannot be reached: the run stops (exit 1) rather than failing every item, the message
    names the scratch folder and its free space, no item is recorded (no attempt counted) and the checkpoint
    stays; the night after, with space again, deposits them all."""
    night = Night(tmp_path)
    night.add("a")
    assert night.harvest().returncode == 0
    night.add("b", "c")
    scratch = tmp_path / "state" / "scratch"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(scratch)], check=True)
    try:
        fill(scratch)
        checkpoint = peek(night.ledger, "SELECT checkpoint FROM checkpoints")

        full = night.harvest()

        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr
        reason = (f"fetching: cannot write {scratch / 'dam'} (the scratch space: state_dir sets where it is): No "
                  f"space left on device (0.0 MB free there): free space on its filesystem: then run again (no "
                  f"item's attempt was counted)")
        assert f"dam: run stopped: {reason} (everything settled so far is recorded)" in full.stderr
        assert night.runs()[-1] == (2, "failed", f"RunHalted: {reason}")
        assert night.items() == {"a/a/master.tif": ("deposited", 0)}
        assert peek(night.ledger, "SELECT checkpoint FROM checkpoints") == checkpoint
    finally:
        subprocess.run(["umount", str(scratch)], check=True)

    again = night.harvest()
    assert again.returncode == 0, again.stderr
    assert night.items() == {f"{o}/{o}/master.tif": ("deposited", 0) for o in "abc"}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the store needs root")
def test_a_conversion_process_that_cannot_start_stops_the_run_and_spends_no_attempt(tmp_path):
    """The interpreter replaced under a running cron job (an upgrade): every item failed alike, each spending an
    attempt, until all were out of attempts and waited for `gcis-etl retry`."""
    night = Night(tmp_path)
    night.add("a", "b")
    gone = tmp_path / "python3.11-upgraded-away"
    upgraded = (f"import sys, runpy; sys.executable = {str(gone)!r}; "
                f"sys.argv = ['gcis-etl', '--config', {str(tmp_path / 'config.yaml')!r}, 'harvest']; "
                f"runpy.run_module('gcis_etl.cli', run_name='__main__')")

    stopped = subprocess.run([sys.executable, "-c", upgraded], capture_output=True, text=True, timeout=120)

    assert stopped.returncode == 1, stopped.stderr
    reason = (f"converting: the conversion process could not be started: {gone}: No such file or directory: then "
              f"run again (no item's attempt was counted)")
    assert f"dam: run stopped: {reason}" in stopped.stderr, stopped.stderr
    assert night.runs() == [(1, "failed", f"RunHalted: {reason}")]
    assert night.items() == {}

    again = night.harvest()
    assert again.returncode == 0, again.stderr
    assert night.items() == {f"{o}/{o}/master.tif": ("deposited", 0) for o in "ab"}


def test_a_full_local_store_stops_the_run_and_spends_no_attempt(tmp_path):
    """As for a full scratch space: the first deposit the store's disk refuses stops the run (exit 1) with the
    store's path and free space, no item is recorded and the checkpoint stays; with room again, the next run
    deposits them all, and the store holds no temporary file."""
    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(store)], check=True)
    try:
        night = Night(tmp_path)
        night.add("a")
        assert night.harvest().returncode == 0
        night.add("b", "c")
        fill(store)
        checkpoint = peek(night.ledger, "SELECT checkpoint FROM checkpoints")

        full = night.harvest()

        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr
        stopped = re.search(r"dam: run stopped: depositing: (\S+): cannot write: No space left on device "
                            r"\(0\.0 MB free in the store's filesystem\): the store takes no more data; make room "
                            r"there, then run again \(no item's attempt was counted\) \(everything settled so far "
                            r"is recorded\)", full.stderr)
        assert stopped, full.stderr
        assert Path(stopped[1]).parent.parent == store / "dam" and Path(stopped[1]).parent.name in "bc"
        assert night.runs()[-1][:2] == (2, "failed") and night.runs()[-1][2].startswith("RunHalted: depositing: ")
        assert night.items() == {"a/a/master.tif": ("deposited", 0)}
        assert peek(night.ledger, "SELECT checkpoint FROM checkpoints") == checkpoint

        (store / "filler").unlink()
        again = night.harvest()
        assert again.returncode == 0, again.stderr
        assert night.items() == {f"{o}/{o}/master.tif": ("deposited", 0) for o in "abc"}
        assert not [p for p in store.rglob(".*.tmp")]
    finally:
        subprocess.run(["umount", str(store)], check=True)


# ------------------------------------------------------------------------------------ the night's log


def test_each_run_ends_with_one_log_line_and_quiet_leaves_stdout_empty(tmp_path):
    """Under --log-json a log shipper sees how each run went, without the stdout summary: INFO for a run that
    exits 0, WARNING for one with problems, with the run's numbers as fields; as plain text with --quiet, which
    leaves cron only what went wrong to mail. The summary says when the run started and how long it took."""
    night = Night(tmp_path)
    night.add("a")
    first = night.harvest("--log-json", "--quiet")
    broken = tmp_path / "src" / "b"
    broken.mkdir()
    (broken / "master.tif").write_bytes(b"not an image")
    second = night.harvest("--log-json", "--quiet")
    third = night.harvest()

    assert (first.returncode, second.returncode) == (0, 1), first.stderr + second.stderr
    assert first.stdout == second.stdout == ""
    ends = []
    for run in (first, second):
        lines = [json.loads(line) for line in run.stderr.splitlines()]
        ends += [line for line in lines if "status" in line]
    assert [(e["level"], e["pipeline"], e["run_id"], e["status"], e["counts"], e["note"]) for e in ends] == [
        ("info", "dam", 1, "completed", {"deposited": 1, "skipped": 0, "rejected": 0, "failed": 0}, None),
        ("warning", "dam", 2, "completed", {"deposited": 0, "skipped": 1, "rejected": 1, "failed": 0}, None)]
    checkpoints = [c for c, in peek(night.ledger, "SELECT checkpoint_after FROM runs ORDER BY run_id")]
    assert [e["checkpoint"] for e in ends] == checkpoints[:2] and None not in checkpoints[:2]
    assert all(isinstance(e["seconds"], float) and e["seconds"] >= 0 for e in ends)
    assert third.stdout.startswith("dam: run 3 completed: 0 deposited, 2 skipped"), third.stdout
    assert re.search(r"^  started \S+, took \d+ s$", third.stdout, re.M), third.stdout
    assert third.stderr == ""  # the summary says it: no log line for the same on a terminal

    (tmp_path / "src" / "c").mkdir()
    (tmp_path / "src" / "c" / "master.tif").write_bytes(b"not an image either")
    fourth = night.harvest("--quiet")  # what cron mails: only what went wrong
    assert fourth.returncode == 1 and fourth.stdout == ""
    assert [line.split(":")[0] for line in fourth.stderr.splitlines()] == ["WARNING rejected c/master.tif",
                                                                            "WARNING dam"]
    assert re.fullmatch(r"WARNING dam: run 4 completed: 0 deposited, 2 skipped, 1 rejected, 0 failed; 0 manifests "
                        r"published; took \d+ s", fourth.stderr.splitlines()[1]), fourth.stderr


# --------------------------------------------------------------------------------- the reports folder


def test_reports_are_kept_for_the_latest_runs_and_a_csv_only_when_there_are_problems(tmp_path):
    """As many runs' reports as the ledger keeps skipped items for (ledger.skipped_history_runs): the folder
    does not grow for ever, and `gcis-etl report` still rebuilds an older run's from the ledger."""
    night = Night(tmp_path, ledger={"skipped_history_runs": 2})
    night.add("a")
    (tmp_path / "src" / "b").mkdir()
    (tmp_path / "src" / "b" / "master.tif").write_bytes(b"not an image")
    (night.reports / "other-run1.json").parent.mkdir(parents=True)
    (night.reports / "other-run1.json").write_text("{}")  # another pipeline's, sharing the folder
    assert night.harvest().returncode == 1
    assert sorted(p.name for p in night.reports.iterdir()) == ["dam-run1-problems.csv", "dam-run1.json",
                                                               "other-run1.json"]
    (tmp_path / "src" / "b" / "master.tif").unlink()  # the problem goes: no CSV any more
    for _ in range(3):
        night.harvest()

    assert sorted(p.name for p in night.reports.iterdir()) == ["dam-run3.json", "dam-run4.json", "other-run1.json"]
    rebuilt = subprocess.run([GCIS, "--config", str(tmp_path / "config.yaml"), "report", "1"], capture_output=True,
                             text=True, timeout=60)
    assert "run 1 completed" in rebuilt.stdout and "rejected: b/master.tif" in rebuilt.stdout, rebuilt.stdout


def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_stands(tmp_path):
    """The run is recorded before its report is written: a reports folder that cannot be written (a full disk;
    here a file in its way) costs the files only, which `gcis-etl report` rebuilds from the ledger."""
    night = Night(tmp_path)
    night.add("a")
    night.reports.parent.mkdir(parents=True)
    night.reports.write_text("in the way")

    run = night.harvest()

    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.startswith(f"WARNING dam: the report of run 1 was not written under {night.reports}: "), run.stderr
    assert run.stderr.rstrip().endswith("`gcis-etl report 1` shows it")
    assert night.runs() == [(1, "completed", None)] and "report:" not in run.stdout
