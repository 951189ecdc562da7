"""The source protocol every connector implements, and the records that flow out of a source.

Connectors know nothing of imaging, stores or Celery: they list objects, describe them and fetch bytes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from string import Formatter
from typing import Collection, Iterable, Iterator, Protocol
from urllib.parse import quote

from connectors.redaction import scrub
from connectors.errors import (DESCRIBE_ERRORS, AuthenticationFailed, ObjectNotFound, RetryStopped,
                               SourceUnavailable)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LangValue:
    """One descriptive value, with its language when the source states one (for IIIF language maps)."""

    value: str
    language: str | None = None


@dataclass(frozen=True)
class Fixity:
    algorithm: str  # lower-case hashlib name: "md5", "sha1", "sha256"; one we cannot compute, as the source
    #                 names it, lower-case and compacted: "crc32"
    value: str      # lower-case hex digest


@dataclass(frozen=True)
class SourceItem:
    """One master image of an object, in display order."""

    id: str
    sequence: int
    original_name: str
    size: int | None
    modified: datetime | None
    fixity: Fixity | None = None
    label: str | None = None
    locator: str = ""  # connector-specific address of the bytes (URL, path, key)


@dataclass(frozen=True)
class SourceObject:
    """A Rosetta IE, an OTMM asset or asset group, a folder: what becomes one IIIF manifest."""

    id: str
    modified: datetime
    items: tuple[SourceItem, ...]
    metadata: dict[str, tuple[LangValue, ...]] = field(default_factory=dict)  # source field -> values
    source_url: str | None = None
    listed_at: datetime | None = None
    """The object's value of the date its listing is sorted on, which a run cut short moves the checkpoint to
    (Source.lists_in_modified_order), where `modified` counts dates the listing is not sorted on (a Rosetta IE's
    files'). None: the listing is sorted on `modified` itself, or not sorted."""


def source_url(template: str | None, object_id: str, **fields: str) -> str | None:
    """A connector's source_url_template filled in, the id percent-encoded whole: an id with a space would make
    the URL invalid, and a '&', '#' or '/' in it would point the link elsewhere."""
    if not template:
        return None
    values = {"id": quote(object_id, safe=""), **fields}
    return "".join(literal + (values[name] if name else "") for literal, name in _template(template, values))


def checked_source_url_template(template: str | None, *fields: str) -> str | None:
    """For a connector's settings: a template source_url could not fill (a misspelt or unclosed placeholder)
    is refused when the configuration loads, rather than failing, or making a wrong link, at every object."""
    if template:
        _template(template, ("id", *fields))
    return template


def _template(template: str, names: Collection[str]) -> list[tuple[str, str | None]]:
    """The template as str.format reads it ({{ and }} are literal braces): (literal text, placeholder name)
    pieces, each placeholder a bare {name} among `names` (a conversion or format spec would change the link);
    a ValueError names the placeholder that is not."""
    allowed = ", ".join(f"{{{name}}}" for name in names)
    try:
        pieces = list(Formatter().parse(template))
    except ValueError as exc:
        read = max(end for end in range(len(template)) if _readable(template[:end]))
        bad = template[read:template.find("}", read) + 1 or None]
        raise ValueError(f"{bad!r} is not a placeholder ({exc}; a literal brace is written twice); the template "
                         f"may use {allowed}") from None
    for _, name, spec, conversion in pieces:
        if name is not None and (name not in names or spec or conversion):
            written = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"unknown placeholder {written}; the template may use {allowed}")
    return [(literal, name) for literal, name, _, _ in pieces]


def _readable(text: str) -> bool:
    try:
        list(Formatter().parse(text))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class UnreadableObject:
    """An object the source names but cannot describe (a malformed record, an IE whose getIE fails): it comes
    in the listing in its place, so the run records the failure against it and goes on with the others; one
    bad record must not stop every run."""

    id: str
    modified: datetime | None  # the listing's stamp, when it has one
    reason: str
    gone: bool = False  # the source says no such object exists (asked for by id)


def listed_at(obj: SourceObject | UnreadableObject) -> datetime | None:
    """Where the object stands in its listing: the date the listing is sorted on (SourceObject.listed_at where that
    is not `modified`; an UnreadableObject's is the listing's stamp, None when it has none). A checkpoint goes no
    further than an object's, or a run would not list it again."""
    return obj.modified if isinstance(obj, UnreadableObject) else obj.listed_at or obj.modified


@dataclass(frozen=True)
class ListingMoved:
    """Comes in a listing paged by offset that shrank or shifted while it was read (an object deleted, or moved
    out of the search, between two pages): every later object moved back, one onto a page already read, and was
    never served. Which one is unknown, so the run goes on with what it was given and holds its checkpoint."""

    reason: str


@dataclass(frozen=True)
class ListingCut(ListingMoved):
    """A listing the server stopped serving before its end, what it served being whole and in order (a server
    that caps how deep it pages). A source listing oldest first (Source.lists_in_modified_order) has then given
    everything up to its last object, so the run moves its checkpoint there, as for a run cut short, and the next
    run takes the rest: held, a cap would give every run the same first objects and never the others. Otherwise
    it holds the checkpoint, as a ListingMoved does."""


@dataclass(frozen=True)
class FetchedFile:
    """A master streamed to scratch space whose size (and fixity, when the source has one) were checked."""

    item: SourceItem
    path: Path
    size: int
    sha256: str
    fixity_verified: bool


class Source(Protocol):
    """What the pipeline needs from a source.

    Every time it gives (an object's modified and listed_at, an item's modified) has a timezone: a naive one
    compares with no checkpoint, so the run fails that object, naming the time (it is not guessed to be UTC,
    which a source's local time would put hours off). Each item of an object has its own id, and each object
    its own id in a listing: an object whose items share one fails, and a second object listed under an id
    an earlier one has (not the same object listed again) fails in that run alone."""

    name: str
    lists_in_modified_order: bool
    """True when `changes(since)` lists oldest first for certain: every object not yet yielded is modified no
    earlier than the last one yielded (as listed: one edited after its page was read may come with a later
    time). A run cut short then moves its checkpoint to where its listing stopped; otherwise the next run lists
    the same window again from its start. An UnreadableObject with no stamp may come anywhere: it marks no place
    in the listing, and holds the checkpoint at the window's start while it has attempts left."""
    modified_order_setting: str | None
    """Where lists_in_modified_order is False: the settings under the pipeline's `source:` that sort the listing
    oldest first and say so ("search.sort: asc_<id> and search.modified_order: true"), for a run cut short to
    advise; None when this source's listing cannot be so sorted (an OAI set, a list of ids, a folder walk)."""
    item_ids_unique: bool = False
    """True when an item id is the source's own name for one master wherever it is listed, never another
    object's item (an OTMM asset id in a grouped pipeline): an item the ledger records under another object has
    then moved from it, and the run revisits that object to take the item out of its manifest
    (Harvest._note_moves). Optional: a source without the attribute is taken as False (its ids may be per-object
    names, which two objects share), and the run asks nothing of the ledger for it (items_unique)."""

    def changes(self, since: datetime | None,
                until: datetime | None = None) -> Iterator[SourceObject | UnreadableObject | ListingMoved]:
        """Objects modified at or after `since` (all objects when None), oldest first where the source allows;
        one it lists but cannot describe (DESCRIBE_ERRORS) as an UnreadableObject, as `unreadable` makes it; a
        ListingMoved where its paged listing is seen to have shrunk or shifted under it, a ListingCut where it
        stopped short.

        `until` (optional) closes the window, so a run can record exactly what it covered as its checkpoint.
        """

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        """Objects named explicitly (migrations, --object, revisits), one per id in the order given; at an id it
        cannot describe (DESCRIBE_ERRORS) it raises, after the objects before it. A whole batch is asked
        in one call: a source that must list its store to find an object lists it once."""

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        """Stream the item's bytes into dest_dir, verify size and fixity, and return the local file: what
        connectors.fetching.fetch_verified does (room in scratch, retries, atomic rename) given a way to open the
        item's bytes as a Body."""

    # Optional: `reachable() -> None`, raising SourceUnavailable (or AuthenticationFailed) when the source cannot
    # be reached now, cheaply: what source_down asks.
    # Optional: `described(object_ids) -> Iterator[SourceObject | UnreadableObject]`, what `described` below makes
    # of `get`, for a source that can do it in one pass.
    # Optional: `close() -> None`, ending what the source holds on the server (an OTMM session), best effort: what
    # close_source below calls once a command is done with the source, which may still be used after.
    # Optional: `transport_settings: tuple[str, ...]`, a class attribute: the settings (dotted when nested,
    # "search.page_size") that change how the source is reached, not what it lists, beside those every source has
    # (gcis_etl.pipelines.TRANSPORT); a change of any other setting, credentials aside, makes the next run list
    # everything.


def items_unique(source: Source) -> bool:
    """Source.item_ids_unique, False for a source that does not say (a custom connector written before it)."""
    return getattr(source, "item_ids_unique", False) is True


def close_source(source: Source) -> None:
    """Source.close where the source has one (optional): a session left open on the server piles up there, one
    more every cron run. Never raises: the run's outcome does not hang on it."""
    close = getattr(source, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception as exc:  # someone's connector: a close that failed leaves what the server ends itself in time
        name = getattr(source, "name", "source")
        log.warning("%s: closing the source failed (%s: %s); the run's outcome stands", name, type(exc).__name__,
                    scrub(str(exc)))  # someone's text: a URL with its token, a signed query
        log.debug("%s: closing the source failed", name, exc_info=True)  # -v: for the connector's author


def source_down(source: Source, object_id: str, what: str) -> bool:
    """Whether the source is down as a whole, after `what` (describing `object_id`, downloading one of its files)
    outlasted its retries: the run then stops, where one object or file that always fails, on a source that
    otherwise answers, is that one's failure and spends its attempt. The source's cheap `reachable()` tells,
    where it has one, else describing the object again."""
    try:
        if hasattr(source, "reachable"):
            source.reachable()
        else:
            for _ in source.get([object_id]):
                pass
    except (SourceUnavailable, AuthenticationFailed):
        return True
    except RetryStopped:  # the run was asked to stop while the probe waited: no verdict
        raise
    except Exception:  # anything else says nothing of an outage: the failure is the object's or the file's
        log.warning("%s: asking the source again after %s failed", object_id, what, exc_info=True)
    return False


def unreadable(source: Source, object_id: str, stamp: datetime | None, exc: Exception,
               gone: bool = False) -> UnreadableObject:
    """The object that describing raised `exc` (DESCRIBE_ERRORS) at, in its place. A description that outlasted
    its retries (SourceUnavailable) is the object's failure only while the source answers otherwise (an IE whose
    METS the gateway always times out on): when the source is down as a whole (source_down), or has no
    `reachable()` to tell, `exc` is raised and stops the run, which must not spend every object's attempt on an
    outage."""
    reason = str(exc)
    if isinstance(exc, SourceUnavailable):
        # without reachable(), source_down would describe this very object again: no verdict, a second budget
        if not hasattr(source, "reachable") or source_down(source, object_id, "describing it"):
            raise exc
        reason += " (the source answers otherwise)"
    return UnreadableObject(object_id, stamp, reason, gone)


def described(source: Source, object_ids: Iterable[str]) -> Iterator[SourceObject | UnreadableObject]:
    """The objects named, one per id in order: an object the source cannot describe, or no longer has (`gone`),
    stands alone in its place. Through the source's own `described` where it has one (a grouped source, which
    lists its whole store for a batch), else `get`, asked again for the ids after each it raises at."""
    own = getattr(source, "described", None)
    if own is not None:
        yield from own(object_ids)
        return
    remaining = list(object_ids)
    while remaining:
        done = 0
        try:
            for obj in source.get(remaining):
                done += 1
                yield obj
        except DESCRIBE_ERRORS as exc:
            yield unreadable(source, remaining[done], None, exc, gone=isinstance(exc, ObjectNotFound))
            done += 1
        else:
            return
        remaining = remaining[done:]
