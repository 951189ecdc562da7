"""The access-master cache iipsrv reads: a local mirror of the access masters in the stores.

iipsrv reads files only (not S3), so the access masters are copied next to it. Layout of `cache.dir`:

- ``images/<key>``: the access masters at their store keys. iipsrv's FILESYSTEM_PREFIX is this folder, so
  an image's IIIF identifier is its store key.
- ``incoming/``: copies being made. Same filesystem as ``images/``, so moving a finished copy there is
  one atomic rename: iipsrv never sees a half-written file.
- ``state.sqlite``: what each cached file is (key, source, SHA-256, size, what the store listing said, the
  file's inode and mtime) and when it was last accessed, plus how far the access log has been read.
- ``lock``: one sync, prune or purge at a time.

sync: an object whose store listing (size, modified) and cached file (inode, size, mtime) are as recorded
is unchanged, with no request. Otherwise its HEAD gives the SHA-256 recorded when it was deposited; when
the cached copy already has it, nothing is copied. Otherwise the object is downloaded into ``incoming/``,
hashed, compared, fsync'ed and renamed over the old copy. A mismatch leaves the old copy serving.

prune: evicts by last access, which is the latest of (a) the last request for the image in the web
server's access log, (b) the file's atime and (c) when it was synced. The access log is exact; atime is
kept by the kernel only coarsely (relatime: at most once a day per file; noatime: never; tiles iipsrv serves
from its memory cache do not read the file at all), but it is a lower bound, as is the sync time, so the
latest of the three is the best estimate whichever are available.

An evicted image is remembered, and sync does not copy it back just because it is still in the store (that
would undo the prune). It copies it back once the access log shows a request for it after its eviction:
iipsrv answers 404 for that request, and the image is served again after the next sync (cron interval).
Without an access log, evicted images stay out until purged and deposited again.

purge: removes the cached copies (and the records) of images no longer in their store, or of given keys.
An image is one the state records, or an access master in ``images/`` it does not (a lost ``state.sqlite``)
under a source's prefix: such a file is gone when every source whose prefix it is under was listed and none
has it. Any other file in ``images/`` is foreign (put there by hand, or of a pipeline not synced): counted,
never removed. "No longer in their store" is only ever concluded from a complete listing: a store that
cannot be listed (an unmounted volume, an unreadable folder, an unreachable bucket) fails the sync of that
source, or the purge, and nothing of it is removed. Nor is anything of a store that lists no access master
at all while the cache holds some of it: its prefix or root changed, or its volume's empty mount point is
read, far more likely than every image withdrawn at once; `purge` with their keys removes them.
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence
from urllib.parse import unquote, urlsplit

from pydantic import ByteSize, field_validator

from gcis_etl.durable import fsync_path, room, sha256_file
from gcis_etl.errors import ConfigError, GcisError, IntegrityError, StoreError
from gcis_etl.iipsrv import ServerSettings, reload
from gcis_etl.isolation import disk_refusal
from gcis_etl.keys import UnsafeKey, check_key
from gcis_etl.ledger import sqlite_code
from gcis_etl.locks import RunLock
from gcis_etl.reports import counted
from gcis_etl.settings import Settings
from gcis_etl.spans import parse_span
from gcis_etl.stores import ListedObject, Store

if TYPE_CHECKING:
    from gcis_etl.config import Config

SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    key TEXT PRIMARY KEY, source TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    listed_modified TEXT NOT NULL, inode INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    synced REAL NOT NULL, last_access REAL NOT NULL, evicted REAL, wanted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS images_source ON images (source, key);
CREATE TABLE IF NOT EXISTS access_log (
    id INTEGER PRIMARY KEY CHECK (id = 1), inode INTEGER NOT NULL, offset INTEGER NOT NULL
);
"""

# deploy/iipsrv/lighttpd.conf: accesslog.format = "%{%s}t %h \"%r\" %>s %b"
_LOG_LINE = re.compile(rb'^(\d+) \S+ "(?:GET|HEAD) (\S+) [^"]*" \d{3} ')


class CacheSettings(Settings):
    """config.yaml `cache:`: where the cache is, what it mirrors, its limits, and the server reading it."""

    dir: Path = Path("var/iipsrv-cache")
    pipelines: tuple[str, ...] | None = None    # whose access masters are mirrored; all pipelines if unset
    extensions: tuple[str, ...] = (".tif", ".tiff", ".jp2")  # what counts as an access master in a store
    max_bytes: ByteSize | None = None           # `prune` default: e.g. 500G
    max_age: timedelta | None = None            # `prune` default: e.g. 30d (since the last access)
    server: ServerSettings = ServerSettings()

    @field_validator("max_age", mode="before")
    @classmethod
    def _span(cls, value):
        """The spans `cache prune --max-age` and `harvest --since` take (gcis_etl.spans), not pydantic's own."""
        return parse_span(value) if isinstance(value, str) else value

    @field_validator("extensions")
    @classmethod
    def _extensions(cls, extensions: tuple[str, ...]) -> tuple[str, ...]:
        if not extensions or not all(re.fullmatch(r"\.[a-z0-9]+", e) for e in extensions):
            raise ValueError("give at least one lower-case extension with its dot, e.g. [.tif, .jp2]")
        return extensions

    @property
    def images_dir(self) -> Path:
        return self.dir / "images"


class CacheUnusable(ConfigError):
    """The cache folder takes no more writes (its disk full or read-only, its state.sqlite failing): every copy
    after would fail alike, so the command stops at once, in one line, and exits 2 as for a cache lock that cannot
    be made (cache --help): nothing can be cached until someone makes room or repairs the folder."""


@dataclass(frozen=True)
class CacheSource:
    """Where one pipeline's access masters are: a store and the key prefix its images share."""

    name: str
    store: Store
    prefix: str = ""


def cache_sources(config: Config, names: Sequence[str] = ()) -> list[CacheSource]:
    """The sources of the pipelines named, by default those cache.pipelines names (all when it names none). A
    pipeline config.yaml does not have is a ConfigError naming it; so is one whose recipe writes an extension
    cache.extensions does not list: the cache would copy none of its access masters, and say nothing (a sync saw
    no key of it), while its manifests name them on the server; and one whose recipe writes HTJ2K unless
    cache.server.decodes_htj2k: Debian's iipsrv answers its full-resolution tiles with flat grey JPEGs, 200 OK,
    which the JP2's own verification (whole tiles) cannot see."""
    selected = list(names) or list(config.cache.pipelines or sorted(config.pipelines))
    pipelines = [config.pipeline(name) for name in selected]
    extensions = config.cache.extensions
    for pipeline in pipelines:
        recipe = pipeline.recipe
        if recipe.extension not in extensions:
            raise ConfigError(f"{config.source_file}: cache.extensions ({', '.join(extensions)}) does not list "
                              f"{recipe.extension}, what pipeline {pipeline.name}'s recipe {recipe.name} writes: "
                              "the cache would copy none of its access masters; add it")
        if recipe.jp2 is not None and recipe.jp2.ht and not config.cache.server.decodes_htj2k:
            raise ConfigError(f"{config.source_file}: pipeline {pipeline.name}'s recipe {recipe.name} writes HTJ2K, "
                              "which Debian 12's iipsrv (OpenJPEG 2.5.0) serves as flat grey tiles at full "
                              "resolution: leave the pipeline out of cache.pipelines, or serve the cache with an "
                              "iipsrv that decodes HTJ2K regions (Kakadu, a later OpenJPEG) and set "
                              "cache.server.decodes_htj2k: true")
    return [CacheSource(p.name, p.store, p.settings.store.keys.image_prefix(p.name)) for p in pipelines]


@dataclass(frozen=True)
class Failure:
    source: str
    key: str | None   # None: the source as a whole (its listing failed)
    reason: str


@dataclass(frozen=True)
class SyncResult:
    copied: tuple[str, ...]
    replaced: tuple[str, ...]  # of the copied, those iipsrv may have had before: over a file at their path
                               # (changed, or one the state did not record), or evicted and back
    adopted: tuple[str, ...]   # already in the cache with the right content, now recorded (after a crash or
                               # a lost state)
    unchanged: int
    evicted: int               # not copied: evicted by prune and not requested since
    gone: tuple[str, ...]      # cached, no longer in the store: removed if purge_gone, else left to `purge`
    foreign: int               # files in images/ neither recorded nor under a synced source's prefix (or not
                               # access masters): never removed
    failed: tuple[Failure, ...]
    bytes_copied: int
    reloaded: bool             # the iipsrv processes were restarted (see sync())
    seconds: float


@dataclass(frozen=True)
class Evicted:
    key: str
    size: int
    last_access: float        # epoch seconds


@dataclass(frozen=True)
class PruneResult:
    evicted: tuple[Evicted, ...]
    kept: int
    kept_bytes: int
    unrecorded: int           # files in images/ the state does not record: neither evicted nor in kept_bytes
    unrecorded_bytes: int     # (`cache sync` records those in a store, `sync --purge` removes those gone)

    @property
    def freed_bytes(self) -> int:
        return sum(e.size for e in self.evicted)


@dataclass(frozen=True)
class PurgeResult:
    removed: tuple[str, ...]
    not_cached: tuple[str, ...]   # keys asked for that the cache did not hold
    freed_bytes: int
    reloaded: bool                # the iipsrv processes were restarted (they may have had a removed image)


@dataclass(frozen=True)
class _Record:
    key: str
    source: str
    sha256: str
    size: int
    listed_modified: str
    inode: int
    mtime_ns: int
    synced: float
    last_access: float
    evicted: float | None = None   # when prune removed the file (the record stays: see the module docstring)
    wanted: bool = False           # requested since it was evicted (the access log has a later line for it)

    def matches(self, st: os.stat_result) -> bool:
        """The cached file is still the one recorded (nothing replaced or edited it)."""
        return (st.st_ino, st.st_size, st.st_mtime_ns) == (self.inode, self.size, self.mtime_ns)


class _State:
    """state.sqlite. WAL and a commit per change: a killed sync loses at most the record of the file it had
    just renamed into place, and the next sync adopts that file after hashing it."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def get(self, key: str) -> _Record | None:
        row = self.db.execute("SELECT * FROM images WHERE key = ?", (key,)).fetchone()
        return _Record(*row) if row else None

    def all(self) -> list[_Record]:
        return [_Record(*row) for row in self.db.execute("SELECT * FROM images ORDER BY key")]

    def put(self, record: _Record) -> None:
        self.db.execute("INSERT OR REPLACE INTO images VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (record.key, record.source, record.sha256, record.size, record.listed_modified,
                         record.inode, record.mtime_ns, record.synced, record.last_access, record.evicted,
                         record.wanted))

    def relisted(self, key: str, listed_modified: str) -> None:
        self.db.execute("UPDATE images SET listed_modified = ? WHERE key = ?", (listed_modified, key))

    def remove(self, key: str) -> None:
        self.db.execute("DELETE FROM images WHERE key = ?", (key,))

    def evict(self, key: str, at: float) -> None:
        self.db.execute("UPDATE images SET evicted = ?, wanted = 0 WHERE key = ?", (at, key))

    def keys(self, source: str, prefix: str) -> set[str]:
        rows = self.db.execute("SELECT key FROM images WHERE source = ? AND substr(key, 1, ?) = ?",
                               (source, len(prefix), prefix))
        return {key for (key,) in rows}

    def accessed(self, latest: dict[str, float]) -> None:
        """Requests read from the access log. The log is read in order, so a request for an evicted image
        read now came after the prune that evicted it (lighttpd's clock in the log lags by up to a second,
        which is why this does not compare times)."""
        with self.db:
            self.db.executemany("UPDATE images SET last_access = max(last_access, ?), "
                                "wanted = (evicted IS NOT NULL) WHERE key = ?",
                                [(at, key) for key, at in latest.items()])

    def log_position(self) -> tuple[int, int]:
        row = self.db.execute("SELECT inode, offset FROM access_log WHERE id = 1").fetchone()
        return row or (-1, 0)

    def set_log_position(self, inode: int, offset: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO access_log VALUES (1, ?, ?)", (inode, offset))


class _Cache:
    """The cache directory, locked, with its state open: what sync, prune and purge work on."""

    def __init__(self, settings: CacheSettings, action: str):
        self.settings = settings
        self.images = settings.images_dir
        self.incoming = settings.dir / "incoming"
        self._lock = RunLock(settings.dir / "lock", f"a cache {action} on {settings.dir}")
        self.state: _State | None = None

    def __enter__(self) -> _Cache:
        self._lock.__enter__()
        try:
            self.images.mkdir(parents=True, exist_ok=True)
            self.incoming.mkdir(parents=True, exist_ok=True)
            self.state = _State(self.settings.dir / "state.sqlite")
        except BaseException as exc:
            self._lock.__exit__()
            self._raise_unusable(exc)
            raise
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        self.state.close()
        self._lock.__exit__()
        self._raise_unusable(exc)

    def _raise_unusable(self, exc: BaseException | None) -> None:
        """An SQLite error of the cache's state as CacheUnusable: one line naming it and what to do, not a
        traceback (a copy whose record could not be written is removed first: see _sync_one)."""
        if isinstance(exc, sqlite3.Error):
            todo = _STATE_TROUBLE.get(sqlite_code(exc),
                                      "check the cache folder's filesystem (full, read-only, unmounted?)")
            raise CacheUnusable(f"cache {self.settings.dir}: its state {self.settings.dir / 'state.sqlite'} cannot "
                                f"be used ({exc}): {todo.format(room=self.room())}") from None

    def refusal(self, exc: BaseException, needs: int = 0) -> bool:
        """Whether `exc`, raised writing into the cache, is its disk refusing (full, over quota, read-only) or
        having less room than the write `needs`."""
        return disk_refusal(exc, self.settings.dir, needs=needs) is not None

    def room(self) -> str:
        """The cache's disk is full (how full, what makes room), or read-only (what makes it writable)."""
        if room(self.settings.dir)[1]:
            return "its filesystem is mounted read-only: remount it read-write, or move cache.dir to one that is"
        usage = shutil.disk_usage(self.settings.dir)
        return (f"its disk is full ({usage.free / 1e6:.1f} MB free of {usage.total / 1e6:.1f} MB): run `gcis-etl "
                f"cache prune --max-bytes SIZE` (and set cache.max_bytes below the disk's size: cron's `cache prune` "
                f"then keeps that room), or give the cache more room")

    def path(self, key: str) -> Path:
        return self.images / check_key(key)

    def clear_incoming(self) -> None:
        """Remove what a killed sync (or anyone) left in incoming/, files and folders alike."""
        try:
            for leftover in self.incoming.iterdir():
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
        except OSError as exc:
            raise StoreError(f"{self.incoming}: cannot remove what is left in it ({exc}): empty it by hand, "
                             f"it holds only unfinished copies") from None

    def unrecorded(self) -> dict[str, int]:
        """The files in images/ the state has no record of, by key (their path below images/), with their
        sizes: after a lost state.sqlite, those no sync has adopted yet, and whatever was put there by hand."""
        recorded = {record.key for record in self.state.all()}
        found = {}
        for folder, _, names in os.walk(self.images):
            for name in names:
                path = Path(folder, name)
                key = path.relative_to(self.images).as_posix()
                if key not in recorded:
                    found[key] = path.lstat().st_size
        return found

    def delete_file(self, key: str) -> int:
        """Delete the cached file (and folders it leaves empty); the bytes freed. iipsrv answers 404 from then
        on (it stats the file on every request), though browsers and CDNs keep what they got for max-age."""
        path = self.path(key)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        for parent in path.parents:
            if parent == self.images:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty
                break
        return size

    def read_access_log(self) -> None:
        """Fold the access log's new lines into last_access. A rotated log (another inode, or shorter than
        where reading stopped) is read from its start; what the old file got after the last read is lost,
        which only makes those images look older than they are (atime and sync time still count)."""
        try:
            f = open(self.settings.server.access_log, "rb")
        except FileNotFoundError:
            return
        with f:
            st = os.fstat(f.fileno())
            inode, offset = self.state.log_position()
            if inode != st.st_ino or offset > st.st_size:
                offset = 0
            f.seek(offset)
            latest: dict[str, float] = {}
            for line in f:
                if not line.endswith(b"\n"):  # still being written: read it next time
                    break
                offset += len(line)
                match = _LOG_LINE.match(line)
                if match:
                    for key in _keys_of(match.group(2).decode("ascii", "replace"), self.settings.server.prefix):
                        latest[key] = max(latest.get(key, 0.0), float(match.group(1)))
        self.state.accessed(latest)
        self.state.set_log_position(st.st_ino, offset)


_STATE_TROUBLE = {  # SQLite's primary result codes for a state.sqlite that cannot be used, and what to do (any
    # other, an I/O error among them: _raise_unusable's "check the cache folder's filesystem")
    "FULL": "{room}",
    "READONLY": "make the cache folder and the file writable by this user",
    "CANTOPEN": "make the cache folder writable by this user",
    **dict.fromkeys(("CORRUPT", "NOTADB"), "the file is damaged: remove it (and any state.sqlite-wal and -shm beside "
                    "it); the next sync records the cached files again, hashing each, and copies back what prune "
                    "evicted"),
}


def _keys_of(target: str, prefix: str) -> tuple[str, ...]:
    """The keys an Image API request may name: `{key}/info.json`, `{key}/{region}/{size}/{rotation}/{quality}`
    or `{key}` itself (iipsrv decodes %2F, so either form of the identifier counts)."""
    path = unquote(urlsplit(target).path)
    if not path.startswith(prefix + "/"):
        return ()
    identifier = path[len(prefix) + 1:]
    return identifier.removesuffix("/info.json"), identifier.rsplit("/", 4)[0], identifier


# ---------------------------------------------------------------------------------------------------- sync


def sync(settings: CacheSettings, sources: Sequence[CacheSource], *, purge_gone: bool = False) -> SyncResult:
    """Copy the new or changed access masters of `sources` into the cache, and the evicted ones requested
    since their eviction (see the module docstring); with `purge_gone`, remove the cached images no longer
    in their store, as `purge` does.

    iipsrv is restarted when it may hold an image whose file was replaced or removed, and after any adoption:
    an adopted file was not recorded, so what iipsrv last read at its path is unknown (a sync killed after
    renaming a new copy over an old one leaves the new file for the next sync to adopt). Adoption follows
    only a crash or a lost state, so this costs a rare restart."""
    started = time.monotonic()
    copied, replaced, adopted, gone, failed = [], [], [], [], []
    unchanged = evicted = bytes_copied = 0
    with _Cache(settings, "sync") as cache:
        cache.clear_incoming()
        cache.read_access_log()
        listings: dict[str, set[str]] = {}
        for source in sources:
            seen: set[str] = set()
            try:
                for listed in source.store.list(source.prefix):
                    if not listed.key.lower().endswith(settings.extensions):
                        continue
                    seen.add(listed.key)
                    try:
                        outcome, size = _sync_one(cache, source, listed)
                    except CacheUnusable:
                        raise
                    except GcisError as exc:
                        failed.append(Failure(source.name, listed.key, str(exc)))
                        continue
                    if outcome in ("copied", "replaced"):
                        copied.append(listed.key)
                        bytes_copied += size
                        if outcome == "replaced":
                            replaced.append(listed.key)
                    elif outcome == "adopted":
                        adopted.append(listed.key)
                    elif outcome == "evicted":
                        evicted += 1
                    else:
                        unchanged += 1
            except StoreError as exc:
                failed.append(Failure(source.name, None, f"listing failed, sync of this source stopped: {exc}"))
                continue
            listings[source.name] = seen
        gone, foreign, refused = _gone(cache, sources, listings)
        failed.extend(refused)
        for key in gone if purge_gone else ():
            cache.delete_file(key)
            cache.state.remove(key)
    reloaded = _reload(settings, failed) if replaced or adopted or (purge_gone and gone) else False
    return SyncResult(tuple(copied), tuple(replaced), tuple(adopted), unchanged, evicted, tuple(gone), foreign,
                      tuple(failed), bytes_copied, reloaded, time.monotonic() - started)


def _gone(cache: _Cache, sources: Sequence[CacheSource],
          listings: dict[str, set[str]]) -> tuple[list[str], int, list[Failure]]:
    """The cached images no longer in their store, how many files are foreign, and a Failure for each source
    of which none is taken for gone (see the module docstring). `listings`: the keys of each source's complete
    listing; a source without one could not be listed."""
    extensions = cache.settings.extensions
    unrecorded = cache.unrecorded()
    owners = {key: [s.name for s in sources if key.startswith(s.prefix)] for key in unrecorded
              if key.lower().endswith(extensions) and _is_key(key)}
    complete: dict[str, set[str]] = {}
    gone: set[str] = set()
    failures = []
    for source in sources:
        listed = listings.get(source.name)
        if listed is None:
            continue
        cached = cache.state.keys(source.name, source.prefix)
        held = len(cached) + sum(source.name in names for names in owners.values())
        if held and not any(key.lower().endswith(extensions) for key in listed):
            failures.append(Failure(source.name, None, (
                f"{source.store.describe(source.prefix)}: lists no access master, yet the cache holds "
                f"{counted(held, 'image')} of pipeline {source.name!r}: none is taken for gone (did the store's "
                f"prefix or root change, or its volume go unmounted?); `gcis-etl cache purge KEY...` removes the "
                f"keys given")))
            continue
        complete[source.name] = listed
        gone |= cached - listed
    gone |= {key for key, names in owners.items()
             if names and all(name in complete and key not in complete[name] for name in names)}
    foreign = sum(1 for key in unrecorded if not owners.get(key))
    return sorted(gone), foreign, failures


def _is_key(name: str) -> bool:
    """Whether a file name below images/ could be a store key (a file named otherwise is foreign)."""
    try:
        check_key(name)
    except UnsafeKey:
        return False
    return True


def _reload(settings: CacheSettings, failed: list[Failure]) -> bool:
    try:
        return reload(settings.server)
    except GcisError as exc:
        failed.append(Failure("iipsrv", None, f"{exc}: it may serve replaced images with their old size"))
        return False


def _sync_one(cache: _Cache, source: CacheSource, listed: ListedObject) -> tuple[str, int]:
    """'unchanged', 'evicted', 'adopted', 'copied' or 'replaced' (with the bytes copied); a GcisError says
    why not."""
    key = listed.key
    path = cache.path(key)
    modified = listed.modified.isoformat()
    record = cache.state.get(key)
    if record is not None and record.source != source.name:
        raise StoreError(f"{key} is also cached from {record.source!r}: one iipsrv serves one key space, "
                         f"so keys must be unique across the stores it mirrors")
    if record is not None and record.evicted is not None and not record.wanted:
        return "evicted", 0
    st = _stat(path)
    intact = record is not None and st is not None and record.matches(st)
    if intact and (record.size, record.listed_modified) == (listed.size, modified):
        return "unchanged", 0
    head = source.store.head(key)
    if head is None:
        raise StoreError(f"{source.store.describe(key)} was deleted while the cache was syncing")
    if head.sha256 is None:
        raise IntegrityError(f"{source.store.describe(key)} "
                             f"{head.doubt or 'has no SHA-256 recorded (not deposited by gcis-etl)'}: "
                             f"a copy could not be verified, so none was made")
    if intact and record.sha256 == head.sha256 and not head.doubt:
        cache.state.relisted(key, modified)
        return "unchanged", 0
    if st is not None and not intact and sha256_file(path) == head.sha256:
        _record(cache, source, key, head.sha256, modified, path.stat(), record)
        return "adopted", 0
    tmp = cache.incoming / f"{uuid.uuid4().hex}.partial"
    try:
        sha256 = source.store.download(key, tmp)
        size = tmp.stat().st_size
        if (size, sha256) != (head.size, head.sha256):
            raise IntegrityError(f"{source.store.describe(key)}: the copy has {size} bytes with SHA-256 {sha256}, "
                                 f"the store recorded {head.size} bytes with {head.sha256}"
                                 f"{f' ({head.doubt})' if head.doubt else ''}; the cache keeps "
                                 f"{'its previous copy' if st else 'no copy'}")
        os.chmod(tmp, 0o644)
        _newer_than(tmp, st.st_mtime if st else record.mtime_ns / 1e9 if record else None)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
        fsync_path(path.parent)
    except IntegrityError:
        raise
    except (OSError, StoreError) as exc:  # the download's (the store's fault, or the cache's disk), or writing
        tmp.unlink(missing_ok=True)       # first: the room left is measured without it
        if cache.refusal(exc, needs=head.size):
            raise CacheUnusable(f"cache {cache.settings.dir}: cannot copy {key} ({head.size / 1e6:.1f} MB) into "
                                f"it: {cache.room()}; sync stopped") from None
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{cache.settings.dir}: cannot write the copy of {key}: {exc.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)
    try:
        _record(cache, source, key, head.sha256, modified, path.stat(), record)
    except sqlite3.Error:  # its disk full, say: the copy goes, and gives the room `cache prune` needs to record
        cache.delete_file(key)  # evictions (prune cannot evict a file without a record); the next sync copies it
        raise
    return ("copied" if record is None and st is None else "replaced"), size


def _record(cache: _Cache, source: CacheSource, key: str, sha256: str, modified: str, st: os.stat_result,
            previous: _Record | None) -> None:
    now = time.time()
    last_access = max(now, previous.last_access) if previous else now
    cache.state.put(_Record(key, source.name, sha256, st.st_size, modified, st.st_ino, st.st_mtime_ns, now,
                            last_access))


def _newer_than(path: Path, previous: float | None) -> None:
    """iipsrv's Last-Modified is the file's mtime in whole seconds, and it answers 304 to an If-Modified-Since
    that is not older: a copy replacing another within the same second would be "not modified" for clients
    that hold the old one. Such a copy gets the next second."""
    mtime = path.stat().st_mtime
    if previous is not None and int(mtime) <= int(previous):
        os.utime(path, (mtime, int(previous) + 1))


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------------------------------- prune


def prune(settings: CacheSettings, *, max_bytes: int | None = None, max_age: timedelta | None = None,
          now: float | None = None) -> PruneResult:
    """Evict the images not accessed within `max_age`, then the least recently accessed ones until the cache
    holds at most `max_bytes`. Files the state does not record are left alone (prune cannot tell an image not
    adopted yet from one gone or a foreign file: sync can) and counted apart."""
    now = time.time() if now is None else now
    with _Cache(settings, "prune") as cache:
        cache.read_access_log()
        cached = []
        for record in cache.state.all():
            if record.evicted is not None:
                continue
            st = _stat(cache.path(record.key))
            if st is None:  # deleted by hand: the next sync copies it again
                cache.state.remove(record.key)
                continue
            cached.append(Evicted(record.key, st.st_size, max(record.last_access, st.st_atime, record.synced)))
        cached.sort(key=lambda c: (c.last_access, c.key))
        total = sum(c.size for c in cached)
        evicted = []
        for candidate in cached:
            too_old = max_age is not None and candidate.last_access < now - max_age.total_seconds()
            too_big = max_bytes is not None and total > max_bytes
            if too_old or too_big:
                cache.delete_file(candidate.key)
                cache.state.evict(candidate.key, now)
                total -= candidate.size
                evicted.append(candidate)
        unrecorded = cache.unrecorded()
    return PruneResult(tuple(evicted), len(cached) - len(evicted), total, len(unrecorded), sum(unrecorded.values()))


# --------------------------------------------------------------------------------------------------- purge


def purge(settings: CacheSettings, sources: Sequence[CacheSource], keys: Iterable[str] = ()) -> PurgeResult:
    """Remove the cached copies and records of `keys` (store keys, or identifiers as IIIF URLs have them);
    without keys, of every image of `sources` that is no longer in its store."""
    keys = [check_key(unquote(k).strip("/")) for k in keys]
    with _Cache(settings, "purge") as cache:
        if keys:
            targets = keys
        else:
            try:
                listings = {s.name: {o.key for o in s.store.list(s.prefix)} for s in sources}
            except StoreError as exc:
                raise StoreError(f"{exc}; nothing was purged") from None
            targets, _, refused = _gone(cache, sources, listings)
            if refused:
                raise StoreError(f"{refused[0].reason}; nothing was purged")
        removed, not_cached, freed = [], [], 0
        for key in targets:
            size = cache.delete_file(key)
            known = cache.state.get(key) is not None
            cache.state.remove(key)
            (removed if size or known else not_cached).append(key)
            freed += size
    return PurgeResult(tuple(removed), tuple(not_cached), freed, reload(settings.server) if removed else False)
