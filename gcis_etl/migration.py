"""Migration scripts and the context they run in.

A script is a module in migrations/ (or any .py path) whose `main(args) -> exit code` is made by @migration:

    @migration(__doc__)
    @click.option("--pipeline", "name", required=True)
    def main(ctx: MigrationContext, name: str) -> None:
        ctx.harvest(name, full=True)

@migration adds the options every script shares (--config, --dry-run, --log-json, -v), loads the
configuration, makes the first Ctrl-C or SIGTERM a clean stop, and ends with the report: a summary on stdout
and, unless --dry-run, a JSON summary and a CSV of the problems and destructive actions in <state_dir>/reports,
named <script>-<pipeline>-<timestamp> for a script given one pipeline (its --pipeline NAME, the `name` parameter),
<script>-<timestamp> otherwise; they are kept until removed by hand (no retention, unlike run reports).
Exit codes are those of `gcis-etl harvest`: 0 done; 1 some items or keys failed or were rejected, or the
migration stopped on an error; 2 configuration or usage error; 3 another run holds the pipeline; 128 + the
signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP) stopped by a signal; a signal that came during the last
items of its last harvest run, which completed all the same, leaves it completed (its runs say what it did).

Work that is a harvest goes through harvest(), where the ledger decides what is already settled: re-running a
migration continues where the last run stopped. Other work (copying between stores) uses the stores and the
ledger directly.

From Python, migrate() runs a script as a library call: the same function, no signal handling, no logging set
up, nothing printed on stdout, from any thread; it returns the MigrationReport. run_script() is the command line's way:
it leaves the process's signal handlers and logging (logs.kept) as it found them when it returns.
"""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import signal
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Callable, TypeVar
from urllib.parse import urlsplit

import click
import yaml

from gcis_etl.commands import (CONFIG, EXIT_ITEM_FAILED, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, LIMIT, LOG_JSON, MAX_MINUTES,
                               STOPPING_SIGNALS, VERBOSE, as_stop, fail_config, stop_on_signals)
from gcis_etl.config import Config, anchor_in, anchored_store, load_config
from gcis_etl.durable import atomic_write
from gcis_etl.errors import ConfigError, GcisError, StoreError
from gcis_etl.harvesting import AT_LIMIT, HarvestOptions, Progress, TimeLimit, harvest
from gcis_etl.ledger import Ledger, now
from gcis_etl.locks import LockHeld, RunLock, pipeline_lock
from gcis_etl.models import item_label
from gcis_etl.pipelines import Pipeline
from gcis_etl.reports import PROBLEMS as RUN_PROBLEMS
from gcis_etl.reports import RunReport, counted, report_from_ledger
from gcis_etl.settings import Settings, interpolate_env, load_yaml, parse, read_yaml
from gcis_etl.stores import LocalStoreSettings, S3StoreSettings, Store, StoreSettings
from gcis_etl.supersession import Retired

if TYPE_CHECKING:
    from gcis_etl.progress import LiveLine

log = logging.getLogger(__name__)
L = TypeVar("L", bound="LiveLine")

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
PROBLEMS = (*RUN_PROBLEMS, "missing", "damaged", "unreadable")


def available() -> list[str]:
    return sorted(p.stem for p in MIGRATIONS.glob("*.py") if not p.name.startswith("_"))


_loaded: dict[Path, tuple[tuple[int, int], ModuleType]] = {}  # a script's file -> (its mtime and size, its module)
_loading = threading.RLock()  # RLock: a script that loads another as it is loaded waits for no one


def load_script(script: str) -> ModuleType:
    """The migration script `script` names (a name in migrations/, or a .py path), loaded once: every call, on any
    thread, gets the same module (a load per call executed the script again under another thread's run, whose
    objects were then of classes its module's name no longer led to: pickle, isinstance). A file changed since is
    loaded again, as the command line would run it: an edited script is not run stale (a run under way keeps the
    module it began with). Each file and version is a module of its own name, so that neither a namesake script in
    another folder nor a version loaded later takes the name a run under way pickles its classes by. ConfigError if
    there is none."""
    path = Path(script)
    if path.suffix != ".py":
        path = MIGRATIONS / f"{script}.py"
    if not path.is_file():
        raise ConfigError(f"no migration script {script!r} (available: {', '.join(available()) or 'none yet'})")
    path = path.resolve()
    with _loading:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        known = _loaded.get(path)
        if known and known[0] == version:
            return known[1]
        name = f"gcis_migration_{path.stem}_{hashlib.sha256(f'{path}:{version}'.encode()).hexdigest()[:12]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the script is being loaded
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]  # as a failed import leaves it: the next call tries again
            raise
        _loaded[path] = (version, module)
        return module


def run_script(script: str, args: list[str]) -> int:
    """`gcis-migrate SCRIPT ARGS...`: its exit code. A command line (summary on stdout, its own log handler,
    Ctrl-C and SIGTERM a clean stop), which leaves the signal handlers and logging as it found them (logs.kept)."""
    try:
        module = load_script(script)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        return EXIT_USAGE
    return int(module.main(args) or 0)


def migrate(script: str, config: Config | str | os.PathLike, *, dry_run: bool = False,
            stop: threading.Event | None = None, **options: Any) -> MigrationReport:
    """Run migration script `script` (a name in migrations/, as available() lists them, or a .py path) as a library
    call: what `gcis-migrate SCRIPT` does, by the same function, returning its MigrationReport (which says how the
    command would have exited: report.exit_code). It installs no signal handler, sets up no logging (its lines go
    to the caller's loggers, "gcis_etl.migration" among them: with none set up, Python shows the WARNING ones on
    stderr), prints nothing on stdout, and may run on any thread. The script is loaded once, and again when its
    file changes (load_script).

    `config`: a Config, or the path of a config.yaml (load_config). `options`: the script's own options, named
    as `gcis-migrate SCRIPT --help` lists them without the dashes (pipeline="museum", older_than=90, repair=True;
    its parameter's name, such as name="museum", is taken too), checked as the command line checks them; the
    others take the command line's defaults. `stop`: the caller's threading.Event; set, the migration finishes
    what is in flight and stops, its report "stopped" (exit_code 1). A harvest run it makes writes its own run
    report, as `gcis-etl harvest` does. Raises ConfigError for an unknown script, a bad configuration or an
    option that is unknown, missing or out of range; LockHeld never (another run holding the pipeline is the
    report's status "stopped", exit_code 3); what a script raises that is no GcisError (a bug) goes through."""
    migration: Migration = load_script(script).main.migration
    if not isinstance(config, Config):
        config = load_config(config)
    try:
        return migration.run(config, migration.options(options), dry_run, stop=stop or threading.Event(),
                             terminal=False)
    except click.ClickException as exc:  # a value the script itself checks (move_store's --to-store)
        raise ConfigError(f"{migration.script}: {exc.format_message()}") from None


# ------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Event:
    subject: str  # a store key, or an item (models.item_label)
    outcome: str
    reason: str = ""


class MigrationReport:
    """What a migration did: counts by outcome, the harvest runs it made, the first problems, and (written as
    they happen, so a move of millions of keys, or a load of millions of rejected items, holds only counts in
    memory) a CSV row for every problem, its harvest runs' among them, and every listed action such as a
    deletion. A folder that cannot be written loses the files, not the migration: a warning, then the summary.

    What migrate() returns, once the migration has ended:
      script, pipeline   the script's name; the one pipeline it worked on (None for one on several: reencode)
      status             "completed", "dry-run", "stopped" (a stop asked for, a limit spent, another run holding
                         the pipeline) or "stopped on an error"
      exit_code          how `gcis-migrate` exits for it: 0 done; 1 problems, or stopped (a caller's stop) or
                         stopped on an error; 3 another run holds the pipeline; 128 + n stopped by signal n
      counts             outcome -> how many ("ok", "damaged", "missing", "copied", "deposited", ...; a dry run's
                         "would ..."): the script's --help says what each means
      notes              what the summary's "note:" lines say (why it stopped, what is left, what to do)
      problems           the first SHOWN problems, each an Event(subject, outcome, reason); problems_total: all
      runs               the ids of the harvest runs it made (`gcis-etl report RUN`)
      started, finished  ISO 8601 times
      json_file          the JSON summary written under <state_dir>/reports, or None (a dry run, or a folder
                         that could not be written: a warning is logged)
      csv_file           the CSV with one row per problem and listed action (deletion, kept key), or None
                         (nothing to list, a dry run, or not written)
      summary()          what the command line prints"""

    SHOWN = 10

    def __init__(self, script: str, dry_run: bool, directory: Path, pipeline: str | None = None):
        """`pipeline`: the one the script works on (its --pipeline), which the report's file names and its JSON
        name too: <script>-<pipeline>-<timestamp>.json/.csv; None for a script on several (reencode)."""
        self.script = script
        self.pipeline = pipeline
        self.directory = directory
        self.started = now().isoformat()
        self.finished: str | None = None
        self.status = "dry-run" if dry_run else "completed"
        self.counts: dict[str, int] = {}
        self.runs: list[int] = []
        self.problems: list[Event] = []  # the first SHOWN
        self.problems_total = 0
        self.notes: list[str] = []
        self.cut_short = EXIT_OK  # the exit code of what stopped it short: a lock held, a signal, a caller's stop
        stem = "-".join(filter(None, (script, pipeline, now().strftime('%Y%m%dT%H%M%S-%f'))))
        self.json_path = None if dry_run else directory / f"{stem}.json"
        self.csv_path = None if dry_run else directory / f"{stem}.csv"
        self._csv: IO[str] | None = None
        self._unwritten: str | None = None  # why the files could not be written
        self._lock = threading.Lock()

    def event(self, subject: str, outcome: str, reason: str = "", listed: bool = True) -> None:
        """Count `outcome` for `subject` and log it (a problem at WARNING, as a harvest logs a rejected or failed
        item); problems, and listed outcomes, also go to the CSV."""
        log.log(logging.WARNING if outcome in PROBLEMS else logging.INFO, "%s %s%s", outcome, subject,
                f": {reason}" if reason else "", extra={"script": self.script, "subject": subject, "outcome": outcome})
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if outcome in PROBLEMS:
                self._problem(Event(subject, outcome, reason), now().isoformat())
            elif listed:
                self._row([subject, outcome, reason, now().isoformat()])

    def add(self, outcome: str, n: int) -> None:
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + n

    def add_run(self, run: RunReport) -> None:
        """A harvest run made by the migration (it wrote its own report; here its counts, and its problems for
        the summary and the CSV). A run read back after a crash holds only its first problems: a note says
        where the others are."""
        for outcome, n in run.counts.items():
            self.add(f"would {outcome}" if run.status == "dry-run" else outcome, n)
        if run.run_id is not None:
            self.runs.append(run.run_id)
            self.add("manifests published", run.manifests)
        with self._lock:
            for item in run.problems:
                self._problem(Event(item_label(item.object_id, item.item_id), item.outcome, item.reason or ""), item.at)
            unread = (run.problems_total or 0) - len(run.problems)
            self.problems_total += max(unread, 0)
        if unread > 0:
            self.notes.append(f"{run.pipeline}: run {run.run_id}: {counted(unread, 'more problem')} than the CSV "
                              f"lists: `gcis-etl report {run.run_id} --json` lists them all")
        if run.status == "stopped":
            self.status = "stopped"
            self.notes.append(f"{run.pipeline}: run {run.run_id}: {run.note}; run again to continue")

    def stop(self, status: str, note: str) -> None:
        self.status = status
        self.notes.append(note)

    @property
    def exit_code(self) -> int:
        stopped_on_error = self.status == "stopped on an error"
        found = EXIT_ITEM_FAILED if stopped_on_error or any(self.counts.get(p) for p in PROBLEMS) else EXIT_OK
        return max(found, self.cut_short)

    @property
    def json_file(self) -> Path | None:
        """The JSON summary, once written (finish())."""
        return self.json_path if self.finished and self.json_path and not self._unwritten else None

    @property
    def csv_file(self) -> Path | None:
        """The CSV of problems and listed actions, if any row was written."""
        return self.csv_path if self._csv and not self._unwritten else None

    def to_dict(self) -> dict[str, Any]:
        return {"script": self.script, "pipeline": self.pipeline, "status": self.status, "started": self.started,
                "finished": self.finished, "counts": self.counts, "harvest_runs": self.runs, "notes": self.notes,
                "problems": [vars(p) for p in self.problems], "problems_total": self.problems_total,
                "csv_path": str(self.csv_path) if self._csv else None}

    def headline(self) -> str:
        counts = ", ".join(_phrase(n, outcome) for outcome, n in self.counts.items() if n) or (
            "nothing done" if self.status.startswith("stopped") else "nothing to do")
        return f"{self.script}: {self.status}: {counts}"

    def ended(self, exit_code: int) -> None:
        """One log line at the end, as a harvest run's (--log-json): INFO when it exits 0, WARNING otherwise."""
        note = "; ".join(self.notes) or None
        log.log(logging.INFO if exit_code == EXIT_OK else logging.WARNING, "%s",
                "; ".join(filter(None, (self.headline(), note))),
                extra={"script": self.script, "pipeline": self.pipeline, "status": self.status, "counts": self.counts,
                       "note": note,
                       "harvest_runs": self.runs, "problems_total": self.problems_total, "exit_code": exit_code,
                       "report": str(self.json_file) if self.json_file else None})

    def summary(self) -> str:
        lines = [self.headline()]
        if self.runs:
            lines.append(f"  harvest runs {self.runs[0]}..{self.runs[-1]} (`gcis-etl report RUN` for each)"
                         if len(self.runs) > 1 else f"  harvest run {self.runs[0]} (`gcis-etl report {self.runs[0]}`)")
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  {p.outcome}: {p.subject}: {p.reason}" for p in self.problems]
        if self.problems_total > len(self.problems):
            lines.append(f"  ... and {self.problems_total - len(self.problems)} more ({self._listed_in()})")
        if self.csv_file:
            lines.append(f"  one line per problem, deletion, kept key or item no longer in the source: "
                         f"{self.csv_file}")
        if self.json_file:
            lines.append(f"  report: {self.json_file}")
        return "\n".join(lines)

    def finish(self) -> None:
        self.finished = now().isoformat()
        self.close()
        if self.json_path and not self._unwritten:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                atomic_write(self.json_path, json.dumps(self.to_dict(), indent=2) + "\n")
            except OSError as exc:
                self._not_written(exc)

    def close(self) -> None:
        """The CSV closed, its rows written: by finish(), and by Migration.run whatever ends the run (a script's
        bug, a ConfigError, a second Ctrl-C), which left its file open."""
        with self._lock:
            if self._csv and not self._csv.closed:
                try:
                    self._csv.close()
                except OSError as exc:
                    self._not_written(exc)

    def _problem(self, event: Event, at: str | None) -> None:
        """Under the lock."""
        self.problems_total += 1
        if len(self.problems) < self.SHOWN:
            self.problems.append(event)
        self._row([event.subject, event.outcome, event.reason, at or ""])

    def _row(self, row: list[str]) -> None:
        """Under the lock."""
        if self.csv_path is None or self._unwritten:
            return
        try:
            if self._csv is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._csv = open(self.csv_path, "w", newline="", buffering=1)
                csv.writer(self._csv).writerow(["subject", "outcome", "reason", "at"])
            csv.writer(self._csv).writerow(row)
        except OSError as exc:
            self._not_written(exc)

    def _not_written(self, exc: OSError) -> None:
        """Once: the migration goes on, and its summary is all there is of its report."""
        if self._unwritten is None:
            self._unwritten = exc.strerror or str(exc)
            log.warning("%s: the migration's report was not written under %s: %s; only its summary is shown",
                        self.script, self.directory, self._unwritten, extra={"script": self.script})

    def _listed_in(self) -> str:
        """Where the problems the summary leaves out are."""
        if self.csv_path is None:
            return "a dry run writes no CSV; -v logs each"
        if self._unwritten:
            return f"no CSV of them: {self._unwritten}; -v logs each"
        return f"see {self.csv_path}"


_COUNTED_NOUNS = frozenset({"objects", "manifests", "masters"})  # those the scripts' outcomes name in the plural


def _phrase(n: int, outcome: str) -> str:
    """"1 object already loaded", not "1 objects ...": the report's counts keep the outcome as it is."""
    return f"{n} {' '.join(word[:-1] if n == 1 and word in _COUNTED_NOUNS else word for word in outcome.split())}"


# ------------------------------------------------------------------------------------------------ context


@dataclass
class Budget(TimeLimit):
    """--limit (items) and --max-minutes (`minutes`) across every harvest run of a migration: each run gets what is
    left, one after another (runs are not known ahead, so share() of one). Without --max-minutes there is no time
    limit (a pipeline's max_run_minutes is a cron limit)."""

    limit: int | None = None
    processed: int = 0

    def exhausted(self) -> str | None:
        """Why no further harvest run may start, or None."""
        if self.minutes_left() <= 0:
            return f"--max-minutes {self.minutes:g} spent"
        if self.limit is not None and self.processed >= self.limit:
            return f"--limit {self.limit} reached"
        return None

    def options(self, **options: Any) -> HarvestOptions:
        limit = None if self.limit is None else self.limit - self.processed
        # spent since exhausted() said otherwise: NO_TIME_LEFT, and the run stops before its first item
        return self.handed(HarvestOptions(limit=limit, **options))

    def spend(self, run: RunReport) -> None:
        self.processed += sum(run.counts.get(outcome, 0) for outcome in ("deposited", "rejected", "failed"))

    def worded(self, note: str | None) -> str | None:
        """A run's note, naming --limit where the harvest named what was left of it for the run (options())."""
        cut_short, sep, rest = (note or "").partition("; ")
        if self.limit is None or not cut_short.startswith(AT_LIMIT):
            return note
        return f"stopped at the migration's limit of {counted(self.limit, 'item')}{sep}{rest}"


class RetiredReported:
    """A harvest run's progress, with each old access master the run retires (gcis_etl/supersession.py) in the
    report as it happens: the CSV of a migration killed during a run holds what it deleted."""

    def __init__(self, shown: Progress, report: MigrationReport):
        self.shown = shown
        self.report = report

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shown, name)

    def retired(self, retired: Retired) -> None:
        self.report.event(retired.key, "old access masters kept" if retired.kept else "old access masters deleted",
                          f"replaced by {retired.replaced_by}" if retired.replaced_by else "its item is gone")
        self.shown.retired(retired)


@dataclass
class MigrationContext:
    """What a script works with: the configuration, the ledger, stores, harvest runs, the report."""

    config: Config
    report: MigrationReport
    dry_run: bool = False
    verbose: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    budget: Budget = field(default_factory=Budget)
    stop_heeded: bool = False  # a harvest run met the stop: the report's status says whether it left work undone
    terminal: bool = True  # the command line's: live lines where stderr is a terminal; migrate() draws none

    def shown(self, progress: L) -> L:
        """A script's live line (gcis_etl.progress), drawn only for the command line: a library call's stderr
        may be a terminal (a REPL), and is not its to draw on."""
        progress.live = progress.live and self.terminal
        return progress

    def pipeline(self, name: str) -> Pipeline:
        return self.config.pipeline(name)

    def ledger(self) -> Ledger:
        """Read-only in a dry run, which changes nothing: not even by creating the ledger (a missing one reads as
        empty, so the dry run says what a first run would do)."""
        return Ledger.open(self.config, read_only=self.dry_run)

    def lock(self, name: str) -> RunLock:
        """The pipeline's run lock (the one harvest takes), for work that must not overlap a harvest."""
        return pipeline_lock(self.config.state_dir, name)

    def scratch(self, name: str) -> Path:
        """Room for temporary files of this script on pipeline `name` (created by whoever writes there)."""
        return self.config.state_dir / "scratch" / f"{self.report.script}-{name}"

    def harvest(self, name: str, **options: Any) -> bool:
        """One harvest run of pipeline `name` with `options` (HarvestOptions fields) within the budget, added to
        the report; False when the migration should go no further (stopped, out of budget, run cut short).
        A stop or a budget spent is reported here, when a run would start: a run the signal reached during its
        last items completes, and the migration is stopped only if it has another run to make."""
        from gcis_etl.progress import progress_for
        if self.stop.is_set():
            self.report.stop("stopped", "stopped on request: run again to continue")
            return False
        spent = self.budget.exhausted()
        if spent:
            self.report.stop("stopped", f"{spent} before {name}'s next harvest run: run again to continue")
            return False
        progress = RetiredReported(self.shown(progress_for(name)), self.report)
        with self.ledger() as ledger:
            last = next((r.run_id for r in ledger.runs(name, limit=1)), 0)
        try:
            run = harvest(self.config, name, self.budget.options(dry_run=self.dry_run, **options), progress,
                          self.stop)
        except GcisError:
            with self.ledger() as ledger:  # what the run settled before it crashed counts too
                for crashed in ledger.runs(name, limit=1):
                    if crashed.run_id > last:
                        self.report.add_run(report_from_ledger(ledger, crashed, shown=self.report.SHOWN))
            raise
        finally:
            progress.clear()
        self.report.add_run(replace(run, note=self.budget.worded(run.note)))
        self.budget.spend(run)
        if self.verbose:
            for planned in run.planned:
                click.echo(planned.line())
        self.stop_heeded = self.stop.is_set()  # a run that completed all the same left nothing undone
        return run.status in ("completed", "dry-run")


# ------------------------------------------------------------------------------------------------- stores


class _StoreSpec(Settings):
    store: StoreSettings


def store_settings(spec: str, option: str) -> LocalStoreSettings | S3StoreSettings:
    """A store given on the command line: a YAML/JSON file, or an inline mapping, written like a pipeline's
    `store:` section (optionally under a top-level `store:` key). A relative local root is relative to the
    file's folder (to the working directory when inline), as in config.yaml."""
    path = Path(spec)
    if path.is_file():
        data, source, base = read_yaml(path), str(path), path.resolve().parent
    else:
        try:
            data = load_yaml(spec)
        except yaml.YAMLError:
            data = None
        source, base = option, Path.cwd()
        if not isinstance(data, dict):
            raise click.BadParameter(f"{spec!r} is neither a file nor a mapping such as "
                                     f"'{{kind: s3, bucket: NAME, prefix: PREFIX}}'", param_hint=option)
    if isinstance(data, dict) and set(data) == {"store"}:
        data = data["store"]
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a store mapping (kind: local or s3, ...)")
    data = anchored_store(interpolate_env(data, "store"), anchor_in(base))
    return parse(_StoreSpec, {"store": data}, source).store


def same_store(a: LocalStoreSettings | S3StoreSettings, b: LocalStoreSettings | S3StoreSettings) -> bool:
    """Whether two store settings name the same objects. Only what names them counts: a local root wherever its
    symlinks lead; an S3 server, bucket and prefix. Not how they are reached (region, addressing style,
    retries...): comparing whole settings took the live store, given without its region, for another one."""
    if isinstance(a, S3StoreSettings) and isinstance(b, S3StoreSettings):
        return (_s3_server(a.endpoint_url), a.bucket, a.prefix) == (_s3_server(b.endpoint_url), b.bucket, b.prefix)
    if isinstance(a, LocalStoreSettings) and isinstance(b, LocalStoreSettings):
        try:
            return a.root.samefile(b.root)
        except OSError:  # a root not made yet
            return a.root.resolve() == b.root.resolve()
    return False


def _s3_server(endpoint_url: str | None) -> str:
    """AWS for no endpoint or any *.amazonaws.com one (a bucket name is unique across its regions), otherwise
    host:port/path with the scheme's default port."""
    if endpoint_url is None:
        return "aws"
    url = urlsplit(endpoint_url)
    if url.hostname == "amazonaws.com" or url.hostname.endswith(".amazonaws.com"):
        return "aws"
    return f"{url.hostname}:{url.port or (443 if url.scheme == 'https' else 80)}{url.path.rstrip('/')}"


def shows_through(written: Store, read: Store) -> bool:
    """Whether an object put in `written` can be read from `read`: the same objects reached two ways that no
    comparison of settings sees (another host name for the server, a bind mount). The object is removed; one
    that cannot be (a policy without s3:DeleteObject) is a warning naming it, and the answer stands."""
    key = f"gcis-etl-store-check-{uuid.uuid4().hex}"
    written.put_bytes(key, b"gcis-etl: are these two stores one?\n", content_type="text/plain")
    try:
        return read.exists(key)
    finally:
        try:
            written.delete(key)
        except StoreError as exc:
            log.warning("the store check object was left behind: %s; delete it by hand", exc, extra={"key": key})


# ------------------------------------------------------------------------------------------------ scripts


def _common_options() -> list[click.Parameter]:
    return [CONFIG.param(), click.Option(["--dry-run"], is_flag=True, help="Say what would be done; change nothing."),
            LOG_JSON.param(), VERBOSE.param()]


@dataclass(frozen=True)
class Migration:
    """A script's function and the command line made of it: run() is what both the command line (the callback
    of `command`) and migrate() run."""

    script: str
    function: Callable[..., None]
    budget: bool
    command: click.Command

    def run(self, config: Config, options: dict[str, Any], dry_run: bool = False, verbose: int = 0,
            stop: threading.Event | None = None, terminal: bool = True) -> MigrationReport:
        """The script's function on `options` (its own, as click gives them), ended with its report finished and
        the exit code set; a ConfigError, or what is not a GcisError, is raised (the report's CSV closed). `stop`:
        a StopRequest for the command line (a signal sets it), a caller's Event otherwise. `terminal`:
        MigrationContext.terminal."""
        pipeline = options.get("name")  # a script's --pipeline, when it takes one pipeline
        ctx = MigrationContext(config, MigrationReport(self.script, dry_run, config.reports_dir,
                                                       pipeline if isinstance(pipeline, str) else None),
                               dry_run, verbose, stop or threading.Event(), terminal=terminal)
        options = dict(options)
        if self.budget:
            ctx.budget = Budget(options.pop("limit"), minutes=options.pop("max_minutes"))
        try:
            self.function(ctx, **options)
        except LockHeld as exc:
            ctx.report.stop("stopped", str(exc))
            ctx.report.cut_short = EXIT_LOCKED
        except ConfigError:
            raise
        except GcisError as exc:
            ctx.report.stop("stopped on an error", f"{type(exc).__name__}: {exc} (everything settled so far "
                                                    f"is recorded: remove the cause and run again)")
        finally:
            ctx.report.close()
        if ctx.stop.is_set() and ctx.report.status == "completed" and not ctx.stop_heeded:
            ctx.report.stop("stopped", "stopped on request: run again to continue")
        ctx.report.finish()
        if ctx.report.status != "completed":
            ctx.report.cut_short = max(ctx.report.cut_short, as_stop(ctx.stop).exit_code)
        return ctx.report

    def options(self, given: dict[str, Any]) -> dict[str, Any]:
        """A library caller's options (by the long option's name, dashes as underscores, or the parameter's
        name) as the command line gives them to the function: each given one parsed and checked as its flag
        would be, the others their defaults. ConfigError names an unknown, missing or bad one."""
        own = [p for p in self.command.params if p.name not in _COMMON]
        named = {key: p for p in own for key in (p.name, *(o[2:].replace("-", "_") for o in p.opts
                                                           if o.startswith("--")))}
        unknown = sorted(set(given) - set(named))
        if unknown:
            raise ConfigError(f"{self.script}: no option {', '.join(map(repr, unknown))} (it takes "
                              f"{', '.join(sorted({p.opts[0][2:].replace('-', '_') for p in own}))})")
        args: list[str] = []
        for key, value in given.items():
            param = named[key]
            if [k for k in given if named[k] is param] != [key]:
                raise ConfigError(f"{self.script}: {param.opts[0]} given twice: as "
                                  f"{' and '.join(k for k in given if named[k] is param)}")
            args += _flagged(param, value, self.script)
        try:
            parsed = self.command.make_context(f"gcis-migrate {self.script}", args).params
        except click.ClickException as exc:
            raise ConfigError(f"{self.script}: {exc.format_message()}") from None
        return {p.name: parsed[p.name] for p in own}


_COMMON = frozenset({"config_file", "dry_run", "log_json", "verbose"})  # _common_options(): not a script's own


def _flagged(param: click.Parameter, value: Any, script: str) -> list[str]:
    """`value` as the command line would give it to `param`: its flag alone for True, nothing for False or None
    (the default), the flag once per value of a repeatable option."""
    flag = next(o for o in param.opts if o.startswith("--"))
    if value is None:
        return []
    if getattr(param, "is_flag", False):
        if not isinstance(value, bool):
            raise ConfigError(f"{script}: {flag} is True or False, not {value!r}")
        off = param.secondary_opts[:1]  # a --x/--no-x flag: False says so, which may not be its default
        return [flag] if value else off
    values = value if param.multiple and isinstance(value, (list, tuple)) else [value]
    return [f"{flag}={os.fspath(v) if isinstance(v, os.PathLike) else v}" for v in values]


def migration(help_text: str, budget: bool = False,
              in_flight: str = "items") -> Callable[[Callable[..., None]], Callable[[list[str]], int]]:
    """Make a script's `main(args) -> exit code` from `function(ctx, **its click options)`. With `budget`, the
    script takes --limit and --max-minutes, handed to it as ctx.budget for its harvest runs to share.
    `in_flight`: what a Ctrl-C says the script finishes first ("keys" for one that reads store keys).
    `main.migration` is the Migration, which migrate() runs."""

    def decorate(function: Callable[..., None]) -> Callable[[list[str]], int]:
        script = Path(inspect.getfile(function)).stem

        def callback(config_file: str | None, dry_run: bool, log_json: bool, verbose: int, **options: Any) -> int:
            from gcis_etl.logs import configure, say
            configure(log_json, verbose)
            config = load_config(config_file)
            handlers = {signum: signal.getsignal(signum) for signum in STOPPING_SIGNALS}
            stop = stop_on_signals(in_flight)
            try:
                report = migration.run(config, options, dry_run, verbose, stop)
            finally:  # a second Ctrl-C that abandoned the work in flight left the defaults: the process is ending
                if not stop.abandoned:
                    for signum, handler in handlers.items():
                        signal.signal(signum, handler)
            if log_json and report.status == "stopped on an error":  # otherwise the summary says it
                say(f"{script}: stopped on an error: {report.notes[-1]}", script=script)
            elif log_json and report.cut_short == EXIT_LOCKED:
                say(f"{script}: {report.notes[-1]}", script=script)
            click.echo(report.summary())
            if log_json:
                report.ended(report.exit_code)
            return report.exit_code

        params = _common_options() + list(reversed(getattr(function, "__click_params__", []))) + (
            [LIMIT.param(), MAX_MINUTES.param()] if budget else [])
        command = click.Command(script, callback=callback, params=params, help=help_text,
                                context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
        unnamed = [p.human_readable_name for p in command.params
                   if not any(o.startswith("--") for o in getattr(p, "opts", ()))]
        if unnamed:  # migrate() names a script's options as their --long flags
            raise TypeError(f"migration script {script}: {', '.join(unnamed)} has no --long option name")
        migration = Migration(script, function, budget, command)

        def main(args: list[str]) -> int:
            from gcis_etl.logs import kept
            with kept():  # the command line sets logging up (logs.configure) for its run only
                try:
                    return command.main(args, prog_name=f"gcis-migrate {script}", standalone_mode=False)
                except click.ClickException as exc:
                    exc.show()
                    return EXIT_USAGE
                except ConfigError as exc:
                    fail_config(exc)
                except click.Abort:
                    click.echo("aborted", err=True)
                    return EXIT_ITEM_FAILED

        main.command = command
        main.migration = migration
        return main

    return decorate
