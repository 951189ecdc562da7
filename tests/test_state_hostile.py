"""The state a run keeps, damaged or out of reach: a ledger with damaged pages or header, one another process holds
locked, lock files in a folder mounted read-only. Each command says so in one line and exits 2, as for a
configuration error, never with a traceback. Real SQLite files, real subprocesses, real read-only mounts (root)."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

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
    assert "sqlite3 ledger.sqlite.damaged .recover" in message and "lists every source in full" in message
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
