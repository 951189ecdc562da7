"""A harvest run of one pipeline: changes since the checkpoint → plan against the ledger → executor → ledger →
per-object manifests → the checkpoint → the collection.

Why it is safe to kill at any point: item results are committed as they arrive; an item in flight when the
run dies is redone next time (processing is idempotent, so at worst it is converted again, never deposited
twice); a manifest is published only once all its object's items are settled and recorded as such; the
collection lists the objects the ledger says are published but not yet listed; and the checkpoint moves only
at the end of a run, never past an object that still has an unsettled item, not at all after a listing that
moved while it was paged (see Harvest._hold_checkpoint), and after a run cut short only to where its listing
stopped, when the source lists oldest first (see Harvest.next_checkpoint).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Callable, Collection, Iterator, Sequence

from connectors.base import (LangValue, ListingCut, ListingMoved, Source, SourceItem, SourceObject, UnreadableObject,
                             close_source, described, items_unique, listed_at)
from connectors.errors import RetryStopped
from connectors.redaction import scrub
from connectors.retry import waits_end_when
from gcis_etl.commands import EXIT_ITEM_FAILED, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, Interrupted, Stop, as_stop
from gcis_etl.config import Config
from gcis_etl.errors import ConfigError, GcisError, ManifestError, StoreError, StoreRefused, StoreUnavailable
from gcis_etl.executors import Executor, open_executor
from gcis_etl.keys import UnsafeKey
from gcis_etl.ledger import (ABANDONED, COUNTED, MANIFEST, OBJECT, STOPPED_BY_SIGNAL, STOPPED_ON_REQUEST, ItemRecord,
                             Ledger, LedgerError, LedgerUnwritable, ObjectRecord, Unprocessed, now)
from gcis_etl.locks import LockHeld, pipeline_lock
from gcis_etl.manifests import CollectionEntry, DepositedImage
from gcis_etl.pipelines import Pipeline, config_folder
from gcis_etl.recipes import load_recipe
from gcis_etl.reports import (PLANNED, PlannedItem, RunReport, counted, prune_reports, report_from_ledger,
                              write_report)
from gcis_etl.stores import uploads_kept
from gcis_etl.supersession import Retired, retire_superseded
from gcis_etl.work import ItemResult, ItemTask, Outcome, fingerprint, remedy, told_what_to_do

log = logging.getLogger("gcis_etl.harvest")  # the name log shippers filter on (progress.py logs items under it)

NO_TIME_LEFT = 1e-6  # minutes: a run given these stops before its first item (HarvestOptions takes no 0)
TIME_UP = "stopped at the run time limit"  # a run's note at its time limit (max_run_minutes, --max-minutes)
AT_LIMIT = "stopped at the limit of "  # a run's note at HarvestOptions.limit (a migration words it anew)
LISTING_CHANGED = "the source's listing settings changed since the checkpoint: listing everything"
STOPS_RUN = (StoreUnavailable, StoreRefused)  # a store error no manifest or collection write gets past: StoreFull too


class RunHalted(GcisError):
    """No item can be done now (a worker's scratch space full or read-only, the store full or unavailable):
    every item would fail the same way and spend its attempts, so the run stops, as when the store check fails."""


@dataclass(frozen=True)
class SharedId:
    """In a listing, in the place of a second object the source lists under an id an earlier one has (see
    Harvest._other_object): it fails in this run, with `reason`."""

    id: str
    reason: str


@dataclass(frozen=True)
class HarvestOptions:
    dry_run: bool = False
    since: datetime | None = None          # instead of the checkpoint (the checkpoint is then left alone)
    limit: int | None = None               # items to process (skipped ones do not count)
    object_ids: tuple[str, ...] = ()       # only these objects (the checkpoint is left alone)
    force: bool = False                    # process even unchanged or rejected items, publish manifests again
    redo_rejected: bool = False            # process rejected items again (after a policy change)
    max_run_minutes: float | None = None   # overrides the pipeline's
    recipe: str | None = None              # overrides the pipeline's (migrations)
    full: bool = False                     # list the whole source whatever the checkpoint, like a first run
    reencode: str | None = None            # re-derive what was deposited with this recipe (by name)
    fresh_attempts: bool = False           # failed items of object_ids start their attempts again (retry)
    keep_superseded: bool = False          # access masters re-derived under another key stay in the store
    described: tuple[SourceObject | UnreadableObject, ...] = field(default=(), compare=False, repr=False)
    """object_ids as connectors.base.described gave them, one per id in order, where the caller described them
    already (reencode, to leave out what the source no longer has): the run takes them instead of asking the
    source a second time. Not recorded with the run's options."""
    timed_from: float | None = field(default=None, compare=False, repr=False)
    """When max_run_minutes began to count (a time.monotonic()), where the caller gave the run its time before
    calling: harvest_pipelines, when it gave the run its share of what was left, so that the run's clock does not
    start later, once its ledger is open (another process may hold it), and the last run end past the command's
    limit. None: when the run starts. Not recorded with the run's options."""

    def __post_init__(self):
        """The CLI refuses these; a library caller's would be read wrongly: a limit of 0 as a run stopped at once,
        0 minutes as the pipeline's limit, a str of ids as one id per character; or crash the run: a since that is
        not a datetime (the CLI's "7d" is its own), or one with no timezone, which no source's times compare with;
        a recipe that is no name (a Recipe, which convert() takes): a run's tasks carry the recipe's name, which
        the workers, in other processes or on other hosts, look up in their recipe_dirs."""
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"HarvestOptions.limit must be at least 1 item (or None for no limit), not {self.limit}")
        if self.max_run_minutes is not None and not self.max_run_minutes > 0:
            raise ValueError(f"HarvestOptions.max_run_minutes must be more than 0 (or None for the pipeline's), "
                             f"not {self.max_run_minutes}")
        if self.since is not None and not isinstance(self.since, datetime):
            raise TypeError(f"HarvestOptions.since is a datetime with a timezone (or None for the checkpoint), "
                            f"not {self.since!r}")
        if self.since is not None and self.since.utcoffset() is None:
            raise ValueError(f"HarvestOptions.since needs a timezone (tzinfo=timezone.utc for UTC), not the naive "
                             f"{self.since.isoformat()}")
        for key, value in (("recipe", self.recipe), ("reencode", self.reencode)):
            if value is not None and not isinstance(value, str):
                named = getattr(value, "name", None)
                instead = f" ({key}={named!r} for this one)" if isinstance(named, str) else ""
                raise TypeError(f"HarvestOptions.{key} is the name of a recipe{instead}, which the run's workers look "
                                f"up in their recipe_dirs, not an object of type {type(value).__name__}")
        if isinstance(self.object_ids, str):
            raise TypeError(f"HarvestOptions.object_ids is a tuple of object ids: ({self.object_ids!r},), "
                            f"not {self.object_ids!r}")
        if self.described and tuple(obj.id for obj in self.described) != tuple(dict.fromkeys(self.object_ids)):
            raise ValueError("HarvestOptions.described holds the objects of object_ids, one per id in order")


@dataclass(kw_only=True)
class TimeLimit:
    """A time limit that runs one after another share (a harvest's pipelines, a migration's harvest runs): its
    clock starts once, and each run gets its share of what is left when it starts, so that what one does not use
    passes to those after it. `minutes` None: no limit."""

    minutes: float | None = None
    started: float = field(default_factory=time.monotonic)

    def minutes_left(self) -> float:
        return math.inf if self.minutes is None else self.minutes - (time.monotonic() - self.started) / 60

    def share(self, runs: int = 1) -> float:
        """The minutes of the next of `runs` runs left, sharing what is left equally; NO_TIME_LEFT when none is."""
        return max(self.minutes_left() / runs, NO_TIME_LEFT)

    def handed(self, options: HarvestOptions, runs: int = 1, cap: float | None = None) -> HarvestOptions:
        """`options` with the next run's share of `runs` (at most `cap` minutes), its clock started as the share is
        measured (HarvestOptions.timed_from), not once its ledger is open: the last run ends no later than the
        limit."""
        timed_from = time.monotonic()
        share = self.share(runs)
        return replace(options, max_run_minutes=share if cap is None else min(cap, share), timed_from=timed_from)


def retry_statuses(failed: bool, rejected: bool) -> list[str]:
    """The item statuses `gcis-etl retry` takes up: failed (`failed`), rejected (`rejected`)."""
    return (["failed"] if failed else []) + (["rejected"] if rejected else [])


def retry_targets(ledger: Ledger, names: list[str], object_ids: tuple[str, ...], failed: bool,
                  rejected: bool) -> dict[str, tuple[str, ...]]:
    """What `gcis-etl retry` processes again, by pipeline: the objects with failed items (`failed`) and rejected
    ones (`rejected`), of those named if any are. A pipeline with none is left out: a named object with nothing
    to retry is not harvested (in every pipeline, when none is named)."""
    statuses = retry_statuses(failed, rejected)
    targets = {}
    for name in names:
        ids = {o for status in statuses for o in ledger.objects_with(name, status)}
        if object_ids:
            ids &= set(object_ids)
        if ids:
            targets[name] = tuple(sorted(ids))
    return targets


@dataclass(frozen=True)
class Decision:
    process: bool
    reason: str
    outcome: Outcome = Outcome.SKIPPED  # what the run records when it does not process the item


def decide(record: ItemRecord | None, item_fingerprint: str, recipe_digest: str, max_attempts: int,
           force: bool = False, redo_rejected: bool = False, reencode: str | None = None,
           placed: str | None = None, recipe_name: str | None = None) -> Decision:
    """Whether an item needs work, from what the ledger knows of it. `placed`: the key the store's keys give
    its access master now; another than the one deposited when the item moved within its object (`{sequence}`
    keys: a page inserted, removed or reordered), where its old key names another page's image now.
    `recipe_name`: the name of the recipe whose digest is `recipe_digest`; an item deposited under that name with
    another digest was made by the recipe before it was edited in place, which the reason says."""
    if record is None:
        return Decision(True, "new")
    if record.fingerprint != item_fingerprint:
        return Decision(True, "changed in the source")
    if force:
        return Decision(True, "forced")
    if redo_rejected and record.status == "rejected":
        return Decision(True, "rejected before; asked to try again")
    if record.status == "failed":
        if record.attempts < max_attempts:
            return Decision(True, f"retry {record.attempts + 1} of {max_attempts}")
        return Decision(False, f"failed {record.attempts} times (last: {record.reason}); "
                               f"`gcis-etl retry` tries again", Outcome.FAILED)
    if record.status == "rejected":
        return Decision(False, f"rejected before ({record.reason}); waits for the source to change")
    if placed is not None and placed != record.output_key:
        return Decision(True, f"moved within its object: its access master goes from {record.output_key} to {placed}")
    if record.recipe_digest != recipe_digest:
        if record.recipe == reencode:
            return Decision(True, f"deposited with recipe {record.recipe} ({record.recipe_digest}); re-deriving")
        if record.recipe == recipe_name:
            return Decision(False, f"unchanged; deposited with an older version of recipe {recipe_name} (digest "
                                   f"{record.recipe_digest}, now {recipe_digest}): `gcis-migrate reencode "
                                   f"--from-recipe {recipe_name}` re-derives it")
        return Decision(False, f"unchanged; deposited with recipe {record.recipe} ({record.recipe_digest}): "
                               f"--force or the reencode migration re-derives it")
    return Decision(False, "unchanged")


@dataclass(frozen=True)
class _Manifests:
    """An object's manifests as its settled items show them now, and what the run does with them: "publish",
    "touched" (they differ from those published in the object's modified time alone, which none shows: the
    same bytes) or "" (up to date)."""

    images: list[DepositedImage]
    digest: str
    action: str


@dataclass(frozen=True)
class _Plan:
    """What the run does with each item of an object (its task, if processed). `lost`: the items whose recorded
    access master is not theirs in the store, looked for when its manifests go out again (Harvest.plan).
    `manifests`: with no item to process, what object_settled does with its manifests."""

    items: list[tuple[SourceItem, Decision, ItemTask | None]]
    lost: frozenset[str] = frozenset()
    manifests: _Manifests | None = None


@dataclass
class _PendingObject:
    obj: SourceObject
    records: dict[str, ItemRecord] | None  # its items in the ledger as planned; None once one was sent to be done
    plan: _Plan
    waiting: set[str] = field(default_factory=set)
    complete: bool = False  # every item is planned (a stop or a limit can cut an object short)

    @cached_property
    def item_ids(self) -> frozenset[str]:
        return frozenset(item.id for item in self.obj.items)


class Progress:
    """Receives what a run does; the CLI draws it (a bar on a terminal) and logs each item (the run does not)."""

    def planned(self, obj: SourceObject, tasks: int) -> None: ...
    def started(self, object_id: str, item_id: str) -> None: ...  # the executor took it (it had a free slot)
    def item(self, object_id: str, item_id: str, outcome: str, reason: str | None,
             warnings: tuple[str, ...] = ()) -> None: ...
    def note(self, message: str) -> None: ...

    def warning(self, pipeline: str, message: str) -> None:
        """Something the run did besides its items, which its report says (Harvest.noted): logged as it happens,
        where a live line is drawn on a line of its own."""
        log.warning("%s: %s", pipeline, message, extra={"pipeline": pipeline})

    def retired(self, retired: Retired) -> None:  # an old access master deleted (or kept), as it happens
        by = (f"superseded by {retired.replaced_by}" if retired.replaced_by else
              "its item has no other access master recorded")
        self.note(f"{'kept' if retired.kept else 'deleted'} {retired.key}, {by}")

    def ended(self, report: RunReport) -> None: ...  # the run is over (failed ones too), recorded or not
    def clear(self) -> None: ...  # the run is over, or ended without starting: what was drawn goes


class Harvest:
    def __init__(self, config: Config, pipeline: Pipeline, options: HarvestOptions, ledger: Ledger,
                 progress: Progress, stop: Stop):
        self.config = config
        self.pipeline = pipeline
        self.options = options
        self.ledger = ledger
        self.progress = progress
        self.stop = stop
        self.recipe = (pipeline.recipe if options.recipe is None
                       else load_recipe(options.recipe, config_folder(pipeline.config_file)))
        self.counts = {name: 0 for name in COUNTED}
        self.manifests_published = 0
        self.pending: dict[str, _PendingObject] = {}
        self.unsettled: list[datetime | None] = []  # listing dates of objects left unsettled (None: unknown)
        self.submitted = 0
        self.run_id = 0
        self.began = time.monotonic() if options.timed_from is None else options.timed_from
        minutes = options.max_run_minutes or pipeline.settings.max_run_minutes
        self.deadline = self.began + minutes * 60 if minutes else None
        self.cut_short: str | None = None
        self.halted: str | None = None  # why a worker could not work at all (RunHalted)
        self.checkpoint_held: str | None = None  # why a complete run leaves the checkpoint where it was
        self.listing_cut: str | None = None  # why a listing in modified order stopped short (ListingCut)
        # the objects this run has seen in the source, with their first items' ids: what a repeat is known by
        self.listed: dict[str, str | None] = {}
        self.reached: datetime | None = None  # how far the listing got, for a source listing in modified order
        self.superseding = True  # the ledger may hold superseded keys of the pipeline (execute looks)
        # items listed in another object than the one the ledger records them under: {that object: {item: now in}}
        self.moved: dict[str, dict[str, str]] = {}
        self.notes: list[str] = []  # what the run did besides its items that its report says (a collection rebuilt)

    # ------------------------------------------------------------------------------------ listing

    def window(self) -> tuple[datetime | None, datetime]:
        until = now()
        if self.options.since is not None:
            return self.options.since, until
        checkpoint = None if self.options.full else self.checkpoint()
        return (checkpoint - self.pipeline.overlap if checkpoint else None), until

    def checkpoint(self) -> datetime | None:
        """The pipeline's checkpoint, unless it was taken under other listing settings (listing_changed)."""
        return None if self.listing_changed else self.ledger.checkpoint(self.pipeline.name)

    @property
    def listing_note(self) -> str | None:
        """Why a run over the checkpoint's window lists everything, where it does."""
        listing_window = self.options.since is None and not self.options.full and not self.options.object_ids
        return LISTING_CHANGED if listing_window and self.listing_changed else None

    @cached_property
    def listing_changed(self) -> bool:
        """Whether the checkpoint was taken while the source was asked to list something else (Pipeline.
        listing_digest: another set, query or server): it says nothing of what the source lists now, so the run
        lists everything, as a first run does (unchanged items are skipped), and records its own checkpoint."""
        return self.ledger.listing_changed(self.pipeline.name, self.pipeline.listing_digest)

    def objects(self, since: datetime | None, until: datetime) -> Iterator[SourceObject | UnreadableObject | SharedId]:
        """The objects to harvest; a stop asked for while the source is waited for (before a retry: harvest sets
        connectors.retry.waits_end_when) ends them as a stop between two objects does."""
        try:
            yield from self._objects(since, until)
        except RetryStopped:
            self.should_stop()

    def _objects(self, since: datetime | None, until: datetime) -> Iterator[SourceObject | UnreadableObject | SharedId]:
        source = self.pipeline.source
        seen = self.listed
        # No upper bound: an object modified during the run (or stamped ahead by a skewed clock) is taken now;
        # the checkpoint stays at the run's start, so the next run sees it again and skips it as unchanged.
        listing = (self.options.described or described(source, dict.fromkeys(self.options.object_ids))
                   if self.options.object_ids else source.changes(since))
        for obj in (_usable(obj, source.name) for obj in listing):
            if isinstance(obj, ListingCut) and source.lists_in_modified_order:
                self.listing_cut = obj.reason
                log.warning("%s: %s; the checkpoint moves to where the listing stopped (it is sorted oldest first), "
                            "so the next run takes the rest", self.pipeline.name, obj.reason)
                continue
            if isinstance(obj, ListingMoved) or obj.id in seen:
                if (other := self._other_object(obj)) is not None:
                    yield other
                    continue
                self._hold_checkpoint(obj.reason if isinstance(obj, ListingMoved) else
                                      f"{obj.id} was listed twice: the source's listing moved while it was paged "
                                      "(an object edited during the run) and may have passed over others")
                # The caller looks for a reason to stop between the objects it is given: a listing repeating itself
                # for ever gives it none, so the time limit and a stop are looked for here too.
                if self.should_stop():
                    return
                continue
            seen[obj.id] = obj.items[0].id if isinstance(obj, SourceObject) and obj.items else None
            self._reach(obj, until)
            self._note_moves(obj)
            yield obj
        if self.listing_cut is None:
            self.reached = until  # the listing is exhausted (what comes next are revisits, asked for by id)
        if self.options.object_ids:
            return
        retry = sorted({r.object_id for r in self._failed_items("attempts<?")} - seen.keys())
        if retry:
            self.progress.note(f"revisiting {len(retry)} objects with failed items")
        for obj in (_usable(obj, source.name) for obj in described(source, retry)):
            self._note_moves(obj)
            yield obj
        # one listed settles without its moved items (_moved_away), unless it did before they were seen: then the
        # next run that lists it or their new object does
        left = sorted(self.moved.keys() - seen.keys() - set(retry))
        for object_id in left:
            self.progress.note(f"revisiting {object_id}: {_moves(self.moved[object_id])}")
        yield from (_usable(obj, source.name) for obj in described(source, left))

    @cached_property
    def unique_items(self) -> bool:
        return items_unique(self.pipeline.source)

    def _note_moves(self, obj: SourceObject | UnreadableObject) -> None:
        """An item of `obj` that the ledger records under another object has moved from that one (the source's
        item ids being its own, Source.item_ids_unique): that object is revisited after the listing, described
        again without it, so that its manifests go out again without the item (no item of it changed, so it is not
        listed). One query an object, for such a source only."""
        if not self.unique_items or not isinstance(obj, SourceObject) or not obj.items:
            return
        for record in self.ledger.elsewhere(self.pipeline.name, obj.id, [item.id for item in obj.items]):
            self.moved.setdefault(record.object_id, {})[record.item_id] = obj.id

    def _other_object(self, obj: SourceObject | UnreadableObject | ListingMoved) -> SharedId | None:
        """A second object under an id listed already that is another object, not the same one listed again (a
        paging repeat, or one edited during the run, keeps its first item): two files example.tif and example.jp2
        that a folder source makes one id of. The first stays the id's; this one fails in this run alone, as a
        defect of the source that holds no checkpoint (the next run finds them both again, as listed)."""
        if not isinstance(obj, SourceObject) or not obj.items:
            return None
        first = self.listed.get(obj.id)
        if first is None or any(item.id == first for item in obj.items):
            return None
        return SharedId(obj.id, f"the source lists two objects under the id {obj.id!r}, one of {first!r} and one "
                                f"of {obj.items[0].id!r}: the first was taken, this one is left out until the "
                                f"source gives each its own id")

    def _reach(self, obj: SourceObject | UnreadableObject, until: datetime) -> None:
        """The place in the listing of the last object listed, the one in hand included (a run stopping takes
        none after it): its listed_at (connectors.base), not a newest date that may run ahead of objects to come. One
        stamped after the run began was edited after its page was read, so its time is not its place in the
        listing; one with no time is no earlier than the one before it: neither moves it."""
        at = listed_at(obj)
        if at is not None and at <= until:
            self.reached = at

    def _hold_checkpoint(self, why: str) -> None:
        """Sources page their listings by offset: an object edited after its page was read moves to the end (it
        comes twice), one deleted or moved out of the search makes every later object move back one place, and
        the one on the next page boundary is never served. Which one is unknown, so the checkpoint stays where
        it was: the next run lists the same window again, skipping what is unchanged and taking what this run
        passed over."""
        if self.checkpoint_held is None:
            self.checkpoint_held = f"{why}; the checkpoint stays where it was, so the next run lists them again"
            log.warning("%s: %s", self.pipeline.name, self.checkpoint_held)

    # ----------------------------------------------------------------------------------- planning

    def records(self, object_id: str) -> dict[str, ItemRecord]:
        """The object's items in the ledger, by id: one query an object, not one an item."""
        return {record.item_id: record for record in self.ledger.items(self.pipeline.name, object_id)}

    def plan(self, obj: SourceObject, records: dict[str, ItemRecord]) -> _Plan:
        """Each item decided from the ledger; then, if the object's manifests go out again (an item is processed,
        or they are not up to date), the items to skip whose recorded access master is not theirs in the store
        (Harvest._lost) are processed again, as a new item is; a rejected one's, whose last deposit its manifests
        keep showing, is left out of them. An object with nothing to do costs no request to the store."""
        settings = self.pipeline.settings
        decisions = {item.id: decide(records.get(item.id), fingerprint(item), self.recipe.digest,
                                     settings.max_attempts, self.options.force, self.options.redo_rejected,
                                     self.options.reencode, self._placed(obj.id, item, records.get(item.id)),
                                     self.recipe.name)
                     for item in obj.items}
        processed = any(d.process for d in decisions.values())
        manifests = None if processed else self._manifests(obj, records)
        lost = {}
        if self.pipeline.manifests is not None and (processed or manifests and manifests.action == "publish"):
            lost = self._lost(records, decisions)
        for item_id, why in lost.items():
            decisions[item_id] = (Decision(True, why) if records[item_id].status == "deposited" else
                                  replace(decisions[item_id], reason=f"{decisions[item_id].reason}; {why}: not shown"))
        planned = []
        for item in obj.items:
            record, decision = records.get(item.id), decisions[item.id]
            attempt = record.attempts + 1 if record and record.status == "failed" else 1
            task = ItemTask(self.pipeline.name, obj.id, item, self.recipe.name, self.recipe.digest, attempt,
                            self.options.force, self.pipeline.worker_digests)
            planned.append((item, decision, task if decision.process else None))
        return _Plan(planned, frozenset(lost), None if lost else manifests)  # lost: not what was planned

    def _manifests(self, obj: SourceObject, records: dict[str, ItemRecord], lost: Collection[str] = ()
                   ) -> _Manifests | None:
        """What the object's manifests show from its items' `records` (the access masters recorded, bar those of
        rejected items that are gone: `lost` from the store (Harvest.plan), or written over by another item's
        deposit, maybe in this very run: _holders), and what the run does with them; None when it publishes none:
        no manifests, an item unsettled or failed, no image."""
        manifests = self.pipeline.manifests
        items = [(item, records.get(item.id)) for item in obj.items]
        if manifests is None or any(record is None or record.status == "failed" for _, record in items):
            return None
        holders = _holders(records)
        images = [DepositedImage(item.sequence, record.output_key, record.width, record.height, item.label)
                  for item, record in items if record.output_key and not (
                      record.status == "rejected" and (item.id in lost or holders[record.output_key] is not record))]
        if not images:
            return None
        digest = _manifest_fingerprint(obj, images, self.manifest_settings)
        known = self.ledger.object(self.pipeline.name, obj.id)
        if known is None or self.options.force:
            action = "publish"
        elif known.manifest_fingerprint == digest:
            action = ""
        else:
            action = "touched" if self._touched_only(obj, images, known) else "publish"
        return _Manifests(images, digest, action)

    def _lost(self, records: dict[str, ItemRecord], decisions: dict[str, Decision]) -> dict[str, str]:
        """{item id: why} for the items skipped whose recorded access master is not theirs in the store: another
        item of the object deposited under its key since (`{sequence}` keys: a page withdrawn, its record kept,
        then put back where another page went meanwhile), or the store no longer holds it (deleted by hand, or
        retired by a run the ledger, put back from a backup, does not know), which one request a key asks. None
        looked for when an item out of attempts keeps the manifests from going out. A store that cannot answer
        stops the run (a StoreError), as at check_store."""
        if any(not d.process and d.outcome is Outcome.FAILED for d in decisions.values()):
            return {}
        holders = _holders(records)
        lost = {}
        for record in (records[i] for i, d in decisions.items() if not d.process and records[i].output_key):
            key = record.output_key
            if holders[key] is not record:
                lost[record.item_id] = f"{holders[key].item_id} was deposited under its key {key} since"
            elif not self.pipeline.store.exists(key):
                lost[record.item_id] = f"its access master {key} is no longer in the store"
        return lost

    def _placed(self, object_id: str, item: SourceItem, record: ItemRecord | None) -> str | None:
        """The key the item's access master has now that its place in the object changed, where its key follows
        its place (`{sequence}`); None when it did not move, its key does not say, or it cannot be named."""
        if record is None or record.output_key is None or record.sequence == item.sequence:
            return None
        keys, ext = self.pipeline.store.keys, self.recipe.extension.lstrip(".")
        try:
            now, then = (keys.image_key(self.pipeline.name, object_id, item.id, sequence, ext)
                         for sequence in (item.sequence, record.sequence))
        except UnsafeKey:  # the worker says so, with the item's failure
            return None
        return now if now != then else None

    @cached_property
    def starved(self) -> bool:
        """Whether the run was given no time (harvest_pipelines: NO_TIME_LEFT) or stopped before it began: asked
        first (harvest, once it holds the pipeline's lock), and then it asks neither the workers nor the source
        anything, nor writes its collection: a listing only to stop at its first object would move the checkpoint
        over nothing and call that where the listing stopped. It still aborts the uploads a killed run before it
        left (harvest): were that left to the next run given time, a run starved otherwise than by NO_TIME_LEFT
        (a stop, a share spent waiting for the ledger) would pass for one given time, and they would stay."""
        return self.should_stop()

    def should_stop(self, listed_all: bool = False) -> bool:
        """`listed_all`: asked once the listing is over (a break set cut_short already): the time limit, which
        stops the taking of new objects, has none left to stop; the run is cut short by it only if the executor
        leaves items undone (execute): one it did not send, the limit having passed while it waited for a slot."""
        if self.cut_short or self.halted:
            return True
        if self.stop.is_set():
            self.cut_short = STOPPED_ON_REQUEST
        elif self._out_of_time() and not listed_all:
            self.cut_short = TIME_UP
        else:
            self.cut_short = self._at_limit()
        return self.cut_short is not None

    def _at_limit(self) -> str | None:
        """Why no more items are taken to process, once --limit of them are (skipped ones do not count)."""
        limit = self.options.limit
        return f"{AT_LIMIT}{counted(limit, 'item')}" if limit is not None and self.submitted >= limit else None

    def stopping(self) -> bool:
        """What the executor asks while it waits: a stop asked for or the run's time up, it sends no more tasks
        and waits only for those started (Celery: the others stay in their queue for the next run; with no worker
        running, waiting for them would never end). Not at --limit: the tasks sent are within it."""
        return self.stop.is_set() or self._out_of_time()

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    # ------------------------------------------------------------------------------------ running

    def dry_run(self, since: datetime | None, until: datetime) -> list[PlannedItem]:
        """What execute would do with the same options: up to --limit, where it stops (cut_short says so)."""
        planned = []
        for obj in self.objects(since, until):
            self.cut_short = self._at_limit()
            if self.cut_short:
                break
            if isinstance(obj, (UnreadableObject, SharedId)):
                planned.append(PlannedItem(obj.id, OBJECT, "fail", obj.reason))
                continue
            for item, decision, task in self.plan(obj, self.records(obj.id)).items:
                if task is not None:
                    self.cut_short = self._at_limit()
                    if self.cut_short:
                        break
                    self.submitted += 1
                planned.append(PlannedItem(obj.id, item.id, "process" if task else "skip", decision.reason))
        return planned

    def execute(self, executor: Executor, since: datetime | None, until: datetime) -> None:
        """An object's items not processed are recorded together (one transaction), before the next item is sent
        to be done and once the object is planned, so they are recorded in the order they were decided. A starved
        run does nothing."""
        if self.starved:
            return
        self.check_store()
        executor.check()
        self.superseding = self.ledger.has_superseded(self.pipeline.name)
        for obj in self.objects(since, until):
            if self.should_stop():
                break
            if isinstance(obj, SharedId):
                self._fail_in_run(obj.id, obj.reason)
                continue
            if isinstance(obj, UnreadableObject):
                self.unreadable(obj, since)
                continue
            records = self.records(obj.id)
            self._forget_unsettled(obj.id, records, {item.id for item in obj.items})  # OBJECT: described now
            plan = self.plan(obj, records)
            pending = self.pending.setdefault(obj.id, _PendingObject(obj, records, plan))
            tasks, unprocessed = 0, []
            for item, decision, task in plan.items:
                if task is None:
                    self._count(obj.id, item.id, decision.outcome.value, decision.reason)
                    unprocessed.append(Unprocessed(obj.id, item.id, decision.outcome.value, decision.reason))
                    continue
                if self.should_stop():
                    break
                self.ledger.record_unprocessed(self.run_id, unprocessed)
                unprocessed, pending.records = [], None
                pending.waiting.add(task.item.id)
                tasks += 1
                self.submitted += 1
                for result in executor.submit(task):  # may hold this item's own: an earlier run's, still recorded
                    self.settle(result)
                if task.item.id in pending.waiting:  # after the items whose slot it took: in flight, never one too many
                    self.progress.started(obj.id, task.item.id)
            else:
                pending.complete = True
            self.ledger.record_unprocessed(self.run_id, unprocessed)
            self.progress.planned(obj, tasks)
            self._settle_when_done(obj.id)
        if not self.should_stop(listed_all=True) and not self.options.object_ids:
            self.report_exhausted()
        for result in executor.drain():
            self.settle(result)
        if self.halted:
            raise RunHalted(self.halted)
        if any(pending.waiting for pending in self.pending.values()):  # the executor left them (see stopping)
            self.should_stop()  # the stop or the time limit came while the last tasks were in flight
        for pending in list(self.pending.values()):  # cut short: these stay for the next run
            self.unsettled.append(listed_at(pending.obj))

    def check_store(self) -> None:
        """One request before any item: a store that is missing (a mistyped bucket, a local root whose volume
        is not mounted), refuses the credentials or is down past its retries stops the run here (a StoreError),
        rather than failing every item and spending its attempts. A local root is made only while the ledger
        holds no deposit of the pipeline: on its first run."""
        self.pipeline.store.check(create=not self.ledger.has_deposit(self.pipeline.name))

    def unreadable(self, obj: UnreadableObject, since: datetime | None) -> None:
        """The object's failure, under the item id OBJECT: it has attempts like an item's, holds the checkpoint
        until they are spent, and `gcis-etl retry` starts them again. An object asked for by id that the source
        does not have is a failure of this run only; one revisited (for its failed items, or items that moved to
        another object: _moved_away) that is gone since, a note."""
        name = self.pipeline.name
        if obj.gone:
            records = self.records(obj.id)
            self._forget_unsettled(obj.id, records, set())
            self._moved_away(obj.id, records, set())
            if not self.options.object_ids:
                self.progress.note(f"not revisiting {obj.id}: {obj.reason}")
                return
            self._fail_in_run(obj.id, obj.reason)
            return
        reason = f"the source cannot describe it: {obj.reason}"
        self.ledger.record(self.run_id, ItemResult(name, obj.id, OBJECT, 0, Outcome.FAILED, "", self.recipe.name,
                                                   self.recipe.digest, 0, reason), obj.modified)
        self._count(obj.id, OBJECT, Outcome.FAILED.value, reason)
        if self.ledger.item(name, obj.id, OBJECT).attempts < self.pipeline.settings.max_attempts:
            self.unsettled.append(listed_at(obj) or since)

    def _fail_in_run(self, object_id: str, reason: str) -> None:
        """The object fails in this run's report alone: the ledger keeps no item of it, and no attempt."""
        self._count(object_id, OBJECT, Outcome.FAILED.value, reason)
        self.ledger.record_unprocessed(self.run_id, [Unprocessed(object_id, OBJECT, Outcome.FAILED.value, reason)])

    def _forget_unsettled(self, object_id: str, records: dict[str, ItemRecord], listed: set[str]) -> None:
        """Failed or rejected items the source no longer lists in the object (a master deleted or renamed since,
        the object gone), and its failure to be described (OBJECT) once it is, are forgotten (and taken out of
        `records`): they stayed failed in `status` for ever, and their object was revisited on every run.
        Deposited ones stay: their access masters are in the store (withdrawals do not reach it)."""
        for item_id in [i for i, r in records.items() if i not in listed and r.status in ("failed", "rejected")]:
            self.ledger.forget_item(self.pipeline.name, object_id, item_id)
            del records[item_id]

    def _moved_away(self, object_id: str, records: dict[str, ItemRecord], listed: Collection[str]) -> None:
        """Items of the object in the ledger (`records`) that the source no longer lists in it (`listed`) but in
        another object (this run saw it, _note_moves, or the ledger records them there), once its manifests no
        longer show them (republished without them), or the object is gone (its manifests stay, as a withdrawal's
        do): they are forgotten here, so that no later run revisits the object for them, and an access master of
        theirs here that is not the one they now have is superseded, retired once no manifest of the object shows
        it. An item not listed anywhere else was withdrawn: it stays (withdrawals never reach the store)."""
        if not self.unique_items:
            return
        moved = self.moved.pop(object_id, {})
        away = [record for item_id, record in records.items() if item_id not in listed]
        if not away:
            return
        now_in: dict[str, set[str | None]] = {item_id: set() for item_id in moved}
        for record in self.ledger.elsewhere(self.pipeline.name, object_id, [r.item_id for r in away]):
            now_in.setdefault(record.item_id, set()).add(record.output_key)
        for record in (r for r in away if r.item_id in now_in):
            if record.output_key and record.output_key not in now_in[record.item_id]:
                self.ledger.supersede(self.pipeline.name, object_id, record.item_id, record.output_key, self.run_id)
                self.superseding = True
            self.ledger.forget_item(self.pipeline.name, object_id, record.item_id)

    def report_exhausted(self) -> None:
        """Items out of attempts count as failed in every run, so cron keeps seeing exit 1 until someone runs
        `gcis-etl retry`; that is known from the ledger, without asking the source again."""
        unprocessed = []
        for record in self._failed_items("attempts>=?"):
            if record.object_id not in self.listed:
                decision = decide(record, record.fingerprint, self.recipe.digest, self.pipeline.settings.max_attempts)
                self._count(record.object_id, record.item_id, decision.outcome.value, decision.reason)
                unprocessed.append(Unprocessed(record.object_id, record.item_id, decision.outcome.value,
                                               decision.reason))
        self.ledger.record_unprocessed(self.run_id, unprocessed)

    def _failed_items(self, attempts: str) -> Iterator[ItemRecord]:
        return self.ledger.iter_items(self.pipeline.name, f"status='failed' AND {attempts}",
                                      (self.pipeline.settings.max_attempts,))

    def settle(self, result: ItemResult) -> None:
        """A result that stops the run is not the item's: it is not recorded, and counts no attempt."""
        if result.stops_run:
            self.halted = self.halted or result.reason
            return
        pending = self.pending[result.object_id]
        item = next(i for i in pending.obj.items if i.id == result.item_id)
        self.ledger.record(self.run_id, result, item.modified, pending.item_ids)
        self.superseding = self.superseding or result.outcome is Outcome.DEPOSITED  # under another key, maybe
        self._count(result.object_id, result.item_id, result.outcome.value, result.reason, result.warnings)
        pending.waiting.discard(result.item_id)
        self._settle_when_done(result.object_id)

    def _settle_when_done(self, object_id: str) -> None:
        """Once all of an object's items are planned and have an outcome, and only once: an item's outcome can
        come back while the object is still being planned (the executor had it already)."""
        pending = self.pending.get(object_id)
        if pending is not None and pending.complete and not pending.waiting:
            self.object_settled(object_id)

    def _count(self, object_id: str, item_id: str, outcome: str, reason: str | None,
               warnings: tuple[str, ...] = ()) -> None:
        self.counts[outcome] += 1
        self.progress.item(object_id, item_id, outcome, reason, warnings)

    def object_settled(self, object_id: str) -> None:
        """All items have an outcome: publish the manifest when every item is deposited or rejected, then retire
        the access masters the object's items no longer use (gcis_etl/supersession.py). An item whose new version
        was rejected keeps its last deposit on show, as the ledger keeps it: a broken upload never takes a page
        out of a manifest or a manifest off line (status and report list the rejection)."""
        pending = self.pending.pop(object_id)
        obj = pending.obj
        records = pending.records if pending.records is not None else self.records(obj.id)
        items = [(item, records.get(item.id)) for item in obj.items]
        if any(record is None or record.status == "failed" for _, record in items):
            if any(record and record.status == "failed" and record.attempts < self.pipeline.settings.max_attempts
                   for _, record in items):
                self.unsettled.append(listed_at(obj))
            return
        settled = pending.plan.manifests or self._manifests(obj, records, pending.plan.lost)  # planned: nothing sent
        if settled is not None and settled.action == "touched":
            self.ledger.record_touched(self.pipeline.name, obj.id, obj.modified, settled.digest)
        elif settled is not None and settled.action == "publish":
            manifests = self.pipeline.manifests
            try:
                published = manifests.publish(obj, settled.images)
            except (ManifestError, StoreError) as exc:
                if isinstance(exc, STOPS_RUN):
                    raise
                self._manifest_not_published(obj, exc)
                return  # its deposited manifest still shows the superseded keys
            for warning in published.warnings:
                log.warning("%s/%s: %s", self.pipeline.name, obj.id, warning,
                            extra={"pipeline": self.pipeline.name, "object_id": obj.id, "item_id": MANIFEST})
            label = [[v.value, v.language] for v in manifests.label_of(obj)]
            self.ledger.record_manifest(self.run_id, self.pipeline.name, obj.id, obj.modified, label,
                                        settled.digest, published.warnings)
            self.manifests_published += 1
        self._moved_away(obj.id, records, pending.item_ids)
        if not self.superseding:  # nothing to retire: not a query an object
            return
        for retired in retire_superseded(self.ledger, self.pipeline, obj.id, self.options.keep_superseded):
            self.progress.retired(retired)

    def _manifest_not_published(self, obj: SourceObject, exc: ManifestError | StoreError) -> None:
        """One of the object's manifests is invalid (its metadata: it waits for the source to change), or the store
        would not take its key (a folder or an immutable file in its place): the other objects and the collection
        go on. For the store's refusal the object holds the checkpoint, so that the next runs list it again and
        publish it once its key is put right (a store refusing everything stops the run: STOPS_RUN)."""
        retried = isinstance(exc, StoreError)
        reason = f"manifest not published: {exc}" + ("; the next run tries again" if retried else "")
        self._count(obj.id, MANIFEST, Outcome.REJECTED.value, reason)
        self.ledger.reject_manifest(self.run_id, self.pipeline.name, obj.id, reason)
        if retried:
            self.unsettled.append(listed_at(obj))

    def _touched_only(self, obj: SourceObject, images: list[DepositedImage], known: ObjectRecord) -> bool:
        """Whether the object differs from what its manifests were published for in its modified time alone, which
        no manifest shows (a file touched, a DAM record saved unedited): publishing would write the same bytes,
        yet count a manifest published and rewrite the collection. Asked only of an object whose fingerprint
        changed: a re-run over unchanged ones pays nothing more."""
        then = replace(obj, modified=datetime.fromisoformat(known.modified))
        return _manifest_fingerprint(then, images, self.manifest_settings) == known.manifest_fingerprint

    @cached_property
    def manifest_settings(self) -> str:
        """The manifests' settings as a manifest's fingerprint holds them: the same all the run."""
        return self.pipeline.manifests.settings.model_dump_json()

    def abandon(self, executor: Executor, exc: BaseException, checkpoint: datetime | None) -> None:
        """The run ends on `exc`: the items in flight are recorded, then the run as failed (its source, store,
        ledger or workers failed as a whole, and said why), crashed (a bug) or, on a KeyboardInterrupt (a library
        caller's Ctrl-C, which the caller sees raised), stopped on request, with the checkpoint it set before
        `exc` came (the collection's writing, last, failed). A ledger that cannot be written
        is what the command reports, whatever else went wrong (it must be put right before anything can run),
        and the run's note: when even that cannot be recorded (its disk full), the run stays 'running', which
        `status` shows as ended without finishing once the lock is free. What the items in flight deposited,
        the next run finds in the store. A manifest that an item in flight completes and that cannot be published
        (the store full: what `exc` may be) is logged, not raised: it would leave the run 'running'."""
        unwritable = exc if isinstance(exc, LedgerUnwritable) else None
        try:
            for result in executor.drain():
                try:
                    self.settle(result)
                except LedgerUnwritable:
                    raise
                except GcisError as failure:  # publishing its object's manifest: the next run, listing it, does
                    log.warning("%s: %s: left to the next run, this one having ended on an error: %s",
                                self.pipeline.name, result.object_id, failure,
                                extra={"pipeline": self.pipeline.name, "object_id": result.object_id})
        except LedgerUnwritable as failure:
            unwritable = unwritable or failure
        ended = unwritable or exc
        if isinstance(ended, KeyboardInterrupt):  # a library caller's Ctrl-C: its items in flight are recorded
            status, note = "stopped", STOPPED_ON_REQUEST
        else:
            status, note = "failed" if isinstance(ended, GcisError) else "crashed", _told(ended, typed=True)
        try:
            self.ledger.finish_run(self.run_id, status, self.counts, self.manifests_published, checkpoint, note)
        except LedgerUnwritable as failure:
            unwritable = unwritable or failure
        self.progress.ended(self.in_memory(status, note))
        if unwritable is not None and unwritable is not exc:
            raise unwritable

    def in_memory(self, status: str, note: str) -> RunReport:
        """The report of a run that ended on an error, from what the run holds (the ledger may not be writable)."""
        return RunReport(pipeline=self.pipeline.name, run_id=self.run_id, status=status, started=None, finished=None,
                         since=None, until=None, checkpoint_after=None, counts=dict(self.counts),
                         manifests=self.manifests_published, note=note, seconds=time.monotonic() - self.began)

    def update_collection(self) -> None:
        """The objects published since the collection was last written added to it; a collection missing from the
        store (deleted, expired, a restore without it) written again from all the ledger records as published,
        even by a run that published nothing: one HEAD a version, where nothing waits."""
        manifests = self.pipeline.manifests
        if manifests is None:
            return
        waiting = self.ledger.awaiting_collection(self.pipeline.name)
        if not waiting and (next(self.ledger.published(self.pipeline.name, page=1), None) is None or all(
                self.pipeline.store.exists(manifests.collection_key(v)) for v in manifests.settings.versions)):
            return
        manifests.update_collection((_entry(o) for o in waiting), published=lambda: map(
            _entry, self.ledger.published_objects(self.pipeline.name)), noted=self.noted)
        self.ledger.mark_in_collection(self.pipeline.name, [o.object_id for o in waiting])

    def noted(self, message: str) -> None:
        """Something the run did besides its items, which its report says: a warning as it happens."""
        self.progress.warning(self.pipeline.name, message)
        self.notes.append(message)

    def next_checkpoint(self, since: datetime | None, until: datetime) -> datetime | None:
        """Only a run over the checkpoint's own window moves it, never past an unsettled object, and a run cut
        short only when its source lists in modified order, to where its listing stopped: otherwise the next run
        lists the same window from its start again, re-skipping all that is settled before it reaches new work,
        and a window bigger than one run's reach is never got through."""
        reached = self.reached if self.cut_short or self.listing_cut else until
        if (self.checkpoint_held or self.options.since is not None or self.options.object_ids
                or None in self.unsettled or reached is None
                or (self.cut_short and not self.pipeline.source.lists_in_modified_order)):
            return None
        current = self.checkpoint()
        if current is None and not self.listed:  # a first listing that was empty: a set or a query mistyped
            return None  # would otherwise hide all that the one meant lists, for ever; the next run lists it all
        target = min([reached, *self.unsettled])
        return target if current is None or target > current else None

    def note(self, checkpoint: datetime | None) -> str | None:
        """Why the run stopped, or left the checkpoint where it was; for a run cut short, where the checkpoint
        is now; why it listed everything. A stop on request keeps its note alone: reports.py reads it for the
        exit code."""
        if self.cut_short in STOPPED_BY_SIGNAL:
            return self.cut_short
        if not self.cut_short:
            parts = (self.listing_note, self.checkpoint_held, self._where_cut(checkpoint))
        elif checkpoint is not None:
            parts = (_moved_to(self.cut_short, checkpoint), self.listing_note)
        else:
            parts = (self.cut_short, self.checkpoint_held, self.relisting(), self.listing_note)
        return "; ".join(filter(None, (*parts, *self.notes))) or None

    def _where_cut(self, checkpoint: datetime | None) -> str | None:
        """Where a listing the server cut short (ListingCut) left the checkpoint: at the last object listed, unless
        something else holds it or more objects than the server serves share the checkpoint's modified time (no
        run gets past those: `gcis-migrate initial_load` lists them another way)."""
        if self.listing_cut is None or self.checkpoint_held:
            return None
        if checkpoint is not None:
            return _moved_to(self.listing_cut, checkpoint)
        current = self.checkpoint()
        if (self.options.since is None and not self.unsettled and None not in (self.reached, current)
                and self.reached <= current):
            return (f"{self.listing_cut}; the checkpoint stays where it was: all the objects served are modified no "
                    f"later than it, so no run gets past them; load them with `gcis-migrate initial_load`")
        return f"{self.listing_cut}; the checkpoint stays where it was"

    def relisting(self) -> str | None:
        """What a run cut short over the checkpoint's window says when its source does not list in modified
        order: the next one starts where it did, and where that cannot go on for ever, what to do."""
        if (not self.cut_short or self.cut_short in STOPPED_BY_SIGNAL or self.starved
                or self.checkpoint_held or self.pipeline.source.lists_in_modified_order
                or self.options.since is not None or self.options.object_ids):
            return None  # a stop asked for is no lack of reach, nor is a run given no time
        source = self.pipeline.source
        sorting = (f"set {source.modified_order_setting} under pipelines.{self.pipeline.name}.source (a listing "
                   f"sorted oldest first on the modified date), " if source.modified_order_setting else "")
        cannot = "" if sorting else f" ({source.name}'s listing cannot be sorted on the modified date)"
        return (f"the checkpoint stays where it was, so the next run lists the same window again from its start "
                f"({source.name} is not known to list oldest first); if runs keep stopping before they get through "
                f"it, raise max_run_minutes or --max-minutes, {sorting}or load the backlog once with "
                f"`gcis-migrate initial_load`"
                f"{cannot}")


def harvest(config: Config, name: str, options: HarvestOptions = HarvestOptions(),
            progress: Progress | None = None, stop: threading.Event | Stop | None = None,
            executor: Executor | None = None) -> RunReport:
    """Run one pipeline once. Raises LockHeld when another run holds the pipeline; ConfigError, SourceError for
    problems that stop the whole run (the ledger then keeps everything settled so far). `stop` set: no new item
    is taken, and the run ends once those in flight are recorded (with Celery, those a worker started: the others
    stay in their queue for the next run, as at max_run_minutes). When it is a StopRequest (stop_on_signals), a
    second Ctrl-C ends the run at once, recorded as stopped (ABANDONED): the items in flight are not waited for,
    and the checkpoint stays where it was, so that the next run does them again."""
    pipeline = config.pipeline(name)
    progress = progress or Progress()
    stop = as_stop(stop)
    with _source_closed(pipeline), Ledger.open(config, read_only=options.dry_run) as ledger:  # a dry run: not made
        run = Harvest(config, pipeline, options, ledger, progress, stop)
        if options.dry_run:
            since, until = run.window()
            planned = run.dry_run(since, until)
            return RunReport(name, None, "dry-run", None, None, _iso(since), _iso(until), None,
                             {action: sum(p.action == action for p in planned) for action in PLANNED}, 0,
                             note="; ".join(filter(None, (run.cut_short, run.listing_note))) or None,
                             planned=planned)
        with pipeline_lock(config.state_dir, name):
            # by whichever run comes next, a starved one too (Harvest.starved says why)
            last = next(iter(ledger.runs(name, limit=1)), None)
            if last is not None and last.status == "running":  # killed: we hold the lock, it is gone
                _abort_uploads(config, run, last.run_id, "which was killed")
            elif last is not None and last.note == ABANDONED:
                _abort_uploads(config, run, last.run_id, "which abandoned its items in flight")
            if options.fresh_attempts:  # under the lock: a running harvest counts attempts too
                for object_id in options.object_ids:
                    ledger.reset_attempts(name, object_id)
            since, until = run.window()
            run.run_id = ledger.begin_run(name, since, until, _options(options))
            scratch = config.state_dir / "scratch" / name
            shutil.rmtree(scratch, ignore_errors=True)  # left by a killed run; we hold the lock
            own = executor is None
            executor = executor or open_executor(pipeline.settings.executor, {name: pipeline},
                                                 pipeline.settings.concurrency, scratch, pipeline.settings.transfers,
                                                 run.stopping)
            checkpoint = None
            try:
                with stop.in_flight(), waits_end_when(stop.is_set):
                    run.execute(executor, since, until)
                checkpoint = run.next_checkpoint(since, until)
                if checkpoint is not None:
                    ledger.set_checkpoint(name, checkpoint, run.run_id, pipeline.listing_digest)
                elif relisting := run.relisting():
                    log.warning("%s: %s", name, relisting)
                # After the checkpoint: the collection lists what the ledger holds, not what the run listed, so a
                # collection the store will not take (its key a folder) stops this run without holding every later
                # run's listing back; the next run writes it.
                if not run.starved:
                    run.update_collection()
            except Interrupted:  # what is in flight finishes unseen, or dies with the process: not waited for
                run.cut_short = ABANDONED
                if own:  # a library caller's process lives on: its workers go once their items are done
                    threading.Thread(target=executor.close, name="gcis-abandoned", daemon=True).start()
                    own = False
            except BaseException as exc:
                run.abandon(executor, exc, checkpoint)  # raises the ledger's failure, if it could not record it
                if not isinstance(exc, LedgerUnwritable):  # recorded: its report written as any run's is
                    try:
                        _reported(config, ledger, run.run_id)
                    except Exception:  # the run's own error is what the command reports
                        log.warning("%s: the report of run %s was not written", name, run.run_id, exc_info=True)
                raise
            finally:
                if own:
                    executor.close()
            if left := executor.left_queued(name):
                queued = f"{counted(left, 'task')} left queued for the next run"
                if run.cut_short in STOPPED_BY_SIGNAL:  # its note is the stop's alone (reports.py reads it)
                    log.warning("%s: %s", name, queued, extra={"pipeline": name})
                else:
                    run.notes.append(queued)
            ledger.finish_run(run.run_id, "stopped" if run.cut_short else "completed", run.counts,
                              run.manifests_published, checkpoint, run.note(checkpoint))
            report = _reported(config, ledger, run.run_id)
            progress.ended(report)
            return report


@contextmanager
def _source_closed(pipeline: Pipeline) -> Iterator[None]:
    """The run's source closed after it, if the run opened it (Pipeline.source is made on first use): a session it
    holds on the server ends with the run instead of piling up there, one more each cron run."""
    try:
        yield
    finally:
        if "source" in vars(pipeline):
            close_source(pipeline.source)


def _reported(config: Config, ledger: Ledger, run_id: int) -> RunReport:
    """A recorded run's report, from the ledger, written under reports_dir (harvest --help promises one for every
    run, a failed one too), where the reports of the pipeline's older runs than the ledger keeps go."""
    report = write_report(report_from_ledger(ledger, ledger.run(run_id)), config.reports_dir)
    prune_reports(config.reports_dir, ledger, report.pipeline)
    return report


def open_sources(config: Config, names: Sequence[str]) -> dict[str, Source]:
    """The commands that list or fetch need their sources' secrets (config.yaml leaves a source's unset ${VAR}
    to the opening, so that status, report and cache need none): all are opened before any run starts, and
    one missing raises ConfigError naming the key. The sources, by pipeline name."""
    return {name: config.pipeline(name).source for name in names}


@dataclass(frozen=True)
class PipelineOutcome:
    """A pipeline's part in harvest_pipelines. exit_code: as `gcis-etl harvest` would exit for it alone
    (gcis_etl.commands). No report: `message` words for whoever ran it why: the run stopped on an error, or it was
    not started (`started` False), as a stop asked for, or a ledger that cannot be written, came first."""

    name: str
    exit_code: int
    report: RunReport | None = None
    message: str | None = None
    started: bool = True


def harvest_pipelines(config: Config, names: Sequence[str] = (), options: HarvestOptions = HarvestOptions(),
                      stop: threading.Event | Stop | None = None, progress_for: Callable[[str], Progress] | None = None
                      ) -> Iterator[PipelineOutcome]:
    """What `gcis-etl harvest` does: each pipeline named (all when none is) harvested in turn, its outcome given
    as it ends; the command exits with the highest exit code among them. Every source is opened first. Another
    run holding a pipeline's lock, its source, store or scratch space failing as a whole, or a bug (an exception
    that is not a GcisError, its traceback logged), ends that pipeline's run alone; a ledger that cannot be
    written leaves the pipelines after it unstarted (they share it), as does a stop asked for (stop_on_signals
    sets it), each said in its outcome's message; a ConfigError is raised. `progress_for(name)`: what shows a
    pipeline's run (gcis_etl.progress.progress_for on a terminal; none by default). `stop` may be the caller's
    own Event, as for harvest(): set, it stops the runs as a signal would, and they exit 1 as a report of a run
    that did not complete does (there is no signal to report). `names` is a sequence of names: a str alone is
    refused, as HarvestOptions.object_ids refuses one (it would be read as one name per character).
    The time limit spans the call, not each run: options.max_run_minutes, else the pipelines' own max_run_minutes
    (the longest, when each has one; cron's interval is the call's); each pipeline gets an equal share of what is
    left of it when it starts (_shared), so what one does not use passes to those after it. One that overruns its
    share (a source hanging, a Celery task a worker started) leaves less to those after it, or none: one started
    with none left takes no item, and a WARNING says so and who took its time. With no names, the pipelines run in
    turn (_in_turn), so that it is not the same one every time; names given run in their order."""
    if isinstance(names, str):
        raise TypeError(f"harvest_pipelines' names are a sequence of pipeline names: ({names!r},), not {names!r}")
    names = list(names) or _in_turn(config)
    stop = as_stop(stop)
    limit = TimeLimit(minutes=None if options.dry_run else  # a dry run takes its time: it plans every item
                      _longest(config, names) if options.max_run_minutes is None else options.max_run_minutes)
    open_sources(config, names)
    not_started: tuple[int, str] | None = None  # the exit code of the pipelines left, once none can start, and why
    turns: list[_Turn] = []
    for runs_left, name in zip(range(len(names), 0, -1), names):
        if not_started is None and stop.is_set():  # the command was cut short
            not_started = stop.exit_code, f"the harvest was stopped by {stop.stopped_by}"
        if not_started is not None:
            yield PipelineOutcome(name, not_started[0], message=f"{name}: not started: {not_started[1]}",
                                  started=False)
            continue
        progress = progress_for(name) if progress_for else Progress()
        given = _shared(options, config.pipeline(name), limit, runs_left)
        if given.max_run_minutes is not None and given.max_run_minutes <= NO_TIME_LEFT:
            log.warning("%s", _no_time_left(name, options, limit, turns), extra={"pipeline": name})
        turn = _Turn(name, given.max_run_minutes)
        try:
            report = harvest(config, name, given, progress, stop)
        except LockHeld as exc:
            outcome = PipelineOutcome(name, EXIT_LOCKED, message=_told(exc))
        except LedgerUnwritable as exc:
            not_started = EXIT_USAGE, "the ledger cannot be written (said above)"
            outcome = PipelineOutcome(name, EXIT_USAGE, message=f"{name}: run stopped: {_told(exc, name)}")
        except ConfigError:
            raise
        except GcisError as exc:
            outcome = PipelineOutcome(name, EXIT_ITEM_FAILED, message=_stopped(name, exc))
        except Exception as exc:  # a bug (a connector's listing raising KeyError): the run is recorded as crashed
            log.exception("%s: run crashed", name, extra={"pipeline": name})
            outcome = PipelineOutcome(name, EXIT_ITEM_FAILED, message=f"{name}: run crashed: {_told(exc, typed=True)} "
                                                                      f"(its traceback is logged)")
        else:
            stopped = stop.exit_code if report.note in STOPPED_BY_SIGNAL else EXIT_OK
            outcome = PipelineOutcome(name, max(report.exit_code, stopped), report)
        finally:
            progress.clear()
            turns.append(turn.ended())
        yield outcome


@dataclass(frozen=True)
class _Turn:
    """A pipeline's run in harvest_pipelines: the minutes it was given (None: no limit), and the seconds it took."""

    name: str
    minutes: float | None
    began: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    def ended(self) -> _Turn:
        return replace(self, seconds=time.monotonic() - self.began)

    @property
    def overran(self) -> bool:
        return self.minutes is not None and self.minutes > NO_TIME_LEFT and self.seconds > self.minutes * 60


def _no_time_left(name: str, options: HarvestOptions, limit: TimeLimit, turns: Sequence[_Turn]) -> str:
    """What a pipeline started with none of the command's time left says, naming the runs before it that took
    more than they were given (a source hanging, a Celery task a worker started: finished past the limit)."""
    of = (f"--max-minutes {options.max_run_minutes:g}" if options.max_run_minutes is not None
          else f"the pipelines' max_run_minutes ({limit.minutes:g})")
    took = ", ".join(f"{t.name} ran {_seconds(t.seconds)} of its {_seconds(t.minutes * 60)}"
                     for t in turns if t.overran)
    return f"{name}: no time left of {of}{f' ({took})' if took else ''}: no item taken"


def _seconds(seconds: float) -> str:
    return f"{round(seconds, 1):g} s"


def _in_turn(config: Config) -> list[str]:
    """Every pipeline, in turn: the one whose last run given time started longest ago first (those never given
    any first of all, by name). A run given none (NO_TIME_LEFT) had no turn, so a pipeline that a slow one before
    it left without time goes first next time, instead of losing its turn to it on every run. A ledger that
    cannot be read leaves them by name: the first run says what is wrong with it."""
    try:
        with Ledger.open(config, read_only=True) as ledger:
            last = ledger.last_runs_given(NO_TIME_LEFT)
    except LedgerError:
        last = {}
    return sorted(config.pipelines, key=lambda name: (last.get(name, 0), name))


def _longest(config: Config, names: Sequence[str]) -> float | None:
    """The pipelines' longest max_run_minutes; None (no limit) when one of them has none."""
    own = [config.pipeline(name).settings.max_run_minutes for name in names]
    return None if None in own else max(own, default=None)


def _shared(options: HarvestOptions, pipeline: Pipeline, limit: TimeLimit, runs: int) -> HarvestOptions:
    """`options` with the pipeline's time: its share of what is left of `limit` among the `runs` left, or its own
    max_run_minutes where that is shorter (unless options.max_run_minutes, the operator's --max-minutes, set the
    limit: a catch-up run may be longer than cron's). None left, it gets NO_TIME_LEFT: the run takes no item, and
    its report says it stopped at the run time limit (TimeLimit.handed)."""
    if limit.minutes is None:
        return options
    return limit.handed(options, runs, pipeline.settings.max_run_minutes if options.max_run_minutes is None else None)


def _moved_to(why: str, checkpoint: datetime) -> str:
    """The note of a run whose listing stopped short (cut short, or by the server) and moved the checkpoint."""
    return f"{why}; the checkpoint moved to {checkpoint.isoformat()}, where the listing stopped"


def _told(exc: BaseException, pipeline: str = "", typed: bool = False) -> str:
    """An error as a run records it (its note) or says it (PipelineOutcome.message): `typed`, after its type's
    name; without the `pipeline`'s name it starts with, when what follows says it (a source's errors start with its
    name, the pipeline's). Scrubbed of the secrets the sources' settings hold (connectors.redaction), which whatever
    raised it, someone's connector say, may have put in its text."""
    text = str(exc).removeprefix(f"{pipeline}: ") if pipeline else str(exc)
    return scrub(f"{type(exc).__name__}: {text}" if typed else text)


def _stopped(name: str, exc: GcisError) -> str:
    """What a run that `exc` stopped says: the error, what to do about it (work.remedy, as an item's halting
    says it), and "run again" only where neither says what to do ("running again will not help" must not be
    followed by it)."""
    then = remedy(exc)
    told = f"{_told(exc, name)}: {then}" if then else _told(exc, name)
    again = "" if told_what_to_do(told) else "; run again"
    return f"{name}: run stopped: {told} (everything settled so far is recorded{again})"


def _abort_uploads(config: Config, run: Harvest, last_run: int, which: str) -> None:
    """A run killed, or that abandoned its items in flight, mid-upload leaves its multipart parts in S3 (never
    completed, invisible, but billed) or its temporary files in a local store. Celery workers outlive the run
    that sent them work: their uploads may still be going for a task's hard time limit, so only older ones are
    aborted. Only the pipeline's own keys, never another pipeline's in a shared store: its collections, and its
    images (with the default key templates, its manifests too) when their keys start with a prefix of its own;
    without one (KeyTemplates.own_image_prefix), the ledger does not know which keys the run had in flight, and
    the uploads of images found are left, as the run's report says (stores.uploads_kept)."""
    pipeline = run.pipeline
    prefix = pipeline.store.keys.own_image_prefix(pipeline.name)
    keys = [] if prefix is None else [prefix]
    if pipeline.manifests is not None:
        keys += [pipeline.manifests.collection_key(version) for version in pipeline.manifests.settings.versions]
    older_than = timedelta(0) if pipeline.settings.executor == "local" else timedelta(
        seconds=config.celery.limits_for(pipeline.recipe).hard_seconds)
    aborted = pipeline.store.abort_incomplete_uploads(older_than=older_than, keys=tuple(keys)) if keys else []
    if aborted:
        run.noted(f"aborted {len(aborted)} incomplete uploads left by run {last_run}, {which}: {', '.join(aborted)}")
    if kept := uploads_kept(pipeline.store, pipeline.name, f"run {last_run}, {which},", older_than):
        run.noted(kept)


def _entry(record: ObjectRecord) -> CollectionEntry:
    """An object's entry in the collection, as the ledger records its label."""
    return CollectionEntry(record.object_id, tuple(LangValue(v, lang) for v, lang in json.loads(record.label)))


def _usable(obj: SourceObject | UnreadableObject | ListingMoved, source: str
            ) -> SourceObject | UnreadableObject | ListingMoved:
    """An object the run cannot take as its source describes it, in its place as one the source cannot describe
    (it fails before any of its items is sent, holding the checkpoint until its attempts are spent): two of its
    items under one id, of which the ledger keeps one record (the second master was neither deposited nor
    failed, and its manifest showed the first twice); a time with no timezone, which no other time compares with
    (connectors.base.Source). A connector's own words (why it cannot describe an object, why its listing moved) are
    scrubbed of the sources' secrets here, where they enter: the ledger, the reports and a dry run show them."""
    if not isinstance(obj, SourceObject):
        return replace(obj, reason=scrub(obj.reason))
    times = [("its modified time", obj.modified), ("its listed_at", obj.listed_at),
             *((f"the modified time of its item {item.id}", item.modified) for item in obj.items)]
    naive = next(((what, at) for what, at in times if at is not None and at.utcoffset() is None), None)
    if naive is not None:
        return UnreadableObject(obj.id, None, f"{source} gave {naive[0]} with no timezone "
                                              f"({naive[1].isoformat()}): a source's times must have one")
    if len({item.id for item in obj.items}) < len(obj.items):
        sequences: dict[str, list[int]] = {}
        for item in obj.items:
            sequences.setdefault(item.id, []).append(item.sequence)
        shared = next((item_id, n) for item_id, n in sequences.items() if len(n) > 1)
        return UnreadableObject(obj.id, listed_at(obj), f"its items {', '.join(map(str, shared[1]))} share the id "
                                                        f"{shared[0]!r}: each item needs its own")
    return obj


def _moves(moved: dict[str, str]) -> str:
    """{item id: the object it is now listed in} in words: "its item A is now listed in G2; ..."."""
    by_object: dict[str, list[str]] = {}
    for item_id, object_id in moved.items():
        by_object.setdefault(object_id, []).append(item_id)
    return "; ".join(f"its item {ids[0]} is now listed in {object_id}" if len(ids) == 1 else
                     f"its items {', '.join(ids)} are now listed in {object_id}"
                     for object_id, ids in by_object.items())


def _holders(records: dict[str, ItemRecord]) -> dict[str, ItemRecord]:
    """Of the records naming each key, the one whose access master is there: a deposited one before a rejected
    or failed one (which keeps its last key but wrote none), then the one written last."""
    holders: dict[str, ItemRecord] = {}
    for record in (r for r in records.values() if r.output_key):
        held = holders.get(record.output_key)
        if held is None or (record.status == "deposited", record.updated) > (held.status == "deposited", held.updated):
            holders[record.output_key] = record
    return holders


def _manifest_fingerprint(obj: SourceObject, images: list[DepositedImage], settings: str) -> str:
    """listed_at is left out: where the object stood in a listing is not in its manifest, and an object asked
    for by id has none; its items are None (the images stand for them). The JSON is that of asdict, which
    ledgers' digests were made of, without asdict deep-copying every item first (a quarter of a re-run's time)."""
    shown = {k: v for k, v in _as_json(obj).items() if k != "listed_at"} | {"items": None}
    document = {"object": shown, "images": images, "settings": settings}
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=_as_json).encode()).hexdigest()


def _as_json(value: object) -> object:
    """A dataclass as asdict's dict of its fields, one level at a time (json.dumps comes back for a dataclass
    inside); anything else JSON does not know as str (datetimes)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return str(value)


def _options(options: HarvestOptions) -> dict:
    """What the ledger records of a run's options: those set (a migration's run without --max-minutes has an
    infinite max_run_minutes, which JSON cannot hold: left out, as no limit is)."""
    return {k: v for k, v in asdict(replace(options, described=(), timed_from=None)).items()
            if v not in (None, (), False, math.inf)}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
