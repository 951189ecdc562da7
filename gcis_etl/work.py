"""One source item through fetch → convert → deposit: the unit every executor runs (local pool, Celery task).

A task carries names, not objects (pipeline, recipe, the item's source record), so it can cross a process or
a broker; the worker resolves them against its own config.yaml, where the secrets come from its environment.
Processing is idempotent: an item whose access master is already in the store, made from the same source
version with the same recipe, is recognised from the stored object's provenance and not converted again —
what makes a redelivered Celery task or a re-run after kill -9 cheap and free of duplicates.
"""
from __future__ import annotations

import logging
import re
import shutil
import socket
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from connectors.base import FetchedFile, Fixity, Source, SourceItem, source_down
from connectors.errors import AuthenticationFailed, PermissionDenied, SourceUnavailable
from connectors.fetching import fetch_warnings
from connectors.redaction import scrub
from gcis_etl.errors import (ConfigError, GcisError, SourceError, StoreError, StoreFull, StoreRefused, StoreUnavailable,
                             VersionSkew)
from gcis_etl.isolation import ChildPool, code_changed, disk_refusal, running_process
from gcis_etl.keys import UnsafeKey
from gcis_etl.models import Status, item_label
from gcis_etl.pipelines import Pipeline, config_folder
from gcis_etl.recipes import Recipe, load_recipe
from gcis_etl.stores import Provenance, Store, StoredObject

log = logging.getLogger(__name__)


class Outcome(str, Enum):
    DEPOSITED = "deposited"  # converted, verified and in the store (or found there already, identical)
    SKIPPED = "skipped"      # unchanged since it was settled: nothing to do
    REJECTED = "rejected"    # the master breaks policy or cannot be decoded; waits for the source to change
    FAILED = "failed"        # something else went wrong; retried up to the pipeline's max_attempts


@dataclass(frozen=True)
class ItemTask:
    pipeline: str
    object_id: str
    item: SourceItem
    recipe: str
    recipe_digest: str
    attempt: int = 1
    force: bool = False  # harvest --force: convert and deposit again, whatever the store says it holds
    # the harvest's Pipeline.worker_digests; None from a harvest older than them (a task still in the queue)
    settings: dict[str, str] | None = field(default=None, hash=False)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.item)

    @property
    def label(self) -> str:
        """The item as log lines name it (models.item_label)."""
        return item_label(self.object_id, self.item.id)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (for a broker)."""
        data = asdict(self)
        data["item"]["modified"] = self.item.modified.isoformat() if self.item.modified else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemTask:
        """Raises VersionSkew for a task of another version of gcis-etl, rather than a TypeError that would pass
        for the item's failure."""
        item = data.get("item")
        fixity = item.get("fixity") if isinstance(item, dict) else None
        _readable(*((part, where, given) for (part, where), given in zip(TASK_PARTS, (data, item, fixity))
                    if isinstance(given, dict)))
        item = dict(data["item"])
        item["modified"] = datetime.fromisoformat(item["modified"]) if item["modified"] else None
        item["fixity"] = Fixity(**item["fixity"]) if item.get("fixity") else None
        return cls(**{**data, "item": SourceItem(**item)})


@dataclass(frozen=True)
class ItemResult:
    """What became of one task; the ledger records it."""

    pipeline: str
    object_id: str
    item_id: str
    sequence: int
    outcome: Outcome
    fingerprint: str
    recipe: str
    recipe_digest: str
    attempt: int
    reason: str | None = None
    key: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    width: int | None = None
    height: int | None = None
    master_sha256: str | None = None
    seconds: float = 0.0
    transient: bool = False  # a failure that may well pass on its own (outage, timeout)
    stops_run: bool = False  # not the item's failure: no item can be done now (scratch full, store or source down)
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["warnings"] = list(self.warnings)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemResult:
        """Raises VersionSkew for the outcome of a worker of another version of gcis-etl."""
        _readable((cls, "", data))
        return cls(**{**data, "outcome": Outcome(data["outcome"]), "warnings": tuple(data.get("warnings", ()))})

    @classmethod
    def failed(cls, task: ItemTask, reason: str | None = None) -> ItemResult:
        """What a task that failed for `reason` gives; Worker.process starts from it and fills in what happened."""
        return cls(task.pipeline, task.object_id, task.item.id, task.item.sequence, Outcome.FAILED,
                   task.fingerprint, task.recipe, task.recipe_digest, task.attempt, reason=reason)


# the dataclasses a task's dict is read into, and where each one's fields sit in it
TASK_PARTS: tuple[tuple[type, str], ...] = ((ItemTask, ""), (SourceItem, "item."), (Fixity, "item.fixity."))


def _readable(*parts: tuple[type, str, dict[str, Any]]) -> None:
    """Raises VersionSkew naming the keys of each (dataclass, where, dict) no field of it takes and the fields it
    needs no key gives: the dicts were written by another version of gcis-etl."""
    unknown: list[str] = []
    missing: list[str] = []
    for cls, where, data in parts:
        known = {f.name: f for f in fields(cls)}
        unknown += [where + key for key in data if key not in known]
        missing += [where + name for name, f in known.items()
                    if name not in data and f.default is MISSING and f.default_factory is MISSING]
    if unknown or missing:
        raise VersionSkew(skew_fields(unknown, missing))


def skew_fields(unknown: list[str], missing: list[str]) -> str:
    """How a VersionSkew names the fields that one version wrote and the other does not know, or needs."""
    return "; ".join(f"{what} {', '.join(names)}" for what, names in
                     (("unknown fields", unknown), ("missing fields", missing)) if names)


def fingerprint(item: SourceItem) -> str:
    """The source's version of an item: its fixity when the source has one, else its size and modification time."""
    if item.fixity is not None:
        return f"{item.fixity.algorithm}:{item.fixity.value}"
    modified = item.modified.isoformat() if item.modified else "?"
    return f"size:{item.size};modified:{modified}"


_PERMANENT_SOURCE_ERRORS = (AuthenticationFailed, PermissionDenied)


class RecipeCache:
    """The recipe a task names, looked up as its pipeline's config file looks names up (recipe_dirs of the
    file's folder, whatever the working directory: a Celery pool process's is not the config's), each file
    read once: a long-lived worker or orchestrator meets the same few recipes in every task. A pipeline's own
    recipe is taken as it is (it may be given by path)."""

    def __init__(self, pipelines: dict[str, Pipeline]):
        self._folders = {name: config_folder(p.config_file) for name, p in pipelines.items()}
        self._found = {(self._folders[name], p.recipe.name): p.recipe for name, p in pipelines.items()}

    def of(self, task: ItemTask) -> Recipe:
        key = (self._folders[task.pipeline], task.recipe)
        if key not in self._found:
            self._found[key] = load_recipe(task.recipe, key[0])
        return self._found[key]


def image_key(store: Store, task: ItemTask, recipe: Recipe) -> str:
    """Where a task's access master goes in `store` (UnsafeKey when its identifiers cannot name it): what the
    worker deposits into, and where an upload its killed process left is looked for."""
    return store.keys.image_key(task.pipeline, task.object_id, task.item.id, task.item.sequence,
                                recipe.extension.lstrip("."))


class Worker:
    """Processes tasks for the pipelines of one config, in one thread or process, with a conversion child leased
    from `children` (the local executor's threads share one pool) or, without it, one of its own.

    The child process (isolation.py) does all decoding and encoding: this process never loads libvips, so it
    can be forked, threaded or run as a Celery worker without libvips' thread pool in the way.
    """

    def __init__(self, pipelines: dict[str, Pipeline], scratch: Path, children: ChildPool | None = None,
                 node: str | None = None):
        """`node`: the Celery worker this Worker runs under (its -n name), None in a harvest's own process: what a
        refusal names, and what it asks to restart."""
        self.pipelines = pipelines
        self.node = node
        self._worker_named = f"the worker {node}" if node else f"the worker on {socket.gethostname()}"
        self.scratch = scratch
        self._own = children is None
        self._children = ChildPool(1) if children is None else children
        self._recipes = RecipeCache(pipelines)

    def image_key(self, task: ItemTask) -> str | None:
        """Where `task`'s access master goes, or None when this worker cannot name it (process says why)."""
        try:
            return image_key(self.pipelines[task.pipeline].store, task, self._recipes.of(task))
        except (KeyError, GcisError):
            return None

    def close(self) -> None:
        if self._own:
            self._children.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def process(self, task: ItemTask) -> ItemResult:
        """Never raises for a bad item or an outage: the result says what happened and why, scrubbed of the
        sources' secrets (a plug-in connector's error may quote one; the built-in ones scrub their own)."""
        result = self._told(task)
        return replace(result, reason=result.reason and scrub(result.reason),
                       warnings=tuple(scrub(warning) for warning in result.warnings))

    def _told(self, task: ItemTask) -> ItemResult:
        started = time.monotonic()
        base = ItemResult.failed(task)
        try:
            result = self._process(task, base)
        except SourceError as exc:
            refused = isinstance(exc, AuthenticationFailed)
            if refused or self._source_down(task, exc):
                return halting(base, f"fetching: {exc}", remedy(exc), transient=not refused)
            answered = " (the source answers otherwise)" if isinstance(exc, SourceUnavailable) else ""
            result = replace(base, reason=f"fetching: {exc}{answered}",
                             transient=not isinstance(exc, _PERMANENT_SOURCE_ERRORS))
        except StoreUnavailable as exc:  # a Celery worker still retries an outage (transient) before it stops
            return halting(base, f"depositing: {exc}", remedy(exc), transient=not isinstance(exc, StoreFull))
        except StoreRefused as exc:  # its message says what to check: until then every item would fail alike
            return halting(base, f"depositing: {exc}", remedy(exc), transient=False)
        except StoreError as exc:
            result = replace(base, reason=f"depositing: {exc}", transient=True)
        except GcisError as exc:
            result = replace(base, reason=str(exc))
        except OSError as exc:
            stopped = self._scratch_refused(base, exc)  # only scratch is written here: a store's are StoreErrors
            if stopped is not None:
                return stopped
            result = replace(base, reason=f"{type(exc).__name__}: {exc}", transient=True)
        except Exception as exc:  # a bug must cost one item, never the batch or the worker
            log.exception("internal error on %s", task.label)
            result = replace(base, reason=f"internal error: {type(exc).__name__}: {exc}")
        return replace(result, seconds=time.monotonic() - started)

    def _source_down(self, task: ItemTask, exc: SourceError) -> bool:
        """Whether a download that outlasted its retries is the whole source's outage, which stops the run, or
        this item's alone, which spends its attempt (connectors.base.source_down tells)."""
        return isinstance(exc, SourceUnavailable) and source_down(
            self.pipelines[task.pipeline].source, task.object_id, f"item {task.item.id}'s download")

    def _scratch_full(self, base: ItemResult, step: str, refusal: str, folder: Path) -> ItemResult:
        """A disk refused a write into the scratch space (isolation.disk_refusal's words): every item would fail
        alike, so the run stops. The item's own folder is named as the scratch space, which config sets."""
        return halting(base, f"{step}: {refusal.replace(str(folder), self._scratch_named)}", "then run again",
                          transient=False)

    def _scratch_refused(self, base: ItemResult, exc: OSError) -> ItemResult | None:
        """The run's stop when a full or read-only disk refused a write into the scratch space; None otherwise."""
        refused = disk_refusal(exc, self.scratch)
        return None if refused is None else self._scratch_full(base, "fetching", str(refused), self.scratch)

    @property
    def _scratch_named(self) -> str:
        return f"{self.scratch} (the scratch space: state_dir sets where it is)"

    def _unusable_scratch(self, base: ItemResult, exc: OSError) -> ItemResult:
        """The scratch space's folder cannot be made or written into: every item would fail alike, so the run
        stops, naming what is in the way (a file where a folder should be) or what to check."""
        stopped = self._scratch_refused(base, exc)
        if stopped is not None:
            return stopped
        blocker = next(path for path in (self.scratch, *self.scratch.parents) if path.exists())
        remedy = (f"{blocker} is a file, where a folder should be: remove it" if not blocker.is_dir() else
                  f"check the permissions and attributes (lsattr) of {self.scratch} and its folders")
        return halting(base, f"fetching: cannot write {self._scratch_named}: {exc.strerror}: {remedy}",
                          "then run again", transient=False)

    def _process(self, task: ItemTask, base: ItemResult) -> ItemResult:
        # What it imports from now on is another version's (ImportError: the item's failure). In a Celery worker,
        # changed since process_item's own check put tasks back: this task is STARTED, and put back the harvest
        # would send it again, so the run stops here (the worker shuts itself down on this result).
        if code_changed():
            return upgraded(base) if self.node is None else halting(
                base, f"gcis-etl was upgraded under {running_process()} since it started", WORKER_STOPS,
                transient=False)
        from gcis_etl.conversion import convert
        pipeline = self.pipelines[task.pipeline] if task.pipeline in self.pipelines else None
        # A worker deployed apart from the harvest's configuration fails every item alike: the run stops
        if pipeline is None:
            return halting(base, f"pipeline {task.pipeline!r} is not in the configuration of {self._worker_named}",
                           REDEPLOY, transient=False)
        try:
            recipe = self._recipes.of(task)
        except ConfigError as exc:  # not found, or unreadable, where this worker looks
            return halting(base, f"{self._worker_named}: {exc}", REDEPLOY, transient=False)
        if recipe.digest != task.recipe_digest:
            return halting(base, f"recipe {task.recipe!r} on {self._worker_named} has digest {recipe.digest}, the "
                                 f"task was planned with {task.recipe_digest}", REDEPLOY, transient=False)
        differ = [what for what, digest in (task.settings or {}).items()
                  if pipeline.worker_digests.get(what) != digest]
        if differ:
            return halting(base, f"the {' and '.join(differ)} settings of pipeline {task.pipeline!r} on "
                                    f"{self._worker_named} are not those the task was planned with: the "
                                    f"config.yaml files differ, or the harvest and the worker run different versions "
                                    f"of gcis-etl (a release that adds a setting changes what is compared)", REDEPLOY,
                              transient=False)
        store = pipeline.store
        try:
            key = image_key(store, task, recipe)
        except UnsafeKey as exc:  # the same on every attempt, before anything is fetched: not worth retrying soon
            return replace(base, reason=f"cannot be named in the store: {exc}")
        done = None if task.force else store.head(key)  # a damaged copy keeps its provenance
        # this item's own: with `{sequence}` keys, the key of a page that moved holds another page's until redone
        reusable = done is not None and bool(done.sha256) and not done.doubt \
            and done.provenance.recipe_digest == recipe.digest and bool(done.provenance.width) \
            and done.provenance.source_id == _source_id(task)
        if reusable and done.provenance.source_checksum == task.fingerprint:
            return _already(base, key, done, "already in the store from the same source version and recipe")
        try:
            self.scratch.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix="item-", dir=self.scratch))
        except OSError as exc:
            return self._unusable_scratch(base, exc)
        try:
            fetched = pipeline.source.fetch(task.item, scratch)
            # A master touched without changing (a new modification time, a re-upload of the same file) is
            # recognised by its bytes. The stored provenance keeps the older version: putting the same
            # output again changes nothing, and rewriting S3 metadata would copy the whole object.
            if reusable and done.provenance.master_sha256 == fetched.sha256:
                return replace(_already(base, key, done, "already in the store from the same master bytes and "
                                                         "recipe; only the source's version of the master changed"),
                               master_sha256=fetched.sha256)
            output = scratch / f"access{recipe.extension}"
            with self._children.lease(pipeline.settings.isolation) as child:  # only while converting
                converted = convert(fetched.path, output, recipe, pipeline.settings.imaging, worker=child,
                                    durable=False)  # scratch: the store makes durable what it holds
            doubted = (f"the access master in the store was not reused: {done.doubt}",) \
                if done is not None and done.doubt else ()
            common = dict(master_sha256=fetched.sha256,
                          warnings=doubted + fetch_warnings(fetched) + converted.warnings)
            # the scratch path changes every run: name the master as the source does
            reason = (converted.reason or "").replace(str(fetched.path), task.item.original_name) or None
            if converted.status is Status.REJECTED:
                damaged = None if fetched.fixity_verified else _damaged_transfer(pipeline.source, fetched, scratch)
                if damaged:
                    return replace(base, reason=damaged, transient=True, **common)
                return replace(base, outcome=Outcome.REJECTED, reason=reason, **common)
            if converted.disk_full:  # its scratch or output folder's disk
                return self._scratch_full(base, "converting", reason, scratch)
            if converted.cannot_start:  # the machine's, not the master's: every item would fail alike
                return halting(base, f"converting: {reason}", "then run again", transient=True)
            if converted.status is Status.FAILED:
                return replace(base, reason=reason, **common)
            # put HEADs the key to leave identical bytes alone: worth it only when `done` holds these bytes
            stored = store.put(key, output, sha256=converted.sha256, provenance=Provenance(
                source_id=_source_id(task), source_checksum=task.fingerprint,
                master_sha256=fetched.sha256,
                recipe=recipe.name, recipe_digest=recipe.digest, width=converted.width, height=converted.height),
                overwrite=done is None or bool(done.doubt) or done.sha256 != converted.sha256)
            return replace(base, outcome=Outcome.DEPOSITED, key=key, sha256=stored.sha256, bytes=stored.size,
                           width=converted.width, height=converted.height, **common)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _damaged_transfer(source: Source, fetched: FetchedFile, scratch: Path) -> str | None:
    """Why a rejected master's bytes may be the transfer's damage, not the master's, or None. Without a checksum
    from the source a corrupted download passes for a corrupt master, and a rejection waits for the master to
    change in the source, for ever: the master is downloaded again, and two downloads that differ fail the item
    (retried within its attempts) rather than reject it."""
    again = scratch / "again"
    again.mkdir()
    second = source.fetch(fetched.item, again)
    if second.sha256 == fetched.sha256:
        return None
    return (f"fetching: two downloads of the master differ (SHA-256 {fetched.sha256[:16]}…, {second.sha256[:16]}…) "
            f"and the source gives no checksum to tell the right one: a damaged transfer, not a rejected master")


# what a refusal for a configuration or recipe the worker and the harvest read apart asks
REDEPLOY = ("restart every worker with the config.yaml and recipes of the harvest's machine, then run the harvest "
            "again: either side may be the stale one (a worker reads them as it starts, a harvest as it begins)")
# what a Celery worker upgraded under it does (gcis_etl.worker shuts it down, warm), and what is left to do
WORKER_STOPS = ("it stops itself, for its supervisor to start it again on the new files (`celery -A gcis_etl.worker "
                "status` lists the workers running); then run the harvest again")


def upgraded(base: ItemResult) -> ItemResult:
    """The stop of a harvest whose own process (local executor, or the orchestrator of a Celery pool) runs code
    its files no longer hold: it ends with the run, and the next run starts on the new files."""
    return halting(base, f"gcis-etl was upgraded under this harvest ({running_process()}) since it started",
                   "run again", transient=False)


def halting(base: ItemResult, failure: str, then: str | None, transient: bool) -> ItemResult:
    """Not the item's failure: no item can be done now (harvesting stops the run, and counts no attempt).
    `then`: what to do, None when `failure` says it (remedy). `transient`: a Celery worker retries it first."""
    return replace(base, reason=f"{failure}{f': {then}' if then else ''} (no item's attempt was counted)",
                   transient=transient, stops_run=True)


_REMEDIES: tuple[tuple[type[GcisError], str], ...] = (
    (AuthenticationFailed, "fix the source's credentials, then run again"),
    (SourceUnavailable, "the source is unavailable: run again once it is back"),
    (StoreFull, "the store takes no more data; make room there, then run again"),
    (StoreUnavailable, "run again once it is back"),
    (StoreRefused, "then run again"),  # its message says what to check
)
_TOLD_WHAT_TO_DO = re.compile(r"\brun(ning)? again\b|will not help")


def remedy(exc: GcisError) -> str | None:
    """What to do about an error no item gets past, said after it once, by halting as by the note of a run it
    stops (harvesting): None when its kind has none, or its message says what to do (a run halted: halting's
    words; a search the source refuses: "running again will not help")."""
    if told_what_to_do(str(exc)):
        return None
    return next((then for kind, then in _REMEDIES if isinstance(exc, kind)), None)


def told_what_to_do(message: str) -> bool:
    """Whether a message says what to do next (run again, or that running again will not help)."""
    return _TOLD_WHAT_TO_DO.search(message) is not None


def _source_id(task: ItemTask) -> str:
    """The item an access master was made from, in its provenance."""
    return f"{task.object_id}/{task.item.id}"


def _already(base: ItemResult, key: str, done: StoredObject, why: str) -> ItemResult:
    """The item's access master is in the store already: deposited, without converting it again."""
    return replace(base, outcome=Outcome.DEPOSITED, key=key, sha256=done.sha256, bytes=done.size,
                   width=done.provenance.width, height=done.provenance.height,
                   master_sha256=done.provenance.master_sha256, warnings=(why,))
