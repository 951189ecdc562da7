"""The Celery worker pool through Redis Sentinel: Debian's redis-server in sentinel mode watching a
password-protected master, real workers."""
from __future__ import annotations

import subprocess
from urllib.parse import quote

import pytest

from gcis_etl.distributed import CelerySettings
from gcis_etl.errors import ConfigError
from gcis_etl.settings import parse
from tests.broker import Pool, assert_harvests_agree, make_masters, redis_binary
from tests.servers import free_port, wait_for_port

PASSWORD = "Xy7#Top/Secret?"  # reserved characters, as generated passwords have them


@pytest.fixture
def sentinel(tmp_path_factory):
    """A master requiring PASSWORD and one Sentinel watching it as `gcis`; the Sentinel's port."""
    folder = tmp_path_factory.mktemp("sentinel")
    master, port = free_port(), free_port()
    (folder / "sentinel.conf").write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor gcis 127.0.0.1 {master} 1\n"
                                          f"sentinel auth-pass gcis {PASSWORD}\n")
    processes = []
    for args, listening in ((["--port", str(master), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--requirepass", PASSWORD], master),
                            ([str(folder / "sentinel.conf"), "--sentinel"], port)):
        processes.append(subprocess.Popen([redis_binary(), *args, "--dir", str(folder), "--loglevel", "warning"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for_port(listening, processes[-1])
    yield port
    for process in processes:
        process.kill()
        process.wait()


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    masters = make_masters(tmp_path / "masters", objects=3, per_object=3, rejected=2)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def test_a_harvest_through_redis_sentinel_records_the_same_ledger_and_store_as_a_local_harvest(sentinel, pool):
    """Tasks and outcomes both go through the Sentinel (broker_url stands for result_backend too), and the
    password, percent-encoded, reaches the master intact."""
    url = f"sentinel://:{quote(PASSWORD, safe='')}@127.0.0.1:{sentinel}"
    workers = assert_harvests_agree(pool, broker_url=f"{url};{url}", sentinel_master_name="gcis")

    for worker in workers:
        log = worker.log_text()
        assert f"transport:   sentinel://:**@127.0.0.1:{sentinel}//" in log
        assert "Top" not in log and quote(PASSWORD, safe="") not in log


def test_sentinel_urls_need_the_master_name_and_only_they_take_it():
    with pytest.raises(ConfigError, match=r"celery\.sentinel_master_name: required with a sentinel:// "
                                          r"broker_url: the name of the master"):
        parse(CelerySettings, {"broker_url": "sentinel://127.0.0.1:26379"}, "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"sentinel_master_name: required with a sentinel:// result_backend"):
        parse(CelerySettings, {"broker_url": "amqp://rabbit//", "result_backend": "sentinel://s:26379"},
              "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"sentinel_master_name: only used with a sentinel://"):
        parse(CelerySettings, {"sentinel_master_name": "gcis"}, "config.yaml", "celery")
    conf = CelerySettings(broker_url="amqp://rabbit//", result_backend="sentinel://s:26379",
                          sentinel_master_name="gcis").celery_conf()
    assert conf["broker_transport_options"] == {} and conf["result_backend_transport_options"] == {
        "master_name": "gcis"}
