"""A late duplicate of a task: its message delivered again (Redis redelivers a vanished worker's message after the
visibility timeout) once nobody waits for it, the task having been sent again and its outcome taken. It used to
run, long after, against a state that had moved on: it overwrote the access master of the recipe the item had
meanwhile been re-encoded to, and left a SUCCESS that a later submission of the same work took for its own though
the key had been retired since."""
from __future__ import annotations

from pathlib import Path

import pytest
import redis as redis_client

from gcis_etl.config import load_config
from gcis_etl.distributed import TASK_NAME
from gcis_etl.work import Outcome
from gcis_etl.worker import CeleryExecutor, celery_app, celery_task_id
from tests.broker import Pool, make_masters, received, run_all, tasks_of
from tests.harvests import wait_for

CURRENT = b"the access master of the recipe the item was re-encoded to since"


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    return Pool(tmp_path, minio, redis_server, make_masters(tmp_path / "masters", objects=1, per_object=1),
                celery_workers)


@pytest.fixture
def run(pool):
    """A worker with one pool process (the skip and the deliberate re-run meet the same process), the pipeline,
    its one task and the task's id."""
    config_file = pool.config("dup")
    config = load_config(config_file)
    worker = pool.start("w1", config_file)
    pipeline = config.pipeline("demo")
    (task,) = tasks_of(pipeline)
    app = celery_app(config.celery)
    yield worker, pipeline, task, celery_task_id(task), app
    app.close()


def duplicate(app, pipeline, task, task_id: str, worker, deliveries: int) -> None:
    """Publishes the task's message again under its id, as a redelivery brings it back: no SENT marker stored
    (that is the orchestrator's, when it sends); then waits until a worker took it and its message is gone from
    the broker (acknowledged: neither queued nor unacknowledged)."""
    queue = load_config(pipeline.config_file).celery.queue_for(pipeline.recipe)
    app.send_task(TASK_NAME, (task.to_dict(),), task_id=task_id, queue=queue)
    broker = redis_client.Redis.from_url(app.conf.broker_url)

    def settled() -> bool:
        held = [*broker.lrange(queue, 0, -1), *broker.hvals("unacked")]
        return received([worker], task_id) == deliveries and not any(task_id.encode() in m for m in held)

    wait_for(settled, "the duplicate taken and acknowledged", timeout=60)


def raw_meta(app, task_id: str) -> bytes | None:
    return redis_client.Redis.from_url(app.conf.result_backend).get(f"celery-task-meta-{task_id}")


def test_a_late_duplicate_nobody_waits_for_is_not_run(run):
    worker, pipeline, task, task_id, app = run
    (result,) = run_all(CeleryExecutor({"demo": pipeline}, 2, Path("unused")), [task])
    assert result.outcome is Outcome.DEPOSITED
    assert raw_meta(app, task_id) is None  # handed over, forgotten
    pipeline.store.put_bytes(result.key, CURRENT, content_type="image/tiff")  # the state moved on

    duplicate(app, pipeline, task, task_id, worker, deliveries=2)
    assert pipeline.store.get_bytes(result.key) == CURRENT
    assert raw_meta(app, task_id) is None  # no outcome left for a later submission of the same work to take
    assert (f"demo/{task.item.id}: task {task_id} not run, nobody waits for it "
            f"(no SENT marker: a late duplicate whose outcome was taken"
            in worker.log_text())


def test_a_duplicate_of_an_outcome_not_yet_taken_is_not_run_and_a_deliberate_rerun_is(run):
    worker, pipeline, task, task_id, app = run
    executor = CeleryExecutor({"demo": pipeline}, 2, Path("unused"))
    assert executor.submit(task) == []
    wait_for(lambda: app.backend.get_task_meta(task_id, cache=False)["status"] == "SUCCESS", "the outcome")
    recorded = raw_meta(app, task_id)
    key = app.backend.get_task_meta(task_id, cache=False)["result"]["key"]
    pipeline.store.put_bytes(key, CURRENT, content_type="image/tiff")

    duplicate(app, pipeline, task, task_id, worker, deliveries=2)
    assert raw_meta(app, task_id) == recorded  # the very outcome, its date_done too
    assert pipeline.store.get_bytes(key) == CURRENT
    assert (f"demo/{task.item.id}: task {task_id} not run, a duplicate: its outcome (SUCCESS) "
            f"is recorded, not yet taken") in worker.log_text()
    (taken,) = list(executor.drain())
    executor.close()
    assert taken.outcome is Outcome.DEPOSITED and raw_meta(app, task_id) is None

    pipeline.store.delete(key)  # retired; then the same work is submitted again, on purpose
    (rerun,) = run_all(CeleryExecutor({"demo": pipeline}, 2, Path("unused")), [task])
    assert received([worker], task_id) == 3
    assert rerun.outcome is Outcome.DEPOSITED and pipeline.store.exists(key)
    assert pipeline.store.get_bytes(key) != CURRENT
