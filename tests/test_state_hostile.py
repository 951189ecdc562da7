"""The state a run keeps, damaged or out of reach: a ledger with damaged pages or header, one another process holds
locked, lock files in a folder mounted read-only. Each command says so in one line and exits 2, as for a
configuration error, never with a traceback. Real SQLite files, real subprocesses, real read-only mounts (root).
A damaged ledger recovered as the message says, with Debian 12's sqlite3 (whose `.recover` cannot work); a ledger
file that holds nothing, or another program's tables; the report files of a run number that a ledger put back
gives again."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

from gcis_etl.ledger import Ledger
from tests.test_cli_state import MASTER, cli, write_config

DAMAGED = "; the file is damaged: move it aside (to ledger.sqlite.damaged, say, "
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="a read-only mount needs root")


@pytest.fixture(scope="module")
def harvested(tmp_path_factory) -> Path:
    """One pipeline of two objects, harvested once for the module (a harvest takes seconds)."""
    folder = tmp_path_factory.mktemp("harvested")
    for name in ("a", "b"):
        (folder / "masters" / name).mkdir(parents=True)
        shutil.copy(MASTER, folder / "masters" / name / "p1.jpg")
    write_config(folder, "masters")
    done = cli(folder, "harvest")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


@pytest.fixture
def site(harvested, tmp_path) -> Path:
    """A copy of the harvested site: state in ./state, a cache in ./cache."""
    site = tmp_path / "site"
    shutil.copytree(harvested, site)
    write_config(site, "masters", cache={"dir": str(site / "cache")})
    return site


def one_message(done: subprocess.CompletedProcess) -> str:
    """The command's one line on stderr (after the heading a configuration error has)."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line != "configuration error:"]
    assert len(lines) == 1, done.stderr
    return lines[0]


def damage_pages(ledger: Path) -> None:
    """Overwrite the first page of every table and index: the file opens (its schema is whole), queries fail."""
    with sqlite3.connect(ledger) as db:
        roots = [row[0] for row in db.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1")]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with ledger.open("r+b") as file:
        for root in roots:
            file.seek((root - 1) * size)
            file.write(b"\xff" * size)


def damage_header(ledger: Path) -> None:
    with ledger.open("r+b") as file:
        file.write(b"\xff" * 100)


COMMANDS = [("harvest", "--full"), ("status",), ("report", "1"), ("retry", "p")]


@pytest.mark.parametrize("damage", [damage_pages, damage_header], ids=["pages", "header"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_damaged_ledger_stops_every_command_in_one_line_saying_what_to_do(site, damage, command):
    ledger = site / "state/ledger.sqlite"
    damage(ledger)
    done = cli(site, *command)
    assert done.returncode == 2, done.stdout + done.stderr
    message = one_message(done)
    assert f"ledger {ledger}: " in message and DAMAGED in message, message
    assert "`sqlite3 ledger.sqlite.damaged .dump | sed" in message and "lists every source in full" in message
    assert "run crashed" not in message and "writable by this user" not in message


def test_a_ledger_held_locked_names_the_holder_and_how_long_it_waited(site):
    write_config(site, "masters", ledger={"journal_mode": "delete", "busy_timeout_seconds": 1})
    assert cli(site, "harvest").returncode == 0  # out of WAL mode: a writer now locks readers out
    hold = ("import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(site / "state/ledger.sqlite")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for command in (("status",), ("harvest",)):
            done = cli(site, *command)
            assert done.returncode == 2, done.stdout + done.stderr
            message = one_message(done)
            assert (f"ledger {site}/state/ledger.sqlite: database is locked; another process (pid {holder.pid}) "
                    f"held it past ledger.busy_timeout_seconds (1 s)") in message, message
    finally:
        holder.kill()
        holder.wait()


def test_a_ledger_outside_state_dir_that_cannot_be_opened_is_named_where_it_is(site):
    (site / "elsewhere").write_text("")
    write_config(site, "masters", ledger={"path": str(site / "elsewhere/ledger.sqlite")})
    done = cli(site, "harvest")
    assert done.returncode == 2, done.stdout + done.stderr
    message = one_message(done)
    assert message.startswith(f"ledger {site}/elsewhere/ledger.sqlite cannot be opened: "), message
    assert f"; is its folder {site}/elsewhere there and writable by this user?" in message
    assert "state_dir" not in message


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` bind-mounted read-only over itself, as a filesystem remounted read-only after a good run."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@NEEDS_ROOT
def test_a_harvest_whose_lock_folder_is_read_only_says_so_in_one_line(site):
    lock = site / "state/locks/p.lock"
    with read_only(lock.parent):
        done = cli(site, "harvest")
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_message(done) == (f"lock {lock} for pipeline 'p' cannot be taken (Read-only file system): its "
                                 f"filesystem is mounted read-only: mount it read-write, or move the folder to one "
                                 f"that is; nothing was done")


@NEEDS_ROOT
@pytest.mark.parametrize("command", [("sync",), ("prune", "--max-bytes", "1G"), ("purge",)])
def test_a_cache_command_whose_folder_is_read_only_says_so_in_one_line(site, command):
    cache = site / "cache"
    cache.mkdir()
    with read_only(cache):
        done = cli(site, "cache", *command)
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_message(done) == (f"lock {cache}/lock for a cache {command[0]} on {cache} cannot be taken (Read-only "
                                 f"file system): its filesystem is mounted read-only: mount it read-write, or move "
                                 f"the folder to one that is; nothing was done")


# ------------------------------------------------------------------ recovery, and files that are no ledger


def store_digests(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site / "store")): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((site / "store").rglob("*")) if p.is_file()}


def damage_items_and_tail(ledger: Path) -> None:
    """Garbage over the items table's page, and the file cut short of its last page."""
    with sqlite3.connect(ledger) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='items'").fetchone()[0]
        size, pages = db.execute("PRAGMA page_size").fetchone()[0], db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    with ledger.open("r+b") as file:
        file.seek((root - 1) * size)
        file.write(bytes(range(256)) * (size // 256))
        file.truncate((pages - 1) * size)


def recover_as_advised(site: Path, damage) -> subprocess.CompletedProcess:
    """Damage the ledger, let a harvest say what to do, and do it: the file moved aside, the command run."""
    ledger = site / "state/ledger.sqlite"
    damage(ledger)
    done = cli(site, "harvest")
    assert done.returncode == 2, done.stdout + done.stderr
    advice = re.search(r"or what `([^`]+)` can read of it", one_message(done))[1]
    ledger.rename(ledger.with_name("ledger.sqlite.damaged"))
    return subprocess.run(["bash", "-c", advice], cwd=ledger.parent, capture_output=True, text=True, timeout=60)


def test_the_advised_rebuild_of_a_damaged_ledger_keeps_what_sqlite_reads_and_a_harvest_goes_on(site):
    stored = store_digests(site)
    rebuilt = recover_as_advised(site, damage_items_and_tail)
    assert rebuilt.returncode == 0, rebuilt.stderr
    status = cli(site, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "last run: 1 completed" in status.stdout  # the runs table was read back
    assert "items: 0 deposited" in status.stdout  # its damaged page lost

    again = cli(site, "harvest")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "run 2 completed: 2 deposited" in again.stdout
    assert again.stdout.count("already in the store from the same source version and recipe") == 2
    assert store_digests(site) == stored


def test_a_ledger_whose_header_sqlite_cannot_read_is_rebuilt_empty_and_every_command_reads_it_so(site):
    stored = store_digests(site)
    assert recover_as_advised(site, damage_header).returncode == 0
    assert (site / "state/ledger.sqlite").stat().st_size == 0
    for command, code, said in [(("status",), 0, "checkpoint: none"), (("retry", "p"), 0, "nothing to retry"),
                                (("harvest", "--dry-run"), 0, "would process 2 items"), (("report",), 2, "no run")]:
        done = cli(site, *command)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == code and said in done.stdout + done.stderr, (command, done.stdout + done.stderr)
    assert (site / "state/ledger.sqlite").stat().st_size == 0  # reading it changed nothing
    again = cli(site, "harvest")
    assert again.returncode == 0 and "run 1 completed: 2 deposited" in again.stdout, again.stdout + again.stderr
    assert store_digests(site) == stored


def test_an_sqlite_file_of_another_program_is_no_ledger_and_no_command_reads_or_changes_it(site):
    ledger = site / "state/ledger.sqlite"
    ledger.unlink()
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('kept')")
    db.close()
    before = ledger.read_bytes()
    for command in (("harvest",), ("harvest", "--dry-run"), ("status",), ("report", "1"), ("retry", "p")):
        done = cli(site, *command)
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert one_message(done) == (f"ledger {ledger} is an SQLite database but not a gcis-etl ledger (its tables: "
                                     f"notes; a ledger has items, objects, runs, run_items, checkpoints): is "
                                     f"ledger.path the right file? nothing was done")
    assert ledger.read_bytes() == before
    assert sorted(p.name for p in ledger.parent.glob("ledger.sqlite*")) == ["ledger.sqlite"]


def test_a_run_numbered_as_a_lost_one_is_not_reported_with_the_lost_runs_files(site):
    """Run 2 rejects an item and writes its CSV; the ledger of before run 2 is put back; the new run 2, killed
    before writing its files, and then a run 2 with no problems, are reported without the lost run's files."""
    ledger, reports = site / "state/ledger.sqlite", site / "state/reports"
    backup = site / "ledger.backup"
    shutil.copy(ledger, backup)  # after run 1: no -wal beside it, the harvest ended
    (site / "masters/c").mkdir()
    (site / "masters/c/p1.jpg").write_bytes(b"not a JPEG at all" * 100)
    lost = cli(site, "harvest")
    assert lost.returncode == 1 and "run 2 completed: 0 deposited, 2 skipped, 1 rejected" in lost.stdout, lost.stdout
    assert (reports / "p-run2-problems.csv").is_file()
    shutil.rmtree(site / "masters/c")
    shutil.copy(backup, ledger)

    with Ledger(ledger) as put_back:  # a run 2 killed before it wrote its report
        assert put_back.begin_run("p", None, datetime.now(timezone.utc), {}) == 2
    killed = json.loads(cli(site, "report", "2", "--json").stdout)
    assert killed["status"] == "running" and (killed["json_path"], killed["csv_path"]) == (None, None), killed

    shutil.copy(backup, ledger)
    again = cli(site, "harvest")
    assert again.returncode == 0 and "run 2 completed" in again.stdout, again.stdout + again.stderr
    assert sorted(p.name for p in reports.iterdir()) == ["p-run1.json", "p-run2.json"]
    shown = json.loads(cli(site, "report", "2", "--json").stdout)
    assert shown["json_path"] == str(reports / "p-run2.json") and shown["csv_path"] is None, shown
