"""What a production walk of the worker pool found: a broker outage while the harvest asks a worker about its task,
a task whose recipe the worker does not know, a recipe edited under a running worker, a worker consuming none of
the task's queue."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis as redis_client
import yaml

from gcis_etl.config import load_config
from gcis_etl.errors import GcisError
from gcis_etl.recipes import recipe_files
from gcis_etl.work import Outcome, Worker
from gcis_etl.worker import WORKER_PING_SECONDS, CeleryExecutor, celery_task_id
from tests.broker import Pool, RedisServer, make_masters, pool_config, run_all, slow_master, tasks_of
from tests.servers import free_port


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    return Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=1, per_object=2),
                celery_workers)


def _started(executor: CeleryExecutor, task_id: str, timeout: float = 60) -> int:
    """The pid of the pool process once it has started the task."""
    deadline = time.monotonic() + timeout
    while (meta := executor.app.backend.get_task_meta(task_id, cache=False))["status"] != "STARTED":
        assert time.monotonic() < deadline, meta
        time.sleep(0.02)
    return meta["result"]["pid"]


# Redis restarted with its data (appendonly yes): the first broadcast after it is back met the pooled connection's
# socket, closed by the old server, and stopped the run ~4 s after Redis was back. A broker down for a few seconds
# stopped it at the first question to the worker, with no retry; one down for good stops it after outage_retries.
@pytest.mark.parametrize("outage", ["restarted-with-its-data", "down-for-seconds", "down-for-good"])
def test_a_broker_outage_while_the_worker_is_asked_about_its_task_is_ridden_out(pool, tmp_path, caplog, outage):
    separate = outage != "restarted-with-its-data"
    broker = RedisServer(tmp_path / "broker", free_port()) if separate else pool.redis
    if separate:
        (tmp_path / "broker").mkdir()
        broker.start()
    try:  # a separate broker stops whatever fails
        masters = tmp_path / "slow-masters"
        slow_master(masters / "big" / "a.tif", size=3000)
        config = pool_config(tmp_path / "outage.yaml", masters=masters, broker_url=broker.url(),
                             store={"kind": "local", "root": str(tmp_path / "store")},
                             celery={"result_backend": pool.redis.url(), "worker_check_seconds": 1,
                                     "time_limits": {"default": {"soft_seconds": 60, "hard_seconds": 70}},
                                     "visibility_timeout_seconds": 80,
                                     "outage_retries": 2 if outage == "down-for-good" else 10})
        pool.start("w1", config)
        settings = load_config(config)
        pipeline = settings.pipeline("demo")
        task = tasks_of(pipeline)[0]
        executor = CeleryExecutor({"demo": pipeline}, 2, Path("unused"), settings.celery)
        executor.check()
        ended: list = []

        def run() -> None:
            try:
                ended.append(run_all(executor, [task]))
            except GcisError as exc:
                ended.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        pid = _started(executor, celery_task_id(task))
        os.kill(pid, signal.SIGSTOP)  # the task stays STARTED while the worker is asked about it, before and after
        try:
            time.sleep(2.5)  # asked at least once on the pooled connection
            if outage == "restarted-with-its-data":
                redis_client.Redis.from_url(broker.url()).save()
                broker.restart()  # kill -9, then started again: it loads what was saved
            else:
                broker.stop()
                time.sleep(3)
                if outage == "down-for-seconds":
                    broker.start()
            runner.join(5 if outage == "down-for-good" else 6)  # asked again: it ends now only if the run stops
        finally:
            os.kill(pid, signal.SIGCONT)
        runner.join(120)
    finally:
        if separate:
            broker.stop()

    assert ended, "the run did not end"
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Failed operation query_task")]
    if outage == "down-for-good":
        assert isinstance(ended[0], GcisError)
        assert str(ended[0]) == (f"the Celery broker or result backend ({broker.url()}, {pool.redis.url()}) cannot be "
                                 f"reached (ConnectionError: Error 111 connecting to 127.0.0.1:{broker.port}. "
                                 f"Connection refused.); tasks already sent keep running on the workers")
        assert retries == [f"Failed operation query_task. Retrying {n} more times. (ConnectionError: Error 111 "
                           f"connecting to 127.0.0.1:{broker.port}. Connection refused.)" for n in (2, 1)]
        return
    assert not isinstance(ended[0], GcisError), ended[0]
    assert [(r.outcome, r.reason) for r in ended[0]] == [(Outcome.DEPOSITED, None)]
    if outage == "down-for-seconds":
        assert retries and retries[0].startswith("Failed operation query_task. Retrying 10 more times. "
                                                 "(ConnectionError: Error 111 connecting to ")


def test_a_worker_that_does_not_know_the_recipe_stops_the_run_naming_its_host(tmp_path):
    """It failed the item (an attempt counted) with "recipe 'ptiff-q80' not found (known: ...)", naming no host:
    a worker deployed apart from the harvest's recipes fails every item alike."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = load_config(pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                                     store={"kind": "local", "root": str(tmp_path / "store")}))
    task = replace(tasks_of(config.pipeline("demo"))[0], recipe="ptiff-q80", recipe_digest="0" * 16)
    with Worker({"demo": config.pipeline("demo")}, tmp_path / "scratch") as worker:
        result = worker.process(task)
    assert (result.outcome, result.stops_run, result.transient) == (Outcome.FAILED, True, False)
    assert result.reason.startswith(f"the worker on {socket.gethostname()}: recipe 'ptiff-q80' not found (known: ")
    assert result.reason.endswith(": restart every worker with the config.yaml and recipes of the harvest's machine, "
                                  "then run the harvest again: either side may be the stale one (a worker reads them "
                                  "as it starts, a harvest as it begins) (no item's attempt was counted)")
    assert not (tmp_path / "store").exists()


def test_a_worker_keeps_the_recipes_it_read_at_start_in_every_pool_process(pool, tmp_path):
    """A pool process read the recipe file when it took its first task: after an edit, a new or replaced one
    (max_tasks_per_child, memory limit, killed) used the new file, and one worker held two digests."""
    recipe_file = tmp_path / "ptiff-q80.yaml"
    document = yaml.safe_load(recipe_files()["ptiff-jpeg-q90"].read_text())
    recipe_file.write_text(yaml.safe_dump({**document, "name": "ptiff-q80", "quality": 80}))
    config = pool.config("edited", pipeline={"recipe": str(recipe_file)}, worker_max_tasks_per_child=1)
    worker = pool.start("w1", config)
    pipeline = load_config(config).pipeline("demo")
    tasks = tasks_of(pipeline)  # planned with the recipe the worker started with
    recipe_file.write_text(yaml.safe_dump({**document, "name": "ptiff-q80", "quality": 60}))

    results = run_all(CeleryExecutor({"demo": pipeline}, 1, Path("unused"), load_config(config).celery), tasks)
    assert [(r.outcome, r.reason) for r in results] == [(Outcome.DEPOSITED, None)] * 2
    assert len(set(worker.pool_pids())) >= 2  # the second task ran in a pool process forked after the edit


def test_a_worker_consuming_none_of_the_tasks_queue_is_said_once(pool, caplog):
    """It answered the ping, so the harvest said nothing, and waited for ever on the tasks of the queue that
    worker does not consume."""
    config = pool.config("queues")
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    tasks = tasks_of(pipeline)
    pool.start("jp2", config, "-Q", "gcis-jp2")
    caplog.set_level(logging.WARNING)
    executor = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
    executor.check()
    for task in tasks:
        assert executor.submit(task) == []
    executor.close()
    unconsumed = (f"no Celery worker that answered within {WORKER_PING_SECONDS:g} s consumes queue gcis: its tasks "
                  f"wait there until one does (celery -A gcis_etl.worker worker -Q gcis, with this config.yaml)")
    assert [r.getMessage() for r in caplog.records] == [
        unconsumed, "demo: 2 tasks still in flight: their outcomes stay in the result backend for 72 hours"]

    caplog.clear()
    pool.start("all", config)
    executor = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
    executor.check()
    assert sorted(r.outcome.value for r in run_all(executor, tasks)) == ["deposited", "deposited"]
    assert caplog.records == []


def test_a_worker_whose_main_process_loaded_libvips_does_not_start(tmp_path):
    """Pool processes forked from a process that loaded libvips deadlock in it. Celery only logs what a worker_init
    receiver raises, and went on to start the pool: the worker must exit instead, saying why."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {}, "celery": {
        "broker_url": f"redis://127.0.0.1:{free_port()}/0"}}))  # nothing listens: a started worker would wait
    done = subprocess.run([str(Path(sys.executable).parent / "celery"), "-A", "tests.vips_loading_app", "worker",
                           "-n", "vips@%h"], env=dict(os.environ, GCIS_CONFIG=str(config)), capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parent.parent)
    assert done.returncode == os.EX_SOFTWARE, done.stderr[-2000:]
    assert "libvips is loaded in the Celery worker's main process" in done.stderr
    assert "not starting" in done.stderr
