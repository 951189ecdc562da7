"""Copy a pipeline's access masters, manifests and collections to another store, verified end to end.

Every key the ledger knows for the pipeline (each item's access master, the superseded ones not retired yet,
each published object's manifests, the collections) is copied from the source store (default: the pipeline's
configured store) to the target store (default: the configured one). The bytes read must have the SHA-256 that
the ledger and the source store recorded; the target verifies the SHA-256 it receives, and what it reports
afterwards must match.
Keys do not change (they are relative to a store's root or prefix), so the ledger stays valid as it is.
Re-running continues where the last run stopped: keys already in the target with the same SHA-256 (as the
target records it) are not copied again. The pipeline is locked while keys are copied, so no harvest deposits
into the old store meanwhile. A run starts by removing what a killed run left: its scratch copies, and its
incomplete uploads to the target. A store that goes down or takes no more data stops the run (no key starts
after it; every key would fail alike): run again once it is back, or has room.

Once the pipeline uses the target (step 2), harvests went on there, but one may have run in the old store
between the copy and the switch. An access master that differs is never replaced from the source: the ledger
records its SHA-256. Of a manifest or a collection that differs, the ledger tells which copy is current: a
manifest shows the access masters (keys and sizes) the ledger records for its object's items, a collection
lists the objects the ledger has put in it. Where the manifests of both copies show them (their metadata
differs), the one the ledger's last publish of the object wrote is current: the source's if it was written
then (within minutes), else the target's. A source's copy found current replaces the target's ("replaced");
a target's found current is kept ("newer in the target"); when neither or both can be told current, the key
is a problem and stays in the source (the message says how to put it right).

\b
A move, step by step:
  1. gcis-migrate move_store --pipeline museum --to-store new-store.yaml
     copy and verify (run again until it reports no problem)
  2. point the pipeline's store: in config.yaml, and iipsrv, at the new store; where the manifests are
     served from the store, set its manifests.manifest_base_url to the new store's URL
  3. gcis-migrate initial_load --pipeline museum
     after a new manifest_base_url: publishes every manifest and collection again under it (the copies name
     the old store's, which step 4 empties; a harvest republishes only the objects it lists); converts nothing
  4. gcis-migrate move_store --pipeline museum --from-store old-store.yaml --delete-source
     verify every key in the new store again, then delete it from the old one
Once the pipeline uses the target, a run whose target's manifests name another base URL than
manifest_base_url says so.

\b
A store is a YAML/JSON file or an inline mapping, written like a pipeline's store: section:
  --to-store '{kind: s3, bucket: iiif-new, prefix: access, region: us-east-1}'
  --to-store '{kind: local, root: /srv/iiif/store}'
A relative root: is relative to the store file's folder (inline: to the working directory), as config.yaml's
are to its folder; the summary of step 1 names the target as resolved.

--delete-source reads each key's bytes back from the target, and deletes the source's copy only when they have
the SHA-256 the ledger recorded (for manifests and collections, the one the target recorded); otherwise the key
is a problem and stays in the source. A dry run does not read them.

--delete-source refuses to delete from the store the pipeline is configured with, or from the target, however
the source is written: only the S3 server, bucket and prefix count (not the region, addressing style, ...), or
the local root's real path (symlinks followed). Before deleting anything it also puts a small object in the
source, and refuses if it shows in either of them (one server under two host names, a directory mounted twice);
the object is deleted from the source at once. Nothing is written to, or deleted from, the pipeline's store.

Both stores must place objects alike (the same keys: templates). Manifests are copied byte for byte: their ids
and image service URLs come from the pipeline's manifests: settings, not from the store.

\b
Exit codes: 0 done; 1 some keys failed or are missing, or stopped on an error (run again);
2 configuration or usage error; 3 another run holds the pipeline; 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP)
stopped by that signal after the keys in flight (what was settled is recorded: run it again to continue).
"""
from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterator

import click

from gcis_etl.deposits import StoreKey, pipeline_keys
from gcis_etl.errors import GcisError, IntegrityError, StoreError, StoreUnavailable
from gcis_etl.ledger import Ledger
from gcis_etl.manifests import DepositedImage, collection_items, painted_images
from gcis_etl.migration import Budget, MigrationContext, migration, same_store, shows_through, store_settings
from gcis_etl.pipelines import Pipeline
from gcis_etl.progress import MoveProgress, move_progress
from gcis_etl.reports import counted
from gcis_etl.stores import Store, StoredObject, open_store, uploads_kept


@migration(__doc__, in_flight="keys")
@click.option("--pipeline", "name", required=True, help="The pipeline whose deposits move.")
@click.option("--to-store", "to_spec", metavar="STORE", help="The target (default: the configured store).")
@click.option("--from-store", "from_spec", metavar="STORE", help="The source (default: the configured store).")
@click.option("--delete-source", is_flag=True,
              help="Delete each key from the source once its bytes, read back from the target, are verified.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Keys copied at once.")
@click.option("--limit", type=click.IntRange(min=1),
              help="Copy or delete no more than this many keys; keys found moved already, or that fail, do not "
                   "count, so a run again goes on past them (a trial: it stops at the limit; run again to go on).")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True),
              help="Start no new key after this many minutes (a night's window: run again to go on).")
def main(ctx: MigrationContext, name: str, to_spec: str | None, from_spec: str | None, delete_source: bool,
         concurrency: int, limit: int | None, max_minutes: float | None) -> None:
    pipeline = ctx.pipeline(name)
    configured = pipeline.settings.store
    source = store_settings(from_spec, "--from-store") if from_spec else configured
    target = store_settings(to_spec, "--to-store") if to_spec else configured
    if same_store(source, target):
        raise click.UsageError("the source and the target are the same store: give --to-store or --from-store")
    if source.keys != target.keys:
        raise click.UsageError("the two stores place objects differently (their keys: templates differ); "
                               "a move keeps every key as it is: give the target the same keys:")
    if delete_source and same_store(source, configured):
        raise click.UsageError(f"--delete-source would delete from the store pipeline {name!r} uses: point its "
                               f"store: at the new store first, then give the old one as --from-store")
    authoritative = same_store(target, configured)
    move = Move(ctx, pipeline, open_store(source, concurrency), open_store(target, concurrency), authoritative,
                delete_source, ctx.scratch(name))
    with ctx.ledger() as ledger, nullcontext() if ctx.dry_run else ctx.lock(name):
        if not ctx.dry_run:
            move.source.check()
            # a new store's local root is made; the live one's never, and it may still be empty (switched to first)
            move.target.check(create=None if authoritative else True)
            move.clean_up(pipeline)
            if delete_source:
                kept = {"the target": move.target}
                if not authoritative:
                    kept[f"the store pipeline {name!r} uses"] = open_store(configured)
                check_apart(move.source, kept)
        budget = Budget(minutes=max_minutes)
        progress = ctx.shown(move_progress(name, lambda: sum(1 for _ in pipeline_keys(ledger, pipeline)),
                                           delete_source, ctx.report.counts))
        try:
            cut = move.run(pipeline_keys(ledger, pipeline), concurrency, budget, progress, limit)
        finally:
            progress.clear()  # before the summary
        stopped = None
        if cut == "limit" and not ctx.stop.is_set():
            stopped = (f"stopped at the limit of {counted(limit, 'key')} copied or deleted (keys moved already, or "
                       f"failed, do not count): run again to go on")
        elif cut and not ctx.stop.is_set():
            stopped = f"stopped: {budget.exhausted()}: run again to go on"
        if stopped:
            if ctx.dry_run:
                ctx.report.notes.append(stopped)
            else:
                ctx.report.stop("stopped", stopped)
        stale = stale_base_url(ledger, pipeline, move.target) if authoritative else None
    newer = ctx.report.counts.get("newer in the target")
    if newer:
        ctx.report.notes.append(f"{counted(newer, 'key')} newer in the target, the store pipeline {name!r} uses: "
                                f"its copies are the ones the ledger shows current, the source's differ from them: "
                                f"kept; the source's copies are stale (the CSV lists them)")
    if stale:
        ctx.report.notes.append(stale)
    if ctx.report.status == "completed" and ctx.report.exit_code == 0 and not ctx.stop.is_set() \
            and not authoritative:
        ctx.report.notes.append(f"next: point pipelines.{name}.store in {ctx.config.source_file} (and iipsrv) at "
                                f"the new store, {move.target.describe('')} (a relative root as resolved), and its "
                                f"manifests.manifest_base_url at the new store's URL if the manifests are served "
                                f"from it; then `gcis-migrate initial_load --pipeline {name}` (after a new "
                                f"manifest_base_url: publishes the manifests again under it); then run with "
                                f"--from-store OLD --delete-source")


def stale_base_url(ledger: Ledger, pipeline: Pipeline, target: Store) -> str | None:
    """Why the manifests in the pipeline's store need publishing again, or None: they were copied from a store
    published elsewhere, and name its base URL, not manifest_base_url (which the operator changed at the switch).
    One manifest read tells; --delete-source empties the store they name, and a harvest republishes only the
    objects it lists."""
    manifests = pipeline.manifests
    object_id = next(iter(ledger.published(pipeline.name)), None) if manifests else None
    if object_id is None:
        return None
    version = manifests.settings.versions[0]
    try:
        document = _document(target, manifests.manifest_key(object_id, version))
    except StoreError:  # not there (a problem the run reported), or unreadable
        return None
    named = (document.get("id") or document.get("@id")) if isinstance(document, dict) else None
    expected = manifests.manifest_id(object_id, version)
    if not isinstance(named, str) or named == expected:
        return None
    return (f"the manifests in the target name {named}, not {expected} (manifest_base_url): "
            f"`gcis-migrate initial_load --pipeline {pipeline.name}` publishes them again under it")


def check_apart(source: Store, kept: dict[str, Store]) -> None:
    """Before --delete-source deletes anything: an object put in the source must not show in a store that keeps
    the keys. Settings cannot tell one S3 server under two host names, or one directory mounted twice. Put in the
    source, which --delete-source deletes from anyway: the pipeline's store need not let us delete (superseded
    masters then wait in the ledger), and must not collect check objects."""
    for what, store in kept.items():
        if shows_through(source, store):
            raise click.UsageError(f"--delete-source: an object written to the source shows in {what}: the source "
                                   f"is that store, reached another way; nothing was deleted")


LISTED = ("replaced", "would replace", "newer in the target")  # in the CSV: the target's content changed (or would),
# or the source's is stale
COPIED = MoveProgress.GROUPS["copied"]  # what --limit counts (without a deletion): not kept nor missing keys


@dataclass(frozen=True)
class Step:
    """What became of one key. `in_source`: the source holds a copy that --delete-source may delete once the
    target's bytes are read back with `sha256`."""

    outcome: str
    reason: str = ""
    sha256: str | None = None
    in_source: bool = False


class Move:
    def __init__(self, ctx: MigrationContext, pipeline: Pipeline, source: Store, target: Store, authoritative: bool,
                 delete_source: bool, scratch: Path):
        self.ctx = ctx
        self.pipeline = pipeline
        self.source = source
        self.target = target
        self.authoritative = authoritative  # the target is the pipeline's store: harvests deposit there
        self.delete_source = delete_source
        self.scratch = scratch

    def clean_up(self, pipeline: Pipeline) -> None:
        """What a killed run left: its scratch copies, and its uploads to the target (multipart parts in S3,
        hidden temporary files in a local store). Under the pipeline's lock no run of ours still writes; an
        upload of a killed harvest's worker that is aborted too was never an object, and its item is not
        recorded as deposited, so the next harvest makes it again. Only under the pipeline's own prefix: without
        one, an upload in the target may be another pipeline's, going on (stores.uploads_kept says so, when
        there are any)."""
        shutil.rmtree(self.scratch, ignore_errors=True)
        prefix = self.target.keys.own_image_prefix(pipeline.name)
        if prefix is None:
            if kept := uploads_kept(self.target, pipeline.name, "a killed run"):
                self.ctx.report.notes.append(f"the target: {kept}")
            return
        aborted = self.target.abort_incomplete_uploads(older_than=timedelta(0), keys=prefix)
        if aborted:
            self.ctx.report.notes.append(f"aborted {len(aborted)} incomplete uploads to the target left by a "
                                         f"killed run: {', '.join(aborted)}")

    def run(self, keys: Iterator[StoreKey], concurrency: int, budget: Budget, progress: MoveProgress,
            limit: int | None = None) -> str | None:
        """A bounded window of keys in flight: millions of keys never sit in memory at once. Why it stopped with
        keys left: "limit" once `limit` keys were copied or deleted (keys moved already, or failed, do not count, so
        a run again goes on past them, and past a key that fails every time; no more keys are under way than the limit leaves), "stopped" on request or
        with the budget's time spent; None when it looked at every key. Each key checks as it starts, since the
        pool holds up to a window of them queued: once stopped, none starts, and those under way finish. A store
        that goes down or takes no more data stops it too (every key would fail alike, each after its retries):
        the first such error is raised once the keys under way have ended."""
        halted: list[StoreUnavailable] = []

        def stopping() -> bool:
            return bool(halted) or self.ctx.stop.is_set() or budget.exhausted() is not None

        def start(item: StoreKey) -> bool | None:
            """None: not started; otherwise whether the key counts against the limit."""
            if stopping():
                return None
            progress.started(item.key)
            done = False  # not settled: the store went down, or an error escaped
            try:
                counts = self.move(item)
                done = True
            except StoreUnavailable as exc:
                halted.append(exc)
                counts = True
            finally:
                progress.settled(item.key, done)
            return counts

        cut: str | None = None
        worked = 0  # keys that count against the limit
        with ThreadPoolExecutor(concurrency, thread_name_prefix="gcis-move") as pool:
            window: deque = deque()

            def settle() -> None:
                nonlocal cut, worked
                counts = window.popleft().result()
                if counts is None:
                    cut = "stopped"
                worked += bool(counts)

            for key in keys:
                while window and (len(window) >= 2 * concurrency or
                                  limit is not None and worked + len(window) >= limit):
                    settle()
                if limit is not None and worked >= limit:
                    cut = "limit"
                    break
                if stopping():
                    cut = "stopped"
                    break
                window.append(pool.submit(start, key))
            while window:
                settle()
        if halted:
            raise halted[0]
        return cut

    def move(self, item: StoreKey) -> bool:
        """Whether the key counts against --limit: it was copied or deleted from the source (or would be, in a dry
        run); not one found moved already, nor one that failed or is missing (each run would stop on them)."""
        report = self.ctx.report
        try:
            step = self.copy(item)
            if step is None:
                return False
            deleting = self.delete_source and step.in_source
            if deleting and not self.ctx.dry_run:
                self.verify(item.key, step.sha256)
        except StoreUnavailable:  # not this key's fault: run() stops
            raise
        except GcisError as exc:  # this key fails, and stays in the source; the others go on
            report.event(item.key, "failed", str(exc))
            return False
        report.event(item.key, step.outcome, step.reason, listed=step.outcome in LISTED)
        if not deleting:
            return step.outcome in COPIED
        if self.ctx.dry_run:
            report.event(item.key, "would delete from the source", listed=False)
        elif self.source.delete(item.key):
            report.event(item.key, "deleted from the source", self.source.describe(item.key))
        return True

    def copy(self, item: StoreKey) -> Step | None:
        """copied, replaced (other content was there), present (already there, same SHA-256), newer in the
        target, missing (a dry run: would copy, would replace); None when a key that need not exist does not."""
        here = self.source.head(item.key)
        there = self.target.head(item.key)
        expected = item.sha256 or (here.sha256 if here else None)
        if here is None:
            if there is not None and there.sha256 and (item.sha256 is None or there.sha256 == item.sha256):
                return Step("present", "already moved (not in the source any more)")
            return Step("missing", f"not in {self.source.describe(item.key)}") if item.required else None
        current = None  # why the source's copy replaces the pipeline's
        if self.authoritative and there is not None:
            current = self.kept(item, here, there)
            if isinstance(current, Step):
                return current
        if item.sha256 and here.sha256 and here.sha256 != item.sha256:
            raise IntegrityError(f"{self.source.describe(item.key)} has SHA-256 {here.sha256}, the ledger "
                                 f"recorded {item.sha256}: not copied")
        if there is not None and expected and there.sha256 == expected and there.size == here.size:
            return Step("present", "", expected, True)
        if self.ctx.dry_run:
            return Step("would copy" if there is None else "would replace", current or "", expected, True)
        with self.scratch_file() as copy:
            actual = self.source.download(item.key, copy)
            size = copy.stat().st_size
            if expected and actual != expected:
                raise IntegrityError(f"{self.source.describe(item.key)}: read {size} bytes with SHA-256 {actual}, "
                                     f"not the recorded {expected}: not copied")
            self.target.put(item.key, copy, sha256=actual, provenance=here.provenance,
                            content_type=here.content_type)
        stored = self.target.head(item.key)
        if stored is None or stored.sha256 != actual or stored.size != size:
            raise IntegrityError(f"{self.target.describe(item.key)}: the target reports "
                                 f"{stored and stored.sha256} after the copy, not {actual}")
        if there is None:
            return Step("copied", "", actual, True)
        held = f"the target held SHA-256 {there.sha256}" if there.sha256 else \
            "the target's copy had no SHA-256 recorded (not deposited by gcis-etl)"
        return Step("replaced", f"{held}, stale: {current}" if current else held, actual, True)

    def kept(self, item: StoreKey, here: StoredObject, there: StoredObject) -> Step | str:
        """The target is the pipeline's store: what it holds is kept unless the ledger shows the source's copy is
        the current one (then why, and it is copied over the target's). An access master there must be the one
        the ledger recorded; of a manifest or collection that differs, current_copy() decides."""
        if item.sha256 and there.sha256 != item.sha256:
            raise IntegrityError(f"{self.target.describe(item.key)} records SHA-256 {there.sha256}, the ledger "
                                 f"recorded {item.sha256}: the pipeline's store is never replaced from the "
                                 f"source, which keeps its copy; `{self.harvest_again(item)}` deposits it again")
        if there.sha256 is None:
            raise IntegrityError(f"{self.target.describe(item.key)}: the pipeline's store records no SHA-256 for "
                                 f"it, so it cannot be verified; the source keeps its copy")
        if here.sha256 == there.sha256 and here.size == there.size:
            return Step("present", "", there.sha256, True)
        if item.version is None:  # an access master: the ledger's (checked above), or one superseded
            return Step("newer in the target", f"kept: the source's copy (SHA-256 {here.sha256}) is stale",
                        there.sha256, True)
        current, reason = self.current_copy(item)
        if current == "target":
            return Step("newer in the target", f"kept: the source's copy (SHA-256 {here.sha256}) is stale: "
                                               f"{reason}", there.sha256, True)
        if current is None:
            raise IntegrityError(f"{self.target.describe(item.key)} differs from the source's copy, and {reason}; "
                                 f"the source keeps its copy")
        return reason

    def harvest_again(self, item: StoreKey) -> str:
        return f"gcis-etl harvest {self.pipeline.name} --force --object {shlex.quote(item.object_id or '')}"

    def current_copy(self, item: StoreKey) -> tuple[str | None, str]:
        """Which copy of a manifest or collection is current, "source" or "target" (None: it cannot be told), and
        why: the one that shows what the ledger records. Read on a ledger connection of this thread's own (a
        connection is not shared across threads); only keys whose copies differ get here."""
        copies = {"source": self.source, "target": self.target}
        with self.ctx.ledger() as ledger:
            if item.object_id is None:
                shows = collection_matcher(ledger, self.pipeline, item.version)
                what, remedy = "the objects the ledger put in the collection", (
                    f"`gcis-etl harvest {self.pipeline.name}` adds the objects waiting for the collection to the "
                    f"pipeline's store's; if it lists them all already, compare the two and delete the source's "
                    f"copy by hand")
            else:
                shows = manifest_matcher(ledger, self.pipeline, item.object_id, item.version)
                what = "the access masters the ledger records for the object's items (keys and sizes)"
                remedy = f"`{self.harvest_again(item)}` republishes it into the pipeline's store"
            current = [where for where, store in copies.items() if shows(_document(store, item.key))]
            if len(current) == 1:
                return current[0], f"only the {current[0]}'s copy lists {what}"
            if not current:
                return None, f"neither lists {what}: {remedy}"
            if item.object_id is None:
                return None, f"both list {what}: {remedy}"
            return self.last_published(ledger, item, remedy)

    def last_published(self, ledger: Ledger, item: StoreKey, remedy: str) -> tuple[str | None, str]:
        """Both copies show the object's access masters (its metadata differs): the current one is the one the
        ledger's last publish of the object wrote, just before the ledger recorded it. A copy written well before
        that publish is not from it; the source's copy written then, and the target's well before, is current."""
        record = ledger.object(self.pipeline.name, item.object_id)
        written = {where: next((o.modified for o in store.list(item.key) if o.key == item.key), None)
                   for where, store in (("source", self.source), ("target", self.target))}
        both = "both show the object's current access masters"
        if record is None or record.published is None or None in written.values():
            return None, f"{both}: {remedy}"
        published = datetime.fromisoformat(record.published)
        times = f"the ledger's last publish of the object {record.published}, the source's copy written " \
                f"{written['source'].isoformat()}, the target's {written['target'].isoformat()}"
        before = {where: when < published - PUBLISHED_WITHIN for where, when in written.items()}
        if before["source"]:
            return "target", f"{both}, and the source's copy is older than the last publish ({times})"
        if before["target"] and written["source"] <= published + PUBLISHED_WITHIN:
            return "source", f"{both}, and the last publish wrote the source's copy ({times})"
        return None, f"{both}, and which one the last publish wrote cannot be told ({times}): {remedy}"

    def verify(self, key: str, sha256: str | None) -> None:
        """Before the source's copy is deleted, the target's bytes are read back: the record a store keeps of
        them (a sidecar, S3 metadata) outlives damage to them."""
        with self.scratch_file() as copy:
            actual = self.target.download(key, copy)
        if actual != sha256:
            raise IntegrityError(f"{self.target.describe(key)}: read back with SHA-256 {actual}, not {sha256}: "
                                 f"not deleted from the source")

    @contextmanager
    def scratch_file(self) -> Iterator[Path]:
        self.scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.scratch) as folder:
            yield Path(folder) / "object"


PUBLISHED_WITHIN = timedelta(minutes=5)  # a store's clock against the ledger's: a copy written by a publish


def _document(store: Store, key: str) -> object:
    """A manifest or collection as JSON; None when it is not JSON (no ledger's content is)."""
    try:
        return json.loads(store.get_bytes(key))
    except ValueError:
        return None


def manifest_matcher(ledger: Ledger, pipeline: Pipeline, object_id: str, version: str):
    """Whether a manifest shows exactly the access masters the ledger records for the object's items: each
    canvas's image service (the access master's key, Manifests.image_service_id) and size."""
    manifests = pipeline.manifests
    expected = Counter((manifests.image_service_id(DepositedImage(r.sequence, r.output_key, r.width, r.height)),
                        r.width, r.height) for r in ledger.items(pipeline.name, object_id) if r.output_key)

    def shows(document: object) -> bool:
        try:
            return Counter(painted_images(document, version)) == expected
        except (KeyError, IndexError, TypeError):
            return False
    return shows


def collection_matcher(ledger: Ledger, pipeline: Pipeline, version: str):
    """Whether a collection lists every object the ledger put in it (published, not waiting for it) and no object
    the ledger has no manifest of."""
    manifests = pipeline.manifests
    published = {manifests.manifest_id(object_id, version) for object_id in ledger.published(pipeline.name)}
    waiting = {manifests.manifest_id(o.object_id, version) for o in ledger.awaiting_collection(pipeline.name)}

    def shows(document: object) -> bool:
        try:
            listed = set(collection_items(document, version))
        except (KeyError, TypeError):
            return False
        return published - waiting <= listed <= published
    return shows
