"""A Celery harvest's time limit (max_run_minutes, --max-minutes) acts as a stop does: no more tasks are sent,
only those a worker started are waited for, and the others stay in their queue for the next run. A cron run with
every worker down used to wait for them for ever, holding the pipeline's lock: every later run exited 3."""
from __future__ import annotations

import os
import subprocess
import time

import pytest
import redis as redis_client

from gcis_etl.config import load_config
from gcis_etl.ledger import Ledger
from gcis_etl.work import Outcome
from gcis_etl.worker import celery_task_id
from tests.broker import Pool, make_masters, received, tasks_of
from tests.harvests import GCIS

# Far beyond the test: a task no worker takes is never sent again, so only the time limit can end the first run.
NO_RESEND = {"visibility_timeout_seconds": 600}


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """Three objects of two small masters: six tasks, two in flight at a time."""
    return Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=3, per_object=2),
                celery_workers)


def _harvest(pool: Pool, config, *options: str) -> subprocess.Popen:
    return subprocess.Popen([GCIS, "--config", str(config), "harvest", "demo", *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **pool.env})


def _ledger(config):
    with Ledger.open(load_config(config)) as ledger:
        return ledger.runs("demo", limit=1)[0], ledger.items("demo")


@pytest.mark.parametrize("objects", [3, 1], ids=["while-sending", "while-draining"])
def test_the_time_limit_ends_a_run_no_worker_serves_and_the_next_run_takes_the_queued_tasks(pool, objects):
    """Three objects: the limit comes while the run waits to send its third task; one: once all are sent (the
    run, waiting for its last tasks, used to be recorded as completed had they been left)."""
    masters = make_masters(pool.tmp / f"masters-{objects}", objects=objects, per_object=2)
    config = pool.config("idle", masters=masters, pipeline={"executor": "celery", "concurrency": 2}, **NO_RESEND)
    first = _harvest(pool, config, "--max-minutes", "0.1")  # 6 s: past the check of the workers (2 s)
    try:
        out, err = first.communicate(timeout=120)  # it used to wait here for ever, its window full
    finally:
        first.kill()
    assert first.returncode == 0, err  # as a run stopped at its time limit exits: by its items (none failed)
    assert "not started yet" not in err  # at INFO: a run stopped at its limit as designed mails nothing
    run, items = _ledger(config)
    assert (run.status, run.note.startswith("stopped at the run time limit"), items) == ("stopped", True, [])
    assert "2 tasks left queued for the next run" in run.note
    assert redis_client.Redis.from_url(pool.redis.url()).llen("gcis") == 2

    worker = pool.start("w1", config)
    rerun = subprocess.run([GCIS, "--config", str(config), "harvest", "demo"], capture_output=True, text=True,
                           env={**os.environ, **pool.env}, timeout=300)
    run, items = _ledger(config)
    assert (rerun.returncode, run.status) == (0, "completed"), rerun.stderr
    pipeline = load_config(config).pipeline("demo")
    tasks = tasks_of(pipeline)
    assert sorted((i.item_id, i.status) for i in items) == sorted((t.item.id, Outcome.DEPOSITED.value) for t in tasks)
    assert {t.item.id: received([worker], celery_task_id(t)) for t in tasks} == {t.item.id: 1 for t in tasks}
    images = {o.key for o in pipeline.store.list(pipeline.store.keys.image_prefix("demo"))}
    assert images == {i.output_key for i in items} and len(images) == len(tasks)


def test_the_item_limit_waits_for_the_tasks_it_sent(pool):
    """--limit is not a stop: the tasks sent are within it. With no worker yet, the run waits for them."""
    config = pool.config("limited", pipeline={"executor": "celery", "concurrency": 2}, **NO_RESEND)
    limited = _harvest(pool, config, "--limit", "2")
    try:
        queue = redis_client.Redis.from_url(pool.redis.url())
        deadline = time.monotonic() + 60
        while queue.llen("gcis") < 2 and limited.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pool.start("w1", config)
        out, err = limited.communicate(timeout=120)
    finally:
        limited.kill()
    assert limited.returncode == 0, err
    assert "not started yet" not in err
    run, items = _ledger(config)
    assert (run.status, run.note.startswith("stopped at the limit of 2 items"), run.deposited) == ("stopped", True, 2)
    assert [i.status for i in items] == ["deposited"] * 2
