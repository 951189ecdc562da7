"""A pool running two versions of gcis-etl (a walk: a worker older than the task's `settings` failed every task it
took with `TypeError: ItemTask.__init__() got an unexpected keyword argument 'settings'`, counted as the item's
failure, and 12 items were out of attempts after 3 runs; new workers did the same to a much older harvest's tasks,
whose items had `mime_type`). A task or an outcome one side cannot read stops the run, counting no attempt, naming
the fields, the worker and what to do. Workers of other versions are real workers with, from GCIS_PEER's module,
the item task of such a version."""
from __future__ import annotations

import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gcis_etl.config import load_config
from gcis_etl.distributed import TASK_NAME
from gcis_etl.harvesting import RunHalted, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.work import ItemResult, ItemTask, Outcome
from gcis_etl.worker import SENT, CeleryExecutor, celery_app
from tests.broker import make_masters, pool_config, run_all, tasks_of

UPGRADE = ("the harvest and the worker run different versions of gcis-etl: upgrade the workers first, then the "
           "harvests; or stop the harvests, let the queues drain and upgrade all (README: Worker pool, Upgrading); "
           "then run again (no item's attempt was counted)")

PEERS = '''
"""The item task of a worker of another version (GCIS_PEER), installed over this version's (celery worker -I)."""
import os
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from connectors import base
from gcis_etl.distributed import TASK_NAME
from gcis_etl.worker import app


@dataclass(frozen=True)
class ItemTask:  # before 3488685: no settings
    pipeline: str
    object_id: str
    item: Any
    recipe: str
    recipe_digest: str
    attempt: int = 1
    force: bool = False


@dataclass(frozen=True)
class SourceItem:  # when items had a mime_type
    id: str
    sequence: int
    original_name: str
    size: Any
    modified: Any
    mime_type: str
    fixity: Any = None
    label: Any = None
    locator: str = ""


def older(payload):
    """Its from_dict built each dataclass with cls(**data)."""
    time.sleep(float(os.environ.get("GCIS_PEER_DELAY", "0")))
    items = SourceItem if os.environ["GCIS_PEER"] == "mime_type" else base.SourceItem
    return ItemTask(**{**payload, "item": items(**payload["item"])})


task = app.tasks[TASK_NAME]
ours = task.run


def newer(payload):
    return {**ours(payload), "colour_profile": "sRGB"}  # a field a later ItemResult has


if os.environ["GCIS_PEER"] == "newer":
    task.run = newer
else:  # older versions left STARTED to Celery (task_track_started), before the task's code
    task.run, task.track_started = older, True
'''


@pytest.fixture
def setup(tmp_path, redis_server):
    """Masters, a config.yaml, and its store's folder."""
    masters = make_masters(tmp_path / "masters", objects=2, per_object=2)
    store = tmp_path / "store"
    store.mkdir()
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(store)}, pipeline={"executor": "celery"})
    (tmp_path / "peers.py").write_text(PEERS)
    return config, store


def peer(celery_workers, tmp_path: Path, config: Path, name: str, version: str, delay: float = 0):
    return celery_workers(name, config, {"PYTHONPATH": str(tmp_path), "GCIS_PEER": version,
                                         "GCIS_PEER_DELAY": str(delay)}, "-I", "peers")


def halted_by(config: Path) -> str:
    with pytest.raises(RunHalted) as halted:
        harvest(load_config(config), "demo")
    with Ledger.open(load_config(config)) as ledger:
        assert ledger.items("demo") == []  # no attempt counted
    return str(halted.value)


def named(reason: str, worker, said: str) -> None:
    """The run's reason is `said`, then UPGRADE, where {worker} names the worker: its node when the harvest saw it
    start the task, else a task whose failure its log shows."""
    who = r"(?:the worker (\S+)|the worker that logged task (gcis-[0-9a-f]+))"
    found = re.fullmatch(re.escape(f"{said}: {UPGRADE}").replace(re.escape("{worker}"), who), reason)
    assert found, reason
    node, task_id = found[1], found[2]
    if node:
        assert node == f"{worker.name}@{socket.gethostname()}"
    else:
        assert f"Task {TASK_NAME}[{task_id}] raised unexpected" in worker.log_text()  # as README says


def test_workers_older_than_the_harvest_stop_the_run_naming_themselves_and_what_to_do(
        tmp_path, setup, celery_workers):
    config, store = setup
    worker = peer(celery_workers, tmp_path, config, "old", "3488685", delay=1)  # long enough to be seen starting
    assert halted_by(config) == (f"the worker old@{socket.gethostname()} cannot read the task (unknown fields "
                                 f"settings): {UPGRADE}")
    worker.stop()

    worker = peer(celery_workers, tmp_path, config, "older", "mime_type")  # fails at once: maybe never seen
    named(halted_by(config), worker, "{worker} cannot read the task (missing fields item.mime_type)")
    worker.stop()
    assert list(store.rglob("*.tif")) == []

    celery_workers("w1", config, {})
    report = harvest(load_config(config), "demo")
    assert (report.status, report.counts["deposited"]) == ("completed", 4)


def test_a_newer_workers_outcome_stops_the_run_and_the_next_run_takes_its_deposits(tmp_path, setup, celery_workers):
    config, store = setup
    worker = peer(celery_workers, tmp_path, config, "new", "newer")
    named(halted_by(config), worker,
          "the harvest cannot read the outcome of {worker} (unknown fields colour_profile)")
    worker.stop()

    celery_workers("w1", config, {})
    report = harvest(load_config(config), "demo")
    assert (report.status, report.counts["deposited"]) == ("completed", 4)
    assert len(list(store.rglob("*.tif"))) == 4


def sent_as_a_harvest(app, payload: dict):
    """The task sent as a harvest sends it, its SENT marker first: a worker does not run a task nobody waits for."""
    task_id = f"gcis-{uuid.uuid4().hex}"
    app.backend.store_result(task_id, None, SENT)
    return app.send_task(TASK_NAME, (payload,), task_id=task_id)


@dataclass(frozen=True)
class NewerTask(ItemTask):
    """A task of a later version, with a field this one does not have."""

    priority: int = 5


def test_a_task_this_worker_cannot_read_is_not_the_items_failure(tmp_path, setup, celery_workers):
    config, store = setup
    celery_workers("w1", config, {})
    node = f"w1@{socket.gethostname()}"
    pipeline = load_config(config).pipeline("demo")
    task, *_ = tasks_of(pipeline)
    executor = CeleryExecutor({"demo": pipeline}, concurrency=2, scratch=tmp_path / "scratch")
    (newer,) = run_all(executor, [NewerTask(**vars(task))])  # as a harvest of a later version sends it
    assert (newer.outcome, newer.stops_run, newer.item_id) == (Outcome.FAILED, True, task.item.id)
    assert newer.reason == f"the worker {node} cannot read the task (unknown fields priority): {UPGRADE}"

    sent = task.to_dict()
    older = {**sent, "item": {**sent["item"], "mime_type": "image/tiff"}}  # a much older harvest's
    unfinished = {**sent, "item": {**{k: v for k, v in sent["item"].items() if k != "original_name"},
                                   "fixity": {"algorithm": "md5", "value": "0" * 32, "signed": True}}}
    app = celery_app(load_config(config).celery)
    try:
        replies = [ItemResult.from_dict(sent_as_a_harvest(app, payload).get(timeout=60))
                   for payload in (older, unfinished)]
    finally:
        app.close()
    assert [(r.outcome, r.stops_run, r.item_id) for r in replies] == [(Outcome.FAILED, True, task.item.id)] * 2
    assert [r.reason for r in replies] == [
        f"the worker {node} cannot read the task (unknown fields item.mime_type): {UPGRADE}",
        f"the worker {node} cannot read the task (unknown fields item.fixity.signed; missing fields "
        f"item.original_name): {UPGRADE}"]
    assert list(store.rglob("*.tif")) == []
