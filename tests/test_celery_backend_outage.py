"""The result backend (Redis) down when a worker finishes a task, after the outage stopped the orchestrator: the
next run must end with the item deposited, not count the backend's failure against it (it did: "task failure:
BackendStoreError: failed to store result on the backend", an attempt counted, the object's manifest held back,
with the image in the store). Redis comes back with its data, as production's (appendonly yes) does: the task's
STARTED marker with it, so the worker records its outcome (over no marker, it records none: nobody waits for it,
tests/test_celery_remark.py)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis as redis_client

from gcis_etl.config import load_config
from gcis_etl.distributed import CelerySettings
from gcis_etl.errors import ConfigError, GcisError
from gcis_etl.settings import parse
from gcis_etl.work import Outcome
from gcis_etl.worker import CeleryExecutor, celery_app, celery_task_id
from tests.broker import Pool, make_masters, received, run_all, slow_master, tasks_of
from tests.harvests import wait_for

GAVE_UP = "Exception raised outside body: BackendStoreError"  # a pool process could not record its outcome


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """One object: a small master and a slow one (a few seconds to convert), which is running when Redis goes."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    slow_master(masters / "obj00" / "slow.tif", size=4000)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def test_workers_retry_recording_outcomes_longer_than_the_orchestrator_reads_them():
    """They used to share outage_retries: a worker gave up recording as early as the orchestrator gave up reading."""
    settings = CelerySettings()
    assert settings.celery_conf()["result_backend_max_retries"] == settings.outage_retries == 40
    assert settings.celery_conf(worker=True)["result_backend_max_retries"] == settings.worker_retries == 120
    raised = parse(CelerySettings, {"outage_retries": 100}, "config.yaml", "celery")  # the default follows it
    assert raised.celery_conf(worker=True)["result_backend_max_retries"] == 300
    assert parse(CelerySettings, {"outage_retries": 1}, "config.yaml", "celery").worker_retries == 120
    with pytest.raises(ConfigError, match=r"celery: .*worker_outage_retries \(120\) must be at least 3 x "
                                          r"outage_retries \(41\)"):
        parse(CelerySettings, {"outage_retries": 41, "worker_outage_retries": 120}, "config.yaml", "celery")


@pytest.mark.parametrize("worker_outage_retries, recorded", [(10, "FAILURE"), (None, "SUCCESS")],
                         ids=["worker-gives-up", "worker-outlasts-the-orchestrator"])
def test_an_outcome_a_worker_could_not_record_is_not_the_items_failure(pool, worker_outage_retries, recorded,
                                                                        caplog):
    """worker-gives-up: the outage outlasts the worker's retries, which records the backend's error as the task's
    FAILURE once Redis is back; the next run sends the task again and it finds its deposit. worker-outlasts-the-
    orchestrator: by default a worker retries longer than the orchestrator, and records its outcome once Redis
    is back (it gave up as early as the orchestrator: nothing was recorded)."""
    retries = {} if worker_outage_retries is None else {"worker_outage_retries": worker_outage_retries}
    config = pool.config("outage", outage_retries=1, time_limits={"default": {"soft_seconds": 60, "hard_seconds": 70}},
                         visibility_timeout_seconds=80, **retries)
    worker = pool.start("w1", config)
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    tasks = tasks_of(pipeline)
    slow = next(t for t in tasks if t.item.id.endswith("slow.tif"))
    slow_id = celery_task_id(slow)
    watcher = celery_app(settings.celery)

    first = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
    assert first.submit(slow) == []
    wait_for(lambda: watcher.backend.get_task_meta(slow_id, cache=False)["status"] == "STARTED", "started",
             timeout=120)
    redis_client.Redis.from_url(pool.redis.url()).save()  # loaded again by the restart
    pool.redis.stop()
    with pytest.raises(GcisError, match="cannot be reached"):
        list(first.drain())
    first.close()
    if worker_outage_retries is None:
        wait_for(lambda: "Failed operation _store_result" in worker.log_text(), "retrying", timeout=120)
        time.sleep(1)
    else:
        wait_for(lambda: GAVE_UP in worker.log_text(), "given up", timeout=120)
    pool.redis.start()
    wait_for(lambda: watcher.backend.get_task_meta(slow_id, cache=False)["status"] not in ("PENDING", "STARTED"),
             "recorded")
    meta = watcher.backend.get_task_meta(slow_id, cache=False)
    watcher.close()
    assert meta["status"] == recorded, meta
    if recorded == "FAILURE":
        assert type(meta["result"]).__name__ == "BackendStoreError"

    results = {r.item_id: r for r in run_all(CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery),
                                              tasks)}
    assert {i: r.outcome for i, r in results.items()} == {t.item.id: Outcome.DEPOSITED for t in tasks}, \
        {i: r.reason for i, r in results.items()}
    if recorded == "FAILURE":
        assert (f" {slow.item.id}: task whose outcome the result backend failed to record "
                f"(BackendStoreError: failed to store result on the backend); sending it again") in caplog.text
        assert any("already in the store" in w for w in results[slow.item.id].warnings)  # not converted again
        assert received([worker], slow_id) == 2
    else:
        assert GAVE_UP not in worker.log_text()
        assert received([worker], slow_id) == 1
