"""A result backend restarted empty must not make a task run twice, and a task nobody waits for any more must leave
no outcome. Walk (RabbitMQ broker, Redis result backend): Redis restarted empty while w2 converted an item; the
harvest, seeing PENDING, sent the task again at once ("lost by the broker"), though RabbitMQ had lost nothing: w1
converted the item while w2 still did, the harvest took w2's outcome and forgot it, then w1 recorded a SUCCESS kept
72 h that a later submission of the same work would take for its own. A message still queued ran twice too."""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import redis as redis_client

from gcis_etl.config import load_config
from gcis_etl.work import Outcome
from gcis_etl.worker import CeleryExecutor, _one_server, celery_app, celery_task_id
from tests.broker import Pool, make_masters, received, slow_master, tasks_of
from tests.harvests import wait_for


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """One object: a small master and two that take a second or so to convert."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    for name in ("a", "b"):
        slow_master(masters / "obj00" / f"{name}.tif", size=3000)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def started_pid(app, task_id: str) -> int:
    """The pool process running the task, once it has recorded STARTED."""
    def pid():
        meta = app.backend.get_task_meta(task_id, cache=False)
        return meta["status"] == "STARTED" and meta["result"]["pid"]
    return wait_for(pid, f"{task_id} started")


def started_on(workers, ids: dict[str, str]) -> list[str]:
    """The hostname of the worker whose log shows each of a.tif's and b.tif's tasks received."""
    return [next(f"{w.name}@{socket.gethostname()}" for w in workers if f"[{ids[name]}] received" in w.log_text())
            for name in ("a.tif", "b.tif")]


def ended(workers, task_id: str) -> int:
    """How many of the task's deliveries ran to their end (recorded or not), or were not run."""
    return sum(w.log_text().count(f"[{task_id}] succeeded in") + w.log_text().count(f"[{task_id}] ignored")
               for w in workers)


def raw_meta(app, task_id: str) -> bytes | None:
    return redis_client.Redis.from_url(app.conf.result_backend).get(f"celery-task-meta-{task_id}")


def test_a_result_backend_restarted_empty_under_rabbitmq_makes_no_task_run_twice(rabbitmq_server, pool, caplog):
    config = pool.config("remark", broker_url=rabbitmq_server.url(), result_backend=pool.redis.url())
    workers = [pool.start("w1", config), pool.start("w2", config)]
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    tasks = {t.item.id.rsplit("/", 1)[1]: t for t in tasks_of(pipeline)}
    ids = {name: celery_task_id(task) for name, task in tasks.items()}
    watcher = celery_app(settings.celery)
    executor = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
    pids = []
    for name in ("a.tif", "b.tif"):  # one on each worker (one pool process each, one message each at a time)
        assert executor.submit(tasks[name]) == []
        pids.append(started_pid(watcher, ids[name]))
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # both running while the result backend is empty, and the harvest looks
    time.sleep(2 * settings.celery.poll_seconds)
    assert executor.submit(tasks["p00.tif"]) == []  # queued in RabbitMQ; the harvest sees who runs a and b
    pool.redis.restart()  # no persistence: every marker is gone; RabbitMQ keeps its messages

    results: list = []
    runner = threading.Thread(target=lambda: results.extend(executor.drain()), daemon=True)
    runner.start()
    try:
        wait_for(lambda: all(watcher.backend.get_task_meta(i, cache=False)["status"] != "PENDING"
                             for i in ids.values()), "every marker back")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    runner.join(120)
    executor.close()
    assert {r.item_id.rsplit("/", 1)[1]: r.outcome for r in results} == {n: Outcome.DEPOSITED for n in tasks}

    hosts = {name: started for name, started in zip(("a.tif", "b.tif"), started_on(workers, ids))}
    for name, task_id in ids.items():
        wait_for(lambda: ended(workers, task_id) == received(workers, task_id), f"every delivery of {name} ended")
        assert raw_meta(watcher, task_id) is None, name  # taken, forgotten: no outcome left behind
        named = f" {tasks[name].item.id}"  # the item id alone (models.item_label)
        if name == "p00.tif":  # queued: sent again at once (a worker may have dropped its message meanwhile)
            assert f"{named}: task lost by the broker; sending it again" in caplog.text
            continue
        assert received(workers, task_id) == 1, name  # running: converted once
        assert (f"{named}: task {task_id} has no marker in the result backend ({pool.redis.url()}: restarted "
                f"empty?); the broker (amqp://guest:***@127.0.0.1:{rabbitmq_server.port}//) keeps its message: "
                f"marker put back (STARTED by {hosts[name]}), waiting for it") in caplog.text
    watcher.close()


@pytest.mark.parametrize("end", ["finishes", "hard-time-limit", "pool-process-killed"])
def test_a_task_whose_outcome_was_taken_meanwhile_records_nothing_when_it_ends(pool, end):
    """Its outcome taken from another message and forgotten by the harvest while it runs: however the task ends,
    no outcome (nor a RETRY, whose new message would run) is left for a later submission to take."""
    limits = {"soft_seconds": 1, "hard_seconds": 2} if end == "hard-time-limit" else {}
    config = pool.config("late", **({"time_limits": {"default": limits}} if limits else {}))
    worker = pool.start("w1", config)
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    task = next(t for t in tasks_of(pipeline) if t.item.id.endswith("/a.tif"))
    task_id = celery_task_id(task)
    watcher = celery_app(settings.celery)
    executor = CeleryExecutor({"demo": pipeline}, 2, Path("unused"), settings.celery)
    assert executor.submit(task) == []
    pid = started_pid(watcher, task_id)
    os.kill(pid, signal.SIGSTOP)  # stopped: neither its limits nor its end can come before the forget
    watcher.backend.forget(task_id)
    if end == "finishes":
        os.kill(pid, signal.SIGCONT)
        state = "SUCCESS"
    elif end == "pool-process-killed":
        os.kill(pid, signal.SIGKILL)  # Celery sends the task again (task_retry_on_worker_lost) and records RETRY
        state = "RETRY"
        wait_for(lambda: received([worker], task_id) == 2, "the task sent again")
    else:
        state = "FAILURE"  # the hard time limit: recorded by the worker's main process
    named = f"demo/{task.item.id}: task {task_id}"
    skipped = f"{named}: its {state} not recorded, nobody waits for it"
    wait_for(lambda: skipped in worker.log_text() or raw_meta(watcher, task_id), f"its {state} recorded or not")
    assert raw_meta(watcher, task_id) is None
    assert skipped in worker.log_text()
    if end == "pool-process-killed":
        wait_for(lambda: f"{named} not run, nobody waits for it" in worker.log_text(), "the new message not run")
        assert raw_meta(watcher, task_id) is None
    executor.app.close()
    watcher.close()


def test_the_broker_and_the_result_backend_are_one_server_by_host_and_port_whatever_the_database():
    assert _one_server("redis://h/0", "redis://h:6379/1")
    assert _one_server("rediss://:pw@h:6379/0", "redis://h/2")
    assert _one_server("sentinel://a:26379;sentinel://b", "sentinel://b:26379;sentinel://c")
    assert not _one_server("redis://h:6380/0", "redis://h:6379/0")
    assert not _one_server("redis://g/0", "redis://h/0")
    assert not _one_server("amqp://guest:guest@h:5672//", "redis://h:6379/0")
    assert not _one_server("sentinel://h:26379", "redis://h:26379/0")


def test_a_task_waited_for_still_records_its_hard_time_limit(pool):
    """The same gate lets a failure through when it is waited for: recorded by the worker's main process."""
    config = pool.config("waited", time_limits={"default": {"soft_seconds": 1, "hard_seconds": 2}})
    pool.start("w1", config)
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    task = next(t for t in tasks_of(pipeline) if t.item.id.endswith("/a.tif"))
    executor = CeleryExecutor({"demo": pipeline}, 2, Path("unused"), settings.celery)
    assert executor.submit(task) == []
    os.kill(started_pid(executor.app, celery_task_id(task)), signal.SIGSTOP)  # past its soft limit, to the hard
    (result,) = list(executor.drain())
    executor.close()
    assert (result.outcome, result.reason) == (Outcome.FAILED, "took longer than the hard time limit of 2 s for "
                                                               f"recipe {task.recipe}")
