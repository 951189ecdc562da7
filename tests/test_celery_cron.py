"""Celery harvests run by cron under a time limit: each run stops with tasks left to the workers, and the next one
takes up what they left. A task whose message the broker lost was never sent again by such runs (the patience
restarted with each), a halt recorded while no run waited was taken by the next run as news, and the soft time
limit hid the outage that used it up."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import redis as redis_client

from gcis_etl.config import load_config
from gcis_etl.work import Outcome
from gcis_etl.worker import SENT, CeleryExecutor, celery_task_id
from tests.broker import Pool, make_masters, received, run_all, tasks_of

# Patience: twice the visibility timeout, 10 s; each limit must stay below the timeout.
LIMITS = {"time_limits": {"default": {"soft_seconds": 3, "hard_seconds": 4}}, "visibility_timeout_seconds": 5}
NO_RETRY = {"retry": {"max_retries": 0}}


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """One object of one small master: one task."""
    return Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=1, per_object=1),
                celery_workers)


class CronRun:
    """One cron run's executor: it stops (its time limit) once `stop()` is called."""

    def __init__(self, config: Path):
        settings = load_config(config)
        self.pipeline = settings.pipeline("demo")
        self.stopped = False
        self.executor = CeleryExecutor({"demo": self.pipeline}, 2, Path("unused"), settings.celery,
                                       stopping=lambda: self.stopped)

    def stop(self) -> list:
        """Stopped at its limit: the tasks a worker has not started are left to the workers."""
        self.stopped = True
        results = list(self.executor.drain())
        self.executor.close()
        return results


def _outcome(pool: Pool, task_id: str, seconds: float = 120) -> dict:
    """The task's record in the result backend once a worker ran it (the runs that sent it have stopped)."""
    backend, deadline = redis_client.Redis.from_url(pool.redis.url()), time.monotonic() + seconds
    while (meta := json.loads(backend.get(f"celery-task-meta-{task_id}") or '{"status": "PENDING"}'))["status"] \
            in ("PENDING", SENT, "STARTED"):
        assert time.monotonic() < deadline, meta
        time.sleep(0.1)
    return meta


def test_a_task_the_broker_lost_is_sent_again_by_a_later_run_once_its_patience_from_its_send_is_spent(pool,
                                                                                                     caplog):
    """Each cron run, shorter than the patience, used to start it afresh: the task was never sent again, and
    each run said it stayed in its queue, in a WARNING cron mailed from every healthy run that stopped at its limit."""
    config = pool.config("lost", **LIMITS)
    first = CronRun(config)
    task = tasks_of(first.pipeline)[0]
    task_id = celery_task_id(task)
    with caplog.at_level(logging.INFO, "gcis_etl.worker"):
        assert first.executor.submit(task) == []  # no worker yet: it stays SENT
        sent = time.monotonic()
        assert first.stop() == []
    left = [(r.levelno, r.getMessage()) for r in caplog.records if "not started yet" in r.getMessage()]
    redis_client.Redis.from_url(pool.redis.url()).delete("gcis")  # the broker lost its message, not its marker
    worker = pool.start("w1", config)
    time.sleep(max(0.0, sent + 10 - time.monotonic()))  # the patience, from the send, is spent
    caplog.clear()

    later = CronRun(config)
    with caplog.at_level(logging.INFO, "gcis_etl.worker"):
        assert later.executor.submit(task) == []
        assert later.stop() == []  # its time is up: the task sent again is left to the worker
    assert f" {task.item.id}: task no progress for 10 s; sending it again" in caplog.text
    meta = _outcome(pool, task_id)
    assert (meta["status"], meta["result"]["outcome"], received([worker], task_id)) == ("SUCCESS", "deposited", 1)
    assert left == [(logging.INFO, "demo: 1 task sent and not started yet is left to the workers: the next run "
                                   "takes its outcome (kept 72 hours), or sends it again if no worker started it "
                                   "within 10 s of its send")]
    assert first.executor.left_queued("demo") == 1


def test_a_halt_recorded_while_no_run_waited_is_sent_again_by_the_next_run_not_taken(pool, minio):
    """The store was down while a worker ran a task the last run left: the next run, the store back, used to stop
    on that outcome (exit 1, mailed), and only the run after it sent the task again."""
    config = pool.config("halt", **NO_RETRY)
    first = CronRun(config)
    task = tasks_of(first.pipeline)[0]
    assert first.executor.submit(task) == [] and first.stop() == []
    minio.stop()
    try:
        pool.start("w1", config)
        halted = _outcome(pool, celery_task_id(task))["result"]
    finally:
        minio.start()
    assert (halted["outcome"], halted["stops_run"], halted["reason"].startswith("depositing: ")) == (
        "failed", True, True)

    results = run_all(CronRun(config).executor, [task])
    assert [(r.outcome, r.reason) for r in results] == [(Outcome.DEPOSITED, None)]


def test_the_soft_time_limit_spent_on_retries_of_an_outage_says_so_and_keeps_its_kind(pool, minio):
    """The limit's reason used to replace the store's error ("took longer than the soft time limit of 3 s for recipe
    ptiff-jpeg-q90"), and to make the outage the item's failure, an attempt counted."""
    config = pool.config("soft", time_limits={"default": {"soft_seconds": 3, "hard_seconds": 10}},
                         visibility_timeout_seconds=11,
                         retry={"max_retries": 5, "backoff_seconds": 2, "backoff_max_seconds": 2, "jitter": False})
    run = CronRun(config)
    task = tasks_of(run.pipeline)[0]
    minio.stop()
    try:
        pool.start("w1", config)
        run.executor.submit(task)
        [result] = list(run.executor.drain())
    finally:
        minio.start()
        run.executor.close()
    assert result.outcome is Outcome.FAILED and result.transient and result.stops_run, result
    assert result.reason.startswith("took longer than the soft time limit of 3 s retrying (its last try: "
                                    "depositing: "), result.reason
