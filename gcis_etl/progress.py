"""What a harvest shows while it runs: a live line on a terminal, and one log line per item: INFO, or WARNING
(shown without -v too) for a rejected or failed one."""
from __future__ import annotations

import logging
import sys
import time

import click

from connectors.base import SourceObject
from gcis_etl.harvesting import Progress
from gcis_etl.ledger import COUNTED
from gcis_etl.reports import PROBLEMS

log = logging.getLogger("gcis_etl.harvest")


class TerminalProgress(Progress):
    """Counts and throughput on one rewritten line (the total is unknown while the source is still listing)."""

    def __init__(self, pipeline: str, live: bool):
        self.pipeline = pipeline
        self.live = live
        self.counts = {name: 0 for name in COUNTED}
        self.objects = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def planned(self, obj: SourceObject, tasks: int) -> None:
        self.objects += 1
        self._draw()

    def item(self, object_id: str, item_id: str, outcome: str, reason: str | None) -> None:
        self.counts[outcome] += 1
        level = logging.WARNING if outcome in PROBLEMS else logging.INFO
        if log.isEnabledFor(level):
            self.clear()  # on a line of its own, not glued to the live one
        log.log(level, "%s %s/%s%s", outcome, object_id, item_id, f": {reason}" if reason else "",
                extra={"pipeline": self.pipeline, "object_id": object_id, "item_id": item_id, "outcome": outcome,
                       "reason": reason})
        self._draw()

    def note(self, message: str) -> None:
        self.clear()
        log.info(message, extra={"pipeline": self.pipeline})

    def _draw(self, force: bool = False) -> None:
        if not self.live or (not force and time.monotonic() - self._drawn < 0.2):
            return
        self._drawn = time.monotonic()
        elapsed = self._drawn - self.started
        done = sum(self.counts.values())
        rate = done / elapsed * 60 if elapsed > 0 else 0
        counts = " ".join(f"{name} {n}" for name, n in self.counts.items())
        click.echo(f"\r{self.pipeline}: {self.objects} objects, {done} items ({counts}) {rate:.0f}/min   ",
                   nl=False, err=True)

    def clear(self) -> None:
        if self.live and self._drawn:
            self._draw(force=True)
            click.echo("", err=True)
            self._drawn = 0.0


def progress_for(pipeline: str) -> TerminalProgress:
    return TerminalProgress(pipeline, live=sys.stderr.isatty())
