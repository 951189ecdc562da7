"""gcis-etl installed anew under a running Celery pool and its harvests (a walk of a rolling deploy): a worker
upgraded under it refused every task of every run until restarted by hand (systemd's Restart=always never fired),
naming one of its pool processes, whose pid restarted nothing; its refusals were logged as tasks that succeeded;
a harvest was asked to "restart this worker"; a Celery harvest upgraded under it noticed nothing; a worker
refusing a task for a recipe or config.yaml that changed named only its host and blamed itself."""
from __future__ import annotations

import logging
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from gcis_etl.config import load_config
from gcis_etl.harvesting import RunHalted, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.work import Outcome, Worker
from gcis_etl.worker import CeleryExecutor
from tests.broker import make_masters, pool_config, tasks_of
from tests.test_celery_drift import variant
from tests.test_upgrade_in_place import NEEDS_NEW_ISOLATION, REPO, another_version, changed, python

HARVEST_UPGRADED = re.compile(r"gcis-etl was upgraded under this harvest \(-c, pid \d+ on .+\) since it started: run "
                              r"again \(no item's attempt was counted\)")
HARVEST_IN = """
import sys
from pathlib import Path
from gcis_etl.config import load_config
from gcis_etl.harvesting import RunHalted, harvest
from tests.test_upgrade_in_place import NEEDS_NEW_ISOLATION, changed
changed(Path(sys.argv[2]), NEEDS_NEW_ISOLATION)
try:
    report = harvest(load_config(sys.argv[1]), "demo")
    print(report.status, report.counts)
except RunHalted as exc:
    print(exc)
"""
WORKER_IN = """
import sys
from pathlib import Path
from gcis_etl.config import load_config
from gcis_etl.work import Worker
from tests.broker import tasks_of
from tests.test_upgrade_in_place import NEEDS_NEW_ISOLATION, changed
planned = load_config(sys.argv[1]).pipeline("demo")
task = tasks_of(planned)[0]
changed(Path(sys.argv[2]), NEEDS_NEW_ISOLATION)
with Worker({"demo": planned}, Path(sys.argv[3]), node="w9@rack4") as worker:
    refused = worker.process(task)
print(refused.stops_run, refused.reason)
"""


def test_a_celery_worker_upgraded_under_it_stops_itself_and_its_task_waits_for_a_worker_on_the_new_files(
        tmp_path, redis_server, celery_workers):
    """The run goes on: the task goes back to its queue untouched, the worker shuts down (warm, exit 0) for its
    supervisor to start it again, saying why at ERROR and naming its node and main process."""
    other = another_version(tmp_path)
    masters = make_masters(tmp_path / "masters", objects=1, per_object=2)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(tmp_path / "store")}, pipeline={"executor": "celery"})
    (other / "sitecustomize.py").write_text("import gcis_etl\n")  # celery puts this checkout first on the path
    stale = celery_workers("w1", config, {"PYTHONPATH": str(other)})
    changed(other, NEEDS_NEW_ISOLATION)

    with ThreadPoolExecutor(1) as running:
        harvested = running.submit(harvest, load_config(config), "demo")
        assert stale.proc.wait(120) == 0, stale.log_text()
        assert not harvested.done()
        celery_workers("w2", config, {})  # as its supervisor would: on the files as they are now
        report = harvested.result(300)

    assert report.counts.get("deposited") == 2, report
    with Ledger.open(load_config(config)) as ledger:
        assert {(i.status, i.attempts) for i in ledger.items("demo")} == {("deposited", 0)}  # no attempt counted
    host = socket.gethostname()
    logged = stale.log_text()
    assert (f" ERROR/ForkPoolWorker-1] demo/obj00/p00.tif: gcis-etl was upgraded under the Celery worker "
            f"w1@{host}, pid {stale.proc.pid} on {host} since it started: the worker stops itself (warm shutdown), for "
            f"its supervisor to start it again on the new files; the task goes back to its queue\n") in logged, logged
    assert "reject requeue=True: gcis-etl was upgraded under this worker\n" in logged and "Traceback" not in logged


def test_a_local_harvest_upgraded_under_it_is_told_to_run_again(tmp_path):
    other = another_version(tmp_path)
    masters = make_masters(tmp_path / "masters", objects=1, per_object=2)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    run = python(HARVEST_IN, str(config), str(other), cwd=tmp_path, path=[other, REPO])
    assert run.returncode == 0, run.stdout + run.stderr
    assert HARVEST_UPGRADED.fullmatch(run.stdout.strip()), run.stdout
    with Ledger.open(load_config(config)) as ledger:
        assert ledger.items("demo") == []  # nothing recorded: no attempt counted


def test_a_celery_worker_upgraded_while_it_starts_a_task_stops_the_run_and_says_it_stops_itself(tmp_path):
    """Between process_item's check (which puts the task back) and the conversion: the task is STARTED, so the run
    stops (the harvest would send it again), and the reason says the worker stops itself and what to do next."""
    other = another_version(tmp_path)
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    run = python(WORKER_IN, str(config), str(other), str(tmp_path / "scratch"), cwd=tmp_path, path=[other, REPO])
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.fullmatch(r"True gcis-etl was upgraded under -c, pid \d+ on .+ since it started: it stops itself, for "
                        r"its supervisor to start it again on the new files \(`celery -A gcis_etl\.worker status` "
                        r"lists the workers running\); then run the harvest again \(no item's attempt was "
                        r"counted\)", run.stdout.strip()), run.stdout


def test_a_celery_harvest_upgraded_under_it_stops_before_sending_a_task(tmp_path, redis_server, celery_workers):
    """As a harvest of the local executor: the orchestrator's own next import would be the new files'."""
    other = another_version(tmp_path)
    masters = make_masters(tmp_path / "masters", objects=1, per_object=2)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(tmp_path / "store")}, pipeline={"executor": "celery"})
    worker = celery_workers("w1", config, {})
    run = python(HARVEST_IN, str(config), str(other), cwd=tmp_path, path=[other, REPO])
    assert run.returncode == 0, run.stdout + run.stderr
    assert HARVEST_UPGRADED.fullmatch(run.stdout.strip()), run.stdout
    assert "] received" not in worker.log_text()
    with Ledger.open(load_config(config)) as ledger:
        assert ledger.items("demo") == []


def test_a_worker_refusing_a_task_of_another_recipe_names_its_node_and_either_side_as_stale(tmp_path):
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    planned = load_config(config).pipeline("demo")
    task = replace(tasks_of(planned)[0], recipe_digest="0" * 16)
    with Worker({"demo": planned}, tmp_path / "scratch", node="w9@rack4") as worker:
        refused = worker.process(task)
    assert (refused.outcome, refused.stops_run) == (Outcome.FAILED, True)
    assert refused.reason == (
        f"recipe {task.recipe!r} on the worker w9@rack4 has digest {planned.recipe.digest}, the task was planned "
        f"with {'0' * 16}: restart every worker with the config.yaml and recipes of the harvest's machine, then run "
        f"the harvest again: either side may be the stale one (a worker reads them as it starts, a harvest as it "
        f"begins) (no item's attempt was counted)")


def test_a_celery_worker_logs_a_refusal_that_stops_the_run_as_an_error(tmp_path, redis_server, celery_workers):
    """Celery logs the task as succeeded, at INFO: the worker's log said nothing more."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(tmp_path / "store")}, pipeline={"executor": "celery"})
    worker = celery_workers("w1", variant(config, "worker.yaml", imaging={"max_megapixels": 500}), {})
    with pytest.raises(RunHalted) as halted:
        harvest(load_config(config), "demo")
    errors = [line for line in worker.log_text().splitlines() if " ERROR" in line]
    assert len(errors) == 1, worker.log_text()
    assert errors[0].endswith(f"demo/obj00/p00.tif: the harvest stops: {halted.value}"), errors
    assert f"the worker w1@{socket.gethostname()} are not those" in str(halted.value)


def test_a_task_queued_while_no_worker_consumes_its_queue_waits_for_one_neither_sent_again_nor_failed(
        tmp_path, redis_server, celery_workers, caplog):
    """Every worker stopped for an upgrade: the run sent the task again after twice the visibility timeout (a second
    message in the queue), and after max_resends failed its item, an attempt counted, saying only "no progress"."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = pool_config(tmp_path / "config.yaml", masters=masters, broker_url=redis_server.url(),
                         store={"kind": "local", "root": str(tmp_path / "store")},
                         celery={"max_resends": 0, "visibility_timeout_seconds": 5,  # a patience of 10 s
                                 "time_limits": {"default": {"soft_seconds": 3, "hard_seconds": 4}}})
    pipeline = load_config(config).pipeline("demo")
    caplog.set_level(logging.WARNING)
    executor = CeleryExecutor({"demo": pipeline}, 2, tmp_path / "unused", load_config(config).celery)
    executor.check()
    assert executor.submit(tasks_of(pipeline)[0]) == []
    queue = executor.settings.queue_for(pipeline.recipe)
    waiting = f"no Celery worker consumes queue {queue}: its tasks wait there, and the run with them, until one does"

    with ThreadPoolExecutor(1) as running:
        drained = running.submit(lambda: list(executor.drain()))
        while waiting not in caplog.text and not drained.done():
            time.sleep(0.2)
        assert not drained.done(), drained.result()
        celery_workers("w1", config, {})
        results = drained.result(300)
    executor.close()

    assert [(r.outcome, r.attempt) for r in results] == [(Outcome.DEPOSITED, 1)], results
    assert caplog.text.count(waiting) == 1, caplog.text
    assert "sending it again" not in caplog.text
