"""What a harvest shows while it runs: a live line on a terminal, and one log line per item: INFO, or WARNING
(shown without -v too) for a rejected or failed one.

One conversion of a big master takes minutes, during which nothing settles: so that a working run can be told
from a hung one, a timer redraws the live line with the items in flight and the age of the oldest, and where
there is no terminal (cron) logs the oldest once per QUIET_SECONDS without an item settled. A move of a store's
keys (migrations/move_store.py) and a fixity audit (migrations/audit.py) show the same kind of line, and nothing
without a terminal; so does one master's conversion (gcis-etl convert: its stage and the time elapsed), which
logs its stages too with -v."""
from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from typing import Callable, Hashable, Mapping

import click

from connectors.base import SourceObject
from gcis_etl.harvesting import Progress
from gcis_etl.ledger import AUDIT_PROBLEMS, COUNTED
from gcis_etl.logs import printable
from gcis_etl.models import item_label
from gcis_etl.reports import PROBLEMS, RunReport, elapsed

log = logging.getLogger("gcis_etl.harvest")
convert_log = logging.getLogger("gcis_etl.convert")

QUIET_SECONDS = 60.0  # without an item settled, a log line names the oldest item in flight
TICK_SECONDS = 1.0    # how often the live line is redrawn while items are in flight


def fitted(head: str, parts: list[tuple[str, ...]], shrink: tuple[int, ...], width: int) -> str:
    """`head` then the parts joined with ", ", each in one of its forms (longest first; "" drops the part): while
    the line is wider than `width`, the part `shrink` names next (the least important first) takes its next form,
    so what tells a working run from a hung one goes last. What still does not fit is cut."""
    chosen = [0] * len(parts)

    def line() -> str:
        return head + ", ".join(form for part, n in zip(parts, chosen) if (form := part[n]))

    for index in shrink:
        if len(line()) <= width:
            break
        chosen[index] += 1
    return line()[:width]


class LiveLine:
    """One line rewritten in place on a terminal (a wrapped line cannot be), redrawn by a timer while work is in
    flight so that its ages and elapsed time move on. Subclasses say what the line holds (_line) under the lock."""

    def __init__(self, pipeline: str, live: bool, tick_seconds: float = TICK_SECONDS):
        self.pipeline = pipeline
        self.live = live
        self.tick_seconds = tick_seconds
        self.began = time.monotonic()
        self.in_flight: dict[Hashable, float] = {}  # what is under way: when it started, oldest first
        self._drawn = 0.0
        self._shown = 0  # the length of the line on screen: a shorter one is padded over it
        self._lock = threading.Lock()  # the timer's thread draws (and logs) too
        self._timer: threading.Thread | None = None
        self._halt = threading.Event()

    def clear(self) -> None:
        """Before other output, and once the run is over: the live line goes and the timer stops, even with
        work left in flight (a broker gone), until more starts."""
        with self._lock:
            self._take_down()
            timer, self._timer = self._timer, None
            self._halt.set()
        if timer is not None:
            timer.join()  # outside the lock, which its last tick may be waiting for

    def _start(self, key: Hashable) -> None:
        """Under the lock: `key` is under way; the timer runs while anything is."""
        self.in_flight[key] = time.monotonic()
        self._draw()
        if self._timer is None and self._timed():
            self._halt = threading.Event()
            self._timer = threading.Thread(target=self._tick, args=(self._halt,), daemon=True,
                                           name=f"gcis-progress-{self.pipeline}")
            self._timer.start()

    def _timed(self) -> bool:
        return self.live

    def _tick(self, halt: threading.Event) -> None:
        """The timer's thread: it ends when nothing is in flight, or clear() stops it."""
        while not halt.wait(self.tick_seconds):
            with self._lock:
                if halt.is_set():
                    return
                if not self.in_flight:
                    self._timer = None
                    return
                self._ticked()

    def _ticked(self) -> None:
        self._draw(force=True)

    def _line(self, seconds: float, width: int) -> str: ...

    def _draw(self, force: bool = False) -> None:
        if not self.live or (not force and time.monotonic() - self._drawn < 0.2):
            return
        self._drawn = time.monotonic()
        width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be redrawn in place
        line = self._line(self._drawn - self.began, width)
        click.echo(f"\r{line.ljust(min(self._shown, width))}", nl=False, err=True)
        self._shown = len(line)

    def _in_flight(self) -> tuple[str, ...]:
        """How much is in flight and the oldest one's age (no part without any)."""
        return (f"{len(self.in_flight)} in flight, oldest {elapsed(self._oldest()[1])}" if self.in_flight else "",)

    def _oldest(self) -> tuple[Hashable, float]:
        """What has been in flight the longest (started first), and for how many seconds."""
        key, since = next(iter(self.in_flight.items()))
        return key, time.monotonic() - since

    def _take_down(self) -> None:
        if self.live and self._drawn:
            self._draw(force=True)
            click.echo("", err=True)
            self._drawn = 0.0
            self._shown = 0


def _broken_down(what: str, counts: dict[str, int]) -> tuple[str, ...]:
    """`what` with its breakdown: every count, then those that are not 0, then none."""
    every = " ".join(f"{name} {n}" for name, n in counts.items())
    nonzero = " ".join(f"{name} {n}" for name, n in counts.items() if n)
    return f"{what} ({every})", f"{what} ({nonzero})" if nonzero else what, what


class TerminalProgress(LiveLine, Progress):
    """Counts and throughput on one rewritten line (the total is unknown while the source is still listing)."""

    def __init__(self, pipeline: str, live: bool, quiet_seconds: float = QUIET_SECONDS,
                 tick_seconds: float = TICK_SECONDS, log_end: bool = True):
        super().__init__(pipeline, live, tick_seconds if live else min(tick_seconds, quiet_seconds))
        self.log_end = log_end
        self.quiet_seconds = quiet_seconds
        self.counts = {name: 0 for name in COUNTED}
        self.objects = 0
        self._heard = self.began  # quiet since: the last item settled, quiet line logged, or work begun

    def planned(self, obj: SourceObject, tasks: int) -> None:
        with self._lock:
            self.objects += 1
            self._draw()

    def started(self, object_id: str, item_id: str) -> None:
        with self._lock:
            if not self.in_flight:
                self._heard = time.monotonic()  # quiet since now, not since an item settled before a long listing
            self._start((object_id, item_id))

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
            log.log(level, "%s %s%s%s", outcome, item_label(object_id, item_id), f": {reason}" if reason else "",
                    f" (warnings: {'; '.join(warnings)})" if warnings else "",
                    extra={"pipeline": self.pipeline, "object_id": object_id, "item_id": item_id,
                           "outcome": outcome, "reason": reason, "warnings": list(warnings)})
            self._draw()

    def note(self, message: str) -> None:
        with self._lock:
            self._take_down()
            log.info("%s", message, extra={"pipeline": self.pipeline})  # a value: it quotes ids (PlainFormatter)

    def warning(self, pipeline: str, message: str) -> None:
        with self._lock:
            self._take_down()
            super().warning(pipeline, message)

    def ended(self, report: RunReport) -> None:
        """One line at the end of every run, so that a night's log tells alone how it went: INFO when it exits
        0, WARNING otherwise (shown without -v, so cron mails it even with --quiet). Not where the summary says
        the same on a terminal (log_end)."""
        if not self.log_end:
            return
        level = logging.INFO if report.exit_code == 0 else logging.WARNING
        # a run that ended on an error raised it, and whoever caught it says it with what to do (harvest_pipelines'
        # message): the text says it once, the JSON line keeps the note
        said = None if report.status in ("failed", "crashed") else report.note
        with self._lock:
            self._take_down()
            log.log(level, "%s", "; ".join(filter(None, (report.headline(), report.took(), said))),
                    extra={"pipeline": report.pipeline, "run_id": report.run_id, "status": report.status,
                           "counts": report.counts, "manifests": report.manifests, "seconds": report.seconds,
                           "checkpoint": report.checkpoint_after, "note": report.note})

    def _timed(self) -> bool:
        return True  # without a terminal, the timer logs the oldest item of a quiet run

    def _ticked(self) -> None:
        if self.live:
            self._draw(force=True)
        elif time.monotonic() - self._heard >= self.quiet_seconds:
            self._log_oldest()

    def _log_oldest(self) -> None:
        (object_id, item_id), age = self._oldest()
        self._heard = time.monotonic()
        count = len(self.in_flight)
        items = "1 item in flight for" if count == 1 else f"{count} items in flight, the oldest for"
        log.info("%s: %s %s: %s", self.pipeline, items, elapsed(age), item_label(object_id, item_id),
                 extra={"pipeline": self.pipeline, "object_id": object_id, "item_id": item_id,
                        "in_flight": count, "seconds": round(age)})

    def _line(self, seconds: float, width: int) -> str:
        """What tells a working run from a hung one (items in flight, the oldest's age, the time elapsed) goes
        last: first the counts that are 0, then the objects, the rate, the rest of the breakdown."""
        done = sum(self.counts.values())
        parts = [(f"{self.objects} objects", ""), _broken_down(f"{done} items", self.counts), _rate(done, seconds),
                 self._in_flight(), (f"{elapsed(seconds)} elapsed",)]
        return fitted(f"{self.pipeline}: ", parts, (1, 0, 2, 1), width)


class MoveProgress(LiveLine):
    """Keys moved from one store to another (migrations/move_store.py): how many of the ledger's are done, copied,
    kept (already there, or newer there) and failed (or missing), deleted from the source, the rate, the keys in
    flight and the oldest one's age (a big master takes minutes to copy), the time elapsed."""

    GROUPS = {"copied": ("copied", "replaced", "would copy", "would replace"), "kept": ("present", "newer in the target"),
              "failed": ("failed", "missing"), "deleted": ("deleted from the source", "would delete from the source")}

    def __init__(self, pipeline: str, total: int, live: bool, deleting: bool, counted: Mapping[str, int],
                 tick_seconds: float = TICK_SECONDS):
        """`counted`: the migration report's counts by outcome, which the line shows by GROUPS (read, never
        copied: the report is what counts)."""
        super().__init__(pipeline, live, tick_seconds)
        self.total = total
        self.done = 0
        self.counted = counted
        self.groups = {group: outcomes for group, outcomes in self.GROUPS.items() if deleting or group != "deleted"}

    def started(self, key: str) -> None:
        with self._lock:
            self._start(key)

    def settled(self, key: str, done: bool) -> None:
        """`key` is no longer under way; `done`: settled (not: its store went down)."""
        with self._lock:
            self.in_flight.pop(key, None)
            self.done += done
            self._draw()

    def _line(self, seconds: float, width: int) -> str:
        counts = {group: sum(self.counted.get(outcome, 0) for outcome in outcomes)
                  for group, outcomes in self.groups.items()}
        parts = [_broken_down(f"{self.done} of {self.total} keys", counts), _rate(self.done, seconds),
                 self._in_flight(), (f"{elapsed(seconds)} elapsed",)]
        return fitted(f"{self.pipeline}: ", parts, (0, 1, 0), width)


def _rate(done: int, seconds: float) -> tuple[str, ...]:
    return f"{done / seconds * 60 if seconds else 0:.0f}/min", ""


class AuditProgress(MoveProgress):
    """Keys read back by a fixity audit (migrations/audit.py): how many of those queued are done, the problems
    found and the keys repaired, the rate, the keys in flight and the oldest one's age, the time elapsed."""

    GROUPS = {"problems": AUDIT_PROBLEMS, "repaired": ("repaired",)}


def _keys_live() -> bool:
    """A migration's line of keys is live on a terminal, as a harvest's, unless each key is logged (-v,
    --log-json), which the line would break into."""
    return sys.stderr.isatty() and not logging.getLogger("gcis_etl.migration").isEnabledFor(logging.INFO)


def move_progress(pipeline: str, count: Callable[[], int], deleting: bool, counted: Mapping[str, int]) -> MoveProgress:
    """`count()` says how many keys the move will look at: a pass over the ledger, made only when live."""
    live = _keys_live()
    return MoveProgress(pipeline, count() if live else 0, live, deleting, counted)


def audit_progress(pipeline: str, total: int, counted: Mapping[str, int]) -> AuditProgress:
    """`total`: the keys the audit will read (those queued, up to --limit)."""
    return AuditProgress(pipeline, total, _keys_live(), False, counted)


def progress_for(pipeline: str, log_end: bool = False) -> TerminalProgress:
    return TerminalProgress(pipeline, live=sys.stderr.isatty(), log_end=log_end)


class ConversionLine(LiveLine):
    """One master's conversion (gcis-etl convert): its stage and the time elapsed, redrawn each tick, so that a
    conversion of minutes (an 800 Mpx master through OpenJPEG) can be told from a hung one. `log_stages` (-v):
    a log line per stage too, with the seconds elapsed (without a terminal, all that is shown). Taken down, not
    left on screen, once the conversion ends: the result's line says the rest."""

    def __init__(self, name: str, live: bool, log_stages: bool, tick_seconds: float = TICK_SECONDS):
        super().__init__(name, live, tick_seconds)
        self.log_stages = log_stages
        self.stage_name = ""

    def __enter__(self) -> "ConversionLine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()

    def stage(self, name: str) -> None:
        """The conversion's stage `name` begins (conversion.convert's on_stage)."""
        with self._lock:
            self.stage_name = name
            if self.log_stages and convert_log.isEnabledFor(logging.INFO):
                self._take_down()  # on a line of its own, not glued to the live one
                seconds = time.monotonic() - self.began
                convert_log.info("%s: %s (%s elapsed)", self.pipeline, name, elapsed(seconds),
                                 extra={"file": self.pipeline, "stage": name, "seconds": round(seconds, 1)})
            if self.in_flight:
                self._draw(force=True)
            else:
                self._start(self.pipeline)

    def _line(self, seconds: float, width: int) -> str:
        return fitted(f"{printable(self.pipeline)}: ", [(self.stage_name, ""), (elapsed(seconds),)], (0,), width)

    def _take_down(self) -> None:
        """Erased: the result's line takes its place."""
        if self.live and self._drawn:
            click.echo(f"\r{' ' * self._shown}\r", nl=False, err=True)
            self._drawn = 0.0
            self._shown = 0
