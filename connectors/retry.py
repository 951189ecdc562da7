"""How long and how often a source operation is retried: one policy for HTTP requests, downloads and S3.

A budget counts attempts and elapsed time across everything done for one logical operation, so a
download whose request is itself retried still stops within `max_total_seconds`. A transfer is bounded by
its pace, not its length (TransferPace): a large master over a slow link may take as long as it needs.
"""
from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

from pydantic import Field, model_validator

from connectors.errors import RetryStopped, SourceUnavailable, TransferInterrupted
from gcis_etl.errors import SourceError
from gcis_etl.settings import Settings

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.1  # how often a retry wait looks whether it is to end early (waits_end_when)
_stopped: ContextVar[Callable[[], bool] | None] = ContextVar("retry_waits_end_when", default=None)


@contextmanager
def waits_end_when(stopped: Callable[[], bool]) -> Iterator[None]:
    """In this block, and this thread only (a harvest's listing, not the downloads in flight its workers finish
    first), a wait before a retry ends as soon as `stopped()` is true, raising RetryStopped: a run asked to stop
    must not first wait out a Retry-After or a backoff, which may last up to max_total_seconds."""
    token = _stopped.set(stopped)
    try:
        yield
    finally:
        _stopped.reset(token)


class RetryPolicy(Settings):
    """Exponential backoff with jitter, bounded in attempts and in total time; timeouts for each request."""

    max_attempts: int = Field(5, ge=1, le=100)
    backoff_base_seconds: float = Field(1.0, ge=0)
    backoff_max_seconds: float = Field(60.0, ge=0)
    jitter: float = Field(0.5, ge=0, le=1, description="fraction of each delay drawn at random (1 = full jitter)")
    max_total_seconds: float = Field(600.0, gt=0, description="no retry starts once waiting would exceed this")
    connect_timeout_seconds: float = Field(10.0, gt=0)
    read_timeout_seconds: float = Field(120.0, gt=0, description="longest silence allowed while reading")
    min_transfer_bytes_per_second: float = Field(
        16384, ge=0, description="a response body (a download, a search page) bringing less over "
                                 "read_timeout_seconds is cut off and retried (a body trickling in never falls "
                                 "silent); 0: never")
    retry_statuses: frozenset[int] = frozenset({429, 500, 502, 503, 504})

    @model_validator(mode="after")
    def _statuses_are_errors(self) -> "RetryPolicy":
        bad = sorted(s for s in self.retry_statuses if not 400 <= s <= 599 or s in (401, 403))
        if bad:
            raise ValueError(f"retry_statuses may only hold 4xx/5xx codes other than 401/403, got {bad}")
        return self

    def backoff(self, retry_number: int) -> float:
        """Delay before retry `retry_number` (1-based): base * 2^(n-1), capped, its `jitter` fraction random."""
        full = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** (retry_number - 1))
        return full * (1 - self.jitter) + random.uniform(0, full * self.jitter)


class RetryBudget:
    """Attempts and time used so far by one operation; `after_failure` waits or gives up."""

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.attempts = 0
        self.started = time.monotonic()

    def start_attempt(self) -> None:
        self.attempts += 1

    def after_failure(self, reason: str, retry_after: float | None = None,
                      give_up: type[SourceError] = SourceUnavailable) -> None:
        """Sleep before the next attempt, or raise `give_up` when attempts or total time are used up.

        `reason` must already be free of credentials: it goes to the log and into the exception. A retry is
        logged at INFO: one that then succeeds is no problem (cron mails the WARNING lines of `harvest --quiet`),
        and one that gives up says so in the error raised, which fails the item or the run, with the attempts.
        """
        policy = self.policy
        elapsed = time.monotonic() - self.started
        if self.attempts >= policy.max_attempts:
            raise give_up(f"{reason}; gave up after {self.attempts} attempt(s) in {elapsed:.1f}s")
        delay = policy.backoff(self.attempts)
        if retry_after is not None:
            delay = max(delay, retry_after)
        if elapsed + delay > policy.max_total_seconds:
            raise give_up(f"{reason}; gave up after {self.attempts} attempt(s): waiting {delay:.1f}s more "
                          f"would exceed max_total_seconds={policy.max_total_seconds:g}")
        log.info("%s; retrying in %.2fs (attempt %d of %d)", reason, delay, self.attempts + 1, policy.max_attempts)
        _wait(delay, reason)


def _wait(seconds: float, reason: str) -> None:
    stopped = _stopped.get()
    if stopped is None:
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stopped():
            raise RetryStopped(f"{reason}; not retried: the run was asked to stop")
        time.sleep(min(left, STOP_CHECK_SECONDS))


class TransferPace:
    """Cuts off a transfer that brings less than min_transfer_bytes_per_second over a read_timeout_seconds
    window: the read timeout bounds silences, and a body trickling in a byte at a time is never silent."""

    def __init__(self, policy: RetryPolicy, subject: str = ""):
        """`subject`: what the transfer is, named in the message where the transport does not name it."""
        self.policy = policy
        self.subject = subject
        self._since, self._bytes = time.monotonic(), 0

    def arrived(self, size: int) -> None:
        self._bytes += size
        elapsed = time.monotonic() - self._since
        if elapsed < self.policy.read_timeout_seconds:
            return
        if self._bytes < self.policy.min_transfer_bytes_per_second * elapsed:
            named = f"{self.subject}: " if self.subject else ""
            floor = self.policy.min_transfer_bytes_per_second
            raise TransferInterrupted(f"{named}transfer too slow: {self._bytes} bytes in the last {elapsed:.1f}s, "
                                      f"under min_transfer_bytes_per_second={floor:g}")
        self._since, self._bytes = time.monotonic(), 0
