"""The `celery:` section of config.yaml, and what follows from it without Celery itself.

Kept apart from gcis_etl.worker so that loading a configuration never imports Celery: which queue a task
goes to (JPEG 2000 recipes cost far more and get their own, so a deployment can give them their own
machines), its time limits, and the Celery settings every worker and orchestrator of a deployment shares.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PlainSerializer, field_validator, model_validator

from gcis_etl.recipes import JP2_ENCODERS, Recipe
from gcis_etl.settings import Settings, checked_url, redacted

TASK_NAME = "gcis_etl.process_item"
QUEUE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_BROKER_SCHEMES = ("redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp")
_RESULT_SCHEMES = ("redis", "rediss", "sentinel")
OUTAGE_RETRY_CEILING_SECONDS = 10  # the longest wait between two retries of an unreachable broker or backend
WORKER_OUTAGE_RETRIES = 120  # a worker's tries at recording an outcome, at least (about 9 minutes)


def _checked(url: str, schemes: tuple[str, ...], what: str) -> str:
    """Each URL of a ';'-separated list (Sentinel, failover) checked as settings.checked_url does."""
    for one in url.split(";"):
        checked_url(one, schemes, what)
    return url


# A URL that may carry a password (from ${VAR}): shown masked whenever the settings are printed.
ServiceUrl = Annotated[str, PlainSerializer(redacted, when_used="json")]


class TimeLimits(Settings):
    """Per task: the soft limit fails the item cleanly (conversion stopped, scratch removed); the hard limit
    kills the pool process and its conversion child if the soft one did not end it."""

    soft_seconds: int = Field(3300, gt=0)
    hard_seconds: int = Field(3600, gt=0)

    @model_validator(mode="after")
    def _soft_first(self) -> "TimeLimits":
        if self.soft_seconds >= self.hard_seconds:
            raise ValueError(f"soft_seconds ({self.soft_seconds}) must be less than hard_seconds "
                             f"({self.hard_seconds})")
        return self


class TaskRetry(Settings):
    """Automatic retries of transient failures (source or store outage, network error) inside one attempt, by
    the pool process that ran the task, after a backoff: within the task's time limits, which the backoffs count
    against. Anything else (a rejected master, a conversion failure, a time limit) is not retried here. A task
    whose pool process died (killed, crashed) is sent again at once, up to max_retries times."""

    max_retries: int = Field(3, ge=0, le=20)
    backoff_seconds: int = Field(10, ge=0, description="delay before the first retry; doubles each time")
    backoff_max_seconds: int = Field(300, ge=0)
    jitter: bool = Field(True, description="full jitter: each delay drawn between 0 and its value")


class QueueRoute(Settings):
    """What goes to one queue: recipes by name, or every recipe of an encoder."""

    recipes: tuple[str, ...] = ()
    encoders: tuple[Literal["ptiff", "tifffile", "kakadu", "openjpeg", "grok"], ...] = ()


class CelerySettings(Settings):
    broker_url: ServiceUrl = Field("redis://127.0.0.1:6379/0",
                                   description="Redis or RabbitMQ (amqp://); a password comes from ${VAR}")
    result_backend: ServiceUrl | None = Field(
        None, description="where tasks record their outcome; default: broker_url when that is Redis")
    default_queue: str = Field("gcis", pattern=QUEUE_NAME)
    queues: dict[str, QueueRoute] = Field(
        {"gcis-jp2": QueueRoute(encoders=JP2_ENCODERS)},
        description="extra queues and what is routed to them; everything else goes to default_queue")
    concurrency: int | None = Field(None, ge=1, le=256, description="pool processes per worker; default: cores")
    worker_max_tasks_per_child: int = Field(200, ge=1, description="a pool process is replaced after this many")
    worker_max_memory_per_child_mb: int = Field(
        512, ge=1, description="a pool process is replaced after a task leaves it larger than this (RSS)")
    time_limits: dict[str, TimeLimits] = Field(
        {"default": TimeLimits()}, description="by recipe name; 'default' for the others")
    retry: TaskRetry = TaskRetry()
    result_expires_hours: float = Field(72, gt=0, description="outcomes kept for a restarted orchestrator")
    visibility_timeout_seconds: int = Field(
        7200, gt=0, description="Redis: a task taken by a worker that vanished is redelivered after this")
    restore_check_seconds: int = Field(
        60, gt=0, description="Redis: how often workers look for tasks of vanished workers")
    poll_seconds: float = Field(0.25, gt=0, description="how often the orchestrator checks outcomes")
    worker_check_seconds: float = Field(
        60, gt=0, description="a task running this long without news has its worker asked whether it still runs "
                              "it; not answering or not running it twice in a row, the task is sent again")
    max_resends: int = Field(5, ge=0, description="times a task the broker lost is sent again before it fails")
    sentinel_master_name: str | None = Field(
        None, min_length=1, description="with sentinel:// URLs: the master the Sentinels monitor "
                                        "(`sentinel monitor <name> ...` in sentinel.conf)")
    outage_retries: int = Field(
        40, ge=0, le=1000, description="the orchestrator's retries of an unreachable broker or result backend "
                                       "before the run stops (40: sending a task waits 0, 1, 2 ... s, at most "
                                       "10, about 6 minutes; reading outcomes, Celery's random backoff doubling "
                                       "from 10 ms to at most 10 s, about 2.5 minutes)")
    worker_outage_retries: int | None = Field(
        None, ge=0, le=30000, description="a worker's retries of recording a task's outcome in an unreachable result "
                                          "backend (Celery's random backoff, about 9 minutes for 120), within the "
                                          "task's time limits; at least 3 x outage_retries; by default that, and at "
                                          "least 120")

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, url: str) -> str:
        return _checked(url, _BROKER_SCHEMES,
                        f"must be a Redis or RabbitMQ URL ({', '.join(s + '://' for s in _BROKER_SCHEMES)})")

    @field_validator("result_backend")
    @classmethod
    def _result_scheme(cls, url: str | None) -> str | None:
        return url if url is None else _checked(
            url, _RESULT_SCHEMES, "must be a Redis URL: outcomes are looked up by task id, also by an orchestrator "
                                  "that restarted (rpc:// cannot do that)")

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, queues: dict[str, QueueRoute]) -> dict[str, QueueRoute]:
        bad = [name for name in queues if not re.match(QUEUE_NAME, name)]
        if bad:
            raise ValueError(f"queue names are letters, digits, '.', '-' and '_' (got {bad})")
        return queues

    @model_validator(mode="after")
    def _consistent(self) -> "CelerySettings":
        if self.result_backend is None and urlsplit(self.broker_url).scheme not in _RESULT_SCHEMES:
            raise ValueError("result_backend: required when the broker is not Redis (a redis:// URL)")
        sentinel = [key for key, url in (("broker_url", self.broker_url), ("result_backend", self.result_backend))
                    if url is not None and urlsplit(url).scheme == "sentinel"]
        if sentinel and self.sentinel_master_name is None:
            raise ValueError(f"sentinel_master_name: required with a sentinel:// {' and '.join(sentinel)}: the "
                             f"name of the master the Sentinels monitor (`sentinel monitor <name> ...`)")
        if self.sentinel_master_name is not None and not sentinel:
            raise ValueError("sentinel_master_name: only used with a sentinel:// broker_url or result_backend")
        if "default" not in self.time_limits:
            raise ValueError("time_limits: needs a 'default' entry")
        if self.default_queue in self.queues:
            raise ValueError(f"queues: {self.default_queue!r} is the default_queue")
        # The workers must outlast the orchestrator, so that a task finished during an outage that stopped the run
        # records its outcome for the next run: a try of theirs waits 5 s on average (random, at most 10 s), a
        # send's waits up to 10 s.
        if self.worker_outage_retries is not None and self.worker_outage_retries < 3 * self.outage_retries:
            raise ValueError(f"worker_outage_retries ({self.worker_outage_retries}) must be at least 3 x "
                             f"outage_retries ({self.outage_retries}): a worker would give up recording an outcome "
                             f"before the orchestrator gives up reading it")
        # A task is unacknowledged from its delivery to its end: retries and their backoffs run inside it, and
        # with one task prefetched per pool process it starts as it is delivered.
        longest = max(limits.hard_seconds for limits in self.time_limits.values())
        if self.visibility_timeout_seconds <= longest:
            raise ValueError(f"visibility_timeout_seconds must exceed the longest hard time limit ({longest}), "
                             f"or running tasks would be redelivered")
        # A worker runs only a task whose SENT marker is there (worker._start), and the marker lasts as long as an
        # outcome: the orchestrator, sending a task again after twice the visibility timeout without progress,
        # must renew it before it expires, or a task waiting in a long queue would never run.
        if self.result_expires_hours * 3600 <= 2 * self.visibility_timeout_seconds:
            raise ValueError(f"result_expires_hours ({self.result_expires_hours:g}) must exceed twice "
                             f"visibility_timeout_seconds ({2 * self.visibility_timeout_seconds} s), or a task "
                             f"queued that long would lose its SENT marker and never run")
        return self

    @property
    def results_url(self) -> str:
        return self.result_backend or self.broker_url

    def queue_for(self, recipe: Recipe) -> str:
        for name, route in self.queues.items():
            if recipe.name in route.recipes:
                return name
        for name, route in self.queues.items():
            if recipe.encoder in route.encoders:
                return name
        return self.default_queue

    @property
    def worker_retries(self) -> int:
        """worker_outage_retries, by default the larger of 120 and 3 x outage_retries (Celery's backoff starts at
        10 ms: a few tries last well under a second)."""
        if self.worker_outage_retries is not None:
            return self.worker_outage_retries
        return max(WORKER_OUTAGE_RETRIES, 3 * self.outage_retries)

    def limits_for(self, recipe: Recipe) -> TimeLimits:
        return self.time_limits.get(recipe.name, self.time_limits["default"])

    def celery_conf(self, worker: bool = False) -> dict[str, Any]:
        """The Celery configuration shared by workers and orchestrators (queues are declared by the app); a
        worker rides out a result backend's outage longer than an orchestrator."""
        transport = {"visibility_timeout": self.visibility_timeout_seconds,
                     "unacked_restore_interval": self.restore_check_seconds, "unacked_restore_throttle": 1}
        sentinel = {"master_name": self.sentinel_master_name}
        broker_scheme = urlsplit(self.broker_url).scheme
        return {
            "broker_url": self.broker_url,
            "result_backend": self.results_url,
            "broker_transport_options": {**transport, **sentinel} if broker_scheme == "sentinel"
                                        else transport if broker_scheme in _RESULT_SCHEMES else {},
            "result_backend_transport_options": sentinel if urlsplit(self.results_url).scheme == "sentinel" else {},
            "broker_connection_retry_on_startup": True,
            "broker_connection_max_retries": None,
            "task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
            "task_default_queue": self.default_queue,
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "task_retry_on_worker_lost": True,
            "task_send_sent_event": True,
            "worker_send_task_events": True,
            "worker_prefetch_multiplier": 1,
            # not Celery's own STARTED and duplicate checks: the task's (worker._start) tell from our SENT marker
            "worker_deduplicate_successful_tasks": False,
            "worker_cancel_long_running_tasks_on_connection_loss": False,
            "worker_concurrency": self.concurrency,
            "worker_max_tasks_per_child": self.worker_max_tasks_per_child,
            "worker_max_memory_per_child": self.worker_max_memory_per_child_mb * 1024,  # KiB
            "result_expires": int(self.result_expires_hours * 3600),
            "result_backend_always_retry": True,
            "result_backend_max_retries": self.worker_retries if worker else self.outage_retries,
            "result_backend_max_sleep_between_retries_ms": OUTAGE_RETRY_CEILING_SECONDS * 1000,
        }

