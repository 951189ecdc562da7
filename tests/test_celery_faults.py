"""The worker pool under faults: kill -9 of a pool process or of a whole worker node in the middle of a task,
a broker restart that loses every message, a store outage. Every item must end deposited or rejected,
exactly once, with nothing half-written in the store."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import redis as redis_client

from gcis_etl.commands import Interrupted
from gcis_etl.config import load_config
from gcis_etl.errors import GcisError
from gcis_etl.ledger import Ledger
from gcis_etl.verification import verify
from gcis_etl.work import Outcome, Worker
from gcis_etl.worker import UNMARK_SECONDS, WORKER_PING_SECONDS, CeleryExecutor, celery_app, celery_task_id
from tests.broker import (Pool, RedisServer, assert_no_stray_conversion_children, expected_outcome, make_masters,
                          minio_env, pool_config, received, run_all, s3_store, slow_master, store_contents, tasks_of)
from tests.harvests import GCIS
from tests.servers import free_port


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """Three objects of three small masters and a larger one (about a second to convert), two with a reject."""
    masters = make_masters(tmp_path / "masters", objects=3, per_object=3, rejected=2)
    for n in range(3):
        slow_master(masters / f"obj{n:02d}" / "slow.tif", size=3000 + n)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def check_batch(tasks, results, store) -> dict:
    """Each task has exactly one result, the expected one, and the store holds exactly the deposited outputs,
    whole (read back and hashed)."""
    assert sorted(r.item_id for r in results) == sorted(t.item.id for t in tasks)
    by_item = {r.item_id: r for r in results}
    assert {i: r.outcome for i, r in by_item.items()} == {i: expected_outcome(i) for i in by_item}, \
        {i: r.reason for i, r in by_item.items() if r.outcome is not expected_outcome(i)}
    stored = {o.key: hashlib.sha256(store.get_bytes(o.key)).hexdigest() for o in store.list()}
    assert stored == {r.key: r.sha256 for r in results if r.outcome is Outcome.DEPOSITED}
    return by_item


class Killer(threading.Thread):
    """Once `after` results are in, kill -9 whatever runs a slow task right now: its pool process, or its
    whole worker node, which `revive` starts again under the same name (as systemd would)."""

    def __init__(self, settings, slow_ids: list[str], after: int, workers: dict, node: bool, revive: bool):
        super().__init__(daemon=True)
        self.app = celery_app(settings)
        self.slow_ids, self.after, self.workers, self.node, self.revive = slow_ids, after, workers, node, revive
        self.results = 0
        self.killed: tuple[str, str, int] | None = None  # task id, worker name, pool process id
        self.stop = threading.Event()

    def progress(self, results: list) -> None:
        self.results = len(results)

    def running(self) -> tuple[str, str, int] | None:
        for task_id in self.slow_ids:
            meta = self.app.backend.get_task_meta(task_id, cache=False)
            if meta["status"] == "STARTED":
                return task_id, meta["result"]["hostname"].split("@")[0], meta["result"]["pid"]
        return None

    def run(self) -> None:
        while not self.stop.is_set() and self.killed is None:
            found = self.running() if self.results >= self.after else None
            if found:
                task_id, name, pid = found
                if self.node:
                    self.workers[name].kill()
                    if self.revive:
                        self.workers[name].start()
                else:
                    psutil.Process(pid).kill()
                self.killed = task_id, name, pid
            time.sleep(0.02)


# Redis redelivers a vanished node's task after visibility_timeout_seconds: 15 s in these tests, 2 h by default.
# With 600 s, only the orchestrator asking the task's worker (worker_check_seconds) can finish the batch in time:
# a node gone does not answer; a node started again (in seconds) answers that it does not run the task.
BATCH_SECONDS = 240  # a batch takes under a minute; waiting on the visibility timeout would take 600 s


@pytest.mark.parametrize("after, node, revive, celery, why", [
    (0, False, False, {}, None), (6, False, False, {}, None), (2, True, False, {}, None),
    (2, True, False, {"visibility_timeout_seconds": 600, "worker_check_seconds": 1}, "which does not answer"),
    (2, True, True, {"visibility_timeout_seconds": 600, "worker_check_seconds": 10}, "which no longer runs it")],
    ids=["pool-process-first-task", "pool-process-later", "whole-node", "whole-node-gone", "whole-node-restarted"])
def test_kill_minus_9_mid_batch_loses_and_duplicates_nothing(pool, after, node, revive, celery, why, caplog):
    config = pool.config("kill", **celery)
    workers = {name: pool.start(name, config) for name in ("w1", "w2")}
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    tasks = tasks_of(pipeline)
    slow_ids = [celery_task_id(t) for t in tasks if t.item.id.endswith("slow.tif")]
    killer = Killer(settings.celery, slow_ids, after, workers, node, revive)
    killer.start()
    batch: list[list] = []
    runner = threading.Thread(target=lambda: batch.append(run_all(
        CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery), tasks, each=killer.progress)),
        daemon=True)
    runner.start()
    runner.join(BATCH_SECONDS)
    killer.stop.set()
    killer.join()
    assert batch, f"the batch did not end within {BATCH_SECONDS} s"
    results = batch[0]

    assert killer.killed is not None
    task_id, name, pid = killer.killed
    if why:
        assert re.search(rf"task started by {name}@\S+, {why}; sending it again", caplog.text)
    by_item = check_batch(tasks, results, pipeline.store)
    killed = next(t for t in tasks if celery_task_id(t) == task_id)
    assert by_item[killed.item.id].outcome is Outcome.DEPOSITED
    assert received(workers.values(), task_id) >= 2  # the task was delivered again after the kill
    if not node:
        assert "Worker exited prematurely: signal 9 (SIGKILL)" in workers[name].log_text()
        # the killed process's scratch was removed by its replacement; only live processes have one
        scratch = {int(d.name.rsplit("-", 1)[1]) for d in (settings.state_dir / "scratch" / "celery").iterdir()}
        assert scratch and pid not in scratch and all(psutil.pid_exists(p) for p in scratch)
    output = pool.tmp / "killed-output.tif"
    output.write_bytes(pipeline.store.get_bytes(by_item[killed.item.id].key))
    assert verify(output).ok
    for worker in workers.values():
        if worker.proc.poll() is None:
            assert_no_stray_conversion_children(worker)


_NEW_POOL_PROCESS = """
import os, socket, sys
from gcis_etl.config import load_config
from gcis_etl.worker import _on_process_init
scratch = load_config().state_dir / "scratch" / "celery"
for pid in (os.getpid(), os.getppid()):  # a dead namesake's (same pid) and a live process's
    item = scratch / f"{socket.gethostname()}-{pid}" / "item-1"
    item.mkdir(parents=True)
    (item / "master.tif").write_bytes(bytes(1000))
_on_process_init()
print(*sorted(p.relative_to(scratch) for p in scratch.rglob("*") if p.is_file()))
"""


def test_a_new_pool_process_empties_the_scratch_named_for_its_pid(tmp_path):
    """A node restarted in a container after kill -9 gets the same pids: a pool process just started finds its
    own pid's folder holding a dead process's fetched master; a live process's folder stays."""
    config = pool_config(tmp_path / "config.yaml", masters=tmp_path, broker_url="redis://127.0.0.1:1/0",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    done = subprocess.run([sys.executable, "-c", _NEW_POOL_PROCESS], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, GCIS_CONFIG=str(config)), cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{socket.gethostname()}-{os.getpid()}/item-1/master.tif"]


@pytest.mark.parametrize("separate_results", [False, True], ids=["broker-and-results", "broker-only"])
def test_a_broker_restart_mid_batch_still_completes_the_batch(pool, tmp_path, caplog, separate_results):
    results_server = RedisServer(tmp_path / "results", free_port()) if separate_results else None
    if results_server:
        (tmp_path / "results").mkdir()
        results_server.start()
    try:
        separate = {"result_backend": results_server.url()} if results_server else {}
        config = pool.config("restart", time_limits={"default": {"soft_seconds": 8, "hard_seconds": 9}},
                             visibility_timeout_seconds=11, **separate)
        workers = [pool.start(name, config) for name in ("w1", "w2")]
        settings = load_config(config)
        pipeline = settings.pipeline("demo")
        tasks = tasks_of(pipeline)
        restarted = []

        def restart_once(so_far: list) -> None:
            if len(so_far) >= 3 and not restarted:
                pool.redis.restart()  # no persistence: every queued and unacknowledged message is gone
                restarted.append(len(so_far))

        results = run_all(CeleryExecutor({"demo": pipeline}, 6, Path("unused"), settings.celery), tasks,
                          each=restart_once)
    finally:
        if results_server:
            results_server.stop()

    assert restarted
    check_batch(tasks, results, pipeline.store)
    # queued tasks were lost with the broker's memory and sent again: at once when our SENT markers went with
    # them, after twice visibility_timeout_seconds without progress when the results live elsewhere
    resent = "no progress for 22 s; sending it again" if separate_results else "lost by the broker; sending it again"
    assert resent in caplog.text
    assert all(worker.proc.poll() is None for worker in workers)


def test_transient_failures_are_retried_with_backoff_and_nothing_else_is(pool, minio):
    config = pool.config("retry", retry={"max_retries": 2, "backoff_seconds": 1, "backoff_max_seconds": 1,
                                         "jitter": False})
    worker = pool.start("w1", config)
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    first, second, third = tasks_of(pipeline)[:3]
    misplanned = replace(first, recipe_digest="0" * 16)  # a failure no retry can fix
    executor = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
    minio.stop()
    try:
        gave_up = {r.item_id: r for r in run_all(executor, [misplanned, second])}
        executor = CeleryExecutor({"demo": pipeline}, 4, Path("unused"), settings.celery)
        assert executor.submit(third) == []
        deadline = time.monotonic() + 120
        while f" {third.item.id}: depositing" not in worker.log_text():
            assert time.monotonic() < deadline, worker.log_text()[-2000:]
            time.sleep(0.05)
    finally:
        minio.start()
    recovered = list(executor.drain())
    executor.close()

    assert gave_up[first.item.id].outcome is Outcome.FAILED and not gave_up[first.item.id].transient
    assert gave_up[first.item.id].stops_run
    assert f"the task was planned with {'0' * 16}: restart every worker" in gave_up[first.item.id].reason
    assert gave_up[second.item.id].outcome is Outcome.FAILED and gave_up[second.item.id].transient
    assert gave_up[second.item.id].reason.startswith("depositing: ")
    second_retries = re.escape(f" {second.item.id}: depositing: ") + r".*; retry (\d) of 2 in 1 s"
    assert re.findall(second_retries, worker.log_text()) == ["1", "2"]
    assert [r.outcome for r in recovered] == [Outcome.DEPOSITED]
    # retried by the pool process that ran it, not through the broker: each task was delivered once
    assert all(received([worker], celery_task_id(t)) == 1 for t in (misplanned, second, third))


def _harvest(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([GCIS, "--config", str(config), "harvest", "demo"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def _last_run(config: Path):
    settings = load_config(config)
    with Ledger.open(settings) as ledger:
        return ledger.runs("demo", limit=1)[0], ledger.items("demo")


def test_a_harvest_whose_broker_cannot_be_reached_stops_before_its_first_item_in_one_line(tmp_path, minio, s3_bucket,
                                                                                       aws_env):
    """It used to spend the result backend's retries (about 3 minutes) on the first item and end in ~2000 lines
    of tracebacks, without the summary line."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=2)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    config = pool_config(tmp_path / "down.yaml", masters=masters, broker_url=unreachable,
                         store=s3_store(minio, s3_bucket), pipeline={"executor": "celery"})
    proc = _harvest(config, minio_env(minio, tmp_path))

    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"demo: run stopped: the Celery broker or result backend ({unreachable}) cannot be reached "
        f"(ConnectionError: Error 111 connecting to {unreachable[8:-2]}. Connection refused.); no task was sent "
        f"(everything settled so far is recorded; run again)"]
    run, items = _last_run(config)
    assert run.status == "failed" and items == []


def test_a_broker_lost_mid_run_stops_the_run_with_one_line_per_retry_and_no_traceback(tmp_path, minio, aws_env):
    """No worker takes the tasks, so the harvest is still waiting for outcomes when Redis goes; it retries as
    many times as outage_retries says, a line each, then stops the run and records it."""
    redis = RedisServer(tmp_path / "redis", free_port())
    (tmp_path / "redis").mkdir()
    redis.start()
    masters = make_masters(tmp_path / "masters", objects=2, per_object=3)
    minio.client().create_bucket(Bucket="outage")
    config = pool_config(tmp_path / "outage.yaml", masters=masters, broker_url=redis.url(),
                         store=s3_store(minio, "outage"), celery={"outage_retries": 2},
                         pipeline={"executor": "celery", "concurrency": 2})
    harvest = subprocess.Popen([GCIS, "--config", str(config), "harvest", "demo"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **minio_env(minio, tmp_path)})
    try:
        client = redis_client.Redis.from_url(redis.url())
        deadline = time.monotonic() + 60
        while client.llen("gcis") < 2 and time.monotonic() < deadline:  # the window is full: it polls
            time.sleep(0.05)
        assert client.llen("gcis") == 2
        redis.stop()
        out, err = harvest.communicate(timeout=300)
    finally:
        harvest.kill()
        redis.stop()

    assert harvest.returncode == 1, err
    assert "Traceback" not in err
    retries = [line for line in err.splitlines() if "Retrying" in line]
    assert len(retries) == 2 and all("(ConnectionError: " in line for line in retries), err
    assert err.strip().splitlines()[-1].startswith(
        f"demo: run stopped: the Celery broker or result backend ({redis.url()}) cannot be reached (")
    assert "; tasks already sent keep running on the workers (everything settled so far" in err
    run, _ = _last_run(config)
    assert run.status == "failed" and "cannot be reached" in run.note


def _executor_on(tmp_path, redis_server, broker_url: str):
    """An executor whose result backend is a real Redis and whose broker is `broker_url`, and one task for it."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = load_config(pool_config(tmp_path / "config.yaml", masters=masters, broker_url=broker_url,
                                     store={"kind": "local", "root": str(tmp_path / "store")},
                                     celery={"result_backend": redis_server.url(), "outage_retries": 1}))
    pipeline = config.pipeline("demo")
    return CeleryExecutor({"demo": pipeline}, 2, tmp_path / "scratch", config.celery), tasks_of(pipeline)[0]


def _sent_at_once_by_the_next_run(executor, task, redis_server) -> None:
    """The marker is gone, and a next run on a broker that answers publishes the task at its first submit."""
    settings = executor.settings.model_copy(update={"broker_url": redis_server.url()})
    executor.close()
    following = CeleryExecutor(executor.pipelines, 2, Path("unused"), settings)
    assert following.app.backend.get_task_meta(celery_task_id(task))["status"] == "PENDING"
    assert following.submit(task) == []
    assert redis_client.Redis.from_url(redis_server.url()).llen("gcis") == 1
    following.app.close()


def test_a_send_the_broker_refused_leaves_no_sent_marker_behind(tmp_path, redis_server, caplog):
    """The marker used to stay without a message: the next run took the task for in flight and waited twice
    visibility_timeout_seconds (4 h by default) before sending it. Each retry of the send says so (they were
    silent: the README promises a line per retry)."""
    executor, task = _executor_on(tmp_path, redis_server, f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(GcisError, match="cannot be reached"), caplog.at_level(logging.WARNING, "gcis_etl.worker"):
        executor.submit(task)
    retries = [r.getMessage() for r in caplog.records if "sending the task failed" in r.getMessage()]
    assert retries and all(line.startswith(f"{task.item.id}: sending the task failed; retrying in ")
                           and "Error" in line for line in retries), caplog.text
    _sent_at_once_by_the_next_run(executor, task, redis_server)


@contextmanager
def _second_ctrl_c_in(seconds: float, before=lambda: None) -> Iterator[None]:
    """Interrupted raised in the main thread after `seconds` (SIGALRM breaks a blocking read), after `before()`."""
    def second_ctrl_c(signum, frame):
        before()
        raise Interrupted(signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, second_ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_send_interrupted_while_the_broker_stalls_leaves_no_sent_marker_behind(tmp_path, redis_server):
    """A second Ctrl-C while the broker accepts the connection but never answers."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel completes the handshake; nothing replies
        executor, task = _executor_on(tmp_path, redis_server, f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        with pytest.raises(Interrupted), _second_ctrl_c_in(1.0):
            executor.submit(task)
    _sent_at_once_by_the_next_run(executor, task, redis_server)


def test_a_marker_the_result_backend_cannot_remove_is_logged_and_the_interrupt_still_stops_the_run(
        tmp_path, redis_server, caplog):
    """The result backend goes down with the broker: the Ctrl-C, not the backend's error, stops the run."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        executor, task = _executor_on(tmp_path, redis_server, f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        with pytest.raises(Interrupted), _second_ctrl_c_in(1.0, before=redis_server.stop):
            executor.submit(task)
    executor.close()
    assert f"task {celery_task_id(task)}: its SENT marker could not be removed (ConnectionError: " in caplog.text


def test_a_marker_the_stalled_result_backend_does_not_take_back_does_not_hold_the_interrupt(
        tmp_path, redis_server, caplog):
    """The broker and the result backend (one Redis host) both stall: the second Ctrl-C reaches the caller once
    the removal has waited UNMARK_SECONDS, not after the backend's socket timeout (2 min), and says so."""
    pid = redis_server.proc.pid
    with socket.create_server(("127.0.0.1", 0)) as silent:
        executor, task = _executor_on(tmp_path, redis_server, f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        try:
            with pytest.raises(Interrupted), _second_ctrl_c_in(1.0, before=lambda: os.kill(pid, signal.SIGSTOP)):
                executor.submit(task)
        finally:
            os.kill(pid, signal.SIGCONT)
    executor.close()
    assert (f"task {celery_task_id(task)}: its SENT marker could not be removed (no answer within "
            f"{UNMARK_SECONDS:g} s)") in caplog.text


def test_sigterm_with_no_worker_running_ends_the_run_and_the_next_run_takes_the_queued_tasks(pool):
    """With no worker, "stopping after the items in flight" never ended: the tasks wait in their queue, and a
    second SIGTERM is ignored (only a second Ctrl-C abandons). Tasks not started are left there instead."""
    config = pool.config("idle", pipeline={"executor": "celery", "concurrency": 2})
    harvest = subprocess.Popen([GCIS, "--config", str(config), "harvest", "demo"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **pool.env})
    try:
        queue = redis_client.Redis.from_url(pool.redis.url())
        deadline = time.monotonic() + 60
        while queue.llen("gcis") < 2 and time.monotonic() < deadline:  # the window is full: it polls
            time.sleep(0.05)
        harvest.send_signal(signal.SIGTERM)
        out, err = harvest.communicate(timeout=60)
    finally:
        harvest.kill()
    assert harvest.returncode == 128 + signal.SIGTERM, err
    assert "not started yet" not in err  # at INFO
    run, items = _last_run(config)
    assert (run.status, run.note, items) == ("stopped", "stopped on request", [])

    pool.start("w1", config)
    rerun = subprocess.run([GCIS, "--config", str(config), "harvest", "demo"], capture_output=True, text=True,
                           env={**os.environ, **pool.env}, timeout=300)
    run, items = _last_run(config)
    assert run.status == "completed", rerun.stderr
    assert sorted((i.item_id, i.status) for i in items) == sorted(
        (t.item.id, expected_outcome(t.item.id).value) for t in tasks_of(load_config(config).pipeline("demo")))


def test_a_worker_started_before_its_pipeline_was_added_stops_the_run_and_counts_no_attempt(tmp_path):
    """Workers read config.yaml when they start: a pipeline added since is unknown to them. Every item would
    fail alike, each spending an attempt (after max_attempts runs, a whole backlog waiting for `retry`)."""
    masters = make_masters(tmp_path / "masters", objects=1, per_object=1)
    config = load_config(pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                                     store={"kind": "local", "root": str(tmp_path / "store")}))
    started_before = Worker({}, tmp_path / "scratch")
    try:
        result = started_before.process(tasks_of(config.pipeline("demo"))[0])
    finally:
        started_before.close()
    assert (result.outcome, result.stops_run, result.transient) == (Outcome.FAILED, True, False)
    assert result.reason == (f"pipeline 'demo' is not in the configuration of the worker on {socket.gethostname()}: "
                             "restart every worker with the config.yaml and recipes of the harvest's machine, then "
                             "run the harvest again: either side may be the stale one (a worker reads them as it "
                             "starts, a harvest as it begins) (no item's attempt was counted)")
    assert not (tmp_path / "store").exists()


def test_a_run_with_no_worker_answering_says_so_before_its_first_task(pool, caplog):
    """Without a worker the tasks wait in the queue for ever: the run used to say nothing for a minute, then only
    "4 items in flight", every minute. With one started, nothing is said."""
    config = pool.config("ping")
    settings = load_config(config)
    caplog.set_level(logging.WARNING)
    executor = CeleryExecutor({"demo": settings.pipeline("demo")}, 4, Path("unused"), settings.celery)
    executor.check()
    nobody = f"no Celery worker answered within {WORKER_PING_SECONDS:g} s: the tasks wait in their queue"
    assert nobody in caplog.text
    caplog.clear()
    pool.start("w1", config)
    executor.check()
    executor.close()
    assert nobody not in caplog.text



@pytest.mark.parametrize("retries", [3, 0], ids=["tried-again", "not-tried-again"])
def test_a_pool_process_killed_mid_upload_leaves_no_parts(tmp_path, minio, redis_server, celery_workers, aws_env,
                                                          caplog, retries):
    """A pool process SIGKILLed mid-upload (its hard time limit, the OOM killer, an operator) left its multipart
    upload incomplete: the task was sent again and deposited, the run completed, and the parts stayed (billed on
    AWS until a lifecycle rule removes them). The try Celery sends after the kill aborts the upload the dead one
    left; when none is sent (its retries spent, or the hard time limit), the orchestrator, reading the failure."""
    import numpy as np
    import tifffile
    import yaml
    master = tmp_path / "masters" / "obj" / "noise.tif"  # noise: its access master is too large for one PUT
    master.parent.mkdir(parents=True)
    tifffile.imwrite(master, np.random.default_rng(7).integers(0, 256, (2600, 2600, 3), dtype=np.uint8),
                     photometric="rgb")
    pool = Pool(tmp_path, minio, redis_server, master.parent.parent, celery_workers)
    config = pool.config("killup", retry={"max_retries": retries})
    document = yaml.safe_load(config.read_text())
    document["pipelines"]["demo"]["store"].update(multipart_threshold=5 << 20, multipart_chunksize=5 << 20,
                                                  max_bandwidth=2 << 20)  # parts of 5 MiB, a few seconds each
    config.write_text(yaml.safe_dump(document))
    worker = pool.start("w1", config)
    settings = load_config(config)
    pipeline = settings.pipeline("demo")
    [task] = tasks_of(pipeline)
    client, bucket = minio.client(), pipeline.store.settings.bucket
    app = celery_app(settings.celery)
    killed: list[dict] = []

    def kill_mid_upload() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            if uploads:
                meta = app.backend.get_task_meta(celery_task_id(task), cache=False)
                psutil.Process(meta["result"]["pid"]).kill()
                killed.extend(uploads)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_mid_upload, daemon=True)
    killer.start()
    with caplog.at_level(logging.WARNING, logger="gcis_etl.worker"):
        [result] = run_all(CeleryExecutor({"demo": pipeline}, 1, Path("unused"), settings.celery), [task])
    killer.join()
    key = "obj/obj~2Fnoise.tif.tif"  # item "obj/noise.tif"
    assert [u["Key"] for u in killed] == [f"iiif/demo/{key}"], killed
    assert "Worker exited prematurely: signal 9 (SIGKILL)" in worker.log_text()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    aborted = f"aborted the incomplete upload of s3://{bucket}/iiif/demo/{key} that a try whose process died left"
    if retries:
        assert result.outcome is Outcome.DEPOSITED and result.key == f"demo/{key}", result.reason
        assert aborted in worker.log_text()
        assert store_contents(pipeline.store) == {result.key: result.sha256}
    else:
        assert result.outcome is Outcome.FAILED and "the worker process died during every try" in result.reason
        assert aborted in caplog.text
        assert store_contents(pipeline.store) == {}
