"""Read back what a pipeline deposited and check its bytes: a fixity audit of its store.

Every key the ledger knows for the pipeline (each item's access master, the superseded ones not retired yet, each
published object's manifests, the collections) is streamed from the pipeline's store through SHA-256 (nothing is
written to disk) and its SHA-256 and size compared with what the ledger recorded (access masters) and with the
store's own record (sidecar, S3 metadata).

\b
Each key is one of:
  ok          its bytes are the ones recorded
  missing     the ledger says it is deposited, the store has no object under its key
  damaged     its bytes (or the store's record of them) are not the ones recorded: the reason names the
              recorded and found SHA-256 (first 12 digits) and sizes
  unreadable  the store answered with an error, past its retries: a failure, not damage (run again)
  absent      a superseded access master retired since, or a collection not published yet: no problem
  lost        damaged or missing again, after a repair that could not bring it back because the source no
              longer lists its item: reported once as a problem, then no more (see --repair)

The ledger records when each key was last audited and what was found. A run audits first the keys last found
damaged, missing or unreadable (whenever that was), then those never audited, then those audited longest ago:
with --limit a nightly cron job audits a slice, and the next night's goes on where it stopped; --older-than DAYS
leaves out the keys audited within the last DAYS days and found ok. Keys the ledger still holds damaged, missing
or unreadable that a run did not read (more of them than --limit, or it stopped) are counted and listed under
that outcome with their recorded reason ("not read by this run"), and the run exits 1: it never says all is well
while the ledger records a problem. A killed run keeps what it recorded. A store holding no object at all (its
volume not mounted, its prefix changed) stops the run before any key is read: every key would be missing.

--repair harvests the objects of damaged or missing access masters and manifests again, forced (from their
masters in the source, converted again: every item of the object, not only the damaged one; their manifests and
collections published again), then audits those keys again: one found right is counted as repaired. One the
repair could not bring back says why (its item no longer listed by the source, or rejected or failed). One whose
item the source no longer lists is reported damaged or missing by that run (exit 1), and recorded lost: not read
first, nor counted a problem, by the runs after it (no repair brings it back while the source lacks its master);
read again in its turn, it is reported lost (listed in the CSV). Put its master back in the source (under its
old name) and run --repair again: found right, it is repaired. A damaged
manifest or collection is deleted first (a store's record outlives damage to the bytes it describes, and
publishing the same document again would leave it be), right before the harvest that republishes it: a run
stopped, or out of --max-minutes, before a repair reports its keys as found and leaves them be; a harvest that
fails after the deletion leaves them missing ("deleted for a repair that did not finish"), first in the next
run's queue. Without --repair the audit only reports. Unreadable keys are never repaired.

\b
Usage:
  gcis-migrate audit --pipeline museum                          everything, or what is left of it
  gcis-migrate audit --pipeline museum --limit 20000            a nightly slice (cron)
  gcis-migrate audit --pipeline museum --older-than 90          what was not audited in the last 90 days
  gcis-migrate audit --pipeline museum --repair                 and re-derive what is damaged or missing
  gcis-migrate audit --pipeline museum --dry-run                how many keys a run would read

\b
Nightly, outside the harvest's cron window (crontab):
  30 2 * * *  gcis-migrate audit --pipeline museum --limit 20000 --max-minutes 180 --log-json

\b
Exit codes: 0 every key audited is ok (or was repaired), and the ledger records no other key as a problem;
1 some keys are damaged, missing or unreadable (found now, or recorded and not read again), or a repair's harvest
failed items, or stopped on an error (run again); act on it with `gcis-migrate audit --pipeline NAME --repair`
(unreadable keys: fix the store and run again); 2 configuration or usage error; 3 another run holds the pipeline
(a harvest that starts while the audit runs exits 3 too: schedule them apart); 130 (Ctrl-C), 143 (SIGTERM) or 129
(SIGHUP) stopped by that signal after the keys in flight (what was audited is recorded: run it again to continue).
On a terminal a live line shows the keys audited of those queued, the problems found, the keys repaired and the
time elapsed.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Iterator

import click

from gcis_etl.deposits import StoreKey, item_key, pipeline_keys
from gcis_etl.errors import StoreError, StoreUnavailable
from gcis_etl.ledger import ItemRecord, Ledger, now
from gcis_etl.locks import RunLock
from gcis_etl.migration import Budget, MigrationContext, migration
from gcis_etl.pipelines import Pipeline
from gcis_etl.progress import AuditProgress, audit_progress
from gcis_etl.reports import counted
from gcis_etl.stores import Store, StoredObject, open_store

REPAIRABLE = ("damaged", "missing")
LOST = "lost"  # recorded, not a problem (ledger.AUDIT_PROBLEMS), for a key whose item the source no longer lists
LOST_ADVICE = ("put its master back in the source (under its old name) and run --repair again; until then it is "
               "recorded lost, and no more reported as a problem")
REPAIR_BATCH = 50  # objects harvested again in one run
SHOWN_DIGITS = 12  # of a SHA-256 in a reason


@migration(__doc__, in_flight="keys")
@click.option("--pipeline", "name", required=True, help="The pipeline whose store is audited.")
@click.option("--repair", is_flag=True,
              help="Harvest the objects of damaged or missing keys again (forced: every item of the object is "
                   "converted again), then audit those keys again.")
@click.option("--older-than", type=click.FloatRange(min=0), default=0, show_default=True, metavar="DAYS",
              help="Leave out the keys audited within the last DAYS days and found ok (0: audit every key).")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Keys read at once.")
@click.option("--limit", type=click.IntRange(min=1),
              help="Audit no more than this many keys (those last found a problem, those never audited, then "
                   "those audited longest ago, first: the next run goes on with the rest).")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True),
              help="Start no new key, nor repair, after this many minutes (run again to go on).")
def main(ctx: MigrationContext, name: str, repair: bool, older_than: float, concurrency: int, limit: int | None,
         max_minutes: float | None) -> None:
    pipeline = ctx.pipeline(name)
    ctx.budget = Budget(minutes=max_minutes)  # the repairs' harvest runs share it
    started = now()
    audited_before = started - timedelta(days=older_than) if older_than else None
    with ctx.ledger() as ledger, nullcontext() if ctx.dry_run else ctx.lock(name) as lock:
        queued = ledger.audit_queue(name, ((k.key, k.to_json()) for k in pipeline_keys(ledger, pipeline)),
                                    audited_before)
        reading = min(queued, limit or queued)
        if ctx.dry_run:
            ctx.report.add("would audit", reading)
            return
        store = open_store(pipeline.settings.store, concurrency)
        store.check(create=False if ledger.has_deposit(name) else None)
        progress = ctx.shown(audit_progress(name, reading, ctx.report.counts))
        audit = Audit(ctx, pipeline, store, lock if repair else None, progress)
        keys = (StoreKey.from_json(payload) for _, payload in ledger.audit_queued())
        try:
            audited = audit.run(ledger, keys, concurrency, limit)
        finally:
            progress.clear()  # before the summary
        left = audit.report_left(ledger, started)
    if left:
        were, them = ("was", "it") if left == 1 else ("were", "them")
        ctx.report.notes.append(f"{counted(left, 'key')} recorded damaged/missing/unreadable {were} not in this "
                                f"slice (listed with the reason recorded: \"not read by this run\"): run again"
                                f"{'' if repair else ' with --repair'} to read {them}")
    if ctx.stop.is_set() or ctx.report.status != "completed" or audited == queued:
        return
    spent = ctx.budget.exhausted()
    if spent:
        ctx.report.stop("stopped", f"stopped: {spent}: run again to go on")
    else:
        ctx.report.notes.append(f"audited {audited} of {counted(queued, 'key')} (--limit {limit}): the next run "
                                f"goes on with those not audited, or audited longest ago")


@contextmanager
def released(lock: RunLock) -> Iterator[None]:
    """The pipeline's lock let go for a harvest run, which takes it, and taken again after it: keys are read only
    while no harvest can deposit (one that took the lock in between stops the audit: exit 3)."""
    lock.__exit__(None, None, None)
    try:
        yield
    finally:
        lock.__enter__()


@dataclass(frozen=True)
class Finding:
    outcome: str  # ok, missing, damaged, unreadable, absent; after a repair, repaired or lost
    reason: str = ""


def digest_of(sha256: str | None, size: int | None) -> str:
    digest = f"SHA-256 {sha256[:SHOWN_DIGITS]}" if sha256 else "no SHA-256"
    return digest if size is None else f"{digest} ({counted(size, 'byte')})"


def compare(item: StoreKey, record: StoredObject, sha256: str, size: int) -> Finding:
    """The bytes read (their SHA-256 and size) against the ledger's record of the key, and the store's."""
    read = digest_of(sha256, size)
    if item.sha256 and (sha256, size) != (item.sha256, item.size if item.size is not None else size):
        return Finding("damaged", f"the ledger recorded {digest_of(item.sha256, item.size)}, read {read}")
    if record.doubt:
        return Finding("damaged", f"{record.doubt}; read {read}")
    if record.sha256 is None:
        return Finding("damaged", f"the store records no SHA-256 for it (written over by another tool?); read {read}")
    if record.sha256 != sha256:
        return Finding("damaged", f"the store recorded {digest_of(record.sha256, None)}, read {read}")
    return Finding("ok")


class Audit:
    def __init__(self, ctx: MigrationContext, pipeline: Pipeline, store: Store, repair: RunLock | None,
                 progress: AuditProgress):
        """`repair`: the pipeline's lock, which the harvest runs that repair take in turn; None: no repair."""
        self.ctx = ctx
        self.pipeline = pipeline
        self.store = store
        self.repair = repair
        self.progress = progress
        self.repaired: set[str] = set()  # objects harvested again: the ledger's records of their keys changed
        self.deleted: dict[str, Finding] = {}  # documents deleted for a repair: what was found of them

    def run(self, ledger: Ledger, keys: Iterator[StoreKey], concurrency: int, limit: int | None) -> int:
        """A bounded window of keys in flight, settled in order on this thread (the ledger's connection is not
        shared across threads). Problems to repair wait until REPAIR_BATCH objects have some; the window is
        emptied first, so no key is read while its object is harvested again. How many keys were audited."""
        pending: dict[str | None, list[tuple[StoreKey, Finding]]] = {}
        audited = 0
        with ThreadPoolExecutor(concurrency, thread_name_prefix="gcis-audit") as pool:
            window: deque[tuple[StoreKey, Future]] = deque()

            def settle() -> None:
                item, future = window.popleft()
                try:
                    finding = future.result()
                except BaseException:  # its store went down: not read
                    self.progress.settled(item.key, False)
                    raise
                self.progress.settled(item.key, True)
                if finding.outcome in REPAIRABLE and self.lost(ledger, item.key):
                    finding = Finding(LOST, f"{finding.reason} (its item no longer in the source: {LOST_ADVICE})")
                ledger.record_audit(self.pipeline.name, item.key, finding.outcome, finding.reason or None)
                if self.repair and finding.outcome in (*REPAIRABLE, LOST):
                    pending.setdefault(item.object_id, []).append((item, finding))
                else:
                    self.report(item, finding)

            try:
                for item in keys:
                    if limit is not None and audited >= limit or self.ctx.stop.is_set() or self.ctx.budget.exhausted():
                        break
                    if item.object_id in self.repaired:
                        item = self.refreshed(ledger, item)
                    self.progress.started(item.key)
                    window.append((item, pool.submit(self.check, item)))
                    audited += 1
                    while window and (len(window) >= 2 * concurrency or window[0][1].done()):
                        settle()
                    if len(pending) >= REPAIR_BATCH:
                        while window:
                            settle()
                        self.repair_batch(ledger, pending)
                while window:
                    settle()
                self.repair_batch(ledger, pending)
            finally:  # a store gone down: what waits for a repair is reported as found (or deleted for it)
                self.report_found(pending)
        return audited

    def report(self, item: StoreKey, finding: Finding) -> None:
        self.ctx.report.event(item.key, finding.outcome, finding.reason, listed=finding.outcome in ("repaired", LOST))

    def lost(self, ledger: Ledger, key: str) -> bool:
        """Whether the ledger records `key` lost: its item gone from the source, as a repair found."""
        record = ledger.audit(self.pipeline.name, key)
        return record is not None and record.outcome == LOST

    def report_left(self, ledger: Ledger, started: datetime) -> int:
        """The keys queued that the ledger holds damaged, missing or unreadable from before this run, which it did
        not read again: each under its recorded outcome (a run never says all is well while the ledger records a
        problem). How many."""
        left = 0
        for record in ledger.audit_problems_left(self.pipeline.name, started):
            left += 1
            self.ctx.report.event(record.key, record.outcome, f"not read by this run (outside its slice); recorded "
                                                              f"{record.audited}: {record.reason or record.outcome}")
        return left

    @staticmethod
    def waiting(pending: dict[str | None, list[tuple[StoreKey, Finding]]]) -> Iterator[tuple[StoreKey, Finding]]:
        """The entries waiting for a repair, each taken out of `pending` as it is handed over: one reported is
        never reported again, whatever is raised after it."""
        for object_id in list(pending):
            entries = pending[object_id]
            while entries:
                yield entries[0]
                entries.pop(0)
            del pending[object_id]

    def report_found(self, pending: dict[str | None, list[tuple[StoreKey, Finding]]]) -> None:
        for item, finding in self.waiting(pending):
            self.report(item, finding)

    def check(self, item: StoreKey) -> Finding:
        """Read the key back; a store that goes down raises (every key would be unreadable alike)."""
        try:
            record = self.store.head(item.key)
            if record is None:
                return self.absent(item)
            try:
                sha256, size = self.store.digest(item.key)
            except StoreUnavailable:
                raise
            except StoreError:
                if self.store.head(item.key) is None:  # deleted since the HEAD
                    return self.absent(item)
                raise
        except StoreUnavailable:
            raise
        except StoreError as exc:
            return Finding("unreadable", str(exc))
        return compare(item, record, sha256, size)

    def absent(self, item: StoreKey) -> Finding:
        where = self.store.describe(item.key)
        if item.required:
            return Finding("missing", f"not in {where}")
        return Finding("absent", "a superseded access master, retired since" if item.object_id else
                       "no collection published yet")  # an item's own access master is always required

    def refreshed(self, ledger: Ledger, item: StoreKey) -> StoreKey:
        """A key of an object harvested again: as the ledger records it now (an access master no item has any
        more was superseded: it need not be there)."""
        if item.version is not None:
            return item
        record = self.holder(ledger, item)
        return item_key(record) if record else replace(item, sha256=None, size=None, required=False)

    def holder(self, ledger: Ledger, item: StoreKey) -> ItemRecord | None:
        """The item whose access master `item` is, as the ledger records it now; None for a document, or a key no
        item has any more."""
        if item.version is not None:
            return None
        return next((r for r in ledger.items(self.pipeline.name, item.object_id) if r.output_key == item.key), None)

    def unrepaired(self, ledger: Ledger, item: StoreKey, run_id: int | None) -> tuple[str, bool]:
        """Why the repair's harvest (run `run_id`) did not bring an access master back, from what it recorded of
        the key's item, and whether the key is lost: the source no longer lists the item (its master deleted or
        renamed since: the run left its record as it was); or its conversion was rejected or failed."""
        record = self.holder(ledger, item)
        if record is None:
            return "after a repair", False
        if record.last_run != run_id:
            return (f"the repair could not bring it back: the source no longer lists item {record.item_id!r} of "
                    f"object {record.object_id!r} (its master deleted or renamed since), whose access master it "
                    f"is ({LOST_ADVICE})"), True
        if record.status != "deposited":
            return f"the repair could not bring it back: its item was {record.status} ({record.reason})", False
        return "after a repair", False

    def repair_batch(self, ledger: Ledger, pending: dict[str | None, list[tuple[StoreKey, Finding]]]) -> None:
        """Harvest the objects again, forced, then audit their keys again. A collection is published again by
        the harvest of any object; a damaged document is deleted first, or its republishing would leave it be:
        only right before a harvest that will run (stopped, out of time or cut short, the keys are reported as
        found, the damaged documents still there). One deleted is recorded missing at once (a harvest that
        fails, or a kill, leaves it so: first in the next run's queue)."""
        if not pending:
            return
        objects = [object_id for object_id in pending if object_id is not None]
        if not objects:
            objects = [object_id for object_id in [next(iter(ledger.published(self.pipeline.name)), None)]
                       if object_id is not None]
        spent = self.ctx.budget.exhausted()
        if spent and not self.ctx.stop.is_set():
            self.ctx.report.stop("stopped", f"stopped: {spent} before the repair of "
                                            f"{counted(len(objects), 'object')}: run again to go on")
        if not objects or spent or self.ctx.stop.is_set():
            self.report_found(pending)
            return
        self.progress.clear()  # the harvest shows its own line
        for entries in pending.values():
            for n, (item, finding) in enumerate(entries):
                if item.version is not None and finding.outcome == "damaged":
                    self.store.delete(item.key)
                    entries[n] = (item, Finding("missing", f"deleted for a repair that did not finish: run --repair "
                                                           f"again (was damaged: {finding.reason})"))
                    ledger.record_audit(self.pipeline.name, item.key, entries[n][1].outcome, entries[n][1].reason)
                    self.deleted[item.key] = finding
        with released(self.repair):
            harvested = self.ctx.harvest(self.pipeline.name, object_ids=tuple(objects), force=True)
        if not harvested:
            self.report_found(pending)
            return
        self.repaired.update(objects)
        run_id = self.ctx.report.runs[-1] if self.ctx.report.runs else None
        for item, before in self.waiting(pending):
            before = self.deleted.pop(item.key, before)
            item = self.refreshed(ledger, item) if item.object_id in self.repaired else item
            after = self.check(item)
            lost = False
            if after.outcome != "ok":
                why, lost = self.unrepaired(ledger, item, run_id)
                after = replace(after, reason=f"{why}: {after.reason}")
            # lost: reported as found this once (exit 1), recorded so that it is not read first ever after
            ledger.record_audit(self.pipeline.name, item.key, LOST if lost else after.outcome, after.reason or None)
            self.report(item, Finding("repaired", f"was {before.outcome}: {before.reason}") if after.outcome == "ok"
                        else replace(after, outcome=LOST) if lost and before.outcome == LOST else after)
