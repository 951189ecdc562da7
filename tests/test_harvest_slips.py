"""Slips of a harvest that read-only walks found: a custom connector's bug in its listing ended every pipeline's
run (a raw traceback, the later pipelines never started); a dry run ignored --limit; HarvestOptions took a limit of
0 or a str of ids; an object moved into the source with an old modification time, left waiting on an item by a
run cut short, held the checkpoint back at that old time; the Celery executor worded one task left as several.

The sources are connectors of this module, declared in the `gcis_etl.connectors` entry points of a distribution
written into tmp_path (the `declare` fixture), as tests/test_custom_connector.py declares one.
"""
from __future__ import annotations

import builtins
import hashlib
import logging
import os
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import pytest
import yaml

from connectors.base import FetchedFile, SourceItem, SourceObject
from gcis_etl.config import load_config
from gcis_etl.harvesting import AT_LIMIT, HarvestOptions, harvest, harvest_pipelines
from gcis_etl.ledger import Ledger
from gcis_etl.settings import Settings
from tests.broker import Pool, make_masters
from tests.harvests import GCIS

REPOSITORY = Path(__file__).resolve().parent.parent
CORPUS = REPOSITORY / "tests" / "corpus"
WRITTEN = datetime(2020, 1, 1, tzinfo=timezone.utc)   # the masters' modification time
MOVED_IN = datetime(2024, 1, 1, tzinfo=timezone.utc)  # when they were moved into the source: where it lists them


class MovedInSettings(Settings):
    folder: Path
    raises: str | None = None  # a builtin exception's name: the listing raises it, as a bug would


class MovedIn:
    """Each folder under `folder` is an object of its files, written long before they were moved in (listed_at),
    as a folder source lists masters moved in with their old modification times (mv, rsync -a)."""

    lists_in_modified_order = True
    modified_order_setting = None

    def __init__(self, settings: MovedInSettings, name: str = "moved-in"):
        self.name, self.settings = name, settings

    def changes(self, since: datetime | None, until: datetime | None = None) -> Iterator[SourceObject]:
        if self.settings.raises:
            raise getattr(builtins, self.settings.raises)("a bug in the listing")
        if since is None or MOVED_IN >= since:
            yield from self.get(sorted(p.name for p in self.settings.folder.iterdir()))

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        for object_id in object_ids:
            files = sorted((self.settings.folder / object_id).iterdir())
            items = tuple(SourceItem(f"{object_id}/{f.name}", n, f.name, f.stat().st_size, WRITTEN, locator=str(f))
                          for n, f in enumerate(files, 1))
            yield SourceObject(object_id, WRITTEN, items, listed_at=MOVED_IN)

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        path = Path(shutil.copyfile(item.locator, Path(dest_dir) / item.original_name))
        return FetchedFile(item, path, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest(), False)


def masters(folder: Path, objects: int, per_object: int) -> Path:
    for o in range(objects):
        (folder / f"o{o}").mkdir(parents=True)
        for i in range(per_object):
            shutil.copyfile(CORPUS / "gray8" / "gray.tif", folder / f"o{o}" / f"p{i}.tif")
    return folder


@pytest.fixture
def configure(tmp_path, declare):
    """configure(pipeline=folder or (folder, exception name), ...): a config file of moved-in sources."""
    declare("moved-in-source", **{"moved-in": f"{__name__}:MovedIn"})

    def write(**pipelines: Path | tuple[Path, str]) -> Path:
        sources = {name: {"folder": str(p), "raises": None} if isinstance(p, Path) else
                   {"folder": str(p[0]), "raises": p[1]} for name, p in pipelines.items()}
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {
            name: {"source": {"kind": "moved-in", **source},
                   "store": {"kind": "local", "root": str(tmp_path / f"store-{name}")}}
            for name, source in sources.items()}}))
        return config
    return write


def test_a_bug_in_one_pipelines_listing_ends_that_run_alone_with_its_traceback_logged_once(configure, tmp_path,
                                                                                          caplog):
    config = load_config(configure(a=(tmp_path / "none", "KeyError"), b=masters(tmp_path / "b", 1, 1)))
    with caplog.at_level(logging.ERROR, logger="gcis_etl"):
        outcomes = list(harvest_pipelines(config))
    crashed, healthy = outcomes
    assert (crashed.name, crashed.exit_code, crashed.report) == ("a", 1, None)
    assert crashed.message == "a: run crashed: KeyError: 'a bug in the listing' (its traceback is logged)"
    assert (healthy.name, healthy.exit_code, healthy.report.status) == ("b", 0, "completed")
    assert healthy.report.counts["deposited"] == 1
    logged = [r for r in caplog.records if r.exc_info]
    assert [(r.getMessage(), r.exc_info[0]) for r in logged] == [("a: run crashed", KeyError)]
    with Ledger.open(config, read_only=True) as ledger:
        run = ledger.runs("a", limit=1)[0]
    assert (run.status, run.note) == ("crashed", "KeyError: 'a bug in the listing'")


def test_an_interrupt_from_a_listing_still_ends_the_whole_harvest(configure, tmp_path):
    config = load_config(configure(a=(tmp_path / "none", "KeyboardInterrupt"), b=masters(tmp_path / "b", 1, 1)))
    runs = harvest_pipelines(config)
    with pytest.raises(KeyboardInterrupt):
        next(runs)
    assert not (tmp_path / "store-b").exists()


def test_the_cli_exits_1_naming_the_crashed_pipeline_and_runs_the_others(configure, tmp_path):
    config = configure(a=(tmp_path / "none", "KeyError"), b=tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPOSITORY)])}  # `declare`'s
    done = subprocess.run([GCIS, "--config", str(config), "harvest"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("Traceback") == 1 and "KeyError: 'a bug in the listing'" in done.stderr
    assert "a: run crashed: KeyError: 'a bug in the listing' (its traceback is logged)" in done.stderr + done.stdout
    assert "b: run 2 completed" in done.stdout


def test_a_dry_run_plans_what_a_run_with_the_same_limit_processes_skips_not_counted(configure, tmp_path):
    config_file = configure(p=masters(tmp_path / "masters", 2, 2))
    config = load_config(config_file)
    first = harvest(config, "p", HarvestOptions(limit=1))
    assert (first.counts["deposited"], first.checkpoint_after) == (1, MOVED_IN.isoformat())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPOSITORY)])}  # `declare`'s
    said = subprocess.run([GCIS, "--config", str(config_file), "harvest", "--dry-run", "--limit", "1"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert said.returncode == 0, said.stderr
    assert re.search(rf"would process 1 items, skip 1 \(since [^)]*\); {AT_LIMIT}1 item$", said.stdout.rstrip()), \
        said.stdout

    dry = harvest(config, "p", HarvestOptions(dry_run=True, limit=2))
    assert [(p.item_id, p.action) for p in dry.planned] == [("o0/p0.tif", "skip"), ("o0/p1.tif", "process"),
                                                            ("o1/p0.tif", "process")]
    assert dry.note == f"{AT_LIMIT}2 items"
    run = harvest(config, "p", HarvestOptions(limit=2))
    with Ledger.open(config, read_only=True) as ledger:
        deposited = {i.item_id for i in ledger.run_items(run.run_id, "deposited")}
    assert deposited == {p.item_id for p in dry.planned if p.action == "process"}
    assert run.note.startswith(dry.note)

    assert harvest(config, "p", HarvestOptions(dry_run=True, limit=5)).note is None  # one item left: not cut short


@pytest.mark.parametrize("options, error, message", [
    ({"limit": 0}, ValueError, "HarvestOptions.limit must be at least 1 item (or None for no limit), not 0"),
    ({"limit": -3}, ValueError, "HarvestOptions.limit must be at least 1 item"),
    ({"max_run_minutes": 0}, ValueError, "HarvestOptions.max_run_minutes must be more than 0"),
    ({"max_run_minutes": -1.5}, ValueError, "HarvestOptions.max_run_minutes must be more than 0"),
    ({"object_ids": "o1"}, TypeError, "HarvestOptions.object_ids is a tuple of object ids: ('o1',), not 'o1'"),
])
def test_harvest_options_a_run_would_read_wrongly_are_refused(options, error, message):
    with pytest.raises(error) as raised:
        HarvestOptions(**options)
    assert str(raised.value).startswith(message)


def test_an_object_moved_in_and_left_unsettled_bounds_the_checkpoint_at_its_listing_date(configure, tmp_path):
    """Cut short at its limit after the first of the object's two items, the run leaves the object unsettled: the
    checkpoint goes to where the listing has it, not back to its masters' old modification time."""
    config = load_config(configure(p=masters(tmp_path / "masters", 1, 2)))
    report = harvest(config, "p", HarvestOptions(limit=1))
    assert (report.status, report.counts["deposited"]) == ("stopped", 1)
    assert report.checkpoint_after == MOVED_IN.isoformat()
    with Ledger.open(config, read_only=True) as ledger:
        assert ledger.checkpoint("p") == MOVED_IN


def test_one_celery_task_left_in_its_queue_is_worded_as_one(tmp_path, minio, redis_server, celery_workers, aws_env):
    """No worker serves the run: its time limit leaves the one task it sent in the queue."""
    pool = Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=1, per_object=1),
                celery_workers)
    config = pool.config("one", pipeline={"executor": "celery", "concurrency": 1}, visibility_timeout_seconds=600)
    done = subprocess.run([GCIS, "--config", str(config), "harvest", "demo", "--max-minutes", "0.2"],
                          capture_output=True, text=True, env={**os.environ, **pool.env}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 task not started yet stays in its queue: a worker runs it, and the next run takes its outcome " \
           "(kept 72 hours)" in done.stderr
