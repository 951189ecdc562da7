"""The Celery worker pool: `celery -A gcis_etl.worker worker`, and the executor that feeds it.

Workers read config.yaml like every other command ($GCIS_CONFIG, else ./config.yaml): its `celery:` section
(broker, queues, limits) and the pipelines, whose sources and stores a task resolves by name. A task is one
source item: fetch → convert → deposit (gcis_etl.work.Worker), and its outcome (an ItemResult) is recorded in
the result backend under an id derived from the work itself, so the outcome survives the orchestrator.

Why the prefork pool, one process per core: time limits, the per-child task and memory limits and the
redelivery of a task whose process died all exist only there. Each pool process owns a Worker, which runs
every decode and encode in its own conversion child (isolation.py) with VIPS_CONCURRENCY=1: neither the
worker's main process nor a pool process ever loads libvips (forked children of a process that ran a
libvips pipeline deadlock in its thread pool), which worker_init and worker_process_init check. A pool
process leads its own process group, so the hard time limit, which kills the group, takes its conversion
child with it; it is replaced after `worker_max_tasks_per_child` tasks or when it outgrows
`worker_max_memory_per_child_mb`, closing its conversion child, which itself is recycled on the
`isolation:` limits (libvips' long-run memory growth lives there).

Per-object manifests and the collection are not tasks: the orchestrator (gcis_etl.harvesting) publishes an
object's manifest once the ledger holds an outcome for each of its items, whichever executor produced them,
and updates the collection once at the end under the pipeline's lock — one writer per pipeline.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, TypeVar
from urllib.parse import urlsplit

from connectors.redaction import scrub
from gcis_etl import logs
from gcis_etl.commands import fail_config
from gcis_etl.config import Config, load_config
from gcis_etl.distributed import OUTAGE_RETRY_CEILING_SECONDS, TASK_NAME, CelerySettings, TaskRetry, redacted
from gcis_etl.errors import ConfigError, GcisError, VersionSkew
from gcis_etl.isolation import code_changed, run_as, running_process
from gcis_etl.models import item_label
from gcis_etl.pipelines import Pipeline
from gcis_etl.reports import counted
from gcis_etl.work import (TASK_PARTS, ItemResult, ItemTask, Outcome, RecipeCache, Worker, halting, image_key,
                           skew_fields, upgraded)

log = logging.getLogger(__name__)

UNMARK_SECONDS = 5.0  # for taking a SENT marker back after a failed send (CeleryExecutor._unmark)
SENT = "SENT"  # our own state: written before a task is published, so that its disappearance shows a loss
_RUNNING = frozenset({SENT, "RECEIVED", "STARTED", "RETRY"})  # a task somebody waits for
WORKER_PING_SECONDS = 2.0  # for a worker to answer, before a run or when asked about a quiet task
_CHECK_RETRIES = 2  # the broker's connection before a run: a restart of a few seconds is ridden out
UPGRADE = ("upgrade the workers first, then the harvests; or stop the harvests, let the queues drain and upgrade all "
           "(README: Worker pool, Upgrading); then run again")
_T = TypeVar("_T")


def celery_app(settings: CelerySettings, worker: bool = False):
    """A Celery app for these settings, with the item task registered (orchestrators only send it)."""
    from celery import Celery
    from kombu import Exchange, Queue

    app = Celery("gcis_etl", set_as_current=False)
    retries = logging.getLogger("celery.backends.base")
    if not any(isinstance(f, _OneLineRetries) for f in retries.filters):
        retries.addFilter(_OneLineRetries())
    traced = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, _UntracedRejects) for f in traced.filters):
        traced.addFilter(_UntracedRejects())
    app.conf.update(settings.celery_conf(worker))
    app.conf.task_queues = [Queue(name, Exchange(name), routing_key=name)
                            for name in (settings.default_queue, *settings.queues)]

    # A task whose pool process died is sent again (task_retry_on_worker_lost) up to max_retries times, at once:
    # with a countdown, the worker that took it would hold it, unacknowledged, behind its running tasks (see
    # _PoolProcess.process). STARTED is recorded by _start, not by Celery (task_track_started is off); outcomes
    # only while waited for (_WaitedFor).
    @app.task(name=TASK_NAME, max_retries=settings.retry.max_retries, default_retry_delay=0,
              **({"backend": _waited_for(app)} if worker else {}))
    def process_item(payload: dict[str, Any]) -> dict[str, Any]:
        if code_changed():  # before _start: the task goes back to its queue as it came, for a worker on the new files
            _stop_upgraded(payload)
        _start(payload)
        try:
            task = ItemTask.from_dict(payload)
        except VersionSkew as exc:
            result = _unreadable(payload, exc)
        else:
            result = _pool_process().process(task, settings.retry)
        if result.stops_run:  # Celery logs the task as succeeded, at INFO
            log.error("%s: the harvest stops: %s", _named(payload), result.reason)
            if code_changed():  # upgraded since the check above: its reason says the worker stops (work.WORKER_STOPS)
                _shut_down()
        return result.to_dict()

    return app


def _waited_for(app: Any) -> Any:
    """The configured result backend (Redis or Sentinel), recording a task's outcome only while it is waited for."""
    from celery.app.backends import by_url
    backend, url = by_url(app.conf.result_backend, app.loader)
    return type(f"WaitedFor{backend.__name__}", (_WaitedFor, backend), {})(app=app, url=url)


class _WaitedFor:
    """Whichever way Celery records an outcome (the task's return or exception, in the pool process; the hard time
    limit and a lost pool process's FAILURE, or its RETRY with the task sent again, in the worker's main process),
    it is recorded only over a marker: SENT, or a running state. A task PENDING had its outcome taken (another
    message's: the harvest forgets an outcome once it is in the ledger), or its marker went with a result backend
    restarted empty (a harvest waiting for it as a running task puts it back: CeleryExecutor._mark_again; else
    it sends the task again); a task with an outcome has another message's. Recorded, it would be kept
    result_expires_hours, for a later submission of the same work to take for its own; a RETRY would have its new
    message run. Celery's own check, in the same place, spares a SUCCESS only. STARTED is _start's, which checks
    for itself."""

    def _store_result(self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None,
                      **kwargs: Any) -> Any:
        if state != "STARTED":
            status = self._get_task_meta_for(task_id)["status"]
            if status not in _RUNNING:
                args = getattr(request, "args", None) or ({},)
                why = ("nobody waits for it (no marker: its outcome taken already, or the result backend restarted "
                       "empty)" if status == "PENDING" else f"another's outcome ({status}) is recorded, not yet taken")
                log.warning("%s: task %s: its %s not recorded, %s", _named(args[0]), task_id, state, why)
                return result
        return super()._store_result(task_id, result, state, traceback, request, **kwargs)


class _OneLineRetries(logging.Filter):
    """Celery logs each retry of an unreachable result backend with a full traceback (about 50 lines, 40 times in
    an outage): a line each, with the reason, says the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()} ({type(error).__name__}: {error})", ()
            record.exc_info, record.exc_text = None, None
        return True


class _UntracedRejects(logging.Filter):
    """Celery logs a task put back in its queue (Reject, _stop_upgraded) with a traceback of 12 lines: its line and
    the error before it say why."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery.exceptions import Reject
        if record.exc_info and isinstance(record.exc_info[1], Reject):
            record.exc_info, record.exc_text = None, None
        return True


# ------------------------------------------------------------------------------------ in the worker


class SoftTimeLimit(GcisError):
    """The task's soft time limit passed: the item fails cleanly (its scratch is removed)."""


class _PoolProcess:
    """The Worker of one pool process, and what its soft time limit does to it."""

    def __init__(self, config: Config, pipelines: dict[str, Pipeline], node: str):
        scratch = config.state_dir / "scratch" / "celery" / f"{socket.gethostname()}-{os.getpid()}"
        self.worker = Worker(pipelines, scratch, node=node)
        self.soft_limit_hit = False

    def process(self, task: ItemTask, retry: TaskRetry) -> ItemResult:
        """A transient failure is retried here, after its backoff, not by Celery's retry with a countdown: that
        new message would be taken at once by a worker and held, unacknowledged, behind its running tasks while
        other workers idle, and redelivered past the visibility timeout to run twice at once. Here the task is
        held at most its hard time limit, which the backoffs count against. The soft limit's failure says what
        the last try that ended on its own met, and is that try's kind: the retries of a source's or store's
        outage stop the run and count no attempt, as they do when they run out; those of the item's transient
        failure count one, as they do then; a try the limit cut (a conversion, a download) counts one."""
        from billiard.pool import SIG_SOFT_TIMEOUT
        from celery import current_task
        from celery.utils.time import get_exponential_backoff_interval
        self.soft_limit_hit = False
        signal.signal(SIG_SOFT_TIMEOUT, self._on_soft_limit)  # billiard installs its own after our init
        began = time.time()
        result = self.worker.process(task)
        ended = None if self.soft_limit_hit else result  # the last try that ended on its own
        for retries in range(retry.max_retries):
            if result.outcome is not Outcome.FAILED or not result.transient or self.soft_limit_hit:
                break
            delay = get_exponential_backoff_interval(retry.backoff_seconds, retries, retry.backoff_max_seconds,
                                                     retry.jitter)
            log.warning("%s: %s; retry %d of %d in %d s", task.label, result.reason,
                        retries + 1, retry.max_retries, delay)
            try:
                time.sleep(delay)
            except SoftTimeLimit:
                break
            result = self.worker.process(task)
            ended = ended if self.soft_limit_hit else result
        if self.soft_limit_hit:
            soft = current_task.request.timelimit[1]
            if ended is None:
                return replace(result, outcome=Outcome.FAILED, transient=False, stops_run=False,
                               reason=f"took longer than the soft time limit of {soft} s for recipe {task.recipe}")
            return replace(ended, reason=f"took longer than the soft time limit of {soft} s retrying (its last "
                                         f"try: {ended.reason})")
        key = self.worker.image_key(task) if current_task.request.retries else None  # Celery retries a task
        if key:  # only after its process died; this try failing too leaves that try's upload all the same
            _abort_dead_upload(self.worker.pipelines[task.pipeline], task, key,
                               timedelta(seconds=time.time() - began))  # never this try's: long complete
        return result

    def _on_soft_limit(self, signum: int, frame: Any) -> None:
        """Stop the conversion first: its reply would otherwise be taken for the next task's."""
        import psutil
        self.soft_limit_hit = True
        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        raise SoftTimeLimit("soft time limit exceeded")

    def close(self) -> None:
        self.worker.close()


@functools.cache
def _config() -> Config:
    return load_config()


@functools.cache
def _pipelines() -> dict[str, Pipeline]:
    """The pipelines, their recipes read: by the worker's main process as it starts (worker_init), so that every
    pool process, forked from it then or later (a replaced one), has the recipes of the worker's start, whatever
    the files say by then. Reading a recipe loads no libvips; the sources and stores are opened in each pool
    process."""
    config = _config()
    pipelines = {name: config.pipeline(name) for name in config.pipelines}
    for pipeline in pipelines.values():
        pipeline.recipe  # a cached_property: read once, here
    return pipelines


@functools.cache
def _pool_process() -> _PoolProcess:
    """Made at the pool process's first task: the task names the worker's node."""
    from celery import current_task
    return _PoolProcess(_config(), _pipelines(), current_task.request.hostname)


def _stop_upgraded(payload: dict[str, Any]) -> NoReturn:
    """A worker whose gcis-etl files changed since it started (upgraded in place) would run, in the pool processes
    it forks, the new modules beside its old ones: it shuts itself down, warm, for its supervisor to start it on the
    new files, and puts the task back in its queue, untouched (SENT), for a worker that runs them. Raises Reject.
    Not a stop of the run: a worker that stayed up would refuse every task of every run until restarted by hand.
    Said and asked once a process: until the shutdown reaches it, the worker may take the task it put back again."""
    from celery.exceptions import Reject
    global _stopping
    if not _stopping:
        _stopping = True
        log.error("%s: gcis-etl was upgraded under %s since it started: the worker stops itself (warm shutdown), for "
                  "its supervisor to start it again on the new files; the task goes back to its queue",
                  _named(payload), running_process())
        _shut_down()
    raise Reject("gcis-etl was upgraded under this worker", requeue=True)


_stopping = False  # _stop_upgraded asked this worker to shut down


def _shut_down() -> None:
    """Asks this task's worker node for a warm shutdown (Celery's remote control: whichever pool runs the task, it
    reaches the node's main process, which stops taking tasks, lets its running ones end and exits)."""
    from celery import current_task
    node = current_task.request.hostname
    try:
        current_task.app.control.shutdown(destination=[node])
    except Exception as exc:  # the broker gone meanwhile: its outage is what the log then says
        log.error("the worker %s could not ask itself to stop (%s: %s): restart it", node, type(exc).__name__,
                  scrub(str(exc)))


def _start(payload: dict[str, Any]) -> None:
    """The task recorded STARTED (the worker and pool process the orchestrator asks about), or not run when nobody
    waits for it (Ignore: its message is acknowledged, nothing recorded). The orchestrator records SENT before it
    sends a task and forgets its outcome once it handed it over: a task PENDING is a late duplicate (Redis
    redelivers a vanished worker's message after the visibility timeout, long after the task was sent again and
    its outcome taken), or its send was taken back, or its marker expired (the orchestrator sends those again); a
    task with an outcome is another message's, not yet taken. Run, it would convert against a state that moved on
    (the item re-encoded to another recipe writing the same key; the key retired), and leave an outcome a later
    submission of the same work would take for its own. Not Celery's track_started: it writes STARTED before the
    task runs, over the state that tells, and putting that back would race with the orchestrator."""
    from celery import current_task
    from celery.exceptions import Ignore
    request, backend = current_task.request, current_task.backend
    status = backend.get_task_meta(request.id, cache=False)["status"]  # never an outcome cached before a forget
    if status not in _RUNNING:
        why = ("nobody waits for it (no SENT marker: a late duplicate whose outcome was taken, a send taken back, "
               "or a marker expired)" if status == "PENDING" else
               f"a duplicate: its outcome ({status}) is recorded, not yet taken")
        log.warning("%s: task %s not run, %s", _named(payload), request.id, why)
        raise Ignore()
    backend.store_result(request.id, {"pid": os.getpid(), "hostname": request.hostname}, "STARTED", request=request)


def _abort_dead_upload(pipeline: Pipeline, task: ItemTask, key: str, older_than: timedelta = timedelta(0)) -> None:
    """What a try of `task` whose pool process was SIGKILLed mid-upload (the hard time limit, the OOM killer, an
    operator) left of its upload of `key`: multipart parts (temporary files in a local store), billed until a
    lifecycle rule removes them, which nothing else aborts once the run completes. Called where the death is
    known: by the try Celery sends again after it, or by the orchestrator reading the task's failure. Only the
    uploads of that very key begun more than `older_than` ago: no other writer of it is running (a harvest holds
    its pipeline's lock, as migrations do), but for a duplicate of the task sent again to a worker that did not
    answer, whose outcome is not waited for. Housekeeping: a failure is logged, the item's outcome stands. One
    listing, only after a death: none on a task's way."""
    try:
        aborted = pipeline.store.abort_incomplete_uploads(older_than=older_than, keys=key, exact=True)
    except GcisError as exc:
        log.warning("%s: the incomplete upload a try that died left may remain: %s",
                    task.label, exc)
        return
    if aborted:
        log.warning("%s: aborted the incomplete upload of %s that a try whose process died left",
                    task.label, pipeline.store.describe(key))


def _item_of(payload: dict[str, Any]) -> dict[str, Any]:
    return payload.get("item") if isinstance(payload.get("item"), dict) else {}


def _named(payload: Any) -> str:
    """pipeline/item (item_label), as far as the task's payload names them."""
    payload = payload if isinstance(payload, dict) else {}
    return f"{payload.get('pipeline')}/{item_label(str(payload.get('object_id')), str(_item_of(payload).get('id')))}"


def _unreadable(payload: dict[str, Any], skew: VersionSkew) -> ItemResult:
    """The stop for a task of another version of gcis-etl: an outcome, which orchestrators of any version read as
    one (a failure would be the item's to those older than VersionSkew). Its item is named as far as the task
    names it: the orchestrator knows the task it sent."""
    from celery import current_task
    item = _item_of(payload)
    named = ItemResult(str(payload.get("pipeline")), str(payload.get("object_id")), str(item.get("id")),
                       item.get("sequence") or 0, Outcome.FAILED, "", str(payload.get("recipe")),
                       str(payload.get("recipe_digest")), payload.get("attempt") or 1)
    return _skewed(named, f"the worker {current_task.request.hostname} cannot read the task ({skew})")


def _skewed(base: ItemResult, unread: str) -> ItemResult:
    """Not the item's failure: every task would meet the same versions."""
    return halting(base, f"{unread}: the harvest and the worker run different versions of gcis-etl", UPGRADE,
                      transient=False)


def _refuse_libvips(where: str) -> None:
    """Exits (70) rather than raises: Celery logs what a signal's receiver raises, and goes on to fork or run
    tasks in a process that would deadlock."""
    if "pyvips" in sys.modules:
        sys.stderr.write(f"gcis-etl worker: libvips is loaded in the {where}: pool processes forked from it would "
                         f"deadlock; only conversion children (gcis_etl.isolation) may load it; not starting\n")
        sys.stderr.flush()
        os._exit(os.EX_SOFTWARE)


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    """Also names the node and this, its main process, in every message asking to restart a process of it."""
    run_as(f"the Celery worker {sender.hostname}, pid {os.getpid()} on {socket.gethostname()}")
    _pipelines()  # before the pool forks; config.yaml checked each recipe as it loaded
    _refuse_libvips("Celery worker's main process")
    settings = _config().celery
    log.info("gcis-etl worker: broker %s, results %s, pipelines %s", redacted(settings.broker_url),
             redacted(settings.results_url), ", ".join(_config().pipelines) or "none")


def _on_process_init(**kwargs: Any) -> None:
    """In each new pool process: own process group (for the hard limit), scratch left by dead ones removed. The
    folder of its own pid is always a dead one's: a node restarted in a container (its own pid namespace) gets
    the same pids again."""
    os.setpgrp()
    _refuse_libvips("Celery pool process")
    import psutil
    scratch = _config().state_dir / "scratch" / "celery"
    host = socket.gethostname()
    for folder in scratch.glob(f"{host}-*"):
        pid = folder.name.rsplit("-", 1)[1]
        if pid.isdigit() and (int(pid) == os.getpid() or not psutil.pid_exists(int(pid))):
            shutil.rmtree(folder, ignore_errors=True)
    log.info("pool process %d ready", os.getpid())


def _on_process_shutdown(**kwargs: Any) -> None:
    if _pool_process.cache_info().currsize:
        _pool_process().close()


def _connect_signals() -> None:
    """Logging as the commands have it (logs.guard), on the loggers Celery sets up: its own (`--loglevel DEBUG`
    leaves botocore logging request headers) and its task logger, which writes through handlers of its own."""
    from celery import signals
    signals.after_setup_logger.connect(logs.guard, weak=False)
    signals.after_setup_task_logger.connect(logs.guard, weak=False)
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.worker_process_init.connect(_on_process_init, weak=False)
    signals.worker_process_shutdown.connect(_on_process_shutdown, weak=False)


@functools.cache
def _worker_app():
    try:
        settings = _config().celery
    except ConfigError as exc:  # a worker that cannot read its configuration says so, without a traceback
        fail_config(exc)
    _connect_signals()
    return celery_app(settings, worker=True)


def __getattr__(name: str) -> Any:
    """`celery -A gcis_etl.worker` asks for `app`: built from config.yaml on first use, so that importing this
    module (the executor does) reads no configuration and connects to nothing."""
    if name == "app":
        return _worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------- in the orchestrator


def celery_task_id(task: ItemTask) -> str:
    """The same work always gets the same id: a resubmission after a restart finds its outcome or its task. The
    settings it was planned with count: an outcome deposited under another store prefix is not this work's."""
    key = "\0".join((task.pipeline, task.object_id, task.item.id, task.fingerprint, task.recipe_digest,
                     str(task.attempt), *(("force",) if task.force else ()),  # forced: not an earlier outcome
                     *(f"{what}={digest}" for what, digest in sorted((task.settings or {}).items()))))
    return "gcis-" + hashlib.sha256(key.encode()).hexdigest()[:40]


@dataclass
class _InFlight:
    task: ItemTask
    progress: tuple[str, str]  # state and its details (a redelivered task is STARTED by another process)
    since: float               # last send or progress (monotonic; a send by an earlier run: _heard_since)
    sends: int = 0
    asked: float = 0.0         # when its worker was last asked whether it runs the task (monotonic)
    unheld: int = 0            # answers in a row that it does not (no answer counts as one)
    host: str | None = None    # the worker that started it, once seen


class CeleryExecutor:
    """Sends ItemTasks to the worker pool and gathers their outcomes from the result backend.

    At most `concurrency` tasks are in flight (make it about twice the pool's processes, so that no worker
    waits for the orchestrator). A task whose outcome is already recorded is not sent again, one still
    running is waited for; an outcome is forgotten once handed over (the caller has recorded it), so that a
    deliberate re-run gets a fresh task. A task the broker lost is sent again under the same id: at once when
    our SENT marker is gone too (a Redis restart without persistence empties queue and results alike), unless
    the task was last seen running and the broker is another server (a result backend of its own restarted
    empty loses the marker alone: it is put back, _mark_again); after twice visibility_timeout_seconds without
    progress otherwise, counted from its send by the later runs too (its marker says when: a cron harvest's runs
    are shorter than that), while a worker consumes its queue (with none, it waits: _waits_for_a_worker).
    A task STARTED by a worker that no longer runs it is sent again once its worker, asked twice
    worker_check_seconds apart, did not answer or did not hold it: Redis redelivers the task of a vanished
    worker only after visibility_timeout_seconds (2 h). A send that raised takes its marker back, so the next
    run sends the task at once; a message that went out all the same is not run. At worst a task runs twice
    while it is waited for, and the second run finds the first's output in the store; a message that comes
    back once its outcome is recorded, or taken, is not run (_start), and one running then records none
    (_WaitedFor). An outcome that would stop the run (_stale_halt) recorded before this run sent its task is sent
    again rather than taken: it told how things stood then.
    Once `stopping()` (a stop asked for, the run's time up; never by default), no task is sent and those not
    started yet are not waited for: they are left to the workers (in their queue, unless the broker lost them),
    and the next run takes their outcomes (with no worker running, waiting for them would never end), or sends
    them again once their patience, from their send, is spent.
    """

    def __init__(self, pipelines: dict[str, Pipeline], concurrency: int, scratch: Path,
                 settings: CelerySettings | None = None, stopping: Callable[[], bool] | None = None):
        self.pipelines = pipelines
        self.stopping = stopping or (lambda: False)
        self._left: Counter[str] = Counter()  # by pipeline: tasks not started when the run stopped, left to workers
        self.window = concurrency
        self.settings = settings or _settings_of(pipelines)
        self.app = celery_app(self.settings)
        self._flights: dict[str, _InFlight] = {}
        self._handed: list[str] = []
        self._recipes = RecipeCache(pipelines)
        self._last_poll = 0.0
        self._unreachable = False
        self._queues: set[str] | None = None  # consumed by a worker, or said not to be; None: no worker answered
        self._unconsumed: set[str] = set()  # queues whose tasks wait for a worker to consume them, said once
        self._lost_together = _one_server(self.settings.broker_url, self.settings.results_url)

    def check(self) -> None:
        """The broker and the result backend answer (within a few tries): otherwise the run stops before its
        first item rather than after outage_retries on it. No worker answering is only said (workers may be
        started on demand, by the queue's length): otherwise the run would wait, in silence, for ever. The
        first worker to answer tells the queues it consumes; a task for another queue asks them all (_send)."""
        with self._reachable("no task was sent"):
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=_CHECK_RETRIES)
                self.app.backend.client.ping()
                self._queues = _queue_names(self._active_queues(connection, limit=1))
        if self._queues is None:
            log.warning("no Celery worker answered within %g s: the tasks wait in their queue until one starts "
                        "(celery -A gcis_etl.worker worker, with this config.yaml)", WORKER_PING_SECONDS)

    def _active_queues(self, connection: Any, limit: int | None = None) -> dict[str, list[dict]] | None:
        """The queues each worker answering within WORKER_PING_SECONDS consumes (its -Q), by worker."""
        return self.app.control.inspect(timeout=WORKER_PING_SECONDS, limit=limit,
                                        connection=connection).active_queues()

    def _watch(self, queue: str) -> None:
        """A worker answering the ping but consuming none of the queue's tasks (started with -Q for another
        queue) would leave the run waiting in silence: said once, at the queue's first task."""
        if self._queues is None or queue in self._queues:
            return
        self._queues |= _queue_names(self._ask_workers("active_queues", self._active_queues)) or set()
        if queue not in self._queues:
            log.warning("no Celery worker that answered within %g s consumes queue %s: its tasks wait there until "
                        "one does (celery -A gcis_etl.worker worker -Q %s, with this config.yaml)",
                        WORKER_PING_SECONDS, queue, queue)
            self._queues.add(queue)

    def submit(self, task: ItemTask) -> list[ItemResult]:
        with self._reachable("tasks already sent keep running on the workers"):
            return self._submit(task)

    def _submit(self, task: ItemTask) -> list[ItemResult]:
        self._forget_handed()
        if code_changed():  # as the local executor's Worker: what this process imports from now on is another version's
            return [upgraded(ItemResult.failed(task))]
        done: list[tuple[str, ItemResult]] = []
        while len(self._flights) >= self.window and not self.stopping():
            finished = self._poll()
            done += finished
            if not finished:
                time.sleep(self.settings.poll_seconds)
        if not self.stopping():  # once stopping, no task is sent: the next run does it
            task_id = celery_task_id(task)
            meta = self.app.backend.get_task_meta(task_id)
            unsent = _InFlight(task, (SENT, "None"), 0.0)  # a task this run sends, or sends again
            if meta["status"] in _RUNNING:
                self._flights[task_id] = _InFlight(task, _progress(meta), _heard_since(meta))
            elif meta["status"] == "PENDING":
                self._send(task_id, unsent)
            elif (stale := _stale_halt(meta)) is not None:
                self.app.backend.forget(task_id)  # Celery records no SENT marker over a SUCCESS
                self._resend(task_id, unsent, stale, level=logging.INFO)
            elif (result := self._finished(task_id, unsent, meta)) is not None:
                done.append((task_id, result))
        if time.monotonic() - self._last_poll >= self.settings.poll_seconds:
            done += self._poll()
        self._handed += [task_id for task_id, _ in done]
        return [result for _, result in done]

    def drain(self) -> Iterator[ItemResult]:
        if self._unreachable:  # nothing more can be learnt: the outcomes stay where the workers record them
            return
        with self._reachable("tasks already sent keep running on the workers"):
            self._forget_handed()
            while self._flights:
                if self.stopping():
                    self._leave_queued()
                finished = self._poll()
                for task_id, result in finished:
                    self._handed.append(task_id)
                    yield result
                    self._forget_handed()
                if not finished:
                    time.sleep(self.settings.poll_seconds)

    def close(self) -> None:
        if not self._unreachable:
            self._forget_handed()
        hours = self.settings.result_expires_hours
        for pipeline, flying in Counter(flight.task.pipeline for flight in self._flights.values()).items():
            stays = "its outcome stays" if flying == 1 else "their outcomes stay"
            log.warning("%s: %s still in flight: %s in the result backend for %g hours", pipeline,
                        counted(flying, "task"), stays, hours)
        for pipeline, left in self._left.items():  # as designed, at a time limit: not mailed (INFO)
            be, it, its, outcomes = ("is", "it", "its", "outcome") if left == 1 else ("are", "them", "their",
                                                                                     "outcomes")
            log.info("%s: %s sent and not started yet %s left to the workers: the next run takes %s %s (kept %g "
                     "hours), or sends %s again if no worker started %s within %g s of %s send", pipeline,
                     counted(left, "task"), be, its, outcomes, hours, it, it,
                     2 * self.settings.visibility_timeout_seconds, its)
        self.app.close()

    def left_queued(self, pipeline: str) -> int:
        """The pipeline's tasks left to the workers, not started, when the run stopped (for the run's note)."""
        return self._left[pipeline]

    def _leave_queued(self) -> None:
        """The run stops after the tasks in flight: one still SENT has not reached a worker's pool process (nor
        is known to be in its queue: the broker may have lost it)."""
        for task_id, flight in list(self._flights.items()):
            if flight.progress[0] == SENT:
                del self._flights[task_id]
                self._left[flight.task.pipeline] += 1

    def _send(self, task_id: str, flight: _InFlight) -> None:
        recipe = self._recipes.of(flight.task)
        limits = self.settings.limits_for(recipe)
        queue = self.settings.queue_for(recipe)
        self._watch(queue)
        app = self.app
        marker = {"sent": time.time()}  # wall clock: the next runs measure the patience from it (_heard_since)
        app.backend.store_result(task_id, marker, SENT)
        # Published directly rather than through app.send_task, which would also subscribe this process to
        # each task's result channel: outcomes are read by id instead, which also works after a restart.
        # argsrepr is what task events (Flower) and worker logs show of the arguments: scrubbed, in case a
        # locator's URL carries a signed query (a presigned rendition URL) the worker needs to fetch it.
        args = (flight.task.to_dict(),)
        message = app.amqp.create_task_message(
            task_id, TASK_NAME, args, {}, time_limit=limits.hard_seconds, soft_time_limit=limits.soft_seconds,
            create_sent_event=app.conf.task_send_sent_event, argsrepr=scrub(repr(args)), kwargsrepr="{}")
        try:
            with app.producer_or_acquire() as producer:
                app.amqp.send_task_message(producer, TASK_NAME, message, queue=queue,
                                           retry=True, retry_policy={
                                               "max_retries": self.settings.outage_retries, "interval_start": 0,
                                               "interval_step": 1, "interval_max": OUTAGE_RETRY_CEILING_SECONDS,
                                               "errback": functools.partial(_sending_retried, flight.task)})
        except BaseException:  # the broker is down, or a second Ctrl-C while it stalls
            self._unmark(task_id)
            raise
        flight.progress, flight.since, flight.sends = _progress({"result": marker, "status": SENT}), \
            time.monotonic(), flight.sends + 1
        flight.asked, flight.unheld, flight.host = flight.since, 0, None  # the worker of this send, once seen
        self._flights[task_id] = flight

    def _unmark(self, task_id: str) -> None:
        """A marker with no message behind it would hold the task back for twice visibility_timeout_seconds on
        the next run; without it, the next run sends the task at once. The error that stopped the send is what
        the caller must see, not this one, and at once (a second Ctrl-C): a result backend that stalls with the
        broker is given UNMARK_SECONDS, in a thread of its own, rather than its socket timeout (2 min)."""
        failures: list[str] = []

        def forget() -> None:
            try:
                self.app.backend.forget(task_id)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {scrub(str(exc))}")

        remover = threading.Thread(target=forget, name="gcis-unmark", daemon=True)
        remover.start()
        remover.join(UNMARK_SECONDS)
        if remover.is_alive():
            failures.append(f"no answer within {UNMARK_SECONDS:g} s")
        if failures:
            log.warning("task %s: its %s marker could not be removed (%s); the next run sends it again only after "
                        "%g s", task_id, SENT, failures[0], 2 * self.settings.visibility_timeout_seconds)

    def _poll(self) -> list[tuple[str, ItemResult]]:
        """The tasks that finished since the last look, with their outcomes; lost ones are sent again."""
        self._last_poll = now = time.monotonic()
        patience = 2 * self.settings.visibility_timeout_seconds
        done, quiet = [], {}
        consumed: set[str] | None = None  # the queues the workers consume: asked once a poll, when needed

        def ended(task_id: str, result: ItemResult | None) -> None:  # None: it was sent again, and flies on
            if result is not None:
                del self._flights[task_id]
                done.append((task_id, result))

        for task_id, flight in list(self._flights.items()):
            meta = self.app.backend.get_task_meta(task_id)
            if meta["status"] == "PENDING" and not self._lost_together and flight.progress[0] == "STARTED" \
                    and flight.host:
                meta = self._mark_again(task_id, flight)
            status = meta["status"]
            if status in _RUNNING:
                if _progress(meta) != flight.progress:
                    flight.progress, flight.since, flight.unheld = _progress(meta), now, 0
                holder = status == "STARTED" and isinstance(meta["result"], dict) and meta["result"].get("hostname")
                flight.host = holder or flight.host
                if holder and now - flight.asked >= self.settings.worker_check_seconds:
                    quiet.setdefault(holder, []).append(task_id)
                if now - flight.since < patience:
                    continue
                if status == SENT:
                    if consumed is None:
                        consumed = _queue_names(self._ask_workers("active_queues", self._active_queues)) or set()
                    if self._waits_for_a_worker(flight, consumed):
                        flight.since = now
                        continue
            if status in _RUNNING or status == "PENDING":
                ended(task_id, self._resend(task_id, flight, "lost by the broker" if status == "PENDING" else
                                            f"no progress for {patience} s"))
            else:
                ended(task_id, self._finished(task_id, flight, meta))
        for task_id, why in self._unheld(quiet, now).items():
            ended(task_id, self._resend(task_id, self._flights[task_id], why))
        return done

    def _waits_for_a_worker(self, flight: _InFlight, consumed: set[str]) -> bool:
        """Whether a task still queued past its patience waits for a worker, none consuming its queue (every worker
        stopped, for an upgrade): its message is most likely there. Sent again, it would be there twice, and after
        max_resends its item failed, an attempt counted. Said once a queue, until a worker consumes it again."""
        queue = self.settings.queue_for(self._recipes.of(flight.task))
        if queue in consumed:
            self._unconsumed.discard(queue)
            return False
        if queue not in self._unconsumed:
            self._unconsumed.add(queue)
            log.warning("no Celery worker consumes queue %s: its tasks wait there, and the run with them, until one "
                        "does (celery -A gcis_etl.worker worker -Q %s, with this config.yaml); no attempt is counted",
                        queue, queue)
        return True

    def _mark_again(self, task_id: str, flight: _InFlight) -> dict[str, Any]:
        """The marker of a task last seen STARTED by its worker, which the result backend lost (restarted empty)
        while the broker, another server, kept its message, put back: the worker running it records its outcome,
        and it is waited for as any other STARTED task (its worker asked about it, and the task sent again once
        the worker no longer holds it: one that finished meanwhile recorded nothing over the missing marker).
        Sent again at once, it ran twice. A task last seen queued (SENT) is sent again at once, as before: a worker
        that took its message meanwhile did not run it (no marker), and put back, it would wait
        visibility_timeout_seconds twice; its old message, if still queued, may then run beside the new one."""
        meta = {"status": "STARTED", "result": {"hostname": flight.host}}
        self.app.backend.store_result(task_id, meta["result"], "STARTED")
        flight.progress = _progress(meta)  # not news: the patience and the worker's check run on
        log.warning("%s: task %s has no marker in the result backend (%s: restarted empty?); the broker (%s) "
                    "keeps its message: marker put back (STARTED by %s), waiting for it",
                    flight.task.label, task_id,
                    redacted(self.settings.results_url), redacted(self.settings.broker_url), flight.host)
        return meta

    def _unheld(self, quiet: dict[str, list[str]], now: float) -> dict[str, str]:
        """Of the STARTED tasks by worker, those whose worker twice in a row did not answer or did not hold them,
        and why. Twice: a task that ends between our read of its state and its worker's answer is not held
        either, and the next poll finds its outcome; a worker that misses one answer is not taken for gone.
        A worker holds a task from its delivery until its outcome is recorded."""
        lost = {}
        for hostname, task_ids in quiet.items():
            held = self._ask_workers("query_task", lambda connection: self.app.control.inspect(
                destination=[hostname], timeout=WORKER_PING_SECONDS, limit=1,
                connection=connection).query_task(*task_ids)) or {}
            for task_id in task_ids:
                flight = self._flights.get(task_id)
                if flight is None or flight.progress[0] != "STARTED":  # it was sent again above
                    continue
                flight.asked = now
                flight.unheld = 0 if task_id in held.get(hostname, {}) else flight.unheld + 1
                if flight.unheld >= 2:
                    lost[task_id] = (f"started by {hostname}, which does not answer" if hostname not in held else
                                     f"started by {hostname}, which no longer runs it")
        return lost

    def _ask_workers(self, command: str, ask: Callable[[Any], _T]) -> _T:
        """A control command to the workers (inspect), on a connection of its own: kombu retries no broadcast,
        and the first one on a pooled connection after the broker restarted meets the socket the old server
        closed ("Connection closed by server."). An outage is ridden out as a send rides it out (outage_retries
        tries, waiting 0, 1, 2 ... s, at most OUTAGE_RETRY_CEILING_SECONDS), a line each as the result backend
        says its retries; then the broker's error, as kombu's OperationalError, stops the run."""
        from kombu.exceptions import OperationalError
        retries = 0
        while True:
            with self.app.connection_for_write() as connection:
                try:
                    connection.ensure_connection(max_retries=0)  # one try each: these are the retries
                    return ask(connection)
                except (OperationalError, *connection.connection_errors) as exc:  # refused: kombu's; closed: Redis'
                    if retries >= self.settings.outage_retries:
                        if isinstance(exc, OperationalError):
                            raise
                        raise OperationalError(str(exc)) from exc
                    cause = exc.__cause__ or exc
                    log.warning("Failed operation %s. Retrying %d more times. (%s: %s)", command,
                                self.settings.outage_retries - retries, type(cause).__name__, scrub(str(cause)))
            time.sleep(min(retries, OUTAGE_RETRY_CEILING_SECONDS))
            retries += 1

    def _finished(self, task_id: str, flight: _InFlight, meta: dict[str, Any]) -> ItemResult | None:
        """A finished task's outcome; a task whose outcome a worker could not record while the result backend was
        down (_unrecorded) is sent again instead (None)."""
        unrecorded = _unrecorded(meta)
        if unrecorded:
            return self._resend(task_id, flight, unrecorded, item_failed=False)
        return self._outcome(task_id, flight, meta)

    def _resend(self, task_id: str, flight: _InFlight, why: str, item_failed: bool = True,
                level: int = logging.WARNING) -> ItemResult | None:
        """The task sent again under its id (a deposit it made is found in the store, not made again), or, after
        max_resends, its failure: the item's, or, when the result backend failed it (_unrecorded), one that stops
        the run and counts no attempt."""
        task = flight.task
        if flight.sends > self.settings.max_resends:
            failed = ItemResult.failed(task, f"task {why}, after {flight.sends} sends")
            return failed if item_failed else replace(
                failed, transient=True, stops_run=True, reason=f"{failed.reason}: not the item's failure, the "
                                                               f"result backend's (no attempt counted)")
        log.log(level, "%s: task %s; sending it again", task.label, why)
        self._send(task_id, flight)
        return None

    def _outcome(self, task_id: str, flight: _InFlight, meta: dict[str, Any]) -> ItemResult:
        """A task or an outcome one side cannot read stops the run (VersionSkew): the pool runs two versions."""
        task = flight.task
        worker = f"the worker {flight.host}" if flight.host else f"the worker that logged task {task_id}"
        if meta["status"] == "SUCCESS":
            try:
                return ItemResult.from_dict(meta["result"])
            except VersionSkew as exc:
                return _skewed(ItemResult.failed(task), f"the harvest cannot read the outcome of {worker} ({exc})")
        error = meta["result"]
        unread = _undecoded(error)
        if unread:
            return _skewed(ItemResult.failed(task), f"{worker} cannot read the task ({unread})")
        name = type(error).__name__
        if name in ("TimeLimitExceeded", "WorkerLostError"):  # its process killed, and not tried again
            self._abort_dead_upload(task)
        if name == "TimeLimitExceeded":
            limit = self.settings.limits_for(self._recipes.of(task)).hard_seconds
            return ItemResult.failed(task, f"took longer than the hard time limit of {limit} s for recipe "
                                           f"{task.recipe}")
        if name == "WorkerLostError":
            return ItemResult.failed(task, f"the worker process died during every try ({error})")
        return ItemResult.failed(task, f"task {meta['status'].lower()}: {name}: {error}")

    def _abort_dead_upload(self, task: ItemTask) -> None:
        """The upload a task's last try left, killed: under the key the try deposits into (work.Worker names it)."""
        pipeline = self.pipelines[task.pipeline]
        try:
            key = image_key(pipeline.store, task, self._recipes.of(task))
        except GcisError:  # the try could not name it either: it uploaded nothing
            return
        _abort_dead_upload(pipeline, task, key)

    @contextmanager
    def _reachable(self, meanwhile: str) -> Iterator[None]:
        """The broker's or the result backend's connection errors, once their retries are spent, as the
        GcisError that stops the run (one line, no traceback)."""
        from celery.exceptions import BackendError
        from kombu.exceptions import OperationalError
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
        try:
            yield
        except (BackendError, OperationalError, RedisConnectionError, RedisTimeoutError) as exc:
            self._unreachable = True
            cause = exc.__cause__ or exc  # BackendGetMetaError says only "failed to get meta"
            urls = dict.fromkeys((redacted(self.settings.broker_url), redacted(self.settings.results_url)))
            raise GcisError(f"the Celery broker or result backend ({', '.join(urls)}) cannot be reached "
                            f"({type(cause).__name__}: {cause}); {meanwhile}") from None

    def _forget_handed(self) -> None:
        """Outcomes the caller has had (it came back for more): a later submission of the same work runs it."""
        for task_id in self._handed:
            self.app.backend.forget(task_id)
        self._handed.clear()


def _sending_retried(task: ItemTask, exc: BaseException, interval: float) -> None:
    """kombu's errback for a send it retries: a line each, as the result backend and _ask_workers say theirs,
    so that an outage's minutes are not silent."""
    log.warning("%s: sending the task failed; retrying in %g s. (%s: %s)", task.label,
                interval, type(exc).__name__, scrub(str(exc)))


def _one_server(broker_url: str, results_url: str) -> bool:
    """Whether the broker and the result backend are one server (one Redis, or Sentinels of one master:
    sentinel_master_name serves both), whose restart empties queues and markers alike: by scheme family and
    host:port of each URL of a ';' list, whatever the database. Told apart when in doubt (a host named two
    ways): a lost message then waits the patience, rather than a kept one running twice."""
    def servers(url: str) -> set[tuple[str, str | None, int | None]]:
        found = set()
        for part in map(urlsplit, url.split(";")):
            family = "redis" if part.scheme == "rediss" else part.scheme
            found.add((family, part.hostname, part.port or _DEFAULT_PORTS.get(family)))
        return found
    return bool(servers(broker_url) & servers(results_url))


_DEFAULT_PORTS = {"redis": 6379, "sentinel": 26379}


def _queue_names(answers: dict[str, list[dict]] | None) -> set[str] | None:
    """The queues consumed by the workers that answered active_queues; None when none answered."""
    return {queue["name"] for queues in answers.values() for queue in queues} if answers else None


def _unrecorded(meta: dict[str, Any]) -> str | None:
    """Why a failed task failed in the result backend rather than on its item, or None. A worker that cannot
    record an outcome (SUCCESS, or STARTED before the item) records instead, once the backend is back, the
    backend's error as the task's FAILURE (celery.exceptions.BackendError, or Redis' own error when it is not one
    Celery retries): the item may well be deposited, and the task sent again finds that deposit."""
    from celery.exceptions import BackendError
    from redis.exceptions import RedisError
    error = meta["result"]
    if meta["status"] != "FAILURE" or not isinstance(error, (BackendError, RedisError)):
        return None
    return f"whose outcome the result backend failed to record ({type(error).__name__}: {scrub(str(error))})"


_DECODED = {part.__name__: where for part, where in TASK_PARTS}
_UNDECODED = re.compile(rf"({'|'.join(_DECODED)})\.__init__\(\) (?:got an (unexpected) keyword argument '\w+'|"
                        r"missing \d+ required (?:positional|keyword-only) arguments?: .+)")


def _undecoded(error: Any) -> str | None:
    """The fields of a task that a worker older than VersionSkew could not read, as VersionSkew names them, from
    the TypeError its ItemTask.from_dict raised building the task's dataclasses from its keys; None for any other
    failure."""
    match = _UNDECODED.fullmatch(str(error)) if type(error) is TypeError else None
    if match is None:
        return None
    names = [_DECODED[match[1]] + name for name in re.findall(r"'(\w+)'", str(error))]
    return skew_fields(names, []) if match[2] else skew_fields([], names)


def _progress(meta: dict[str, Any]) -> tuple[str, str]:
    return meta["status"], str(meta.get("result"))


def _heard_since(meta: dict[str, Any]) -> float:
    """When a task found running was last heard of, on this process's monotonic clock: for one SENT, its send, by
    the wall-clock time its marker holds (written by the run that sent it), so that the patience spans the runs
    of a cron harvest shorter than it; else (a marker of a version before it, a running task) now. Runs on hosts
    whose clocks differ shift the patience (2 x visibility_timeout_seconds, hours) by as much: a reader ahead of
    the sender sends the task again that much early (at worst it runs twice, the second run finding the first's
    output in the store), one behind that much late; a send time ahead of this clock counts as now."""
    now = time.monotonic()
    sent = meta["result"].get("sent") if meta["status"] == SENT and isinstance(meta["result"], dict) else None
    if not isinstance(sent, (int, float)):
        return now
    return now - max(0.0, time.time() - sent)


def _stale_halt(meta: dict[str, Any]) -> str | None:
    """Why a recorded outcome found before this run sent its task is sent again rather than taken, or None. An
    outcome that stops the run (a store or source down, workers of another configuration) tells how things stood
    when a worker ran the task, after the run that sent it had stopped: taken, it would stop this run though the
    store may be back. It counted no attempt; sent again, the task tells how things stand now."""
    if meta["status"] != "SUCCESS":
        return None
    try:
        result = ItemResult.from_dict(meta["result"])
    except VersionSkew:  # _outcome says so
        return None
    return f"whose outcome, recorded before this run, would stop it ({result.reason})" if result.stops_run else None


def _settings_of(pipelines: dict[str, Pipeline]) -> CelerySettings:
    """The `celery:` section of the file the pipelines came from (the workers read the same file)."""
    files = {p.config_file for p in pipelines.values()}
    if len(files) != 1:
        raise GcisError(f"pipelines from several configuration files ({', '.join(sorted(files))}): "
                        f"pass the Celery settings explicitly")
    return load_config(files.pop()).celery
