"""Real brokers and real Celery worker processes for the worker-pool tests (and bench/celery.py).

Redis runs from Debian's redis-server on 127.0.0.1 with a random port and no persistence, so a restart
loses every queued message, the worst case the pool must survive. RabbitMQ runs from Debian's
rabbitmq-server as a private node: its own name, ports, epmd, database and configuration under a temporary
folder, so neither the package's system service nor another test's node is involved. Workers are
`celery -A gcis_etl.worker worker` subprocesses, each in its own session so that a test can kill one whole
node (main process, pool processes, conversion children) and teardown can leave nothing behind. Below them:
folders of corpus masters, the config.yaml a test's orchestrator and workers share, and small helpers to run
a batch.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from tests.servers import MinioServer, terminate, wait_for_port


def redis_binary() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                              else None)
    if not found:
        raise RuntimeError("redis-server not found: `make test` installs Debian's redis-server package")
    return found


@dataclass
class RedisServer:
    """A running redis-server; restart() keeps the port and loses the data (no persistence)."""

    data_dir: Path
    port: int
    proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.data_dir), "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()  # like a crash: nothing is saved
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # not /usr/sbin's: that one switches user


@dataclass
class RabbitMQServer:
    """A private RabbitMQ node on 127.0.0.1: random AMQP, distribution and epmd ports, no plugins. It gets an
    epmd of its own, started here, so that stop() leaves no Erlang port mapper behind either."""

    base: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    epmd: subprocess.Popen | None = None

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, timeout: float = 60.0) -> None:
        from tests.servers import free_port
        if not RABBITMQ_SERVER.exists():
            raise RuntimeError("rabbitmq-server not found: `make test` installs Debian's rabbitmq-server package")
        self.port, dist_port, epmd_port = free_port(), free_port(), free_port()
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "rabbitmq.conf"
        config.write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
                          "loopback_users = none\n"
                          "disk_free_limit.absolute = 1MB\n")  # a nearly full /tmp must not block publishing
        (self.base / "enabled_plugins").write_text("[].\n")
        (self.base / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's
        env = dict(os.environ, HOME=str(self.base),  # the Erlang cookie goes there
                   ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(epmd_port),
                   RABBITMQ_NODENAME=f"gcis-test-{os.getpid()}-{self.port}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(dist_port),
                   RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
                   RABBITMQ_CONFIG_FILE=str(config), RABBITMQ_ADVANCED_CONFIG_FILE=str(self.base / "advanced.config"),
                   RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
                   RABBITMQ_PLUGINS_EXPAND_DIR=str(self.base / "plugins-expand"),
                   RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"), RABBITMQ_LOG_BASE=str(self.base / "log"),
                   RABBITMQ_LOGS=str(self.base / "log" / "node.log"), RABBITMQ_PID_FILE=str(self.base / "node.pid"))
        with open(self.base / "epmd.out", "wb") as out:
            self.epmd = subprocess.Popen(["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with open(self.base / "server.out", "wb") as out:  # in its own session: stop() can end the whole node
            self.proc = subprocess.Popen([str(RABBITMQ_SERVER)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_port(epmd_port, self.epmd, timeout)
            wait_for_port(self.port, self.proc, timeout)
        except RuntimeError as exc:
            log = (self.base / "server.out").read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"RabbitMQ did not start: {exc}\n{log}") from None

    def stop(self, grace: float = 30.0) -> None:
        """A clean shutdown (SIGTERM: the script stops the node), then kill whatever of the node is left,
        and its epmd."""
        if self.proc is not None:
            terminate(self.proc, grace)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # beam.smp, erl_child_setup, inet_gethost
            except ProcessLookupError:
                pass
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait()


_READY = re.compile(r"pool process (\d+) ready")


@dataclass
class CeleryWorker:
    """One worker node (`-n name@host`) started from a config file."""

    name: str
    config: Path
    log: Path
    env: dict[str, str]
    options: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Also a restart under the same name: only what this start logs tells it is ready."""
        logged = self.log.stat().st_size if self.log.exists() else 0
        celery = str(Path(sys.executable).parent / "celery")
        cmd = [celery, "-A", "gcis_etl.worker", "worker", "-n", f"{self.name}@%h", "--loglevel", "INFO",
               "--logfile", str(self.log), "--without-mingle", "--without-gossip", *self.options]
        env = dict(os.environ, **self.env, GCIS_CONFIG=str(self.config))
        with open(self.log.with_suffix(".out"), "wb") as out:  # what is said before logging is set up
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=Path(__file__).parent.parent)
        deadline = time.monotonic() + timeout
        while not (self.log.exists() and b" ready." in self.log.read_bytes()[logged:]):
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} not ready in {timeout} s:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.log.with_suffix(".out"), self.log) if p.exists())

    def processes(self) -> list[psutil.Process]:
        """Every live process of this node: main, pool processes (in the node's session, orphans too), and
        what they started (conversion children run in sessions of their own)."""
        if self.proc is None:
            return []
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == self.proc.pid:
                    found |= {p.pid: p for p in (proc, *proc.children(recursive=True))}
            except (OSError, psutil.Error):
                continue
        return [p for p in found.values() if _alive(p)]

    def pool_pids(self) -> list[int]:
        """Pool processes that have logged they are ready, in order (recycled ones included)."""
        return [int(pid) for pid in _READY.findall(self.log_text())]

    def kill(self) -> None:
        """kill -9 the whole node, as when its machine dies."""
        for proc in self.processes():
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM: finish running tasks), then kill what is left."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


# ------------------------------------------------------------------------------ a pool over sample masters

SAMPLES = ("rgb8-tiff-uncompressed/hopper.tif", "rgb8-tiff-uncompressed/rgb-3c-8b.tiff", "gray8/gray.tif",
           "jpeg-baseline/flowers.jpeg", "jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg",
           "rgb8-tiff-lzw/hopper_lzw.tif")
REJECTED_SAMPLE = "corrupt/bad.tif"


def received(workers, task_id: str) -> int:
    """How many times the workers took this task off the broker."""
    return sum(w.log_text().count(f"[{task_id}] received") for w in workers)


def make_masters(root: Path, objects: int, per_object: int, rejected: int = 0) -> Path:
    """`objects` folders of small corpus masters (one object each); the first `rejected` objects also get a
    rejected.tif no decoder accepts."""
    corpus = Path(__file__).parent / "corpus"
    n = 0
    for o in range(objects):
        folder = root / f"obj{o:02d}"
        folder.mkdir(parents=True)
        for i in range(per_object):
            sample = SAMPLES[n % len(SAMPLES)]
            shutil.copyfile(corpus / sample, folder / f"p{i:02d}{Path(sample).suffix}")
            n += 1
        if o < rejected:
            shutil.copyfile(corpus / REJECTED_SAMPLE, folder / "rejected.tif")
    return root


def expected_outcome(item_id: str):
    """What every master of make_masters must end as."""
    from gcis_etl.work import Outcome
    return Outcome.REJECTED if item_id.endswith("/rejected.tif") else Outcome.DEPOSITED


def pool_config(path: Path, *, masters: Path, broker_url: str, store: dict, celery: dict | None = None,
                pipeline: dict | None = None) -> Path:
    """A config.yaml for the orchestrator and its workers: pipeline `demo`, fast test limits."""
    import yaml
    settings = {
        "broker_url": broker_url,
        "concurrency": 1,
        "time_limits": {"default": {"soft_seconds": 10, "hard_seconds": 12}},
        "retry": {"max_retries": 3, "backoff_seconds": 1, "backoff_max_seconds": 1, "jitter": False},
        "visibility_timeout_seconds": 15,
        "restore_check_seconds": 1,
        "poll_seconds": 0.1,
        **(celery or {}),
    }
    document = {"state_dir": str(path.parent / f"{path.stem}-state"),
                "pipelines": {"demo": {"source": {"kind": "filesystem", "root": str(masters)}, "store": store,
                                       **(pipeline or {})}},
                "celery": settings}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def s3_store(minio, bucket: str) -> dict:
    return {"kind": "s3", "bucket": bucket, "prefix": "iiif", "endpoint_url": minio.endpoint,
            "region": "us-east-1", "addressing_style": "path",
            "retry": {"max_attempts": 2, "connect_timeout": 2, "read_timeout": 10}}


def minio_env(minio, tmp: Path) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key,
            "AWS_CONFIG_FILE": str(tmp / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-creds")}


def tasks_of(pipeline) -> list:
    """One ItemTask per item the pipeline's source lists, in listing order, as a harvest plans it (its settings
    digests are part of its Celery task id)."""
    from gcis_etl.work import ItemTask
    recipe = pipeline.recipe
    return [ItemTask(pipeline.name, obj.id, item, recipe.name, recipe.digest, settings=pipeline.worker_digests)
            for obj in pipeline.source.changes(None) for item in obj.items]


def run_all(executor, tasks, each=None) -> list:
    """Submit every task and drain; `each(results_so_far)` runs after every submit and every result."""
    results: list = []
    for task in tasks:
        results += executor.submit(task)
        if each:
            each(results)
    for result in executor.drain():
        results.append(result)
        if each:
            each(results)
    executor.close()
    return results


def store_contents(store) -> dict[str, str]:
    """key -> SHA-256 of the bytes actually stored (read back, not taken from metadata)."""
    import hashlib
    return {o.key: hashlib.sha256(store.get_bytes(o.key)).hexdigest() for o in store.list()}


def slow_master(path: Path, size: int = 4000) -> Path:
    """An uncompressed RGB TIFF of size x size pixels (gradients and noise): 3000 takes a second or so to convert.
    The gradients are written channel by channel from one ramp (full int64 planes took a second to make)."""
    import numpy as np
    import tifffile
    ramp = np.arange(size)
    image = np.empty((size, size, 3), np.uint8)
    image[..., 0] = ramp * 255 // size  # along x
    image[..., 1] = (ramp * 255 // size)[:, None]  # along y
    image[..., 2] = np.add.outer(ramp, ramp) * 255 // (2 * size)
    image += np.random.default_rng(size).integers(0, 12, image.shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, image, photometric="rgb")
    return path


@dataclass
class Pool:
    """What a worker-pool test works with: MinIO, Redis, worker nodes, a folder of masters."""

    tmp: Path
    minio: MinioServer
    redis: RedisServer
    masters: Path
    start_worker: Callable[..., CeleryWorker]  # the celery_workers fixture

    @property
    def env(self) -> dict[str, str]:
        return minio_env(self.minio, self.tmp)

    def config(self, name: str, *, masters: Path | None = None, pipeline: dict | None = None,
               **celery: object) -> Path:
        """A config file for a run called `name`, storing into a fresh bucket of its own."""
        import uuid
        bucket = f"{name}-{uuid.uuid4().hex[:12]}"
        self.minio.client().create_bucket(Bucket=bucket)
        return pool_config(self.tmp / f"{name}.yaml", masters=masters or self.masters,
                           broker_url=self.redis.url(), store=s3_store(self.minio, bucket),
                           celery=celery, pipeline=pipeline)

    def start(self, name: str, config: Path, *options: str) -> CeleryWorker:
        return self.start_worker(name, config, self.env, *options)


def ledger_rows(config_file: Path) -> dict[str, list[tuple]]:
    """Every table of a pipeline's ledger, rows sorted, without the columns that record when or in which run."""
    import sqlite3

    from gcis_etl.config import load_config
    when = {"first_seen", "updated", "last_run", "run_id", "seconds", "at", "published", "started", "finished",
            "since", "until", "checkpoint_after", "checkpoint", "options"}
    with sqlite3.connect(load_config(config_file).ledger_path) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if t != "sqlite_sequence"]
        rows = {}
        for table in tables:
            kept = [c[1] for c in db.execute(f"PRAGMA table_info({table})") if c[1] not in when]
            rows[table] = sorted(db.execute(f"SELECT {', '.join(kept)} FROM {table}").fetchall())
        return rows


def assert_harvests_agree(pool: Pool, **celery: object) -> list[CeleryWorker]:
    """A harvest of the pool's masters through two Celery workers (`celery` settings: another broker, say)
    records the same ledger and stores the same objects as a harvest with the local executor. Returns the
    workers, which both took work."""
    from gcis_etl.config import load_config
    from gcis_etl.harvesting import harvest
    manifests = {"manifest_base_url": "http://127.0.0.1:8182/store", "image_service_base_url": "http://127.0.0.1/iiif"}
    configs = {run: pool.config(run, pipeline={"executor": run, "concurrency": 4, "manifests": manifests}, **celery)
               for run in ("celery", "local")}
    workers = [pool.start("w1", configs["celery"]), pool.start("w2", configs["celery"])]
    reports = {run: harvest(load_config(configs[run]), "demo") for run in configs}

    assert reports["celery"].counts == reports["local"].counts
    assert reports["celery"].counts["deposited"] == 9 and reports["celery"].counts["rejected"] == 2
    ledgers = {run: ledger_rows(configs[run]) for run in configs}
    assert ledgers["celery"] == ledgers["local"]
    assert len(ledgers["celery"]["items"]) == 11 and len(ledgers["celery"]["objects"]) == 3
    stores = {run: store_contents(load_config(configs[run]).pipeline("demo").store) for run in configs}
    assert stores["celery"] == stores["local"]
    assert len([key for key in stores["celery"] if key.endswith("manifest-v3.json")]) == 3
    assert all(w.log_text().count("] received") > 0 for w in workers)
    return workers


def assert_no_stray_conversion_children(worker: CeleryWorker) -> None:
    """Each conversion child belongs to a live pool process, at most one each (none orphaned by a recycle)."""
    processes = worker.processes()
    pool_pids = {p.pid for p in processes if p.ppid() == worker.proc.pid}
    conversion = [p for p in processes if "_child_main" in " ".join(p.cmdline())]
    assert all(p.ppid() in pool_pids for p in conversion)
    assert len(conversion) <= len(pool_pids)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
