"""The ledger: what became of every source item, run by run, and how far each pipeline's checkpoint has got.

SQLite, in WAL mode by default (readers such as `gcis-etl status` never block a running harvest; several
pipelines may run at once against one file). Every result is committed as it arrives, so a killed run
loses at most the items in flight, which the next run redoes (item processing is idempotent).

Item rows hold the item's settled state: `deposited`, `rejected` or `failed` (with attempts for the current
source version). What a run did with each item is in `run_items` (`skipped` ones for the latest runs only:
ledger.skipped_history_runs). What an item's conversion (or fetch) warned of is recorded with it: in `run_items`
as the run saw it, in `items` for the item's current deposit; what building an object's manifests warned of, in
`objects` for its published manifests and in `manifest_warnings` for the run that published them (JSON lists;
NULL for none). An object whose manifest was rejected is in `manifest_problems` until a manifest of it is
published. An access master an item no longer uses (re-derived under another key) is in `superseded`
until nothing refers to it (gcis_etl/supersession.py). When each key in the store was last read back and what
its bytes were found to be is in `audits` (migrations/audit.py).
"""
from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

from gcis_etl.durable import room
from gcis_etl.errors import ConfigError
from gcis_etl.work import ItemResult, Outcome

RUNS = """CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT, pipeline TEXT NOT NULL,
    started TEXT NOT NULL, finished TEXT,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'stopped', 'failed', 'crashed', 'dry-run')),
    since TEXT, until TEXT, checkpoint_after TEXT, options TEXT NOT NULL DEFAULT '{}',
    deposited INTEGER NOT NULL DEFAULT 0, skipped INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    manifests INTEGER NOT NULL DEFAULT 0, note TEXT
)"""

SUPERSEDED = """CREATE TABLE IF NOT EXISTS superseded (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL, key TEXT NOT NULL,
    run_id INTEGER, at TEXT NOT NULL,
    PRIMARY KEY (pipeline, key)
)"""

MANIFEST_WARNINGS = """CREATE TABLE IF NOT EXISTS manifest_warnings (
    run_id INTEGER NOT NULL, object_id TEXT NOT NULL, warnings TEXT NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY (run_id, object_id)
)"""
AUDIT_PROBLEMS = ("damaged", "missing", "unreadable")  # audit outcomes that stay problems until a key is read right
_AUDIT_PROBLEM_MARKS = ",".join("?" * len(AUDIT_PROBLEMS))  # their SQL parameters
AUDITS = """CREATE TABLE IF NOT EXISTS audits (
    pipeline TEXT NOT NULL, key TEXT NOT NULL, audited TEXT NOT NULL, outcome TEXT NOT NULL, reason TEXT,
    PRIMARY KEY (pipeline, key)
)"""
LEDGER_TABLES = ("items", "objects", "runs", "run_items", "checkpoints")  # every version's ledger has them
ADDED = (("items", "warnings"), ("run_items", "warnings"), ("objects", "warnings"), ("checkpoints", "listing"))
"""Columns added since the first ledgers (table, column), NULL in rows from before: no warnings recorded; a
checkpoint taken as made under the source's listing settings of now (Ledger.checkpoint_listing)."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS items (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL, sequence INTEGER NOT NULL,
    fingerprint TEXT NOT NULL, source_modified TEXT, master_sha256 TEXT,
    recipe TEXT NOT NULL, recipe_digest TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('deposited', 'skipped', 'rejected', 'failed')),
    output_key TEXT, sha256 TEXT, bytes INTEGER, width INTEGER, height INTEGER,
    reason TEXT, attempts INTEGER NOT NULL DEFAULT 0, transient INTEGER NOT NULL DEFAULT 0,
    first_seen TEXT NOT NULL, updated TEXT NOT NULL, last_run INTEGER, warnings TEXT,
    PRIMARY KEY (pipeline, object_id, item_id)
);
CREATE INDEX IF NOT EXISTS items_by_status ON items (pipeline, status, object_id, item_id);
CREATE INDEX IF NOT EXISTS items_by_item ON items (pipeline, item_id);
CREATE TABLE IF NOT EXISTS objects (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, modified TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '[]', manifest_fingerprint TEXT, published TEXT,
    in_collection INTEGER NOT NULL DEFAULT 0, warnings TEXT,
    PRIMARY KEY (pipeline, object_id)
);
{RUNS};
CREATE TABLE IF NOT EXISTS run_items (
    run_id INTEGER NOT NULL, object_id TEXT NOT NULL, item_id TEXT NOT NULL,
    outcome TEXT NOT NULL, reason TEXT, seconds REAL, at TEXT NOT NULL, warnings TEXT,
    PRIMARY KEY (run_id, object_id, item_id)
);
CREATE TABLE IF NOT EXISTS manifest_problems (
    pipeline TEXT NOT NULL, object_id TEXT NOT NULL, reason TEXT NOT NULL, run_id INTEGER NOT NULL, at TEXT NOT NULL,
    PRIMARY KEY (pipeline, object_id)
);
{SUPERSEDED};
{MANIFEST_WARNINGS};
{AUDITS};
CREATE INDEX IF NOT EXISTS superseded_by_object ON superseded (pipeline, object_id, key);
-- made by older versions, narrower than those above, which serve their queries too
DROP INDEX IF EXISTS items_status;
DROP INDEX IF EXISTS superseded_object;
CREATE TABLE IF NOT EXISTS checkpoints (
    pipeline TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, run_id INTEGER, updated TEXT NOT NULL, listing TEXT
);
"""

COUNTED = ("deposited", "skipped", "rejected", "failed")
MANIFEST = "(manifest)"  # stands for the item id where a run records an object's manifest problem
OBJECT = "(object)"  # stands for the item id where the run reports that the source could not describe the object
_KILLED = "the process ended without finishing the run (killed?): the counts are the items it had recorded"
STOPPED_ON_REQUEST = "stopped on request"  # the note of a run SIGINT or SIGTERM stopped (which one is not kept)
ABANDONED = "stopped on request; a second Ctrl-C abandoned the items in flight: the next run redoes them"
STOPPED_BY_SIGNAL = (STOPPED_ON_REQUEST, ABANDONED)  # the notes a command exits 128 + the signal for


class LedgerError(ConfigError):
    """The ledger cannot be opened (its folder unwritable, the file damaged, held by another process): the deployment
    must change before any run can, so it is reported and exits like a configuration error."""


class LedgerUnwritable(LedgerError):
    """The ledger was opened, then failed (a write its disk refused, a damaged page read): a harvest stops, one that
    began is recorded as failed if the ledger takes that much, and the command exits like a configuration error (2):
    nothing can run until the ledger, its disk or filesystem is put right."""


_DAMAGED = ("the file is damaged: move it aside (to {name}.damaged, say, with any {name}-wal, -shm or -journal "
            "beside it, renamed alike) and put back a backup (then run again any `gcis-migrate reencode` made since "
            "it), or what `sqlite3 {name}.damaged .dump | sed '$s/^ROLLBACK; -- due to errors$/COMMIT;/' | sqlite3 "
            "{name}` can read of it; without either, a harvest starts a fresh ledger, which knows no checkpoint, run "
            "or superseded key: it lists every source in full, looks up every item in the store (one there from the "
            "same source version and recipe is not converted again) and publishes every manifest again")
_DAMAGED_CODES = ("CORRUPT", "NOTADB")
_TROUBLE = {  # SQLite's primary result codes for a ledger that cannot be used, and what to do
    **dict.fromkeys(_DAMAGED_CODES, _DAMAGED),
    "FULL": "free space on its filesystem",
    "IOERR": "check its filesystem (full, read-only, unmounted?)",
    "CANTOPEN": "check that its folder is there and writable",
    "READONLY": "make it and its folder writable by this user",
    "BUSY": "another process ({holders}) held it past ledger.busy_timeout_seconds ({timeout:g} s): let it finish, "
            "or stop it",
}
_PERMISSIONS = ("CANTOPEN", "READONLY")  # when the ledger is opened: what its folder's permissions explain


def _holders(path: Path) -> str:
    """Who holds SQLite's locks on the ledger (they are POSIX locks, listed in Linux's /proc/locks, on the file or,
    in WAL mode, on its -shm), or where to look."""
    files = set()
    for name in (path, path.with_name(path.name + "-shm")):
        try:
            st = name.stat()
        except OSError:
            continue
        files.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    try:
        held = Path("/proc/locks").read_text().splitlines()
    except OSError:
        held = []
    pids = sorted({fields[4] for fields in map(str.split, held)
                   if len(fields) > 5 and fields[5] in files and fields[4] != str(os.getpid())}, key=int)
    return f"pid {', '.join(pids)}" if pids else f"`fuser -v {path}` names it"


def sqlite_code(exc: BaseException) -> str:
    """SQLite's primary result code of an error (SQLITE_IOERR_WRITE: IOERR); "" for none (an OSError, an error of
    Python's sqlite3 module itself)."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return name.split("_")[1] if name.startswith("SQLITE_") else ""


def _trouble(path: Path, exc: sqlite3.Error, busy_timeout_seconds: float) -> str:
    """`ledger PATH: SQLite's message; what to do`, for an error whose code is in _TROUBLE."""
    holders = _holders(path) if sqlite_code(exc) == "BUSY" else ""
    todo = _TROUBLE[sqlite_code(exc)].format(name=path.name, holders=holders, timeout=busy_timeout_seconds)
    return f"ledger {path}: {exc}; {todo}"


def now() -> datetime:
    return datetime.now(timezone.utc)


def _ts(value: datetime | None) -> str | None:
    return value.astimezone(timezone.utc).isoformat() if value else None


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _warnings_text(warnings: tuple[str, ...]) -> str | None:
    return json.dumps(list(warnings), ensure_ascii=False) if warnings else None


@dataclass(frozen=True)
class ItemRecord:
    pipeline: str
    object_id: str
    item_id: str
    sequence: int
    fingerprint: str
    source_modified: str | None
    master_sha256: str | None
    recipe: str
    recipe_digest: str
    status: str
    output_key: str | None
    sha256: str | None
    bytes: int | None
    width: int | None
    height: int | None
    reason: str | None
    attempts: int
    transient: int
    first_seen: str
    updated: str
    last_run: int | None
    warnings: tuple[str, ...] = ()  # of the current deposit


@dataclass(frozen=True)
class Unprocessed:
    """An item a run decided not to process, and why (Ledger.record_unprocessed)."""

    object_id: str
    item_id: str
    outcome: str
    reason: str


@dataclass(frozen=True)
class RunRecord:
    run_id: int
    pipeline: str
    started: str
    finished: str | None
    status: str
    since: str | None
    until: str | None
    checkpoint_after: str | None
    options: str
    deposited: int
    skipped: int
    rejected: int
    failed: int
    manifests: int
    note: str | None

    @property
    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTED}


@dataclass(frozen=True)
class RunItem:
    run_id: int
    object_id: str
    item_id: str
    outcome: str
    reason: str | None
    seconds: float | None
    at: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObjectRecord:
    pipeline: str
    object_id: str
    modified: str
    label: str  # JSON [[value, language], ...]: what the collection lists
    manifest_fingerprint: str | None
    published: str | None
    in_collection: int
    warnings: tuple[str, ...] = ()  # of its published manifests


@dataclass(frozen=True)
class SupersededKey:
    pipeline: str
    object_id: str
    item_id: str
    key: str
    run_id: int | None  # the run that deposited its replacement (None: taken from a reencode notes file)
    at: str


@dataclass(frozen=True)
class ManifestWarnings:
    """What building an object's manifests changed or left out of what the source said, in the run that
    published them."""

    run_id: int
    object_id: str
    warnings: tuple[str, ...]
    at: str


@dataclass(frozen=True)
class ManifestProblem:
    pipeline: str
    object_id: str
    reason: str
    run_id: int
    at: str


@dataclass(frozen=True)
class AuditRecord:
    """When a key's bytes were last read back from the store, and what they were found to be."""

    pipeline: str
    key: str
    audited: str
    outcome: str
    reason: str | None


def _upgrade(db: sqlite3.Connection, stale: Callable[[], bool], change: Callable[[], None]) -> None:
    """Bring a ledger an older version made up to date: once, under the write lock, looking again there, since
    another process may have done it meanwhile."""
    if not stale():
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if stale():
            change()
        db.commit()
    except BaseException:
        db.rollback()
        raise


def _allow_failed_runs(db: sqlite3.Connection) -> None:
    """Ledgers made before a run could be recorded as 'failed' (its source or store stopped it) have the older
    CHECK on runs.status; SQLite cannot alter a constraint, so the table is copied under the new one."""
    def copy() -> None:
        db.execute("ALTER TABLE runs RENAME TO runs_before_failed")
        db.execute(RUNS)
        db.execute("INSERT INTO runs SELECT * FROM runs_before_failed")
        db.execute("DROP TABLE runs_before_failed")

    def stale() -> bool:
        return "'failed'" not in db.execute("SELECT sql FROM sqlite_master WHERE name='runs'").fetchone()[0]

    _upgrade(db, stale, copy)


def _missing(db: sqlite3.Connection) -> dict[str, list[str]]:
    """The ADDED columns a ledger made by an older version lacks, by table."""
    missing: dict[str, list[str]] = {}
    for table, column in ADDED:
        if column not in {row[1] for row in db.execute(f"PRAGMA main.table_info({table})")}:
            missing.setdefault(table, []).append(column)
    return missing


def _add_columns(db: sqlite3.Connection) -> None:
    """Rows from before hold NULL in them."""
    def add() -> None:
        for table, columns in _missing(db).items():
            for column in columns:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")

    _upgrade(db, lambda: bool(_missing(db)), add)


def _columns(cls) -> str:
    return ", ".join(f.name for f in fields(cls))


def _record(cls, row: tuple):
    """A row as `cls`, its `warnings` column (JSON text, NULL for none) as a tuple."""
    values = dict(zip((f.name for f in fields(cls)), row))
    if "warnings" in values:
        values["warnings"] = tuple(json.loads(values["warnings"] or "[]"))
    return cls(**values)


def _opened(uri: str, busy_timeout_seconds: float) -> sqlite3.Connection:
    """A connection that has read the file (not at its first query): a hot journal or a file that is no ledger
    fails here."""
    db = sqlite3.connect(uri, uri=True, timeout=busy_timeout_seconds)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        db.close()
        raise
    return db


def _read_only(path: Path, busy_timeout_seconds: float, recover: bool) -> sqlite3.Connection:
    """A write cut short (a process killed, power lost) with journal_mode delete or truncate leaves a hot journal,
    which a read-only connection may not roll back, so it cannot read. With `recover` a connection that may write
    rolls it back first, as the next harvest's would (it holds the pages as they were committed: nothing committed
    is lost); without (a dry run writes nothing), or when this user may not write the ledger, it says what to do.
    In WAL mode readers skip what was not committed: no journal to roll back."""
    uri = path.resolve().as_uri()
    try:
        return _opened(uri + "?mode=ro", busy_timeout_seconds)
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorname != "SQLITE_READONLY_ROLLBACK":
            raise
    todo = "a dry run changes nothing, so cannot roll that back: run `gcis-etl status` once"
    if recover:
        try:
            _opened(uri + "?mode=rw", busy_timeout_seconds).close()
            return _opened(uri + "?mode=ro", busy_timeout_seconds)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname.startswith("SQLITE_BUSY"):  # a harvest writes it now: busy_timeout's message
                raise
            # read-only file, or a folder where the journal cannot be deleted (SQLITE_IOERR_DELETE, CANTOPEN)
            todo = (f"this user may not write it and its folder to roll that back ({exc}): run `gcis-etl status` "
                    f"once as one who may")
    raise LedgerError(f"ledger {path}: a write to it was cut short (a process killed?) and left "
                      f"{path.name}-journal beside it; {todo} (or let the next harvest do it), then run this again "
                      f"(what was committed is kept)")


def _readable(db: sqlite3.Connection) -> None:
    """A ledger made by an older version, read as _writable would make it (in TEMP tables and views: nothing on
    disk changes)."""
    for table, create in (("superseded", SUPERSEDED), ("manifest_warnings", MANIFEST_WARNINGS), ("audits", AUDITS)):
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone():
            db.execute(create.replace("CREATE TABLE", "CREATE TEMP TABLE"))
    for table, columns in _missing(db).items():  # read as NULL, as _add_columns would make them
        nulls = "".join(f", NULL AS {column}" for column in columns)
        db.execute(f"CREATE TEMP VIEW {table} AS SELECT *{nulls} FROM main.{table}")


def _writable(db: sqlite3.Connection, journal_mode: str) -> None:
    """The ledger made, or one made by an older version brought up to date."""
    db.execute(f"PRAGMA journal_mode={journal_mode}")
    db.execute("PRAGMA synchronous=NORMAL")  # with WAL: consistent after any crash, durable per commit
    db.executescript(SCHEMA)
    _allow_failed_runs(db)
    _add_columns(db)


def _empty() -> sqlite3.Connection:
    """What a read-only ledger that holds nothing reads as: no runs, no items (and nothing created on disk)."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    return db


def _is_ledger(path: Path, db: sqlite3.Connection) -> bool:
    """Whether the file holds a ledger (False: no tables at all, as an empty file, which a harvest makes a fresh
    ledger of, and a recovery that read nothing leaves); an SQLite database with tables but none of those every
    version of the ledger has is another program's, which is neither read as nor made into a ledger."""
    tables = sorted(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'"))
    if tables and not set(LEDGER_TABLES) & set(tables):
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise LedgerError(f"ledger {path} is an SQLite database but not a gcis-etl ledger (its tables: {shown}; a "
                          f"ledger has {', '.join(LEDGER_TABLES)}): is ledger.path the right file? nothing was done")
    return bool(tables)


class Ledger:
    """read_only: for commands that only look (status, report, dry runs), which must change nothing; a ledger
    that does not exist yet, or holds nothing (_is_ledger), reads as an empty one (no runs, no items) and is not
    created. recover: a read-only ledger whose last write was cut short is rolled back (_read_only): for status
    and report, not dry runs."""

    def __init__(self, path: Path, journal_mode: str = "wal", busy_timeout_seconds: float = 30,
                 read_only: bool = False, skipped_history_runs: int = 30, recover: bool = False):
        self.path = path
        self.skipped_history_runs = skipped_history_runs
        self.busy_timeout_seconds = busy_timeout_seconds
        try:
            self.db = self._connect(path, journal_mode, busy_timeout_seconds, read_only, recover)
        except (OSError, sqlite3.Error) as exc:
            if path.is_dir():  # SQLite says "disk I/O error" of it, or "unable to open database file"
                raise LedgerError(f"ledger {path} cannot be opened: it is a folder; ledger.path names the ledger's "
                                  f"file (move the folder away, or set ledger.path)") from None
            if sqlite_code(exc) in _TROUBLE and sqlite_code(exc) not in _PERMISSIONS:
                raise LedgerError(_trouble(path, exc, busy_timeout_seconds)) from None
            cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if room(path.parent)[1]:  # SQLite says only "unable to open database file" of it
                raise LedgerError(f"ledger {path} cannot be opened ({cause}): its folder {path.parent} is on a "
                                  f"filesystem mounted read-only: mount it read-write, or point state_dir (or "
                                  f"ledger.path) at one that is") from None
            raise LedgerError(f"ledger {path} cannot be opened: {cause}; is its folder {path.parent} there and "
                              f"writable by this user? (reading a ledger in WAL mode writes beside it too)") from None

    @staticmethod
    def _connect(path: Path, journal_mode: str, busy_timeout_seconds: float, read_only: bool,
                 recover: bool) -> sqlite3.Connection:
        if read_only and not path.exists():
            return _empty()
        if read_only:
            db = _read_only(path, busy_timeout_seconds, recover)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, timeout=busy_timeout_seconds)
        try:
            if not _is_ledger(path, db) and read_only:
                db.close()
                return _empty()
            if read_only:
                _readable(db)
            else:
                _writable(db, journal_mode)
        except BaseException:
            db.close()
            raise
        return db

    @classmethod
    def open(cls, config, read_only: bool = False, recover: bool = False) -> Ledger:
        return cls(config.ledger_path, config.ledger.journal_mode, config.ledger.busy_timeout_seconds, read_only,
                   config.ledger.skipped_history_runs, recover)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """A ledger that cannot be used (its disk full, its filesystem gone read-only or away, held by another
        process past busy_timeout_seconds, a damaged page) is a LedgerUnwritable in one line, not a traceback;
        after a write failed so, reads fail too. Other errors are a mistake in our SQL: raised as they are."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if sqlite_code(exc) not in _TROUBLE:
                raise
            settled = "" if sqlite_code(exc) in _DAMAGED_CODES else \
                ", then run again (what was settled is recorded; what was deposited since is found in the store)"
            raise LedgerUnwritable(_trouble(self.path, exc, self.busy_timeout_seconds) + settled) from None

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction."""
        with self._guarded(), self.db:
            yield

    def _execute(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._guarded():
            return self.db.execute(sql, args)

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        """A query's rows, all read under _guarded: a damaged page may turn up at any row, not only the first."""
        with self._guarded():
            return self.db.execute(sql, args).fetchall()

    def _row(self, sql: str, args: Sequence[Any] = ()) -> tuple | None:
        return next(iter(self._rows(sql, args)), None)

    def _one(self, cls, sql: str, *args: Any):
        row = self._row(f"SELECT {_columns(cls)} FROM {sql}", args)
        return _record(cls, row) if row else None

    def _all(self, cls, sql: str, *args: Any) -> list:
        return [_record(cls, row) for row in self._rows(f"SELECT {_columns(cls)} FROM {sql}", args)]

    # ------------------------------------------------------------------------------------------- runs

    def begin_run(self, pipeline: str, since: datetime | None, until: datetime | None, options: dict,
                  dry_run: bool = False) -> int:
        """Runs left 'running' by a process that is gone (we hold the pipeline's lock) become 'crashed', with the
        counts of the items they recorded (only a run that finishes writes its own). A nightly re-listing records
        every unchanged item as skipped, run after run: those rows are kept for the latest runs only (the runs
        table keeps every run's counts), or a 50k-item pipeline's ledger would grow by gigabytes a year."""
        dead = [row[0] for row in self._rows("SELECT run_id FROM runs WHERE pipeline=? AND status='running'",
                                                (pipeline,))]
        with self._writing():
            for run_id in dead:
                counts = self.recorded_counts(run_id)
                self._execute(f"UPDATE runs SET status='crashed', {', '.join(f'{n}=?' for n in COUNTED)}, "
                              "note=coalesce(note, ?) WHERE run_id=?",
                              (*(counts[n] for n in COUNTED), _KILLED, run_id))
            self._execute("DELETE FROM run_items WHERE outcome='skipped' AND run_id IN (SELECT run_id FROM runs "
                          "WHERE pipeline=? AND status!='running' ORDER BY run_id DESC LIMIT -1 OFFSET ?)",
                          (pipeline, self.skipped_history_runs - 1))
            cursor = self._execute(
                "INSERT INTO runs (pipeline, started, status, since, until, options) VALUES (?,?,?,?,?,?)",
                (pipeline, _ts(now()), "dry-run" if dry_run else "running", _ts(since), _ts(until),
                 json.dumps(options, sort_keys=True, default=str)))
        return cursor.lastrowid

    def finish_run(self, run_id: int, status: str, counts: dict[str, int], manifests: int,
                   checkpoint: datetime | None, note: str | None = None) -> None:
        with self._writing():
            self._execute(
                "UPDATE runs SET finished=?, status=?, deposited=?, skipped=?, rejected=?, failed=?, manifests=?, "
                "checkpoint_after=?, note=? WHERE run_id=?",
                (_ts(now()), status, *(counts.get(name, 0) for name in COUNTED), manifests, _ts(checkpoint),
                 note, run_id))

    def run(self, run_id: int) -> RunRecord | None:
        return self._one(RunRecord, "runs WHERE run_id=?", run_id)

    def counts_so_far(self, run: RunRecord) -> dict[str, int]:
        """A run's counts; while it is still running, those of the items it has recorded so far."""
        return run.counts if run.status != "running" else self.recorded_counts(run.run_id)

    def recorded_counts(self, run_id: int) -> dict[str, int]:
        """The run's items by outcome, counted from what it recorded of each (a manifest rejection among them)."""
        rows = self._rows("SELECT outcome, count(*) FROM run_items WHERE run_id=? GROUP BY outcome", (run_id,))
        return {name: 0 for name in COUNTED} | {k: v for k, v in rows if k in COUNTED}

    def runs(self, pipeline: str | None = None, limit: int = 10) -> list[RunRecord]:
        if pipeline is None:
            return self._all(RunRecord, "runs ORDER BY run_id DESC LIMIT ?", limit)
        return self._all(RunRecord, "runs WHERE pipeline=? ORDER BY run_id DESC LIMIT ?", pipeline, limit)

    def last_runs_given(self, more_than_minutes: float) -> dict[str, int]:
        """{pipeline: its latest run given more than `more_than_minutes`} (the run's id, which grows with its
        start; its time, the max_run_minutes its options record, none meaning no limit); dry runs left out. Options
        that are no JSON (earlier versions recorded a migration's infinite limit as `Infinity`) had no limit."""
        return dict(self._rows("SELECT pipeline, max(run_id) FROM runs WHERE status!='dry-run' AND NOT coalesce("
                               "CASE WHEN json_valid(options) THEN json_extract(options, '$.max_run_minutes') END <= ?,"
                               " 0) GROUP BY pipeline", (more_than_minutes,)))

    def run_items(self, run_id: int, outcome: str | None = None, warned: bool = False,
                  limit: int = -1) -> list[RunItem]:
        """`warned`: only the items with warnings; `limit`: the first so many (-1: all), in the order recorded."""
        sql, args = "run_items WHERE run_id=?", [run_id]
        if outcome is not None:
            sql, args = sql + " AND outcome=?", args + [outcome]
        if warned:
            sql += " AND warnings IS NOT NULL"
        return self._all(RunItem, sql + " ORDER BY at, object_id, item_id LIMIT ?", *args, limit)

    def manifest_warnings(self, run_id: int) -> list[ManifestWarnings]:
        return self._all(ManifestWarnings, "manifest_warnings WHERE run_id=? ORDER BY at", run_id)

    # ------------------------------------------------------------------------------------------ items

    def item(self, pipeline: str, object_id: str, item_id: str) -> ItemRecord | None:
        return self._one(ItemRecord, "items WHERE pipeline=? AND object_id=? AND item_id=?",
                         pipeline, object_id, item_id)

    def items(self, pipeline: str, object_id: str | None = None, status: str | None = None,
              limit: int = -1) -> list[ItemRecord]:
        """`limit`: the first so many (-1: all); `status` shows ten of a million failed items without reading
        them all."""
        sql, args = "items WHERE pipeline=?", [pipeline]
        if object_id is not None:
            sql, args = sql + " AND object_id=?", args + [object_id]
        if status is not None:
            sql, args = sql + " AND status=?", args + [status]
        return self._all(ItemRecord, sql + " ORDER BY object_id, sequence, item_id LIMIT ?", *args, limit)

    def elsewhere(self, pipeline: str, object_id: str, item_ids: Sequence[str]) -> list[ItemRecord]:
        """The records of these items under the pipeline's other objects (Source.item_ids_unique: they were there
        before): one probe of items_by_item an id, in one query however many ids."""
        return self._all(ItemRecord, "items WHERE pipeline=? AND item_id IN (SELECT value FROM json_each(?)) "
                                     "AND object_id!=? ORDER BY object_id, item_id",
                         pipeline, json.dumps(list(item_ids)), object_id)

    def iter_items(self, pipeline: str, where: str = "1", args: tuple = (), page: int = 1000) -> Iterator[ItemRecord]:
        """The pipeline's items matching the SQL condition `where`, in (object_id, item_id) order."""
        return self._paged(ItemRecord, "items", ("object_id", "item_id"), pipeline, where, args, page)

    def _paged(self, cls, table: str, order: tuple[str, ...], pipeline: str, where: str, args: tuple,
               page: int) -> Iterator:
        """The pipeline's rows of `table` matching `where`, in `order` (columns that tell its rows apart), a page
        at a time: no read transaction stays open while the caller works (a migration running harvests
        meanwhile)."""
        columns, marks, after = ", ".join(order), ", ".join("?" * len(order)), ("",) * len(order)
        while True:
            rows = self._all(cls, f"{table} WHERE pipeline=? AND ({where}) AND ({columns}) > ({marks}) "
                                  f"ORDER BY {columns} LIMIT ?", pipeline, *args, *after, page)
            yield from rows
            if len(rows) < page:
                return
            after = tuple(getattr(rows[-1], column) for column in order)

    def record(self, run_id: int, result: ItemResult, source_modified: datetime | None,
               listed: Collection[str] = ()) -> None:
        """Store one result and what the run did; a failure counts an attempt of the current source version.
        Its warnings go with what the run did and, for a deposit, with the item (a deposit without any clears
        those of the one before; an item that fails or is rejected keeps those of the deposit it still has).
        A deposit under another key than the item's last one (a recipe with another extension) supersedes that
        key: it stays in the store, where manifests may still show it, until it is retired; a key deposited
        again (a reencode reversed) is no longer superseded, nor is one another item of the object `listed` now
        has."""
        previous = self.item(result.pipeline, result.object_id, result.item_id)
        same_version = previous is not None and previous.fingerprint == result.fingerprint \
            and previous.recipe_digest == result.recipe_digest
        attempts = (previous.attempts if same_version and previous.status == "failed" else 0) + 1 \
            if result.outcome is Outcome.FAILED else 0
        stamp, warnings = _ts(now()), _warnings_text(result.warnings)
        with self._writing():
            self._execute(
                "INSERT INTO items (pipeline, object_id, item_id, sequence, fingerprint, source_modified, "
                "master_sha256, recipe, recipe_digest, status, output_key, sha256, bytes, width, height, reason, "
                "attempts, transient, first_seen, updated, last_run, warnings) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (pipeline, object_id, item_id) DO UPDATE SET sequence=excluded.sequence, "
                "fingerprint=excluded.fingerprint, source_modified=excluded.source_modified, "
                "master_sha256=coalesce(excluded.master_sha256, items.master_sha256), recipe=excluded.recipe, "
                "recipe_digest=excluded.recipe_digest, status=excluded.status, "
                "output_key=coalesce(excluded.output_key, items.output_key), "
                "sha256=CASE WHEN excluded.status='deposited' THEN excluded.sha256 ELSE items.sha256 END, "
                "bytes=CASE WHEN excluded.status='deposited' THEN excluded.bytes ELSE items.bytes END, "
                "width=coalesce(excluded.width, items.width), height=coalesce(excluded.height, items.height), "
                "reason=excluded.reason, attempts=excluded.attempts, transient=excluded.transient, "
                "updated=excluded.updated, last_run=excluded.last_run, "
                "warnings=CASE WHEN excluded.status='deposited' THEN excluded.warnings ELSE items.warnings END",
                (result.pipeline, result.object_id, result.item_id, result.sequence, result.fingerprint,
                 _ts(source_modified), result.master_sha256, result.recipe, result.recipe_digest,
                 result.outcome.value, result.key, result.sha256, result.bytes, result.width, result.height,
                 result.reason, attempts, int(result.transient), stamp, stamp, run_id,
                 warnings if result.outcome is Outcome.DEPOSITED else None))
            if result.outcome is Outcome.DEPOSITED and result.key:
                self._execute("DELETE FROM superseded WHERE pipeline=? AND key=?", (result.pipeline, result.key))
                # a withdrawn item (its record kept, as withdrawals' are) whose key this deposit took ({sequence}
                # keys: the page after it moved up) has no access master left: forgotten, so that status and
                # move_store no longer count it, and it is new if it comes back
                for item_id in set(self._others_under(result, result.key)) - set(listed):
                    self._forget_item(result.pipeline, result.object_id, item_id)
                if previous is not None and previous.output_key and previous.output_key != result.key \
                        and not self._holds(result, previous.output_key, listed):
                    self._supersede(result.pipeline, result.object_id, result.item_id, previous.output_key, run_id,
                                    stamp)
            self._run_item(run_id, result.object_id, result.item_id, result.outcome.value, result.reason,
                           result.seconds, stamp, warnings)

    def _holds(self, result: ItemResult, key: str, listed: Collection[str]) -> bool:
        """Whether another item of the object, among those `listed` (one withdrawn keeps its record), has `key`
        as its access master: with `{sequence}` keys, pages that moved take each other's keys (the one whose key
        another took is redone: harvesting.decide)."""
        return any(item_id in listed for item_id in self._others_under(result, key))

    def _others_under(self, result: ItemResult, key: str) -> list[str]:
        """The other items of the result's object whose record names `key` as their access master."""
        return [row[0] for row in self._rows(
            "SELECT item_id FROM items WHERE pipeline=? AND object_id=? AND output_key=? AND item_id<>?",
            (result.pipeline, result.object_id, key, result.item_id))]

    def record_unprocessed(self, run_id: int, items: Sequence[Unprocessed]) -> None:
        """Items the run decided not to process (unchanged, rejected before, out of attempts), in one transaction:
        a re-run over unchanged items commits once an object, not once an item. No items: no transaction."""
        if not items:
            return
        with self._writing():
            for item in items:
                self._run_item(run_id, item.object_id, item.item_id, item.outcome, item.reason, 0.0, _ts(now()))

    def _run_item(self, run_id: int, object_id: str, item_id: str, outcome: str, reason: str | None,
                  seconds: float, stamp: str, warnings: str | None = None) -> None:
        self._execute("INSERT INTO run_items (run_id, object_id, item_id, outcome, reason, seconds, at, warnings) "
                      "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (run_id, object_id, item_id) DO UPDATE SET "
                      "outcome=excluded.outcome, reason=excluded.reason, seconds=excluded.seconds, at=excluded.at, "
                      "warnings=excluded.warnings",
                      (run_id, object_id, item_id, outcome, reason, seconds, stamp, warnings))

    def supersede(self, pipeline: str, object_id: str, item_id: str, key: str, run_id: int | None) -> None:
        with self._writing():
            self._supersede(pipeline, object_id, item_id, key, run_id, _ts(now()))

    def _supersede(self, pipeline: str, object_id: str, item_id: str, key: str, run_id: int | None,
                   stamp: str) -> None:
        self._execute("INSERT INTO superseded (pipeline, object_id, item_id, key, run_id, at) VALUES (?,?,?,?,?,?) "
                      "ON CONFLICT (pipeline, key) DO NOTHING", (pipeline, object_id, item_id, key, run_id, stamp))

    def superseded(self, pipeline: str, object_id: str | None = None, page: int = 1000) -> Iterator[SupersededKey]:
        """The keys waiting to be retired, of one object or all, in (object_id, key) order. One object's are paged
        by key alone (on superseded_by_object): SQLite plans paging by (object_id, key) as a range of object_ids,
        reading all the pipeline's superseded keys at every call, and retire_superseded asks object by object."""
        if object_id is None:
            return self._paged(SupersededKey, "superseded", ("object_id", "key"), pipeline, "1", (), page)
        return self._paged(SupersededKey, "superseded", ("key",), pipeline, "object_id=?", (object_id,), page)

    def has_superseded(self, pipeline: str) -> bool:
        """Whether any key of the pipeline waits to be retired: one index probe (a run over a pipeline with none
        asks no object's)."""
        return self._row("SELECT 1 FROM superseded WHERE pipeline=? LIMIT 1", (pipeline,)) is not None

    def superseded_count(self, pipeline: str) -> int:
        return self._row("SELECT count(*) FROM superseded WHERE pipeline=?", (pipeline,))[0]

    def forget_superseded(self, pipeline: str, key: str) -> None:
        with self._writing():
            self._execute("DELETE FROM superseded WHERE pipeline=? AND key=?", (pipeline, key))

    def forget_item(self, pipeline: str, object_id: str, item_id: str) -> None:
        with self._writing():
            self._forget_item(pipeline, object_id, item_id)

    def _forget_item(self, pipeline: str, object_id: str, item_id: str) -> None:
        self._execute("DELETE FROM items WHERE pipeline=? AND object_id=? AND item_id=?", (pipeline, object_id, item_id))

    def reset_attempts(self, pipeline: str, object_id: str) -> int:
        """`gcis-etl retry`: the object's failed items get a fresh set of attempts."""
        with self._writing():
            return self._execute("UPDATE items SET attempts=0 WHERE pipeline=? AND status='failed' AND object_id=?",
                                 (pipeline, object_id)).rowcount

    def counts(self, pipeline: str) -> dict[str, int]:
        rows = self._rows("SELECT status, count(*) FROM items WHERE pipeline=? GROUP BY status", (pipeline,))
        return {name: 0 for name in COUNTED} | dict(rows)

    def has_deposit(self, pipeline: str) -> bool:
        """Whether the pipeline ever deposited anything: one index probe (counts() reads all its items)."""
        return self._row("SELECT 1 FROM items WHERE pipeline=? AND status='deposited' LIMIT 1",
                         (pipeline,)) is not None

    def recipes(self, pipeline: str) -> list[str]:
        """The recipes the pipeline's items were last made with."""
        return [row[0] for row in self._rows("SELECT DISTINCT recipe FROM items WHERE pipeline=? ORDER BY recipe",
                                                (pipeline,))]

    def objects_with(self, pipeline: str, status: str) -> list[str]:
        return [row[0] for row in self._rows(
            "SELECT DISTINCT object_id FROM items WHERE pipeline=? AND status=? ORDER BY object_id",
            (pipeline, status))]

    # ---------------------------------------------------------------------------------------- objects

    def object(self, pipeline: str, object_id: str) -> ObjectRecord | None:
        return self._one(ObjectRecord, "objects WHERE pipeline=? AND object_id=?", pipeline, object_id)

    def record_manifest(self, run_id: int, pipeline: str, object_id: str, modified: datetime,
                        label: list[list[str | None]], fingerprint: str, warnings: tuple[str, ...] = ()) -> None:
        """The object's manifest is deposited (a rejection of an earlier one is over), with what building it warned
        of (none clears those of the one before); it still has to be added to the collection."""
        stamp, text = _ts(now()), _warnings_text(warnings)
        with self._writing():
            self._execute("DELETE FROM manifest_problems WHERE pipeline=? AND object_id=?", (pipeline, object_id))
            # counted as it happens, as its items are: a run killed after it still reports what it published
            self._execute("UPDATE runs SET manifests = manifests + 1 WHERE run_id=?", (run_id,))
            self._execute(
                "INSERT INTO objects (pipeline, object_id, modified, label, manifest_fingerprint, published, "
                "in_collection, warnings) VALUES (?,?,?,?,?,?,0,?) ON CONFLICT (pipeline, object_id) DO UPDATE SET "
                "modified=excluded.modified, label=excluded.label, manifest_fingerprint=excluded.manifest_fingerprint, "
                "published=excluded.published, in_collection=0, warnings=excluded.warnings",
                (pipeline, object_id, _ts(modified), json.dumps(label), fingerprint, stamp, text))
            if text is not None:
                self._execute("INSERT INTO manifest_warnings (run_id, object_id, warnings, at) VALUES (?,?,?,?) "
                              "ON CONFLICT (run_id, object_id) DO UPDATE SET warnings=excluded.warnings, "
                              "at=excluded.at", (run_id, object_id, text, stamp))

    def record_touched(self, pipeline: str, object_id: str, modified: datetime, fingerprint: str) -> None:
        """The object changed in its modified time alone, which no manifest shows: its manifests as published show
        it as it is (no run counts them, the collection is not rewritten, a rejection of a later version is over);
        the fingerprint is what later runs compare with."""
        with self._writing():
            self._execute("DELETE FROM manifest_problems WHERE pipeline=? AND object_id=?", (pipeline, object_id))
            self._execute("UPDATE objects SET modified=?, manifest_fingerprint=? WHERE pipeline=? AND object_id=?",
                          (_ts(modified), fingerprint, pipeline, object_id))

    def reject_manifest(self, run_id: int, pipeline: str, object_id: str, reason: str) -> None:
        """The object's manifest was not published; kept beyond the run, for `status`, until one is."""
        stamp = _ts(now())
        with self._writing():
            self._execute("INSERT INTO manifest_problems (pipeline, object_id, reason, run_id, at) "
                          "VALUES (?,?,?,?,?) ON CONFLICT (pipeline, object_id) DO UPDATE SET "
                          "reason=excluded.reason, run_id=excluded.run_id, at=excluded.at",
                          (pipeline, object_id, reason, run_id, stamp))
            self._run_item(run_id, object_id, MANIFEST, Outcome.REJECTED.value, reason, 0.0, stamp)

    def manifest_problems(self, pipeline: str, limit: int = -1) -> list[ManifestProblem]:
        return self._all(ManifestProblem, "manifest_problems WHERE pipeline=? ORDER BY object_id LIMIT ?", pipeline,
                         limit)

    def manifest_problems_count(self, pipeline: str) -> int:
        return self._row("SELECT count(*) FROM manifest_problems WHERE pipeline=?", (pipeline,))[0]

    def published(self, pipeline: str, page: int = 1000) -> Iterator[str]:
        """Ids of the pipeline's objects whose manifests are deposited, in order, a page at a time."""
        after = ""
        while True:
            rows = [row[0] for row in self._rows(
                "SELECT object_id FROM objects WHERE pipeline=? AND published IS NOT NULL AND object_id > ? "
                "ORDER BY object_id LIMIT ?", (pipeline, after, page))]
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1]

    def published_objects(self, pipeline: str, page: int = 1000) -> Iterator[ObjectRecord]:
        """The objects whose manifests are deposited, in id order, a page at a time: all the pipeline's collection
        lists (withdrawals never reach the store), from which one lost is written again."""
        return self._paged(ObjectRecord, "objects", ("object_id",), pipeline, "published IS NOT NULL", (), page)

    def awaiting_collection(self, pipeline: str) -> list[ObjectRecord]:
        return self._all(ObjectRecord, "objects WHERE pipeline=? AND in_collection=0 AND published IS NOT NULL "
                                       "ORDER BY object_id", pipeline)

    def mark_in_collection(self, pipeline: str, object_ids: list[str]) -> None:
        with self._writing():
            self.db.executemany("UPDATE objects SET in_collection=1 WHERE pipeline=? AND object_id=?",
                                [(pipeline, object_id) for object_id in object_ids])

    # ------------------------------------------------------------------------------------- checkpoint

    def checkpoint(self, pipeline: str) -> datetime | None:
        row = self._row("SELECT checkpoint FROM checkpoints WHERE pipeline=?", (pipeline,))
        return _dt(row[0]) if row else None

    def checkpoint_listing(self, pipeline: str) -> str | None:
        """The digest of the source's listing settings the checkpoint was taken under (Pipeline.listing_digest);
        None: no checkpoint, or one an older version took, which is taken as made under the settings of now."""
        row = self._row("SELECT listing FROM checkpoints WHERE pipeline=?", (pipeline,))
        return row[0] if row else None

    def listing_changed(self, pipeline: str, current: str | None) -> bool:
        """Whether the checkpoint was taken under listing settings other than `current` (None: not known here,
        as the digest of an older version's checkpoint is not): the next run then lists everything."""
        recorded = self.checkpoint_listing(pipeline)
        return None not in (recorded, current) and recorded != current

    def set_checkpoint(self, pipeline: str, checkpoint: datetime, run_id: int, listing: str | None) -> None:
        with self._writing():
            self._execute("INSERT INTO checkpoints (pipeline, checkpoint, run_id, updated, listing) VALUES (?,?,?,?,?) "
                          "ON CONFLICT (pipeline) DO UPDATE SET checkpoint=excluded.checkpoint, "
                          "run_id=excluded.run_id, updated=excluded.updated, listing=excluded.listing",
                          (pipeline, _ts(checkpoint), run_id, _ts(now()), listing))

    def pipelines(self) -> Iterator[str]:
        for row in self._rows("SELECT DISTINCT pipeline FROM runs ORDER BY pipeline"):
            yield row[0]

    # ------------------------------------------------------------------------------------------ audits

    def record_audit(self, pipeline: str, key: str, outcome: str, reason: str | None = None) -> None:
        with self._writing():
            self._execute("INSERT INTO audits (pipeline, key, audited, outcome, reason) VALUES (?,?,?,?,?) "
                          "ON CONFLICT (pipeline, key) DO UPDATE SET audited=excluded.audited, "
                          "outcome=excluded.outcome, reason=excluded.reason",
                          (pipeline, key, _ts(now()), outcome, reason))

    def audit(self, pipeline: str, key: str) -> AuditRecord | None:
        return self._one(AuditRecord, "audits WHERE pipeline=? AND key=?", pipeline, key)

    def audit_queue(self, pipeline: str, entries: Iterable[tuple[str, str]], audited_before: datetime | None,
                    page: int = 1000) -> int:
        """Queue `entries` (key, payload: what the caller needs again of the key) for audit_queued(): those last
        found a problem (AUDIT_PROBLEMS) first, whenever that was (a key found damaged is not one audited recently
        and fine, and every finding is recorded anew: it must not go to the back of the queue), then those never
        audited, then the oldest audit first, each in the order given; the rest audited at or after
        `audited_before` are left out. Held in TEMP tables (a read-only ledger's too: a dry run counts them),
        sorted by SQLite, which spills to disk: millions of keys never sit in memory. Returns how many are
        queued."""
        entries = iter(entries)
        with self._writing():
            for table in ("audit_entries", "audit_queued"):
                self._execute(f"DROP TABLE IF EXISTS temp.{table}")
            self._execute("CREATE TEMP TABLE audit_entries (position INTEGER PRIMARY KEY, key TEXT NOT NULL, "
                          "payload TEXT NOT NULL)")
        # a transaction per batch: `entries` reads the ledger, and a transaction open across those reads would hold
        # its lock (journal_mode delete: no harvest could commit meanwhile)
        while batch := list(islice(entries, page)):
            with self._writing():
                self.db.executemany("INSERT INTO audit_entries (key, payload) VALUES (?,?)", batch)
        with self._writing():
            problem = f"a.outcome IN ({_AUDIT_PROBLEM_MARKS})"
            self._execute("CREATE TEMP TABLE audit_queued AS SELECT e.key, e.payload FROM audit_entries e "
                          "LEFT JOIN audits a ON a.pipeline=? AND a.key=e.key WHERE ? IS NULL OR a.audited IS NULL "
                          f"OR a.audited < ? OR {problem} "
                          f"ORDER BY CASE WHEN {problem} THEN 0 WHEN a.audited IS NULL THEN 1 ELSE 2 END, "
                          "a.audited, e.position",
                          (pipeline, *(_ts(audited_before),) * 2, *AUDIT_PROBLEMS * 2))
            self._execute("DROP TABLE temp.audit_entries")
        return self._row("SELECT count(*) FROM audit_queued")[0]

    def audit_problems_left(self, pipeline: str, since: datetime, page: int = 1000) -> Iterator[AuditRecord]:
        """The keys audit_queue() queued whose last audit, before `since` (a run's start), found a problem: those
        the run did not read again (outside its --limit, or it stopped), which the ledger still holds
        damaged, missing or unreadable."""
        rows = self._queue_pages(f"{', '.join(f'a.{f.name}' for f in fields(AuditRecord))} FROM audit_queued q "
                                 f"JOIN audits a ON a.pipeline=? AND a.key=q.key WHERE a.audited < ? AND a.outcome "
                                 f"IN ({_AUDIT_PROBLEM_MARKS})", (pipeline, _ts(since), *AUDIT_PROBLEMS), page)
        return (AuditRecord(*row) for row in rows)

    def audit_queued(self, page: int = 1000) -> Iterator[tuple[str, str]]:
        """The (key, payload) entries audit_queue() queued, in its order, a page at a time."""
        return self._queue_pages("q.key, q.payload FROM audit_queued q WHERE 1", (), page)

    def _queue_pages(self, select: str, args: tuple, page: int) -> Iterator[tuple]:
        """The rows `select` gives of audit_queued (`q`; its WHERE last) in queue order, a page at a time: no read
        transaction stays open while the caller reads the store."""
        after = 0
        while True:
            rows = self._rows(f"SELECT q.rowid, {select} AND q.rowid > ? ORDER BY q.rowid LIMIT ?",
                              (*args, after, page))
            yield from (row[1:] for row in rows)
            if len(rows) < page:
                return
            after = rows[-1][0]
