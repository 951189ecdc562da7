"""Spans of time as an operator types them: one syntax for every option that takes one (harvest --since,
cache prune --max-age), so that what works in one works in the other."""
from __future__ import annotations

import re
from datetime import timedelta

SPAN_FORMATS = "90m, 36h, 7d, 2w or an ISO 8601 duration (PT90M, P1DT12H, P2W)"

_NUMBER = r"\d+(?:[.,]\d+)?"
_COMPACT = re.compile(r"(?P<n>\d+)\s*(?P<unit>[mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Years and months are left out on purpose: they have no fixed length (and P1M reads as a minute to many).
_ISO = re.compile(rf"P(?:(?P<weeks>{_NUMBER})W|(?:(?P<days>{_NUMBER})D)?"
                  rf"(?:T(?=\d)(?:(?P<hours>{_NUMBER})H)?(?:(?P<minutes>{_NUMBER})M)?(?:(?P<seconds>{_NUMBER})S)?)?)")


def parse_span(text: str) -> timedelta:
    """The span `text` names; ValueError naming the accepted forms otherwise (a bare number or 12:00:00 too:
    minutes or days? a span or a time of day?)."""
    value = text.strip()
    compact = _COMPACT.fullmatch(value.lower())
    iso = _ISO.fullmatch(value.upper())
    if compact:
        parts = {_UNITS[compact["unit"]]: int(compact["n"])}
    elif iso and any(iso.groupdict().values()):
        parts = {unit: float(n.replace(",", ".")) for unit, n in iso.groupdict().items() if n}
    else:
        raise ValueError(f"{text!r} is not a span of time: write {SPAN_FORMATS}")
    try:
        span = timedelta(**parts)
    except OverflowError:
        raise ValueError(f"{text!r} is longer than any span of time this can count") from None
    if span <= timedelta(0):
        raise ValueError(f"{text!r} is a span of zero: give a longer one")
    return span
