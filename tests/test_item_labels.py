"""How runs name an item for people (models.item_label): a filesystem source's item id already starts with its
object's folder, which logs, progress lines, dry-run lines, reports and `status` used to say twice
(`obj02/obj02/p00.jpg`); a DAM's ids stay joined (`IE123/FL456`)."""
from __future__ import annotations

import logging
import re
import shutil
import time

import pytest

from gcis_etl.models import item_label
from gcis_etl.progress import TerminalProgress
from tests.test_harvest_local import CORPUS, cli


@pytest.mark.parametrize("object_id, item_id, label", [
    ("obj02", "obj02/p00.jpg", "obj02/p00.jpg"),  # a folder source's: the item id alone
    ("IE123", "FL456", "IE123/FL456"),            # a DAM's: joined
    ("obj02", "obj02", "obj02/obj02"),            # the object's own id is not a prefix of itself
    ("ob", "obj02/p", "ob/obj02/p"),              # starts with the object's id, but not followed by "/"
    ("a/b", "a/b/c.tif", "a/b/c.tif"),            # an object id holding a slash
])
def test_an_item_is_named_by_its_id_alone_only_when_that_starts_with_its_objects(object_id, item_id, label):
    assert item_label(object_id, item_id) == label


@pytest.fixture
def site(tmp_path):
    """One object folder holding a master that converts and one that is rejected (truncated)."""
    masters = tmp_path / "masters" / "obj02"
    masters.mkdir(parents=True)
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", masters / "p00.jpg")
    shutil.copy(CORPUS / "truncated/truncated.jpg", masters / "p01.jpg")
    (tmp_path / "config.yaml").write_text(
        "pipelines:\n  museum:\n    source: {kind: filesystem, root: masters}\n    overlap_seconds: 0\n"
        "    store: {kind: local, root: store}\n")
    return tmp_path


def test_a_folder_sources_items_are_named_once_in_dry_runs_logs_reports_and_status(site):
    planned = cli(site, "harvest", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "process  obj02/p00.jpg: new" in planned.stdout.splitlines(), planned.stdout

    done = cli(site, "harvest", "-v")
    assert done.returncode == 1, done.stderr  # p01 rejected
    assert "INFO deposited obj02/p00.jpg" in done.stderr.splitlines(), done.stderr
    assert any(line.startswith("WARNING rejected obj02/p01.jpg: ") for line in done.stderr.splitlines()), done.stderr
    assert any(line.startswith("  rejected: obj02/p01.jpg: ") for line in done.stdout.splitlines()), done.stdout

    reported = cli(site, "report", "1")
    assert any(line.startswith("  rejected: obj02/p01.jpg: ") for line in reported.stdout.splitlines()), \
        reported.stdout
    status = cli(site, "status")
    assert any(line.startswith("  rejected: obj02/p01.jpg: ") for line in status.stdout.splitlines()), status.stdout

    shutil.rmtree(site / "var")  # the ledger lost: the access master is recognised in the store, with a warning
    again = cli(site, "harvest")
    warned = "  warning: obj02/p00.jpg: already in the store"
    assert any(line.startswith(warned) for line in again.stdout.splitlines()), again.stdout

    said = "\n".join(r.stdout + r.stderr for r in (planned, done, reported, status, again))
    assert "obj02/obj02" not in said, said


def test_without_a_terminal_the_item_long_in_flight_is_named_once(caplog):
    progress = TerminalProgress("museum", live=False, quiet_seconds=0.05, tick_seconds=0.02)
    with caplog.at_level(logging.INFO, "gcis_etl.harvest"):
        progress.started("obj02", "obj02/p00.jpg")
        deadline = time.monotonic() + 60
        while not any("in flight" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
        progress.item("obj02", "obj02/p00.jpg", "deposited", None)
        progress.clear()
    quiet = next(r for r in caplog.records if "in flight" in r.getMessage())
    assert re.fullmatch(r"museum: 1 item in flight for \d+ s: obj02/p00\.jpg", quiet.getMessage()), quiet.getMessage()
    assert (quiet.object_id, quiet.item_id) == ("obj02", "obj02/p00.jpg")  # the JSON line's fields as they were
    settled = caplog.records[-1]
    assert settled.getMessage() == "deposited obj02/p00.jpg"
    assert (settled.object_id, settled.item_id) == ("obj02", "obj02/p00.jpg")
