"""Sources' timestamps as aware UTC datetimes: every `modified` a connector returns is comparable."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken to be UTC already."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def parse_timestamp(text: str | None, zone: tzinfo = timezone.utc) -> datetime | None:
    """ISO 8601 (Z, an offset, or Rosetta's "YYYY-MM-DD HH:MM:SS"); naive values are clock time in `zone`, taken
    at their earliest reading (01:30 on the night the clocks go back happens twice), so that a checkpoint moved
    to one never passes the edit; windows they are compared with are clock_window's. None if unreadable."""
    try:
        parsed = datetime.fromisoformat((text or "").strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return min(parsed.replace(tzinfo=zone, fold=fold).astimezone(timezone.utc) for fold in (0, 1))
    return parsed.astimezone(timezone.utc)


def clock_window(since: datetime | None, until: datetime | None,
                 zone: tzinfo) -> tuple[datetime | None, datetime | None]:
    """The window [since, until] for times a source writes as clock time in `zone` without an offset: each end
    moved out by the hour a DST change near it repeats or skips. Such a time names one of two instants that far
    apart (and one the clocks skipped, either side of the gap), so whichever it is, it stays in every window
    either reading belongs to (better twice than never); away from a change the window is left as it is."""
    return (since - _swing(since, zone) if since else None, until + _swing(until, zone) if until else None)


def _swing(moment: datetime, zone: tzinfo) -> timedelta:
    """How far the zone's offset moves within a day of `moment` (zero where it keeps one offset)."""
    offsets = [(moment + timedelta(days=days)).astimezone(zone).utcoffset() for days in (-1, 0, 1)]
    return max(offsets) - min(offsets)


def within(moment: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    """Whether `moment` falls in the harvest window [since, until]; an unknown moment does (better twice than never)."""
    return moment is None or ((since is None or moment >= since) and (until is None or moment <= until))
