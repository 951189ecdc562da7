"""Run reports: a JSON summary and a CSV of the items that did not end well, written next to the ledger; and
where a pipeline stands (`gcis-etl status`).

Built from the ledger alone, so `gcis-etl report RUN` gives the same document for any past run, including one
that crashed before it could write its own.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gcis_etl.durable import atomic_write
from gcis_etl.ledger import COUNTED, MANIFEST, Ledger, RunItem, RunRecord

PROBLEMS = ("rejected", "failed")
PLANNED = ("process", "skip", "fail")  # a dry run's actions; fail: an object the source cannot describe


@dataclass(frozen=True)
class PlannedItem:
    """What a dry run would do with an item."""

    object_id: str
    item_id: str
    action: str  # one of PLANNED
    reason: str


@dataclass
class RunReport:
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
    problems: list[RunItem] = field(default_factory=list)
    planned: list[PlannedItem] = field(default_factory=list)
    json_path: str | None = None
    csv_path: str | None = None

    @property
    def exit_code(self) -> int:
        """0: everything deposited or skipped; 1: some items rejected or failed."""
        return 1 if any(self.counts.get(name) for name in PROBLEMS) else 0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        counts = ", ".join(f"{self.counts.get(name, 0)} {name}" for name in COUNTED)
        lines = [f"{self.pipeline}: run {self.run_id} {self.status}: {counts}; {self.manifests} manifests published"]
        if not any(self.counts.values()):
            lines.append(f"  nothing changed in the source since {self.since or 'the beginning'}")
        if self.checkpoint_after:
            lines.append(f"  checkpoint now {self.checkpoint_after}")
        if self.note:
            lines.append(f"  note: {self.note}")
        for problem in self.problems[:10]:
            lines.append(f"  {problem.outcome}: {problem.object_id}/{problem.item_id}: {problem.reason}")
        if len(self.problems) > 10:
            lines.append(f"  ... and {len(self.problems) - 10} more (see {self.csv_path or 'the CSV report'})")
        if self.json_path:
            lines.append(f"  report: {self.json_path}")
        return "\n".join(lines)


def report_from_ledger(ledger: Ledger, run: RunRecord) -> RunReport:
    problems = [item for name in PROBLEMS for item in ledger.run_items(run.run_id, name)]
    return RunReport(pipeline=run.pipeline, run_id=run.run_id, status=run.status, started=run.started,
                     finished=run.finished, since=run.since, until=run.until, checkpoint_after=run.checkpoint_after,
                     counts=ledger.counts_so_far(run), manifests=run.manifests, note=run.note, problems=problems)


def write_report(report: RunReport, directory: Path) -> RunReport:
    """Write `<pipeline>-run<N>.json` and `<pipeline>-run<N>-problems.csv` atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{report.pipeline}-run{report.run_id}"
    report.json_path = str(directory / f"{stem}.json")
    report.csv_path = str(directory / f"{stem}-problems.csv")
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["object_id", "item_id", "outcome", "reason", "seconds", "at"])
    for item in report.problems:
        writer.writerow([item.object_id, item.item_id, item.outcome, item.reason, item.seconds, item.at])
    atomic_write(Path(report.csv_path), text.getvalue())
    atomic_write(Path(report.json_path), json.dumps(report.to_dict(), indent=2) + "\n")
    return report


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

    def to_dict(self) -> dict:
        run = self.last_run
        return {"pipeline": self.pipeline, "checkpoint": self.checkpoint, "items": self.items,
                "last_run": {"run_id": run.run_id, "status": run.status, "started": run.started,
                             "finished": run.finished, **self.last_run_counts} if run else None,
                "problems": [asdict(p) for p in self.problems]}

    def summary(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in self.items.items())
        lines = [self.pipeline, f"  checkpoint: {self.checkpoint or 'none (the next run reads everything)'}",
                 f"  items: {counts}"]
        if self.last_run:
            lines.append(f"  last run: {self.last_run.run_id} {self.last_run.status}, started {self.last_run.started}, "
                         + ", ".join(f"{n} {k}" for k, n in self.last_run_counts.items()))
        lines += [f"  {p.status}: {p.object_id}/{p.item_id} (attempts {p.attempts}): {p.reason}" for p in self.problems]
        return "\n".join(lines)


def pipeline_status(ledger: Ledger, pipeline: str, shown: int = 10) -> PipelineStatus:
    """Its problems: the first `shown` failed items, rejected items and rejected manifests, each kept in the
    ledger until a later run settles them (a rejected manifest, until one is published)."""
    checkpoint = ledger.checkpoint(pipeline)
    run = next(iter(ledger.runs(pipeline, limit=1)), None)
    problems = [Problem(r.object_id, r.item_id, r.status, r.attempts, r.reason)
                for status in ("failed", "rejected") for r in ledger.items(pipeline, status=status)[:shown]]
    problems += [Problem(m.object_id, MANIFEST, "rejected", 0, m.reason)
                 for m in ledger.manifest_problems(pipeline)[:shown]]
    return PipelineStatus(pipeline, checkpoint.isoformat() if checkpoint else None, ledger.counts(pipeline), run,
                          ledger.counts_so_far(run) if run else {}, problems)
