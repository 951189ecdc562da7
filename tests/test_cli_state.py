"""The ledger, `status` and `report` as a user meets them: runs that did not complete, a state_dir that cannot be
written, commands that only look, a run killed without a trace. Real subprocesses on a filesystem source."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from gcis_etl.ledger import OBJECT, Ledger
from gcis_etl.locks import pipeline_lock
from gcis_etl.reports import SHOWN, pipeline_status, report_from_ledger
from gcis_etl.work import ItemResult, Outcome
from tests.conftest import CORPUS

MASTER = CORPUS / "gray8/hopper_gray.jpg"


@pytest.fixture
def site(tmp_path) -> Path:
    """One pipeline, two objects of one small master each; state in ./state."""
    for name in ("a", "b"):
        (tmp_path / "masters" / name).mkdir(parents=True)
        shutil.copy(MASTER, tmp_path / "masters" / name / "p1.jpg")
    write_config(tmp_path, "masters")
    return tmp_path


def write_config(site: Path, root: str, **settings) -> None:
    config = {"state_dir": "state", **settings,
              "pipelines": {"p": {"source": {"kind": "filesystem", "root": root},
                                  "store": {"kind": "local", "root": "store"}}}}
    (site / "config.yaml").write_text(yaml.safe_dump(config))


def cli(site: Path, *args: str, config: bool = True) -> subprocess.CompletedProcess:
    options = ["--config", str(site / "config.yaml")] if config else []
    return subprocess.run([sys.executable, "-m", "gcis_etl.cli", *options, *args], capture_output=True, text=True,
                          cwd=site, timeout=300)


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --------------------------------------------------------------------------- F2: reports of unfinished runs

def test_the_report_of_a_run_whose_source_failed_exits_1_and_does_not_say_nothing_changed(site):
    write_config(site, "nomasters")
    harvested = cli(site, "harvest")
    assert harvested.returncode == 1, harvested.stderr
    for args in (("report", "1"), ("report",), ("report", "--pipeline", "p")):
        shown = cli(site, *args)
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert "run 1 failed" in shown.stdout and "nothing changed" not in shown.stdout
        assert "not a readable folder" in shown.stdout
    as_json = cli(site, "report", "1", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["status"] == "failed"


def test_the_report_of_a_run_stopped_on_request_exits_1_and_one_cut_at_its_limit_as_the_harvest_did(site):
    cfg = load_config(site / "config.yaml")
    stop = threading.Event()
    stop.set()  # what the first SIGINT or SIGTERM does
    assert harvest(cfg, "p", stop=stop).status == "stopped"
    stopped = cli(site, "report", "1")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "run 1 stopped" in stopped.stdout and "nothing changed" not in stopped.stdout

    limited = cli(site, "harvest", "--limit", "1")
    assert limited.returncode == 0 and "stopped at the limit of 1 item" in limited.stdout, limited.stderr
    assert cli(site, "report", "2").returncode == 0


def test_a_completed_run_that_found_nothing_still_says_nothing_changed_and_exits_0(site):
    (site / "empty").mkdir()
    write_config(site, "empty")
    assert cli(site, "harvest").returncode == 0
    shown = cli(site, "report", "1")
    assert shown.returncode == 0, shown.stderr
    assert "run 1 completed" in shown.stdout and "nothing changed in the source since the beginning" in shown.stdout


def test_report_names_the_files_its_run_wrote_under_state_dir_wherever_the_ledger_is(site):
    write_config(site, "masters", ledger={"path": "elsewhere/ledger.sqlite"})
    assert cli(site, "harvest").returncode == 0
    shown = json.loads(cli(site, "report", "1", "--json").stdout)
    assert shown["json_path"] == str(site / "state/reports/p-run1.json")
    assert shown["csv_path"] is None  # no problems: no CSV of them
    assert sorted(p.name for p in (site / "state/reports").iterdir()) == ["p-run1.json"]
    assert json.loads(Path(shown["json_path"]).read_text())["counts"]["deposited"] == 2
    assert f"report: {site / 'state/reports/p-run1.json'}" in cli(site, "report", "1").stdout
    assert not (site / "elsewhere/reports").exists()


def test_report_refuses_a_run_of_another_pipeline_than_the_one_named(site):
    config = yaml.safe_load((site / "config.yaml").read_text())
    config["pipelines"]["q"] = {**config["pipelines"]["p"], "store": {"kind": "local", "root": "store-q"}}
    (site / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli(site, "harvest", "p").returncode == 0
    other = cli(site, "report", "1", "--pipeline", "q")
    assert other.returncode == 2 and "run 1 is a run of p, not of q" in other.stderr, other.stdout + other.stderr
    assert other.stdout == ""
    none_yet = cli(site, "report", "--pipeline", "q")
    assert none_yet.returncode == 2 and "no run of q recorded yet" in none_yet.stderr
    assert cli(site, "report", "1", "--pipeline", "p").returncode == 0


def test_status_shows_the_first_problems_of_each_kind_in_object_order(site):
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:
        run_id = ledger.begin_run("p", None, None, {})
        for i in reversed(range(30)):  # recorded in reverse: the order shown is the ledger's, not arrival's
            outcome = Outcome.FAILED if i % 2 else Outcome.REJECTED
            ledger.record(run_id, ItemResult("p", f"o{i:02d}", "m", 1, outcome, f"sha256:{i}", "r", "d", 1,
                                             f"reason {i}"), None)
        ledger.finish_run(run_id, "completed", {"failed": 15, "rejected": 15}, 0, None)
        state = pipeline_status(ledger, "p", pipeline_lock(cfg.state_dir, "p"), shown=4)
    assert [(p.status, p.object_id) for p in state.problems] == [
        ("failed", "o01"), ("failed", "o03"), ("failed", "o05"), ("failed", "o07"),
        ("rejected", "o00"), ("rejected", "o02"), ("rejected", "o04"), ("rejected", "o06")]
    assert state.items["failed"] == state.items["rejected"] == 15  # the counts are of every item


def record_problems(ledger: Ledger, rejected: int, failed: int, finish: bool = True) -> int:
    """A run of pipeline p that rejected and failed so many items (left running unless `finish`)."""
    run_id = ledger.begin_run("p", None, None, {})
    for i in range(rejected + failed):
        outcome = Outcome.REJECTED if i < rejected else Outcome.FAILED
        ledger.record(run_id, ItemResult("p", f"o{i:02d}", "m", 1, outcome, f"sha256:{i}", "r", "d", 1,
                                         f"reason {i}"), None)
    if finish:
        ledger.finish_run(run_id, "completed", {"rejected": rejected, "failed": failed}, 0, None)
    return run_id


def test_status_says_how_many_problems_it_leaves_out_and_lists_them_all_with_all(site):
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        record_problems(ledger, rejected=12, failed=11)
        for _ in range(2):  # o13 out of its 3 attempts (config.yaml's default max_attempts)
            run_id = ledger.begin_run("p", None, None, {})
            ledger.record(run_id, ItemResult("p", "o13", "m", 1, Outcome.FAILED, "sha256:13", "r", "d", 1,
                                             "reason 13"), None)
            ledger.finish_run(run_id, "completed", {"failed": 1}, 0, None)
    text = cli(site, "status").stdout
    assert text.count("  rejected: ") == text.count("  failed: ") == 10, text
    # attempts count toward max_attempts for failed items only: a rejected one is not tried again
    assert "  rejected: o00/m: reason 0\n" in text
    assert "  failed: o12/m (attempts 1 of 3: the next run tries again): reason 12\n" in text
    assert "  failed: o13/m (attempts 3 of 3: waits for `gcis-etl retry p`): reason 13\n" in text
    assert "  ... and 2 more rejected (gcis-etl status p --all lists them all)" in text
    assert "  ... and 1 more failed (gcis-etl status p --all lists them all)" in text
    shown = json.loads(cli(site, "status", "--json").stdout)
    assert len(shown["problems"]) == 20
    assert shown["problems_total"] == {"failed": 11, "rejected": 12, "rejected_manifests": 0}
    every = cli(site, "status", "--all")
    assert every.stdout.count("  rejected: ") == 12 and " more " not in every.stdout, every.stdout + every.stderr
    assert len(json.loads(cli(site, "status", "--all", "--json").stdout)["problems"]) == 23
    assert "the first 10 of each kind" in cli(site, "status", "--help").stdout


def rows_read(ledger: Ledger) -> list:
    """Grows by one for each row the ledger's queries hand over from now on (sqlite3 passes each to the
    connection's row factory)."""
    rows: list = []
    ledger.db.row_factory = lambda cursor, row: rows.append(row) or row
    return rows


def test_status_counts_thousands_of_rejected_manifests_without_reading_them(site):
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:
        run_id = ledger.begin_run("p", None, None, {})
        for i in range(5000):
            ledger.reject_manifest(run_id, "p", f"o{i:04d}", f"reason {i}")
        ledger.finish_run(run_id, "completed", {}, 0, None)
    text = cli(site, "status").stdout
    assert [line for line in text.splitlines() if "/(manifest)" in line] == [
        f"  rejected: o{i:04d}/(manifest): reason {i}" for i in range(10)], text
    assert text.endswith("\n  ... and 4990 more rejected manifests (gcis-etl status p --all lists them all)\n")
    shown = json.loads(cli(site, "status", "--json").stdout)
    assert len(shown["problems"]) == 10
    assert shown["problems_total"] == {"failed": 0, "rejected": 0, "rejected_manifests": 5000}
    assert len(json.loads(cli(site, "status", "--all", "--json").stdout)["problems"]) == 5000
    with Ledger.open(cfg, read_only=True) as ledger:
        read = rows_read(ledger)
        state = pipeline_status(ledger, "p", pipeline_lock(cfg.state_dir, "p"))
    assert state.problems_total["rejected_manifests"] == 5000 and len(state.problems) == 10
    assert len(read) < 50  # the first 10 and a count, not 5,000 rows


def test_the_report_of_a_run_with_thousands_of_problems_reads_only_those_it_shows(site):
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:
        run_id = record_problems(ledger, rejected=3, failed=4997)
    with Ledger.open(cfg, read_only=True) as ledger:
        run = ledger.run(run_id)
        whole = report_from_ledger(ledger, run)
        read = rows_read(ledger)
        first = report_from_ledger(ledger, run, shown=SHOWN)
    assert len(read) < 50 and len(first.problems) == SHOWN and len(whole.problems) == 5000
    assert first.summary() == whole.summary()
    assert f"  ... and 4990 more (gcis-etl report {run_id} --json lists them all)" in whole.summary()
    shown = cli(site, "report", str(run_id))
    assert shown.returncode == 1 and shown.stdout == whole.summary() + "\n", shown.stdout + shown.stderr
    as_json = json.loads(cli(site, "report", str(run_id), "--json").stdout)
    assert as_json == json.loads(json.dumps(whole.to_dict())) and len(as_json["problems"]) == 5000


def test_the_report_of_a_run_that_wrote_no_csv_says_where_all_its_problems_are(site):
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        run_id = record_problems(ledger, rejected=12, failed=0, finish=False)  # killed: no report files
    shown = cli(site, "report", str(run_id))
    assert f"  ... and 2 more (gcis-etl report {run_id} --json lists them all)" in shown.stdout, shown.stdout
    assert len(json.loads(cli(site, "report", str(run_id), "--json").stdout)["problems"]) == 12


# -------------------------------------------------------------------------- F1: a ledger that cannot open

CUT_SHORT = """
import sys, time
from gcis_etl.config import load_config
from gcis_etl.ledger import Ledger
ledger = Ledger.open(load_config(sys.argv[1]))
ledger.db.execute("PRAGMA cache_size=10")  # its pages spill into the file; the journal keeps the committed ones
ledger.db.execute("BEGIN IMMEDIATE")
ledger.db.execute("UPDATE runs SET note='never committed'")
ledger.db.executemany("INSERT INTO run_items (run_id, object_id, item_id, outcome, at) VALUES (1, ?, 'm', 'failed', 't')",
                      [(f"x{i:05d}" + "-" * 200,) for i in range(5000)])
print("writing", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("journal_mode", ["delete", "truncate"])
def test_a_write_cut_short_is_rolled_back_by_status_and_report_and_a_dry_run_says_what_to_do(site, journal_mode):
    """A harvest killed in the middle of a write leaves a hot journal a read-only connection may not roll back
    (WAL mode has none: its readers skip what was not committed)."""
    write_config(site, "masters", ledger={"journal_mode": journal_mode})
    assert cli(site, "harvest").returncode == 0
    writer = subprocess.Popen([sys.executable, "-c", CUT_SHORT, str(site / "config.yaml")], stdout=subprocess.PIPE,
                              text=True, cwd=site)
    assert writer.stdout.readline() == "writing\n"
    writer.kill()  # SIGKILL
    writer.wait()
    ledger, journal = site / "state/ledger.sqlite", site / "state/ledger.sqlite-journal"
    assert journal.stat().st_size > 0
    before = files_under(site), ledger.read_bytes(), journal.read_bytes()
    planned = cli(site, "harvest", "--dry-run")
    assert planned.returncode == 2 and "Traceback" not in planned.stderr, planned.stdout + planned.stderr
    assert (f"ledger {ledger}: a write to it was cut short (a process killed?) and left ledger.sqlite-journal beside "
            "it; a dry run changes nothing, so cannot roll that back: run `gcis-etl status` once (or let the next "
            "harvest do it), then run this again (what was committed is kept)") in planned.stderr
    assert (files_under(site), ledger.read_bytes(), journal.read_bytes()) == before
    status = cli(site, "status")
    assert status.returncode == 0 and "last run: 1 completed" in status.stdout, status.stdout + status.stderr
    assert not journal.exists()
    assert cli(site, "report", "1").stdout.startswith("p: run 1 completed: 2 deposited, 0 skipped, 0 rejected")
    assert cli(site, "harvest", "--dry-run").returncode == 0
    with Ledger.open(load_config(site / "config.yaml"), read_only=True) as kept:
        assert kept.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert kept.run(1).note is None and kept.counts("p")["deposited"] == 2
        assert sorted(i.object_id for i in kept.run_items(1)) == ["a", "b"]


@pytest.mark.parametrize("command", [("harvest",), ("harvest", "--dry-run"), ("status",), ("report",),
                                     ("retry", "p")])
def test_a_ledger_that_cannot_be_opened_is_a_configuration_error_in_one_message(site, command):
    ledger = site / "state/ledger.sqlite"
    ledger.mkdir(parents=True)  # sqlite3: "unable to open database file" or "disk I/O error", by command
    done = cli(site, *command)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    heading, message = done.stderr.splitlines()
    assert heading == "configuration error:"
    assert message == (f"ledger {ledger} cannot be opened: it is a folder; ledger.path names the ledger's file "
                       f"(move the folder away, or set ledger.path)")


def test_a_state_dir_that_cannot_be_made_is_a_configuration_error_naming_the_ledger(site):
    (site / "plain-file").write_text("")
    write_config(site, "masters", state_dir="plain-file/state")
    done = cli(site, "harvest")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"ledger {site}/plain-file/state/ledger.sqlite cannot be opened: Not a directory" in done.stderr


# ------------------------------------------------------------------- F4: commands that only look write nothing

def test_a_dry_run_status_and_report_on_a_fresh_pipeline_create_nothing(site):
    before = files_under(site)
    planned = cli(site, "harvest", "--dry-run")
    assert planned.returncode == 0 and "p: would process 2 items, skip 0" in planned.stdout, planned.stderr
    status = cli(site, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_run"] is None and json.loads(status.stdout)["checkpoint"] is None
    assert cli(site, "status").returncode == 0
    none_yet = cli(site, "report")
    assert none_yet.returncode == 2 and "no run recorded yet" in none_yet.stderr
    missing = cli(site, "report", "7")
    assert missing.returncode == 2 and "no run 7" in missing.stderr
    assert cli(site, "retry", "p").stdout == "nothing to retry\n"
    assert files_under(site) == before


def test_status_without_a_configuration_leaves_no_ledger_behind(tmp_path):
    done = cli(tmp_path, "status", config=False)
    assert done.returncode == 2 and "configures no pipelines" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_after_real_runs_reads_the_ledger_and_changes_nothing(site):
    assert cli(site, "harvest").returncode == 0
    ledger = site / "state/ledger.sqlite"
    before = ledger.read_bytes()
    planned = cli(site, "harvest", "--dry-run")
    assert "p: would process 0 items, skip 2" in planned.stdout, planned.stderr
    assert ledger.read_bytes() == before


def test_commands_that_only_read_the_ledger_need_no_dam_secret_and_a_harvest_names_it(site, monkeypatch):
    """status, report and cache sync never contact a source: a pipeline whose password is not in their
    environment (the iipsrv host's cron) does not stop them. A harvest that would open it stops before any run,
    naming the key and the variable, never a value."""
    monkeypatch.delenv("GCIS_TEST_UNSET_PASSWORD", raising=False)
    config = yaml.safe_load((site / "config.yaml").read_text())
    config["pipelines"]["dam"] = {"source": {"kind": "rosetta", "base_url": "https://rosetta.example.org",
                                             "username": "etl", "password": "${GCIS_TEST_UNSET_PASSWORD}",
                                             "oai": {"set": "gcis"}},
                                  "store": {"kind": "local", "root": "store"}}
    (site / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli(site, "harvest", "p").returncode == 0
    for args in (("status",), ("report",), ("cache", "sync")):
        done = cli(site, *args)
        assert done.returncode == 0, (args, done.stderr)
    refused = cli(site, "harvest")
    assert refused.returncode == 2
    assert (f"{site / 'config.yaml'}: pipelines.dam.source.password: environment variable GCIS_TEST_UNSET_PASSWORD "
            "is not set") in refused.stderr
    with Ledger.open(load_config(site / "config.yaml"), read_only=True) as ledger:
        assert [run.run_id for run in ledger.runs(None, limit=5)] == [1]


# ------------------------------------------------------------------------- F8: a run killed without a trace

def test_status_tells_a_run_whose_process_is_gone_from_a_running_one(site):
    cfg = load_config(site / "config.yaml")
    with Ledger.open(cfg) as ledger:  # what a harvest killed with kill -9 leaves: its run, still 'running'
        ledger.begin_run("p", None, None, {})
    gone = cli(site, "status")
    assert "last run: 1 ended without finishing (killed?)" in gone.stdout, gone.stdout + gone.stderr
    assert json.loads(cli(site, "status", "--json").stdout)["last_run"]["process_gone"] is True
    killed = cli(site, "report", "1")
    assert killed.returncode == 1 and "p: run 1 ended without finishing (killed?): " in killed.stdout, killed.stdout
    killed_json = json.loads(cli(site, "report", "1", "--json").stdout)
    assert killed_json["process_gone"] is True and killed_json["json_path"] is None  # it wrote no report
    with pipeline_lock(cfg.state_dir, "p"):  # a live run holds the pipeline's lock
        live = cli(site, "status")
        assert "last run: 1 running" in live.stdout, live.stdout + live.stderr
        assert json.loads(cli(site, "status", "--json").stdout)["last_run"]["process_gone"] is False
        running = cli(site, "report", "1")
        assert running.returncode == 1 and "p: run 1 running: " in running.stdout, running.stdout
    assert cli(site, "harvest").returncode == 0  # the next run records it as crashed
    with Ledger.open(cfg) as ledger:
        assert ledger.run(1).status == "crashed"


# -------------------------------------------------------------- F5: a run its source stopped is 'failed'

def test_a_run_its_source_stopped_is_recorded_failed_with_the_reason(site):
    write_config(site, "nomasters")
    assert cli(site, "harvest").returncode == 1
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        run = ledger.run(1)
    assert run.status == "failed" and run.finished is not None
    assert run.note == f"SourceError: p: root {site}/nomasters is not a readable folder (No such file or directory)"
    status = cli(site, "status").stdout
    assert "last run: 1 failed" in status and f"\n    {run.note}\n" in status, status
    assert json.loads(cli(site, "status", "--json").stdout)["last_run"]["note"] == run.note


OLD_RUNS = """CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL,
    started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'stopped', 'crashed', 'dry-run')),
    since TEXT, until TEXT, checkpoint_after TEXT, options TEXT NOT NULL DEFAULT '{}',
    deposited INTEGER NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    manifests INTEGER NOT NULL DEFAULT 0, note TEXT
)"""


def test_a_ledger_made_before_failed_runs_takes_them_and_keeps_its_runs(tmp_path):
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.execute(OLD_RUNS)
    db.execute("INSERT INTO runs (run_id, pipeline, started, status, deposited) VALUES (7, 'p', 't', 'completed', 3)")
    db.commit()
    db.close()
    with Ledger(path) as ledger:
        run_id = ledger.begin_run("p", None, None, {})
        ledger.finish_run(run_id, "failed", {}, 0, None, "SourceError: gone")
        assert run_id == 8 and ledger.run(7).deposited == 3 and ledger.run(8).status == "failed"
    with Ledger(path) as ledger:  # opened again: nothing more to change
        assert [r.run_id for r in ledger.runs("p")] == [8, 7]


def test_skipped_items_are_kept_item_by_item_for_the_latest_runs_only_and_every_run_keeps_its_counts(site):
    write_config(site, "masters", ledger={"skipped_history_runs": 2})
    config = load_config(site / "config.yaml")
    runs = [harvest(config, "p") for _ in range(4)]  # the second run on: both objects unchanged, in the overlap
    assert [r.counts["skipped"] for r in runs] == [0, 2, 2, 2]
    with Ledger.open(config) as ledger:
        kept = {run.run_id: [(i.object_id, i.outcome) for i in ledger.run_items(run.run_id)] for run in runs}
        assert [ledger.run(r.run_id).skipped for r in runs] == [0, 2, 2, 2]
    first, second, third, fourth = (r.run_id for r in runs)
    assert sorted(kept[first]) == [("a", "deposited"), ("b", "deposited")]
    assert kept[second] == []
    assert sorted(kept[third]) == sorted(kept[fourth]) == [("a", "skipped"), ("b", "skipped")]
    assert "2 skipped" in cli(site, "report", str(second)).stdout


def test_status_says_an_object_the_source_could_not_describe_is_tried_again_when_listed_again(site):
    """Its attempts go on past max_attempts (the listing yields it whenever it changes): not "waits for retry"."""
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        for _ in range(4):
            run_id = ledger.begin_run("p", None, None, {})
            ledger.record(run_id, ItemResult("p", "noread", OBJECT, 0, Outcome.FAILED, "", "r", "d", 0,
                                             "the source cannot describe it: Permission denied"), None)
            ledger.finish_run(run_id, "completed", {"failed": 1}, 0, None)
    text = cli(site, "status").stdout
    assert (f"  failed: noread/{OBJECT} (attempts 4 of 3: tried again when the source lists it again, or by "
            f"`gcis-etl retry p`): the source cannot describe it: Permission denied\n") in text, text
