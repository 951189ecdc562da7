"""Sources' timestamps as aware UTC datetimes: every `modified` a connector returns is comparable."""
from __future__ import annotations

from datetime import datetime, timezone, tzinfo


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime; a naive one is taken to be UTC already."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def parse_timestamp(text: str | None, zone: tzinfo = timezone.utc) -> datetime | None:
    """ISO 8601 (Z, an offset, or Rosetta's "YYYY-MM-DD HH:MM:SS"); naive values are in `zone`. None if unreadable."""
    try:
        parsed = datetime.fromisoformat((text or "").strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)
    return parsed.astimezone(timezone.utc)


def within(moment: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    """Whether `moment` falls in the harvest window [since, until]; an unknown moment does (better twice than never)."""
    return moment is None or ((since is None or moment >= since) and (until is None or moment <= until))
