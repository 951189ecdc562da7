"""The Celery worker pool with RabbitMQ as the broker: a private node of Debian's rabbitmq-server, real workers.
Outcomes still go to Redis (the result backend must be one: they are looked up by task id, also by a
restarted orchestrator)."""
from __future__ import annotations

import re

import kombu
import pytest

from tests.broker import Pool, assert_harvests_agree, make_masters


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """Three objects of three small masters each, two of them with a master no decoder accepts."""
    masters = make_masters(tmp_path / "masters", objects=3, per_object=3, rejected=2)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def test_a_harvest_through_celery_on_rabbitmq_records_the_same_ledger_and_store_as_a_local_harvest(
        rabbitmq_server, pool):  # the node is started first and stopped last, after the workers
    workers = assert_harvests_agree(pool, broker_url=rabbitmq_server.url(), result_backend=pool.redis.url())

    banner = re.compile(rf"transport: +amqp://guest:\*\*@127\.0\.0\.1:{rabbitmq_server.port}//")
    assert all(banner.search(w.log_text()) for w in workers)
    with kombu.Connection(rabbitmq_server.url()) as connection:  # the tasks went through RabbitMQ's queue
        _, waiting, consumers = connection.default_channel.queue_declare("gcis", passive=True)
    assert waiting == 0 and consumers == 2
