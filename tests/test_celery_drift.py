"""A worker whose config.yaml differs from the harvest's in what it does to an item beside the recipe: another store
(a walk: `prefix: cf2-other` on one worker put 172 access masters where the harvest's manifests do not look, and
the run said "completed"), other imaging or isolation settings. The task carries the harvest's digests of them."""
from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import RunHalted, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.work import ItemTask, Outcome, Worker
from tests.broker import make_masters, pool_config, tasks_of

REDEPLOY = ("restart every worker with the config.yaml and recipes of the harvest's machine, then run the harvest "
            "again: either side may be the stale one (a worker reads them as it starts, a harvest as it begins) (no "
            "item's attempt was counted)")
DIFFER = ("the config.yaml files differ, or the harvest and the worker run different versions of gcis-etl (a release "
          "that adds a setting changes what is compared)")


def variant(config: Path, name: str, **pipeline: object) -> Path:
    """A copy of `config` whose pipeline `demo` has the keys `pipeline` changes: what a worker deployed with
    another config.yaml reads."""
    document = yaml.safe_load(config.read_text())
    document["pipelines"]["demo"].update(pipeline)
    path = config.with_name(name)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def test_a_worker_with_another_store_stops_the_run_deposits_nothing_and_once_restarted_completes_it(
        tmp_path, redis_server, celery_workers):
    masters = make_masters(tmp_path / "masters", objects=2, per_object=2)
    store, other = tmp_path / "store", tmp_path / "other-store"
    store.mkdir()
    other.mkdir()
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(store)}, pipeline={"executor": "celery"})
    drifted = variant(config, "worker.yaml", store={"kind": "local", "root": str(other)})
    worker = celery_workers("w1", drifted, {})

    with pytest.raises(RunHalted) as halted:
        harvest(load_config(config), "demo")
    assert str(halted.value) == (f"the store settings of pipeline 'demo' on the worker w1@{socket.gethostname()} "
                                 f"are not those the task was planned with: {DIFFER}: {REDEPLOY}")
    assert files(other) == [] and files(store) == []
    with Ledger.open(load_config(config)) as ledger:
        assert ledger.items("demo") == []  # no attempt counted

    worker.stop()
    celery_workers("w2", config, {})
    report = harvest(load_config(config), "demo")
    assert (report.status, report.counts["deposited"]) == ("completed", 4)
    assert files(other) == []
    assert len([path for path in files(store) if path.suffix == ".tif"]) == 4


def test_a_worker_converting_under_other_imaging_and_isolation_settings_refuses_the_task_naming_both(tmp_path):
    """A task from a harvest older than the digests (none in it, still in the queue) is done as before."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    drifted = variant(config, "worker.yaml", imaging={"max_megapixels": 500}, isolation={"timeout_seconds": 60})
    planned = load_config(config).pipeline("demo")
    task = replace(tasks_of(planned)[0], settings=planned.worker_digests)
    older = task.to_dict()
    del older["settings"]
    with Worker({"demo": load_config(drifted).pipeline("demo")}, tmp_path / "scratch") as worker:
        refused = worker.process(ItemTask.from_dict(task.to_dict()))  # as it crosses the broker
        done = worker.process(ItemTask.from_dict(older))
    assert (refused.outcome, refused.stops_run, refused.transient) == (Outcome.FAILED, True, False)
    assert refused.reason == (f"the imaging and isolation settings of pipeline 'demo' on the worker on "
                              f"{socket.gethostname()} are not those the task was planned with: {DIFFER}: {REDEPLOY}")
    assert done.outcome is Outcome.DEPOSITED, done.reason


def test_the_store_digest_counts_where_objects_go_not_the_hosts_credentials_or_transfer_tuning(tmp_path):
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    store = {"kind": "s3", "bucket": "cf2", "prefix": "cf2", "endpoint_url": "http://127.0.0.1:9", "profile": "a"}
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0", store=store)
    digests = {name: load_config(path).pipeline("demo").worker_digests for name, path in {
        "same": config,
        "profile": variant(config, "profile.yaml", store={**store, "profile": "b"}),
        "tuning": variant(config, "tuning.yaml", store={**store, "max_bandwidth": 1000000, "max_concurrency": 2,
                                                        "retry": {"max_attempts": 9}}),
        "prefix": variant(config, "prefix.yaml", store={**store, "prefix": "cf2-other"}),
        "endpoint": variant(config, "endpoint.yaml", store={**store, "endpoint_url": "http://127.0.0.2:9"}),
        "keys": variant(config, "keys.yaml", store={**store, "keys": {"image": "{pipeline}/{object_id}/{item_id}.jp2"
                                                                             ".{ext}"}}),
    }.items()}
    assert digests["profile"] == digests["same"] == digests["tuning"]  # a host's credentials, how it transfers
    for changed in ("prefix", "endpoint", "keys"):
        assert digests[changed]["store"] != digests["same"]["store"], changed
        assert {k: v for k, v in digests[changed].items() if k != "store"} == \
            {k: v for k, v in digests["same"].items() if k != "store"}


def test_an_outcome_planned_under_other_settings_is_not_taken_for_this_work(tmp_path):
    """A task's id is how a run finds an earlier run's outcome in the result backend: one deposited under another
    store prefix (the settings changed between the runs) must not be taken as this task's."""
    from gcis_etl.worker import celery_task_id
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    pipeline = load_config(pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                                       store={"kind": "local", "root": str(tmp_path / "store")})).pipeline("demo")
    (task,) = tasks_of(pipeline)
    moved = replace(task, settings={**task.settings, "store": "0" * 16})
    assert celery_task_id(moved) != celery_task_id(task) == celery_task_id(replace(task))
