"""What every command of ours shares (gcis-etl's, gcis-migrate's scripts, the Celery worker's start): its exit
codes, the clean stop a signal asks for, its one way of failing on a configuration error, and the options both
command lines take, defined once so that both say the same of them.

A library module, not part of gcis_etl.cli: the migration framework and the worker use it without loading
the command line.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, NoReturn, Protocol, runtime_checkable

import click

from gcis_etl.errors import ConfigError

EXIT_OK, EXIT_ITEM_FAILED, EXIT_USAGE, EXIT_LOCKED = 0, 1, 2, 3
EXIT_SIGNALLED = 128  # + the signal's number: a run SIGINT (130), SIGTERM (143) or SIGHUP (129) stopped early


def fail_config(exc: ConfigError) -> NoReturn:
    """Exit 2 naming what is wrong: a JSON log line once a command's --log-json has configured the log (harvest
    and the migration scripts do before they load the configuration), plain text otherwise."""
    from gcis_etl.logs import say
    say(f"configuration error:\n{exc}")
    sys.exit(EXIT_USAGE)


DOUBLED_SIGNAL_SECONDS = 0.5  # coreutils `timeout` and some supervisors signal the process, then its whole group:
# one request arriving twice a few ms apart, which must not read as a second Ctrl-C; no one presses twice that fast


class Interrupted(KeyboardInterrupt):
    """A signal that stops the command now rather than after the work in flight: a second Ctrl-C during a run
    (what was in flight is abandoned, recorded nowhere, so the next run redoes it), or any SIGINT/SIGTERM under
    raise_on_signals. A KeyboardInterrupt, so that what cleans up after a Ctrl-C (finally blocks, a transfer
    cancelled) does so. The command exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return EXIT_SIGNALLED + self.signum


class StopRequest(threading.Event):
    """Set by the first SIGINT, SIGTERM or SIGHUP, which it remembers: a command it stopped exits 128 + the
    signal's number, as a shell reports a process the signal killed, so that cron or systemd never takes a run
    cut short for a success. A run that got to its end all the same (the signal came while its last items were in
    flight) exits as it would have without it: its report says it completed.

    A second Ctrl-C raises Interrupted, only inside `in_flight()`: the wait for the items in flight is what it
    cuts short, and only there is it caught and the run recorded (anywhere else it could leave a run unrecorded,
    and there is nothing left to abandon)."""

    signum: int | None = None
    work = "items"  # what is in flight, as its messages name it (a fixity audit reads keys)
    taken_at = 0.0  # time.monotonic() of the first signal
    abandoned = False
    _waiting = 0  # in_flight() sections open

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.signum is None else EXIT_SIGNALLED + self.signum

    @property
    def stopped_by(self) -> str:
        return "a request" if self.signum is None else signal.Signals(self.signum).name

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """Where a second Ctrl-C abandons the work in flight, raising Interrupted (the caller records it)."""
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    def take(self, signum: int) -> None:
        """What the signal handler does (stop_on_signals). Only a second Ctrl-C abandons the work in flight: a
        SIGTERM (cron, `timeout`, systemd) is named instead, its sender having no Ctrl-C to press."""
        from gcis_etl.logs import say
        if not self.is_set():
            self.signum, self.taken_at = signum, time.monotonic()
            self.set()
            then = "Ctrl-C again to abandon them" if signum == signal.SIGINT else self.stopped_by
            say(f"\nstopping after the {self.work} in flight ({then})", logging.WARNING)
        elif (signum != signal.SIGINT or self.abandoned
              or time.monotonic() - self.taken_at < DOUBLED_SIGNAL_SECONDS):
            return
        elif not self._waiting:
            say("\ncannot abandon now: finishing and recording the run", logging.WARNING)
        else:
            # The process may still wait at its exit for uploads in flight (s3transfer's threads): a further
            # signal ends it on the spot.
            _on_each(signal.SIG_DFL)
            self.abandoned = True
            say(f"\nabandoning the {self.work} in flight: the next run redoes them (Ctrl-C again to end the process "
                "now)", logging.WARNING)
            raise Interrupted(self.signum)


@runtime_checkable
class Stop(Protocol):
    """What a run asks of its stop: StopRequest, or CallersStop for a library caller's own Event."""

    def is_set(self) -> bool: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def stopped_by(self) -> str:
        """Who stopped it, for a message: a signal's name, or its caller."""

    def in_flight(self) -> ContextManager[None]: ...


class CallersStop:
    """A library caller's own threading.Event as a Stop: no signal sets it, so nothing abandons the items in
    flight, and a command it stopped exits 1, as a run that did not complete (there is no signal to report)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def is_set(self) -> bool:
        return self.event.is_set()

    @property
    def exit_code(self) -> int:
        return EXIT_ITEM_FAILED if self.event.is_set() else EXIT_OK

    stopped_by = "its caller"

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        yield


def as_stop(stop: threading.Event | Stop | None) -> Stop:
    """harvest()'s and harvest_pipelines()' `stop`, taken once at their entry: none is a StopRequest never set."""
    if stop is None:
        return StopRequest()
    return stop if isinstance(stop, Stop) else CallersStop(stop)


def stop_on_signals(work: str = "items") -> StopRequest:
    """First SIGINT/SIGTERM/SIGHUP: finish the `work` in flight, record everything, exit. A second Ctrl-C: stop
    now."""
    stop = StopRequest()
    stop.work = work
    _on_each(lambda signum, frame: stop.take(signum))
    return stop


def exit_on_signals() -> None:
    """From a command line's start until the command installs its own handling (stop_on_signals,
    raise_on_signals): a SIGINT, SIGTERM or SIGHUP during the heavy imports or the reading of the configuration
    ends the command at once, with one line (a JSON log line under --log-json) and 128 + the signal's number. It
    was a KeyboardInterrupt traceback, a NameError from a module half imported or click's "Aborted!" (exit 1),
    and for SIGTERM nothing at all. A command that installs no handling of its own (status, report) keeps it.
    A signal sent twice at once (DOUBLED_SIGNAL_SECONDS) says it once."""
    # imported now, not in the handler: the signal may come in the middle of importing what they import
    from gcis_etl.logs import configure, say

    def leave(signum: int) -> None:
        if "--log-json" in sys.argv[1:] and not logging.getLogger().handlers:  # the command got no further
            configure(True, 0)
        say(f"stopped by {signal.Signals(signum).name}", logging.WARNING)
        sys.exit(EXIT_SIGNALLED + signum)

    _on_signals(leave)


def raise_on_signals() -> None:
    """SIGTERM (`kill`, systemd, `timeout`) and SIGHUP as well as SIGINT raise Interrupted, for a command whose
    cleanup must run (a partial output, a server's children): SIGTERM's and SIGHUP's default action ends the
    process on the spot, skipping every finally block. A signal sent twice at once (DOUBLED_SIGNAL_SECONDS)
    raises once, so as not to cut that cleanup short."""
    def interrupted(signum: int) -> None:
        raise Interrupted(signum)

    _on_signals(interrupted)


def _on_signals(handle: Callable[[int], None]) -> None:
    """`handle(signum)` on SIGINT, SIGTERM and SIGHUP, once for a signal sent twice at once
    (DOUBLED_SIGNAL_SECONDS: `timeout` and a terminal's ^C may both send one)."""
    handled_at: list[float] = []

    def handler(signum, frame):
        if handled_at and time.monotonic() - handled_at[0] < DOUBLED_SIGNAL_SECONDS:
            return
        handled_at[:] = [time.monotonic()]
        handle(signum)

    _on_each(handler)


STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # those that stop a command (_on_each)


def _on_each(handler: Callable | signal.Handlers) -> None:
    """`handler` for each signal that stops a command: SIGINT, SIGTERM, and SIGHUP (a terminal closed, an ssh
    session dropped), which ended it on the spot, recording nothing, unless the process was started ignoring
    SIGHUP (nohup): then it is asked to outlive its terminal, and keeps ignoring it."""
    for signum in STOPPING_SIGNALS:
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, handler)


class SharedOption:
    """An option of both command lines: a decorator on gcis-etl's commands, a parameter (`param()`) of the
    click.Command a migration script is made into."""

    def __init__(self, *decls: str, **attrs: Any):
        self.decls = decls
        self.attrs = attrs

    def __call__(self, function: Callable) -> Callable:
        return click.option(*self.decls, **self.attrs)(function)

    def param(self) -> click.Option:
        return click.Option(list(self.decls), **self.attrs)


CONFIG = SharedOption("--config", "config_file", type=click.Path(dir_okay=False), envvar="GCIS_CONFIG",
                      help="Configuration file (default: ./config.yaml, else built-in defaults). Env: GCIS_CONFIG.")
LOG_JSON = SharedOption("--log-json", is_flag=True,
                        help="Log one JSON object per line on stderr (for log shippers).")
VERBOSE = SharedOption("-v", "--verbose", count=True,
                       help="-v: a log line per item (or store key, for a migration that copies keys); -vv: debug.")
LIMIT = SharedOption("--limit", type=click.IntRange(min=1),
                     help="Process at most this many items (deposited, rejected or failed; skips do not count).")
MAX_MINUTES = SharedOption("--max-minutes", type=click.FloatRange(min=0, min_open=True),
                           help="Take no new item after this many minutes (a harvest: across all its pipelines, "
                                "each taking an equal share of what is left; without it, the pipelines' "
                                "max_run_minutes. A migration: across its runs; no time limit otherwise).")
