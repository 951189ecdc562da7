"""Run reports: a JSON summary and, when some items did not end well, a CSV of them, written next to the ledger;
and where a pipeline stands (`gcis-etl status`).

Built from the ledger alone, so `gcis-etl report RUN` gives the same document for any past run, including one
that crashed before it could write its own, or whose files were pruned (prune_reports).
"""
from __future__ import annotations

import csv
import glob
import io
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from gcis_etl.commands import EXIT_ITEM_FAILED, EXIT_OK
from gcis_etl.durable import atomic_write
from gcis_etl.ledger import COUNTED, MANIFEST, OBJECT, STOPPED_BY_SIGNAL, Ledger, RunItem, RunRecord
from gcis_etl.locks import RunLock
from gcis_etl.logs import printable
from gcis_etl.models import item_label

log = logging.getLogger(__name__)

PROBLEMS = ("rejected", "failed")
SHOWN = 10  # of each list in a report's summary (its JSON has them all), of each kind of problem in `status`
PLANNED = ("process", "skip", "fail")  # a dry run's actions; fail: an object the source cannot describe
ENDED_UNFINISHED = "ended without finishing (killed?)"  # a run shown as running whose process is gone


@dataclass(frozen=True)
class PlannedItem:
    """What a dry run would do with an item."""

    object_id: str
    item_id: str
    action: str  # one of PLANNED
    reason: str

    def line(self) -> str:
        """As a dry run lists it: `gcis-etl harvest --dry-run`, and a migration script's with -v."""
        return printable(f"{self.action:8} {item_label(self.object_id, self.item_id)}: {self.reason}")


@dataclass(frozen=True)
class Warned:
    """An item the run deposited, or an object whose manifests it published (item id MANIFEST), and what its
    conversion or the building of the manifests warned of."""

    object_id: str
    item_id: str
    warnings: tuple[str, ...]


@dataclass
class RunReport:
    """One harvest run, as harvest() returns it and `gcis-etl report` shows it. `status`: running, completed,
    stopped (at --limit, the time limit or on request: `note` says which), failed (its source, store, ledger
    or workers failed as a whole: `note` says why), crashed (a bug, or the run was killed) or dry-run.
    `counts`: items by outcome, deposited, skipped, rejected and failed (a dry run's: process, skip and fail,
    its items in `planned`); `problems`: the items rejected or failed; `exit_code`: the CLI's for this run;
    `summary()`: the lines it prints."""

    pipeline: str
    run_id: int | None
    status: str
    started: str | None
    finished: str | None
    since: str | None
    until: str | None
    checkpoint_after: str | None
    counts: dict[str, int]
    manifests: int
    note: str | None = None
    seconds: float | None = None  # from start to end (None: still running, or killed)
    process_gone: bool = False  # recorded as running, but nothing holds the pipeline's lock: killed
    problems: list[RunItem] = field(default_factory=list)
    problems_total: int | None = None  # when `problems` holds only the first (report_from_ledger: shown); not in JSON
    planned: list[PlannedItem] = field(default_factory=list)
    warned: list[Warned] = field(default_factory=list)  # items first, then manifests
    json_path: str | None = None
    csv_path: str | None = None

    @property
    def exit_code(self) -> int:
        """As the harvest's: 0 everything deposited or skipped; 1 some items rejected or failed, or the run did not
        complete (failed, crashed, killed, still running, or stopped by a signal: the ledger does not keep which
        signal, so 1 rather than the harvest's 130 or 143). A run stopped at its --limit or time limit exits as
        the harvest did: by its items. A dry run as the run it foresees: 1 when it would fail objects (the source
        cannot describe them), so a check before a cron entry or a migration is scriptable."""
        if self.status == "dry-run":
            return EXIT_ITEM_FAILED if self.counts.get("fail") else EXIT_OK
        unfinished = self.status not in ("completed", "stopped") or self.note in STOPPED_BY_SIGNAL
        return EXIT_ITEM_FAILED if unfinished or any(self.counts.get(name) for name in PROBLEMS) else EXIT_OK

    def to_dict(self) -> dict:
        return {name: value for name, value in asdict(self).items() if name != "problems_total"}

    def headline(self) -> str:
        if self.status == "dry-run":  # its counts are those of PLANNED, its items in `planned`
            unreadable = f", fail {self.counts['fail']} objects the source cannot describe" \
                if self.counts.get("fail") else ""
            return (f"{self.pipeline}: would process {self.counts.get('process', 0)} items, skip "
                    f"{self.counts.get('skip', 0)}{unreadable} (since {self.since or 'the beginning'})")
        counts = ", ".join(f"{self.counts.get(name, 0)} {name}" for name in COUNTED)
        shown = ENDED_UNFINISHED if self.process_gone else self.status
        return f"{self.pipeline}: run {self.run_id} {shown}: {counts}; {counted(self.manifests, 'manifest')} published"

    def took(self) -> str | None:
        return None if self.seconds is None else f"took {elapsed(self.seconds)}"

    def summary(self) -> str:
        """What a run did, in a few lines; what a dry run would do, in one (without its planned items, which
        `gcis-etl harvest --dry-run` lists before it). Each line printable: ids, and reasons and notes quoting
        them, come from the sources."""
        if self.status == "dry-run":
            return printable("; ".join(filter(None, (self.headline(), self.note))))
        lines = [self.headline()]
        if self.status == "completed" and not any(self.counts.values()):
            lines.append(f"  nothing changed in the source since {self.since or 'the beginning'}")
        if self.checkpoint_after:
            lines.append(f"  checkpoint now {self.checkpoint_after}")
        if self.note:
            lines.append(f"  note: {self.note}")
        for problem in self.problems[:SHOWN]:
            lines.append(f"  {problem.outcome}: {item_label(problem.object_id, problem.item_id)}: {problem.reason}")
        problems = len(self.problems) if self.problems_total is None else self.problems_total
        if problems > SHOWN:
            lines.append(f"  ... and {problems - SHOWN} more ({self._listed_in(self.csv_path)})")
        if self.warned:
            manifests = sum(w.item_id == MANIFEST for w in self.warned)
            lines.append(f"  {counted(len(self.warned) - manifests, 'item')} deposited with warnings, "
                         f"{counted(manifests, 'manifest')} published with warnings")
        for warned in self.warned[:SHOWN]:
            lines.append(f"  warning: {item_label(warned.object_id, warned.item_id)}: {'; '.join(warned.warnings)}")
        if len(self.warned) > SHOWN:
            lines.append(f"  ... and {len(self.warned) - SHOWN} more ({self._listed_in(self.json_path)})")
        if self.json_path:
            lines.append(f"  report: {self.json_path}")
        if self.seconds is not None:
            lines.append(f"  started {self.started}, {self.took()}")
        return "\n".join(map(printable, lines))

    def _listed_in(self, written: str | None) -> str:
        """Where the whole list is: the file the run wrote, or, when it wrote none (still running, killed) or
        it was pruned, the report rebuilt from the ledger."""
        return f"see {written}" if written else f"gcis-etl report {self.run_id} --json lists them all"


def report_from_ledger(ledger: Ledger, run: RunRecord, lock: RunLock | None = None,
                       shown: int | None = None) -> RunReport:
    """`lock`: the pipeline's, when the run may be recorded as running (`gcis-etl report`), to tell one killed
    without a trace from a live one; a harvest reporting its own finished run has no need of it. `shown`: only
    the first so many problems are read (a migration's run may have failed 100,000 items), and how many there
    are; None: all of them, for the report's files and its JSON."""
    run, gone = _unless_gone(ledger, run, lock) if lock else (run, False)
    took = datetime.fromisoformat(run.finished) - datetime.fromisoformat(run.started) if run.finished else None
    problems: list[RunItem] = []
    for name in PROBLEMS:
        problems += ledger.run_items(run.run_id, name, limit=-1 if shown is None else shown - len(problems))
    recorded = None if shown is None else ledger.recorded_counts(run.run_id)
    total = None if recorded is None else sum(recorded[name] for name in PROBLEMS)
    warned = [Warned(i.object_id, i.item_id, i.warnings) for i in ledger.run_items(run.run_id, "deposited", True)]
    warned += [Warned(m.object_id, MANIFEST, m.warnings) for m in ledger.manifest_warnings(run.run_id)]
    return RunReport(pipeline=run.pipeline, run_id=run.run_id, status=run.status, started=run.started,
                     finished=run.finished, since=run.since, until=run.until, checkpoint_after=run.checkpoint_after,
                     counts=ledger.counts_so_far(run), manifests=run.manifests, note=run.note,
                     seconds=took.total_seconds() if took else None, process_gone=gone,
                     problems=problems, problems_total=total, warned=warned)


def _unless_gone(ledger: Ledger, run: RunRecord, lock: RunLock) -> tuple[RunRecord, bool]:
    """The run, and whether its process is gone. A run killed (kill -9, power loss) stays 'running' in the ledger
    until the next run takes the pipeline's lock; a free lock tells it apart from a live run (the run is read
    again after the lock: it may have finished between the two looks)."""
    if run.status != "running" or lock.held():
        return run, False
    run = ledger.run(run.run_id)
    return run, run.status == "running"


def report_files(report: RunReport, directory: Path) -> tuple[Path, Path]:
    """Where a run's report is written: `<pipeline>-run<N>.json` and `<pipeline>-run<N>-problems.csv`."""
    stem = f"{report.pipeline}-run{report.run_id}"
    return directory / f"{stem}.json", directory / f"{stem}-problems.csv"


def with_written_files(report: RunReport, directory: Path) -> RunReport:
    """A report rebuilt from the ledger, with the paths of the files its run wrote when it ended (a run that is
    still going, or was killed, wrote none). Files under its number that tell of another start are not its: run
    numbers restart when an older ledger is put back, and a lost run's files may still be there."""
    json_path, csv_path = report_files(report, directory)
    if _started(json_path) == report.started:
        report.json_path = str(json_path)
        report.csv_path = str(csv_path) if csv_path.is_file() else None
    return report


def _started(json_path: Path) -> str | None:
    """When the run whose report `json_path` is started (None: no such file, or not a report)."""
    try:
        return json.loads(json_path.read_text()).get("started")
    except (OSError, ValueError, AttributeError):
        return None


def write_report(report: RunReport, directory: Path) -> RunReport:
    """Write the report's files (report_files) atomically: the CSV only when the run has problems (one under its
    name otherwise is a lost run's, from before an older ledger was put back: removed), its ids and reasons kept
    from running as formulas (_inert). Files that cannot be written (a full disk) are a warning, not an error:
    the run is recorded, and `gcis-etl report` rebuilds them from the ledger."""
    json_path, csv_path = report_files(report, directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if report.problems:
            text = io.StringIO()
            writer = csv.writer(text)
            writer.writerow(["object_id", "item_id", "outcome", "reason", "seconds", "at"])
            for item in report.problems:
                writer.writerow([_inert(item.object_id), _inert(item.item_id), item.outcome, _inert(item.reason),
                                 item.seconds, item.at])
            atomic_write(csv_path, text.getvalue())
            report.csv_path = str(csv_path)
        else:
            csv_path.unlink(missing_ok=True)
        report.json_path = str(json_path)
        atomic_write(json_path, json.dumps(report.to_dict(), indent=2) + "\n")
    except OSError as exc:
        report.json_path = None
        log.warning("%s: the report of run %s was not written under %s: %s; `gcis-etl report %s` shows it",
                    report.pipeline, report.run_id, directory, exc.strerror or exc, report.run_id,
                    extra={"pipeline": report.pipeline, "run_id": report.run_id})
    return report


def _inert(text: str | None) -> str | None:
    """A CSV cell from a source (an id, a reason quoting one) that a spreadsheet takes as text, not as a formula
    (`=HYPERLINK(...)` as an object id): one starting with =, +, -, @, a tab or a carriage return gets a leading
    ' (OWASP's advice on CSV injection), which a script reading the CSV takes off; the JSON report has them as
    they are."""
    return "'" + text if text and text[0] in _FORMULA else text


_FORMULA = "=+-@\t\r"


def prune_reports(directory: Path, ledger: Ledger, pipeline: str) -> None:
    """A report's files are kept as long as the ledger keeps its run's skipped items (skipped_history_runs): the
    latest runs of the pipeline, its own among them; `gcis-etl report` rebuilds an older one from the ledger."""
    oldest = ledger.runs(pipeline, limit=ledger.skipped_history_runs)[-1].run_id
    named = re.compile(rf"{re.escape(pipeline)}-run(\d+)(\.json|-problems\.csv)")
    for path in directory.glob(f"{glob.escape(pipeline)}-run*"):
        match = named.fullmatch(path.name)
        if match and int(match[1]) < oldest:
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Problem:
    """An item, or an object's manifest (item id MANIFEST), that waits for the source to change or a retry."""

    object_id: str
    item_id: str
    status: str
    attempts: int
    reason: str | None


@dataclass(frozen=True)
class PipelineStatus:
    pipeline: str
    checkpoint: str | None
    items: dict[str, int]
    last_run: RunRecord | None
    last_run_counts: dict[str, int]
    problems: list[Problem]
    process_gone: bool  # the last run is recorded as running, but nothing holds the pipeline's lock
    superseded: int = 0  # old access masters waiting until no manifest shows them (gcis_etl/supersession.py)
    problems_total: dict[str, int] = field(default_factory=dict)  # of each problem_kind: `problems` may be cut
    listing_changed: bool = False  # the checkpoint was taken under other listing settings: the next run lists all
    max_attempts: int | None = None  # the pipeline's: a failed item that had them waits for `gcis-etl retry`

    def to_dict(self) -> dict:
        run = self.last_run
        return {"pipeline": self.pipeline, "checkpoint": self.checkpoint, "listing_changed": self.listing_changed,
                "items": self.items, "max_attempts": self.max_attempts,
                "superseded_waiting": self.superseded,
                "last_run": {"run_id": run.run_id, "status": run.status, "process_gone": self.process_gone,
                             "started": run.started, "finished": run.finished, "note": run.note,
                             **self.last_run_counts} if run else None,
                "problems": [asdict(p) for p in self.problems], "problems_total": self.problems_total}

    def summary(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in self.items.items())
        changed = " (the source's listing settings changed since: the next run lists everything)" \
            if self.listing_changed else ""
        lines = [self.pipeline, f"  checkpoint: {self.checkpoint or 'none (the next run reads everything)'}{changed}",
                 f"  items: {counts}"]
        if self.superseded:
            lines.append(f"  superseded access masters: {self.superseded} wait until their objects' manifests are "
                         f"republished without them (an item failed, a manifest was rejected, a run was cut short, "
                         f"the store refused their deletion: the harvest warns why; or their object left the "
                         f"source, and its manifests stay, showing them)")
        if self.last_run:
            shown = ENDED_UNFINISHED if self.process_gone else self.last_run.status
            lines.append(f"  last run: {self.last_run.run_id} {shown}, started {self.last_run.started}, "
                         + ", ".join(f"{n} {k}" for k, n in self.last_run_counts.items()))
            if self.last_run.note:  # why it failed, stopped, or left the checkpoint where it was
                lines.append(f"    {self.last_run.note}")
        for kind, total in self.problems_total.items():
            listed = [p for p in self.problems if problem_kind(p) == kind]
            lines += [f"  {p.status}: {item_label(p.object_id, p.item_id)}{self._attempts(p)}: {p.reason}"
                      for p in listed]
            if total > len(listed):
                lines.append(f"  ... and {total - len(listed)} more {kind.replace('_', ' ')} "
                             f"(gcis-etl status {self.pipeline} --all lists them all)")
        return "\n".join(map(printable, lines))  # as RunReport.summary's

    def _attempts(self, problem: Problem) -> str:
        """A failed item's attempts, and whether the harvest still tries it or it waits for `gcis-etl retry`. An
        object the source could not describe is described again whenever the source lists it (changed, or in a
        full listing), its attempts spent or not."""
        if problem.status != "failed":
            return ""
        if self.max_attempts is None:
            return f" (attempts {problem.attempts})"
        if problem.attempts < self.max_attempts:
            then = "the next run tries again"
        elif problem.item_id == OBJECT:
            then = f"tried again when the source lists it again, or by `gcis-etl retry {self.pipeline}`"
        else:
            then = f"waits for `gcis-etl retry {self.pipeline}`"
        return f" (attempts {problem.attempts} of {self.max_attempts}: {then})"


def problem_kind(problem: Problem) -> str:
    """failed, rejected (items) or rejected_manifests."""
    return "rejected_manifests" if problem.item_id == MANIFEST else problem.status


def pipeline_status(ledger: Ledger, pipeline: str, lock: RunLock, shown: int | None = SHOWN,
                    listing: str | None = None, max_attempts: int | None = None) -> PipelineStatus:
    """Its problems: the first `shown` (None: all) failed items, rejected items and rejected manifests, each
    kept in the ledger until a later run settles them (a rejected manifest, until one is published), and how
    many there are of each. `lock`: as for report_from_ledger. `listing`: the pipeline's listing digest as
    configured now (Pipeline.listing_digest; None: not compared), against the one the checkpoint was taken under.
    `max_attempts`: the pipeline's, to tell the failed items that wait for `gcis-etl retry`."""
    checkpoint = ledger.checkpoint(pipeline)
    run = next(iter(ledger.runs(pipeline, limit=1)), None)
    run, gone = _unless_gone(ledger, run, lock) if run else (None, False)
    limit = -1 if shown is None else shown
    problems = [Problem(r.object_id, r.item_id, r.status, r.attempts, r.reason)
                for status in ("failed", "rejected") for r in ledger.items(pipeline, status=status, limit=limit)]
    problems += [Problem(m.object_id, MANIFEST, "rejected", 0, m.reason)
                 for m in ledger.manifest_problems(pipeline, limit)]
    items = ledger.counts(pipeline)
    totals = {"failed": items.get("failed", 0), "rejected": items.get("rejected", 0),
              "rejected_manifests": ledger.manifest_problems_count(pipeline)}
    return PipelineStatus(pipeline, checkpoint.isoformat() if checkpoint else None, items, run,
                          ledger.counts_so_far(run) if run else {}, problems, gone, ledger.superseded_count(pipeline),
                          totals, ledger.listing_changed(pipeline, listing), max_attempts)


def counted(n: int, noun: str) -> str:
    """"1 item", "2 items"."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def elapsed(seconds: float) -> str:
    """As people read an age or a run's length: "45 s", "3 min 12 s", "2 h 5 min"."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"
