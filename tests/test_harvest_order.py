"""`gcis-etl harvest` with several pipelines under one time limit: with none named they run in turn, so that one a
slow pipeline before it left no time goes first the next time (it lost its turn on every run, silently); one
started with none left says so in a WARNING naming who took its time, asks nothing of its source (but aborts what a
killed run left in its store) and reports no checkpoint move; a stop names the
pipelines it left unstarted, and a SIGTERM is not answered with a Ctrl-C hint; a run that ended on an error says
that error once.

The set-up of tests/test_harvest_time_limit.py: Rosetta through its emulator, each download held at a Gate until
the test opens it, beside filesystem pipelines of tiny TIFFs.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
import threading

import gcis_etl
from gcis_etl.harvesting import HarvestOptions, harvest_pipelines
from gcis_etl.ledger import Ledger
from gcis_etl.progress import Progress
from tests import test_harvest_time_limit as limits
from tests.harvests import GCIS, PATIENT_RETRY, rosetta_source, serving, wait_for
from tests.test_harvest_time_limit import TIME_UP, every, folder, held_rosetta, items, opened_after

site = limits.site  # the fixture


def ran_in_order(cfg, runs: int) -> list[str]:
    """The pipelines of the latest `runs` runs, in the order they started."""
    with Ledger.open(cfg, read_only=True) as ledger:
        return [run.pipeline for run in reversed(ledger.runs(limit=runs))]


def gcis(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, "--config", str(tmp_path / "config.yaml"), *args], capture_output=True, text=True,
                          timeout=300)


def test_a_pipeline_left_no_time_says_so_and_goes_first_the_next_time(site, tmp_path, caplog):
    """--max-minutes 0.02 (1.2 s): a (first by name, never run) holds its first download 1.5 s, so b starts with
    none left. b warns, naming a's overrun, asks its source nothing (its checkpoint does not move over the first
    object it listed) and, in `gcis-etl harvest` with no names, runs first the next time, and after that too; names
    given keep the operator's order."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": rosetta_source(server.url, retry=PATIENT_RETRY), "b": folder(tmp_path, "b", objects=2)})
        first = opened_after(gate, lambda: every(cfg, [], 0.02), 1.5)
        assert list(first) == ["a", "b"]
        b = first["b"].report
        assert items(cfg, b.run_id) == {} and first["b"].exit_code == 0
        assert (b.status, b.note, b.checkpoint_after) == ("stopped", TIME_UP, None)
        [warned] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("b: no time left")]
        assert re.fullmatch(r"b: no time left of --max-minutes 0\.02 \(a ran [\d.]+ s of its 0\.\d s\): "
                            r"no item taken", warned), warned

        done = gcis(tmp_path, "harvest", "--quiet")  # no names: in turn, b first
        assert done.returncode == 0, done.stderr
        assert ran_in_order(cfg, 2) == ["b", "a"]
        with Ledger.open(cfg, read_only=True) as ledger:
            assert {i.object_id for i in ledger.items("b", status="deposited")} == {"obj0", "obj1"}

        assert list(every(cfg, [], None)) == ["b", "a"]  # both had their turn: the order holds
        assert list(every(cfg, ["a", "b"], None)) == ["a", "b"]  # the operator's


def test_a_pipeline_left_no_time_still_aborts_what_a_killed_run_uploaded(site, tmp_path):
    """b's last run was killed mid-upload, leaving a temporary file in its store; then a's first download, held
    1.5 s, leaves b no time of --max-minutes 0.02. b's run, which asks its source nothing, still removes it: left
    to the next run given time, it stayed for good when b was starved otherwise (a stop, a share spent waiting
    for the ledger), as such a run passed for one given time and the killed run for one cleaned up."""
    gate = held_rosetta()
    with serving(gate) as server:
        cfg = site({"a": rosetta_source(server.url, retry=PATIENT_RETRY), "b": folder(tmp_path, "b")})
        assert items(cfg, every(cfg, ["b"], None)["b"].report.run_id) == {"obj0": "deposited"}
        [master] = (tmp_path / "store" / "b" / "b" / "obj0").glob("[!.]*")
        left = master.with_name(f".{master.name}.killed.tmp")  # as LocalStore names a write in progress
        left.write_bytes(b"half an access master")
        with Ledger.open(cfg) as ledger:  # as the killed run left it: 'running', its lock free
            killed = ledger.begin_run("b", None, None, {})
        runs = opened_after(gate, lambda: every(cfg, ["a", "b"], 0.02), 1.5)
    starved = runs["b"].report
    assert starved.status == "stopped" and not left.exists(), starved.note
    assert starved.note == f"{TIME_UP}; aborted 1 incomplete uploads left by run {killed}, which was killed: " \
                           f"b/obj0/{master.name}"


def test_a_stop_names_the_pipelines_it_left_unstarted(site, tmp_path):
    """A library caller's Event, set as the first run starts: the second was not started, and its outcome says so
    (it said nothing)."""
    cfg = site({"a": folder(tmp_path, "a"), "b": folder(tmp_path, "b")})
    stop = threading.Event()

    def progress_for(name: str) -> Progress:
        stop.set()
        return Progress()

    a, b = harvest_pipelines(cfg, ["a", "b"], stop=stop, progress_for=progress_for)
    assert a.report is not None and a.message is None
    assert (b.report, b.exit_code, b.message) == (None, 1, "b: not started: the harvest was stopped by its caller")


def test_sigterm_is_named_and_the_pipelines_it_left_unstarted_are_told(site, tmp_path):
    """`timeout` (or cron's kill) sends SIGTERM while a's download is held: the first line named Ctrl-C, which
    whoever sent it cannot press again, and b, never started, got no line at all."""
    gate = held_rosetta()
    with serving(gate) as server:
        site({"a": rosetta_source(server.url, retry=PATIENT_RETRY), "b": folder(tmp_path, "b")})
        run = subprocess.Popen([GCIS, "--config", str(tmp_path / "config.yaml"), "harvest", "--quiet", "a", "b"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(run.stderr), daemon=True)
        reader.start()
        wait_for(lambda: gate.held, "a's download is held", run)
        run.send_signal(signal.SIGTERM)
        wait_for(lambda: any("stopping after the items in flight" in line for line in stderr), "the signal was taken")
        gate.open()
        run.wait(120)
        reader.join(10)
    err = "".join(stderr)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert "stopping after the items in flight (SIGTERM)" in err and "Ctrl-C" not in err, err
    assert "b: not started: the harvest was stopped by SIGTERM" in err, err


def test_a_run_that_ended_on_an_error_says_it_once(site, tmp_path):
    """b's store root gone (a volume not mounted) after its first deposit: under --quiet the run's end line gave
    its counts and the error, and the command's line the error again with what to do."""
    cfg = site({"b": folder(tmp_path, "b")})
    assert items(cfg, every(cfg, ["b"], None)["b"].report.run_id) == {"obj0": "deposited"}
    shutil.rmtree(tmp_path / "store" / "b")
    done = gcis(tmp_path, "harvest", "--quiet", "b")
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "the store's root folder is missing" in line]
    assert len(said) == 1 and said[0].startswith("b: run stopped: "), done.stderr
    assert re.search(r"^WARNING .*b: run 2 failed: 0 deposited", done.stderr, re.M), done.stderr


def test_the_turns_are_read_after_a_migrations_run_without_a_time_limit(site, tmp_path):
    """A migration's harvest run without --max-minutes has an infinite limit: recorded as JSON `Infinity`, it made
    every later `harvest` with no names fail (sqlite: malformed JSON). Now it is left out, and a ledger holding one
    from before reads it as a run given time (no limit): b, whose last run was the migration's, goes after a."""
    cfg = site({"a": folder(tmp_path, "a"), "b": folder(tmp_path, "b")})
    assert list(every(cfg, ["a"], None)) == ["a"]
    assert gcis_etl.migrate("initial_load", cfg, pipeline="b").status == "completed"
    with Ledger.open(cfg, read_only=True) as ledger:
        [load] = ledger.runs("b", limit=1)
    assert "max_run_minutes" not in json.loads(load.options)
    with sqlite3.connect(cfg.ledger_path) as db:  # as an earlier version recorded it
        db.execute("UPDATE runs SET options='{\"max_run_minutes\": Infinity}' WHERE run_id=?", (load.run_id,))
    assert list(every(cfg, [], None)) == ["a", "b"]


def test_a_dry_run_shares_no_time_limit(site, tmp_path, caplog):
    """A dry run plans every item whatever the limit: the shares used to leave b none, warned of as taking no item
    while its plan was printed in full."""
    cfg = site({"a": folder(tmp_path, "a", objects=2), "b": folder(tmp_path, "b", objects=2)})
    runs = {o.name: o for o in harvest_pipelines(cfg, [], HarvestOptions(max_run_minutes=1e-5, dry_run=True))}
    assert {name: len(o.report.planned) for name, o in runs.items()} == {"a": 2, "b": 2}
    assert "no time left" not in caplog.text
