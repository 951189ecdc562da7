"""Load a pipeline's whole backlog into its store, or only the objects named in a list.

Without --ids: a harvest of everything the source lists, whatever the pipeline's checkpoint. Re-running
continues where the last run stopped: the source is listed again and the ledger skips every settled item.
A complete run moves the checkpoint as a first harvest does (to the moment the listing started, never past an
object with unsettled items), so the cron harvests carry on from there; a run cut short (--limit,
--max-minutes, Ctrl-C) moves it only when the source lists oldest first, to where its listing stopped.

With --ids: the objects of a CSV file (column --id-column) or of a text file (one id per line, '#' comments),
in harvest runs of --batch-size objects. Objects whose manifest is published and that have no failed item are
not asked of the source again, so a re-run goes straight to what is left. The checkpoint is left alone. An id
the source does not know fails on its own: the other objects, before and after it, are loaded, and the summary
names it as failed (exit 1). Every re-run asks for it again and fails it again: remove it from the list.

The pipeline's max_run_minutes (a cron limit) does not apply; --max-minutes does. Pause the pipeline's cron
harvests meanwhile: a harvest holding the pipeline stops the migration (exit 3).

\b
Usage:
  gcis-migrate initial_load --pipeline museum                   the whole backlog
  gcis-migrate initial_load --pipeline museum --dry-run -v      what would be done, item by item
  gcis-migrate initial_load --pipeline museum --limit 100       a trial: 100 items, then run again
  gcis-migrate initial_load --pipeline library --ids pids.csv   only these objects (column object_id)
  gcis-migrate initial_load --pipeline library --ids pids.txt --max-minutes 600

\b
Exit codes: 0 done; 1 some items rejected or failed, or stopped on an error (run again);
2 configuration or usage error; 3 another run holds the pipeline; 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP)
stopped by that signal after the items in flight, or at once on a second Ctrl-C, which abandons them (what was
settled is recorded: run it again to continue).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import click

from connectors.idlist import IdListSettings, read_text
from gcis_etl.errors import SourceError
from gcis_etl.ledger import Ledger
from gcis_etl.migration import MigrationContext, migration


@migration(__doc__, budget=True)
@click.option("--pipeline", "name", required=True, help="The pipeline to load (a name under pipelines:).")
@click.option("--ids", "ids_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Only these objects: a .csv file, or a text file with one id per line.")
@click.option("--id-column", default="object_id", show_default=True, help="The column of a --ids CSV file.")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="Objects per harvest run with --ids.")
def main(ctx: MigrationContext, name: str, ids_file: Path | None, id_column: str, batch_size: int) -> None:
    pipeline = ctx.pipeline(name)
    if ids_file is None:
        ctx.harvest(name, full=True)
        return
    ids = read_ids(ids_file, id_column)
    with ctx.ledger() as ledger:
        todo = [i for i in ids if pipeline.manifests is None or not loaded(ledger, name, i)]
    ctx.report.add("objects already loaded", len(ids) - len(todo))
    for start in range(0, len(todo), batch_size):
        if not ctx.harvest(name, object_ids=tuple(todo[start:start + batch_size])):
            return


def read_ids(path: Path, column: str) -> list[str]:
    """The ids in file order, each once."""
    try:
        if path.suffix.lower() != ".csv":
            ids = IdListSettings(file=path).read()
        else:
            reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
            if column not in (reader.fieldnames or []):
                raise click.BadParameter(f"{path} has no column {column!r} (columns: "
                                         f"{', '.join(reader.fieldnames or []) or 'none'}); see --id-column",
                                         param_hint="--ids")
            ids = [(row[column] or "").strip() for row in reader]
    except SourceError as exc:
        raise click.BadParameter(str(exc), param_hint="--ids") from None
    return list(dict.fromkeys(i for i in ids if i))


def loaded(ledger: Ledger, pipeline: str, object_id: str) -> bool:
    """Published, and nothing left to retry: a harvest would only confirm it (the manifest is published only
    once every item of the object is settled)."""
    record = ledger.object(pipeline, object_id)
    return record is not None and record.published is not None \
        and not ledger.items(pipeline, object_id, status="failed", limit=1)
