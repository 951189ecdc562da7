"""Slips of a harvest that read-only walks found: a custom connector's bug in its listing ended every pipeline's
run (a raw traceback, the later pipelines never started); a dry run ignored --limit; HarvestOptions took a limit of
0 or a str of ids; an object moved into the source with an old modification time, left waiting on an item by a
run cut short, held the checkpoint back at that old time; the Celery executor worded one task left as several.
And of what a run cannot publish or take as listed: a manifest or collection key the store would not write stopped
every run; an object whose items share an id crashed the run, one with a time with no timezone too; a second object
listed under an id was taken for a listing that moved while paged; HarvestOptions took a since of "7d", and
harvest_pipelines a str of names.

The sources are connectors of this module, declared in the `gcis_etl.connectors` entry points of a distribution
written into tmp_path (the `declare` fixture), as tests/test_custom_connector.py declares one.
"""
from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import pytest
import yaml

from connectors.base import FetchedFile, SourceItem, SourceObject
from gcis_etl.config import load_config
from gcis_etl.errors import StoreFull
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
    quirk: str | None = None   # a connector's slip in what the listing gives: see MovedIn.changes


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
            objects = list(self.get(sorted(p.name for p in self.settings.folder.iterdir())))
            first, quirk = objects[0] if objects else None, self.settings.quirk
            if quirk == "naive":  # o0's modified time with no timezone
                objects[0] = replace(first, modified=first.modified.replace(tzinfo=None))
            elif quirk == "shared-item":  # o0's items all under the id of its first
                objects[0] = replace(first, items=tuple(replace(i, id=first.items[0].id) for i in first.items))
            elif quirk == "twin":  # o1 under o0's id, as a folder source makes "o0" of o0.tif and o0.jp2
                objects[1] = replace(objects[1], id=first.id)
            elif quirk == "repeat":  # o0 again at the end, as a listing paged while o0 was edited gives it
                objects.append(first)
            yield from objects

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
    ({"since": "7d"}, TypeError, "HarvestOptions.since is a datetime with a timezone (or None for the checkpoint), "
                                 "not '7d'"),
    ({"since": datetime(2024, 1, 1)}, ValueError, "HarvestOptions.since needs a timezone (tzinfo=timezone.utc for "
                                                  "UTC), not the naive 2024-01-01T00:00:00"),
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
    done = subprocess.run([GCIS, "--config", str(config), "harvest", "demo", "-v", "--max-minutes", "0.2"],
                          capture_output=True, text=True, env={**os.environ, **pool.env}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("demo: 1 task sent and not started yet is left to the workers: the next run takes its outcome (kept 72 "
            "hours), or sends it again if no worker started it within 1200 s of its send") in done.stderr


@pytest.fixture
def with_manifests(tmp_path, declare):
    """with_manifests(folder, quirk=None, **keys): the config of pipeline p, a moved-in source of `folder` (with
    the `quirk` of MovedIn.changes), its images and manifests in the local store tmp_path/store (under the
    store.keys templates `keys`)."""
    declare("moved-in-source", **{"moved-in": f"{__name__}:MovedIn"})

    def write(folder: Path, quirk: str | None = None, **keys: str):
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "source": {"kind": "moved-in", "folder": str(folder), "quirk": quirk},
            "store": {"kind": "local", "root": str(tmp_path / "store"), **({"keys": keys} if keys else {})},
            "manifests": {"manifest_base_url": "http://localhost/store",
                          "image_service_base_url": "http://localhost/iiif"}}}}))
        return load_config(config)
    return write


def collected(store: Path) -> list[str]:
    """The manifest ids the pipeline's IIIF 3 collection lists."""
    return [item["id"] for item in json.loads((store / "collections" / "p-v3.json").read_text())["items"]]


def test_a_manifest_key_the_store_will_not_take_fails_that_object_alone_and_the_next_run_publishes_it(
        with_manifests, tmp_path):
    """A folder in the place of o1's manifest stopped every run: later objects got no manifest, the collection
    and the checkpoint never moved. The others are published now, and o1 holds the checkpoint at its place in
    the listing, so that the next run, the folder gone, publishes it."""
    config = with_manifests(masters(tmp_path / "masters", 3, 1))
    store = tmp_path / "store"
    blocked = store / "p" / "o1" / "manifest-v3.json"
    blocked.mkdir(parents=True)

    report = harvest(config, "p")

    assert (report.status, report.exit_code, report.manifests) == ("completed", 1, 2)
    assert report.counts == {"deposited": 3, "skipped": 0, "rejected": 1, "failed": 0}
    assert collected(store) == ["http://localhost/store/p/o0/manifest-v3.json",
                                "http://localhost/store/p/o2/manifest-v3.json"]
    with Ledger.open(config, read_only=True) as ledger:
        [problem] = ledger.manifest_problems("p")
        assert ledger.checkpoint("p") == MOVED_IN
    assert problem.object_id == "o1"
    assert problem.reason.startswith(f"manifest not published: {blocked}: cannot write: Is a directory")
    assert problem.reason.endswith("; the next run tries again")

    blocked.rmdir()
    again = harvest(config, "p")
    assert (again.exit_code, again.manifests, again.counts["skipped"]) == (0, 1, 3)
    assert json.loads(blocked.read_text())["id"] == "http://localhost/store/p/o1/manifest-v3.json"
    assert len(collected(store)) == 3
    with Ledger.open(config, read_only=True) as ledger:
        assert ledger.manifest_problems("p") == []
        assert ledger.checkpoint("p") > MOVED_IN


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the manifests needs root")
def test_a_full_store_still_stops_the_run_at_a_manifest_and_the_run_is_recorded_as_failed(with_manifests, tmp_path):
    config = with_manifests(masters(tmp_path / "masters", 2, 1), manifest="manifests/{pipeline}/{object_id}.json")
    full = tmp_path / "store" / "manifests"
    full.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        with open(full / "filler", "wb", buffering=0) as filler, pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 4096)
        with pytest.raises(StoreFull, match="cannot write: No space left on device"):
            harvest(config, "p")
    finally:
        subprocess.run(["umount", str(full)], check=True)
    with Ledger.open(config, read_only=True) as ledger:
        assert ledger.runs("p")[0].status == "failed" and ledger.checkpoint("p") is None


def test_a_collection_key_the_store_will_not_take_stops_the_run_once_the_checkpoint_moved(with_manifests, tmp_path):
    """The collection lists what the ledger holds: the next run writes it, though it lists nothing new."""
    config = with_manifests(masters(tmp_path / "masters", 2, 1))
    store = tmp_path / "store"
    blocked = store / "collections" / "p-v3.json"
    blocked.mkdir(parents=True)

    [outcome] = harvest_pipelines(config)

    assert outcome.exit_code == 1
    assert outcome.message.startswith(f"p: run stopped: {blocked}: cannot write: Is a directory")
    assert outcome.message.endswith("(everything settled so far is recorded; run again)")
    with Ledger.open(config, read_only=True) as ledger:
        run, checkpoint = ledger.runs("p")[0], ledger.checkpoint("p")
    assert run.status == "failed" and checkpoint > MOVED_IN and run.checkpoint_after == checkpoint.isoformat()
    assert (store / "p" / "o1" / "manifest-v3.json").is_file()

    blocked.rmdir()
    again = harvest(config, "p")
    assert (again.exit_code, again.counts["deposited"] + again.counts["skipped"]) == (0, 0)
    assert collected(store) == [f"http://localhost/store/p/{o}/manifest-v3.json" for o in ("o0", "o1")]


def test_an_object_whose_items_share_an_id_fails_naming_it_before_any_item_is_sent(with_manifests, tmp_path):
    """Run 1 crashed in settle after publishing a manifest of the first master twice; later runs deposited one and
    skipped the other, which was never deposited nor failed."""
    config = with_manifests(masters(tmp_path / "masters", 2, 2), quirk="shared-item")
    reason = "its items 1, 2 share the id 'o0/p0.tif': each item needs its own"
    assert [(p.object_id, p.item_id, p.action, p.reason) for p in harvest(config, "p", HarvestOptions(
        dry_run=True)).planned if p.object_id == "o0"] == [("o0", "(object)", "fail", reason)]

    report = harvest(config, "p")

    assert report.counts == {"deposited": 2, "skipped": 0, "rejected": 0, "failed": 1}
    with Ledger.open(config, read_only=True) as ledger:
        assert [(i.object_id, i.item_id, i.reason) for i in ledger.run_items(report.run_id, "failed")] == [
            ("o0", "(object)", f"the source cannot describe it: {reason}")]
        assert {i.object_id for i in ledger.items("p") if i.status == "deposited"} == {"o1"}
    assert not (tmp_path / "store" / "p" / "o0").exists()


def test_a_time_with_no_timezone_fails_its_object_naming_the_time(with_manifests, tmp_path):
    """It crashed the run: "can't compare offset-naive and offset-aware datetimes"."""
    config = with_manifests(masters(tmp_path / "masters", 2, 1), quirk="naive")

    report = harvest(config, "p")

    assert report.counts == {"deposited": 1, "skipped": 0, "rejected": 0, "failed": 1}
    with Ledger.open(config, read_only=True) as ledger:
        assert [(i.object_id, i.reason) for i in ledger.run_items(report.run_id, "failed")] == [
            ("o0", "the source cannot describe it: p gave its modified time with no timezone "
                   "(2020-01-01T00:00:00): a source's times must have one")]


def test_a_second_object_under_a_listed_id_fails_in_that_run_where_the_same_one_listed_again_holds_the_checkpoint(
        with_manifests, tmp_path):
    """Two objects under one id (a folder source's o0.tif and o0.jp2) were taken for a listing that moved while
    it was paged: the second dropped silently, the checkpoint held for ever."""
    folder = masters(tmp_path / "masters", 2, 1)
    twin = harvest(with_manifests(folder, quirk="twin"), "p")
    assert twin.counts == {"deposited": 1, "skipped": 0, "rejected": 0, "failed": 1}
    assert twin.note is None and datetime.fromisoformat(twin.checkpoint_after) > MOVED_IN
    with Ledger.open(load_config(tmp_path / "config.yaml"), read_only=True) as ledger:
        assert [(i.object_id, i.item_id, i.reason) for i in ledger.run_items(twin.run_id, "failed")] == [
            ("o0", "(object)", "the source lists two objects under the id 'o0', one of 'o0/p0.tif' and one of "
                               "'o1/p0.tif': the first was taken, this one is left out until the source gives each "
                               "its own id")]

    repeat = harvest(with_manifests(folder, quirk="repeat"), "p")
    assert repeat.counts == {"deposited": 1, "skipped": 1, "rejected": 0, "failed": 0}
    assert "; o0 was listed twice: " in repeat.note and repeat.checkpoint_after is None  # after: listing changed


def test_harvest_pipelines_refuses_a_str_of_names(configure, tmp_path):
    config = load_config(configure(library=masters(tmp_path / "masters", 1, 1)))
    with pytest.raises(TypeError, match=re.escape("names are a sequence of pipeline names: ('library',), not "
                                                  "'library'")):
        list(harvest_pipelines(config, "library"))
