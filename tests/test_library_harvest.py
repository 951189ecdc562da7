"""harvest_pipelines() called from Python: a Ctrl-C (KeyboardInterrupt, no signal handler of ours installed) is
recorded as the command's is, a run stopped on request with its items in flight recorded, and still reaches the
caller; a dry run's report says what it would do, in the CLI's words; a Recipe given where the run's workers
need a recipe's name is refused when the options are made, not in the middle of the run."""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from connectors.base import FetchedFile, Fixity, SourceItem, SourceObject
from gcis_etl.config import load_config
from gcis_etl.harvesting import AT_LIMIT, HarvestOptions, harvest_pipelines
from gcis_etl.ledger import STOPPED_ON_REQUEST, Ledger
from gcis_etl.recipes import load_recipe
from gcis_etl.settings import Settings
from tests.conftest import CORPUS

MASTER = CORPUS / "jpeg-baseline/flowers.jpeg"


class CtrlCSettings(Settings):
    master: Path


class CtrlCSource:
    """Lists one object, then is interrupted as a terminal's Ctrl-C interrupts a Python program: SIGINT to the
    process, Python's own handler raising KeyboardInterrupt in the main thread."""

    lists_in_modified_order = False
    modified_order_setting = None

    def __init__(self, settings: CtrlCSettings, name: str):
        self.settings, self.name = settings, name

    def changes(self, since, until=None):
        yield self._object()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the KeyboardInterrupt comes first

    def get(self, object_ids):
        return iter(())

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        path = Path(shutil.copyfile(item.locator, Path(dest_dir) / item.original_name))
        return FetchedFile(item, path, path.stat().st_size, item.fixity.value, True)

    def _object(self) -> SourceObject:
        master = self.settings.master
        modified = datetime.fromtimestamp(master.stat().st_mtime, timezone.utc)
        item = SourceItem(master.name, 1, master.name, master.stat().st_size, modified,
                          Fixity("sha256", hashlib.sha256(master.read_bytes()).hexdigest()), locator=str(master))
        return SourceObject("o1", modified, (item,))


def write_config(folder: Path, source: dict) -> Path:
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {
        "photos": {"source": source, "store": {"kind": "local", "root": "store"}}}}))
    return path


@pytest.fixture
def python_ctrl_c():
    """SIGINT as a library caller's program has it (Python's default handler), whatever the test runner
    inherited: a shell starts a background job without job control with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_records_the_run_as_stopped_on_request_and_reaches_the_caller(declare, tmp_path, python_ctrl_c):
    declare("ctrl-c-connectors", ctrlc=f"{__name__}:CtrlCSource")
    config = load_config(write_config(tmp_path, {"kind": "ctrlc", "master": str(MASTER)}))
    with pytest.raises(KeyboardInterrupt):
        list(harvest_pipelines(config))
    with Ledger.open(config, read_only=True) as ledger:
        [run] = ledger.runs("photos")
        counts = ledger.counts_so_far(run)
    assert (run.status, run.note) == ("stopped", STOPPED_ON_REQUEST)
    assert counts["deposited"] == 1  # the item in flight was waited for and recorded, as a first Ctrl-C does


def test_a_dry_runs_report_says_what_it_would_do(tmp_path):
    (tmp_path / "m" / "o").mkdir(parents=True)
    shutil.copyfile(MASTER, tmp_path / "m" / "o" / MASTER.name)
    config = load_config(write_config(tmp_path, {"kind": "filesystem", "root": "m"}))
    [outcome] = harvest_pipelines(config, options=HarvestOptions(dry_run=True))
    report = outcome.report
    assert [(p.action, p.object_id) for p in report.planned] == [("process", "o")]
    assert report.summary() == report.headline() == "photos: would process 1 items, skip 0 (since the beginning)"
    (tmp_path / "m" / "p").mkdir()
    shutil.copyfile(MASTER, tmp_path / "m" / "p" / MASTER.name)
    [outcome] = harvest_pipelines(config, options=HarvestOptions(dry_run=True, limit=1))
    assert outcome.report.summary() == f"photos: would process 1 items, skip 0 (since the beginning); " \
                                       f"{AT_LIMIT}1 item"


def test_a_recipe_object_is_refused_for_its_name():
    recipe = load_recipe("ptiff-jpeg-q90")
    with pytest.raises(TypeError, match=r"HarvestOptions.recipe is the name of a recipe \(recipe='ptiff-jpeg-q90' "
                                        r"for this one\), which the run's workers look up in their recipe_dirs, not "
                                        r"an object of type Recipe"):
        HarvestOptions(recipe=recipe)
    with pytest.raises(TypeError, match="HarvestOptions.reencode is the name of a recipe"):
        HarvestOptions(reencode=recipe)
    assert HarvestOptions(recipe=recipe.name).recipe == "ptiff-jpeg-q90"
