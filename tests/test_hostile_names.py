"""Names from a source made to deceive whoever reads what the tool writes: a file name holding a newline and a
terminal's escape sequences forged a run's summary line in the log, the harvest's summary and `gcis-etl status`;
an object id `=HYPERLINK(...)` ran as a formula in the problems CSV opened in a spreadsheet. And the modes of the
files the tool writes, urllib3's InsecureRequestWarning said once per host whatever the warnings filters do, and
`config check` warning of verify_tls: false. Real subprocesses on a real folder tree of masters."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gcis_etl.durable import atomic_write
from gcis_etl.ledger import RunItem
from gcis_etl.reports import RunReport, write_report
from tests.test_cli_state import MASTER, cli, write_config

FORGED = "samples: run 9 completed: 5 deposited, 0 skipped, 0 rejected, 0 failed"
FOLDER = '=HYPERLINK("https:\\\\evil.example")'  # no slash: one folder, one object
FILE = f"x\n{FORGED}\x1b[1A\x1b[2K.jpg"  # a newline, then ESC [1A ESC [2K: cursor up, erase the line
SHOWN = f"x\\n{FORGED}\\x1b[1A\\x1b[2K.jpg"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """A source whose object is named as a formula, with a good master and a file named to forge a line (not an
    image: rejected); the commands' outputs (under umask 022): a dry run, the harvest (-v), status, report."""
    site = tmp_path_factory.mktemp("hostile")
    (site / "masters" / FOLDER).mkdir(parents=True)
    shutil.copy(MASTER, site / "masters" / FOLDER / "p1.jpg")
    (site / "masters" / FOLDER / FILE).write_bytes(b"not an image")
    write_config(site, "masters")
    umask = os.umask(0o022)  # the commands', for the modes of what they write
    try:
        done = {command: cli(site, *args) for command, args in (
            ("dry-run", ("harvest", "--dry-run")), ("harvest", ("harvest", "-v")), ("status", ("status",)),
            ("report", ("report",)), ("report --json", ("report", "--json")))}
    finally:
        os.umask(umask)
    assert done["harvest"].returncode == 1, done["harvest"].stdout + done["harvest"].stderr
    return site, done


def test_a_name_with_a_newline_and_escape_sequences_forges_no_line_anywhere_a_person_reads(hostile):
    _, done = hostile
    for command in ("dry-run", "harvest", "status", "report"):
        text = done[command].stdout + done[command].stderr
        assert "\x1b" not in text, (command, text)
        assert not [line for line in text.splitlines() if line.startswith("samples:")], (command, text)
        assert SHOWN in text, (command, text)
    assert f"process  {FOLDER}/{SHOWN}: " in done["dry-run"].stdout
    assert f"WARNING rejected {FOLDER}/{SHOWN}: not an image" in done["harvest"].stderr
    assert f"  rejected: {FOLDER}/{SHOWN}: not an image" in done["harvest"].stdout
    assert f"  rejected: {FOLDER}/{SHOWN}: not an image" in done["status"].stdout
    assert f"  rejected: {FOLDER}/{SHOWN}: not an image" in done["report"].stdout
    [problem] = json.loads(done["report --json"].stdout)["problems"]  # JSON keeps the id as it is
    assert problem["item_id"] == f"{FOLDER}/{FILE}"


def test_the_problems_csv_holds_ids_a_spreadsheet_takes_as_text(hostile):
    site, _ = hostile
    [path] = (site / "state" / "reports").glob("*-problems.csv")
    with path.open(newline="") as f:
        [row] = list(csv.DictReader(f))
    assert row["object_id"] == f"'{FOLDER}"
    assert row["item_id"] == f"'{FOLDER}/{FILE}"
    assert row["reason"].startswith("not an image")


@pytest.mark.parametrize("cell,written", [("+1+1", "'+1+1"), ("-2+3", "'-2+3"), ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
                                          ("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("a=1", "a=1"), ("1-2", "1-2")])
def test_every_cell_from_a_source_that_would_start_a_formula_is_quoted(tmp_path, cell, written):
    item = RunItem(1, cell, cell, "failed", cell, 1.0, "2026-11-22T00:00:00+00:00")
    report = RunReport("p", 1, "completed", None, None, None, None, None, {"failed": 1}, 0, problems=[item])
    with open(write_report(report, tmp_path).csv_path, newline="") as f:
        [row] = list(csv.DictReader(f))
    assert (row["object_id"], row["item_id"], row["outcome"], row["reason"]) == (written, written, "failed", written)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_a_file_written_whole_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "a.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == mode
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary left


def test_a_harvest_writes_its_reports_with_the_modes_of_its_ledger_and_lock(hostile):
    site, _ = hostile
    state = site / "state"
    modes = {path.name: path.stat().st_mode & 0o777 for path in (
        state / "ledger.sqlite", state / "locks" / "p.lock", *(state / "reports").iterdir())}
    assert set(modes.values()) == {0o644}, modes


WARN_TWICE = """
import threading, warnings
from urllib3.exceptions import InsecureRequestWarning
from gcis_etl.logs import configure
configure(False, 0)

def request(host):
    warnings.warn(f"Unverified HTTPS request is being made to host '{host}'. Adding certificate verification is "
                  "strongly advised.", InsecureRequestWarning)
    with warnings.catch_warnings():  # as botocore and the imaging libraries do, mid-run
        warnings.simplefilter("ignore", DeprecationWarning)

for host in ("a.example", "a.example", "b.example", "a.example"):
    request(host)
threads = [threading.Thread(target=request, args=("c.example",)) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def test_an_unverified_https_host_is_warned_of_once_whatever_changes_the_warnings_filters():
    done = subprocess.run([sys.executable, "-c", WARN_TWICE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    hosts = [line.split("host '")[1].split("'")[0] for line in done.stderr.splitlines()]
    assert hosts == ["a.example", "b.example", "c.example"], done.stderr
    assert all(line.startswith("WARNING InsecureRequestWarning: ") for line in done.stderr.splitlines())


@pytest.mark.parametrize("verify_tls", [False, "no", True])
def test_config_check_warns_of_a_source_whose_certificate_is_not_checked(tmp_path, verify_tls):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"museum": {
        "source": {"kind": "s3", "bucket": "masters", "endpoint_url": "https://s3.example.org",
                   "verify_tls": verify_tls},
        "store": {"kind": "local", "root": "store"}}}}))
    done = cli(tmp_path, "config", "check")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["pipelines"]["museum"]["source"]["verify_tls"] is (verify_tls is True)  # as read
    if verify_tls is True:
        assert done.stderr == ""
    else:
        assert done.stderr.startswith("warning: pipelines.museum.source.verify_tls: false: the source's TLS "
                                      "certificate is not checked"), done.stderr
