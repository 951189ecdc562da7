"""What a harvest shows while it runs: a live line on a terminal, and one log line per item: INFO, or WARNING
(shown without -v too) for a rejected or failed one.

One conversion of a big master takes minutes, during which nothing settles: so that a working run can be told
from a hung one, a timer redraws the live line with the items in flight and the age of the oldest, and where
there is no terminal (cron) logs the oldest once per QUIET_SECONDS without an item settled."""
from __future__ import annotations

import logging
import shutil
import sys
import threading
import time

import click

from connectors.base import SourceObject
from gcis_etl.harvesting import Progress
from gcis_etl.ledger import COUNTED
from gcis_etl.reports import PROBLEMS, RunReport, elapsed

log = logging.getLogger("gcis_etl.harvest")

QUIET_SECONDS = 60.0  # without an item settled, a log line names the oldest item in flight
TICK_SECONDS = 1.0    # how often the live line is redrawn while items are in flight


class TerminalProgress(Progress):
    """Counts and throughput on one rewritten line (the total is unknown while the source is still listing)."""

    def __init__(self, pipeline: str, live: bool, quiet_seconds: float = QUIET_SECONDS,
                 tick_seconds: float = TICK_SECONDS, log_end: bool = True):
        self.pipeline = pipeline
        self.live = live
        self.log_end = log_end
        self.quiet_seconds = quiet_seconds
        self.tick_seconds = tick_seconds if live else min(tick_seconds, quiet_seconds)
        self.counts = {name: 0 for name in COUNTED}
        self.objects = 0
        self.began = time.monotonic()
        self.in_flight: dict[tuple[str, str], float] = {}  # (object id, item id): when it started, oldest first
        self._drawn = 0.0
        self._heard = self.began  # quiet since: the last item settled, quiet line logged, or work begun
        self._lock = threading.Lock()  # the timer's thread draws and logs too
        self._timer: threading.Thread | None = None
        self._halt = threading.Event()

    def planned(self, obj: SourceObject, tasks: int) -> None:
        with self._lock:
            self.objects += 1
            self._draw()

    def started(self, object_id: str, item_id: str) -> None:
        with self._lock:
            if not self.in_flight:
                self._heard = time.monotonic()  # quiet since now, not since an item settled before a long listing
            self.in_flight[object_id, item_id] = time.monotonic()
            self._draw()
            if self._timer is None:
                self._halt = threading.Event()
                self._timer = threading.Thread(target=self._tick, args=(self._halt,), daemon=True,
                                               name=f"gcis-progress-{self.pipeline}")
                self._timer.start()

    def item(self, object_id: str, item_id: str, outcome: str, reason: str | None,
             warnings: tuple[str, ...] = ()) -> None:
        """One item's outcome, logged with its reason and what its conversion warned of (a misnamed master,
        an encoder option dropped, an output recognised in the store)."""
        with self._lock:
            self.in_flight.pop((object_id, item_id), None)
            self._heard = time.monotonic()
            self.counts[outcome] += 1
            level = logging.WARNING if outcome in PROBLEMS else logging.INFO
            if log.isEnabledFor(level):
                self._take_down()  # on a line of its own, not glued to the live one
            log.log(level, "%s %s/%s%s%s", outcome, object_id, item_id, f": {reason}" if reason else "",
                    f" (warnings: {'; '.join(warnings)})" if warnings else "",
                    extra={"pipeline": self.pipeline, "object_id": object_id, "item_id": item_id,
                           "outcome": outcome, "reason": reason, "warnings": list(warnings)})
            self._draw()

    def note(self, message: str) -> None:
        with self._lock:
            self._take_down()
            log.info(message, extra={"pipeline": self.pipeline})

    def ended(self, report: RunReport) -> None:
        """One line at the end of every run, so that a night's log tells alone how it went: INFO when it exits
        0, WARNING otherwise (shown without -v, so cron mails it even with --quiet). Not where the summary says
        the same on a terminal (log_end)."""
        if not self.log_end:
            return
        level = logging.INFO if report.exit_code == 0 else logging.WARNING
        with self._lock:
            self._take_down()
            log.log(level, "%s", "; ".join(filter(None, (report.headline(), report.took(), report.note))),
                    extra={"pipeline": report.pipeline, "run_id": report.run_id, "status": report.status,
                           "counts": report.counts, "manifests": report.manifests, "seconds": report.seconds,
                           "checkpoint": report.checkpoint_after, "note": report.note})

    def clear(self) -> None:
        """Before other output, and once the run is over: the live line goes and the timer stops, even with
        items left in flight (a broker gone), until another item starts."""
        with self._lock:
            self._take_down()
            timer, self._timer = self._timer, None
            self._halt.set()
        if timer is not None:
            timer.join()  # outside the lock, which its last tick may be waiting for

    def _tick(self, halt: threading.Event) -> None:
        """The timer's thread: it ends when nothing is in flight, or clear() stops it."""
        while not halt.wait(self.tick_seconds):
            with self._lock:
                if halt.is_set():
                    return
                if not self.in_flight:
                    self._timer = None
                    return
                if self.live:
                    self._draw(force=True)
                elif time.monotonic() - self._heard >= self.quiet_seconds:
                    self._log_oldest()

    def _log_oldest(self) -> None:
        (object_id, item_id), age = self._oldest()
        self._heard = time.monotonic()
        count = len(self.in_flight)
        items = "1 item in flight for" if count == 1 else f"{count} items in flight, the oldest for"
        log.info("%s: %s %s: %s/%s", self.pipeline, items, elapsed(age), object_id, item_id,
                 extra={"pipeline": self.pipeline, "object_id": object_id, "item_id": item_id,
                        "in_flight": count, "seconds": round(age)})

    def _draw(self, force: bool = False) -> None:
        if not self.live or (not force and time.monotonic() - self._drawn < 0.2):
            return
        self._drawn = time.monotonic()
        done = sum(self.counts.values())
        rate = done / (self._drawn - self.began) * 60 if self._drawn > self.began else 0
        counts = " ".join(f"{name} {n}" for name, n in self.counts.items())
        oldest = f", {len(self.in_flight)} in flight, oldest {elapsed(self._oldest()[1])}" if self.in_flight else ""
        line = f"{self.pipeline}: {self.objects} objects, {done} items ({counts}) {rate:.0f}/min{oldest}   "
        width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be redrawn in place
        click.echo(f"\r{line[:width]}", nl=False, err=True)

    def _oldest(self) -> tuple[tuple[str, str], float]:
        """The item in flight the longest (started first), and for how many seconds."""
        key, since = next(iter(self.in_flight.items()))
        return key, time.monotonic() - since

    def _take_down(self) -> None:
        if self.live and self._drawn:
            self._draw(force=True)
            click.echo("", err=True)
            self._drawn = 0.0


def progress_for(pipeline: str, log_end: bool = False) -> TerminalProgress:
    return TerminalProgress(pipeline, live=sys.stderr.isatty(), log_end=log_end)
