"""Commands on configured pipelines: harvest (the cron job), demo, status, retry, report, config check."""
from __future__ import annotations

import json
import logging
import sys
from contextlib import contextmanager
from datetime import datetime, timezone

import click

from gcis_etl.cli import _config, main
from gcis_etl.commands import (EXIT_OK, LIMIT, LOG_JSON, MAX_MINUTES, VERBOSE, StopRequest, fail_config,
                               stop_on_signals)
from gcis_etl.errors import ConfigError
from gcis_etl.spans import SPAN_FORMATS, parse_span


class When(click.ParamType):
    """A past moment: an ISO date/time (UTC unless it says otherwise) or a span back from now (gcis_etl.spans).
    A moment in the future is refused: the harvest would look at no change at all, and say nothing of it."""

    name = "when"
    FORMATS = f"a date/time (2026-11-01, 2026-11-01T08:00, UTC unless an offset is given) or a span back " \
              f"from now: {SPAN_FORMATS}"

    def convert(self, value, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        now = datetime.now(timezone.utc)
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                return now - parse_span(text)
            except ValueError:
                self.fail(f"{value!r} is not {self.FORMATS}", param, ctx)
            except OverflowError:
                self.fail(f"{value!r} reaches back before the year 1", param, ctx)
        parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
        if parsed > now:
            self.fail(f"{value!r} is in the future (it is now {now:%Y-%m-%dT%H:%M:%SZ}): give a past moment",
                      param, ctx)
        return parsed


def _pipelines(cfg, names: tuple[str, ...]) -> list[str]:
    """The pipelines named (all when none is): a name config.yaml does not have is a configuration error (exit 2),
    said as fail_config says one (a JSON line under --log-json, once the command configured its log)."""
    if not cfg.pipelines:
        fail_config(ConfigError(f"{cfg.source_file} configures no pipelines"))
    for name in names:
        try:
            cfg.pipeline(name)
        except ConfigError as exc:
            fail_config(exc)
    return list(names) or sorted(cfg.pipelines)


def _logging(log_json: bool, verbose: int) -> None:
    from gcis_etl.logs import configure
    configure(log_json, verbose)


def _run(ctx: click.Context, names: tuple[str, ...], options, log_json: bool, verbose: int,
         stop: StopRequest, quiet: bool = False, note: str | None = None) -> None:
    """`quiet`: no summary on stdout; each run's end is logged instead (with --log-json, as well). `note`: a
    warning for whoever runs the command, said once the log is configured (a JSON line with --log-json)."""
    from gcis_etl.harvesting import harvest_pipelines
    from gcis_etl.logs import say
    from gcis_etl.progress import progress_for
    _logging(log_json, verbose)
    if note:
        say(note, logging.WARNING)
    cfg = _config(ctx)
    code = EXIT_OK
    _pipelines(cfg, names)  # a name config.yaml does not have: exit 2; none: all, in turn (harvest_pipelines)
    try:
        for outcome in harvest_pipelines(cfg, names, options, stop,
                                         lambda name: progress_for(name, log_end=quiet or log_json)):
            code = max(code, outcome.exit_code)
            report = outcome.report
            if outcome.message:  # a run that stopped on an error, or was not started: no report
                say(outcome.message, logging.ERROR if outcome.started else logging.WARNING, pipeline=outcome.name)
            elif options.dry_run or not quiet:  # a dry run says its plan whatever --quiet: it is its output
                for planned in report.planned:  # a dry run's alone
                    click.echo(planned.line())
                click.echo(report.summary())
    except ConfigError as exc:
        fail_config(exc)
    sys.exit(code)


@main.command()
@click.argument("pipelines", nargs=-1)
@click.option("--dry-run", is_flag=True, help="List what would be processed or skipped, and why; change nothing.")
@click.option("--since", type=When(), help="Look at changes since this time instead of the checkpoint "
                                           f"(the checkpoint is then left where it is): {When.FORMATS}.")
@LIMIT
@click.option("--object", "object_ids", multiple=True, metavar="ID",
              help="Only this object (repeatable); the checkpoint is left where it is.")
@click.option("--force", is_flag=True, help="Process the listed items even when unchanged (e.g. after a recipe "
                                           "change) and publish their manifests again (e.g. one lost from the "
                                           "store). Only what is listed: the changes since the checkpoint, or "
                                           "with --since / --object; the whole store: the reencode migration.")
@click.option("--full", is_flag=True, help="List the whole source whatever the checkpoint, as a first run does "
                                          "(unchanged items are skipped; a completed run moves the checkpoint): "
                                          "what an incremental listing cannot see, e.g. a key deleted from an S3 "
                                          "source's object.")
@MAX_MINUTES
@click.option("-q", "--quiet", is_flag=True, help="No summary on stdout (for cron, which mails any output): each "
                                                  "run's end is logged instead, as a WARNING when it exits "
                                                  "non-zero.")
@LOG_JSON
@VERBOSE
@click.pass_context
def harvest(ctx: click.Context, pipelines: tuple[str, ...], dry_run: bool, since, limit, object_ids, force: bool,
            full: bool, max_minutes, quiet: bool, log_json: bool, verbose: int) -> None:
    """Bring the store up to date with the sources: the cron job. All pipelines when none is named.

    Pipelines named run in the order given. With none named, all run in turn: the one whose last run given
    time started longest ago first (one never run, first), so that one left no time by a pipeline before it
    (see the time limit below) goes first the next time.

    For each pipeline: the source's changes since the last checkpoint are fetched, converted, verified and
    deposited; each object's manifest is published once all its items are settled; the collection and the
    checkpoint follow. Unchanged items are skipped, rejected ones wait for the source to change, failed ones
    are retried up to max_attempts. A report (JSON, and a CSV of the problems when there are any) is written
    under <state_dir>/reports, where those of a pipeline's latest ledger.skipped_history_runs runs are kept
    (`gcis-etl report RUN` rebuilds any run's from the ledger). Each run ends with one log line (pipeline,
    run_id, status, counts, manifests, seconds, checkpoint, note: JSON fields) with --log-json or --quiet:
    INFO when it exits 0, WARNING otherwise; the summary, with the run's start and length, goes to stdout
    unless --quiet.

    Exit codes: 0 all deposited or skipped; 1 some items rejected or failed (or the source, the store or
    the scratch space failed as a whole: the run stopped, the items not reached keep their attempts);
    2 configuration or usage error, or a ledger that cannot be opened or written (a full disk: nothing can
    run until it is put right); 3 another run holds the pipeline's lock (nothing was done); 130 (Ctrl-C),
    143 (SIGTERM) or 129 (SIGHUP: the terminal closed; not under nohup) stopped by that signal before the
    end, after recording the items in flight (a run the signal reached during its last items completes, and
    exits as completed), or at once on a second Ctrl-C, which abandons them: the next run redoes them. With
    several pipelines, the highest code wins. A --dry-run exits 1 when it would fail objects (the source cannot
    describe them), else 0. A run stopped at the time limit exits as a completed one would (0 unless items were
    rejected or failed); its note says where the next run starts.

    The time limit (--max-minutes, else the pipelines' max_run_minutes: the longest, when each has one) spans
    the command, not each pipeline: each pipeline gets an equal share of what is left when it starts (what one
    does not use passes to those after it), or, without --max-minutes, its own max_run_minutes where that is
    shorter. At the limit no new item is sent, and the items in flight are finished (each within its source's
    retry.max_total_seconds and isolation.timeout_seconds; with Celery, those a worker started, within
    celery.time_limits): leave that much room below the cron interval. A pipeline that overruns its share so
    leaves less to those after it, and one started with none left takes no item: a WARNING names it and the
    pipelines that took its time, and it exits 0.

    \b
    Examples:
      gcis-etl harvest                          every pipeline, from its checkpoint
      gcis-etl harvest museum --dry-run         what would be done
      gcis-etl harvest library --since 7d --limit 100
      gcis-etl harvest library --full           the whole source (weekly, where objects lose files)
    In a crontab (cron mails what a run prints: with --quiet, only the WARNING lines of what went wrong):
      */15 * * * *  gcis-etl --config /etc/gcis/config.yaml harvest --quiet --max-minutes 14
    For a log shipper (one JSON line per item and per run on stderr):
      */15 * * * *  gcis-etl --config /etc/gcis/config.yaml harvest --quiet --log-json --max-minutes 14
    """
    from gcis_etl.harvesting import HarvestOptions
    if full and (since is not None or object_ids):
        raise click.UsageError("--full lists the whole source: it cannot go with --since or --object")
    from_checkpoint = since is None and not object_ids and not full
    note = ("note: --force reaches only what changed since the checkpoint; add --since or --object for older "
            "items (or use the reencode migration)") if force and from_checkpoint else None
    _run(ctx, pipelines, HarvestOptions(dry_run=dry_run, since=since, limit=limit, object_ids=tuple(object_ids),
                                        force=force, full=full, max_run_minutes=max_minutes), log_json, verbose,
         stop_on_signals(), quiet, note)


@main.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Harvest every configured pipeline (the shipped config.yaml: the bundled sample masters into ./var/)
    and say where the access masters, manifests and run reports are. Run it twice: the second run has
    nothing to do.
    """
    from gcis_etl.harvesting import HarvestOptions
    cfg = _config(ctx)
    _pipelines(cfg, ())  # none configured: exit 2 here, with no outputs to point at
    try:
        _run(ctx, (), HarvestOptions(), False, 0, stop_on_signals())
    except SystemExit as exit_:
        for name in sorted(cfg.pipelines):
            pipeline = cfg.pipeline(name)
            where = pipeline.store.describe("")
            click.echo(f"\n{name}: access masters and manifests under {where}")
            if pipeline.manifests is not None:
                for version in pipeline.manifests.settings.versions:
                    click.echo(f"  collection (IIIF {version}): "
                               f"{pipeline.store.describe(pipeline.manifests.collection_key(version))}")
        click.echo(f"run reports: {cfg.reports_dir}; `gcis-etl status` sums up the ledger")
        raise exit_


@contextmanager
def _ledger_to_read(cfg):
    """The ledger opened read-only: looking changes nothing, not even by creating it (a missing ledger reads as
    empty), but a write cut short is rolled back, as the next harvest would (Ledger: recover); one that cannot be
    opened or read (a damaged page met by a query) is a configuration error (exit 2), in one line rather than a
    traceback."""
    from gcis_etl.ledger import Ledger
    try:
        with Ledger.open(cfg, read_only=True, recover=True) as ledger:
            yield ledger
    except ConfigError as exc:
        fail_config(exc)


@main.command()
@click.argument("pipelines", nargs=-1)
@click.option("--failed/--no-failed", default=True, show_default=True,
              help="Retry failed items (their attempts start again).")
@click.option("--rejected", is_flag=True, help="Also convert rejected items again (after a policy change).")
@click.option("--object", "object_ids", multiple=True, metavar="ID", help="Only this object, if it has items to retry (repeatable).")
@LOG_JSON
@VERBOSE
@click.pass_context
def retry(ctx: click.Context, pipelines: tuple[str, ...], failed: bool, rejected: bool, object_ids, log_json: bool,
          verbose: int) -> None:
    """Process failed (and, with --rejected, rejected) items again now, with a fresh set of attempts.

    \b
    Examples:
      gcis-etl retry museum                     every failed item of the pipeline
      gcis-etl retry museum --object IE12345    one object
      gcis-etl retry museum --rejected          after relaxing the imaging policy
    """
    from gcis_etl.harvesting import HarvestOptions, retry_statuses, retry_targets
    from gcis_etl.reports import counted
    cfg = _config(ctx)
    names = _pipelines(cfg, pipelines)
    with _ledger_to_read(cfg) as ledger:
        targets = retry_targets(ledger, names, tuple(object_ids), failed, rejected)
    if not targets:
        which = " or ".join(retry_statuses(failed, rejected))
        click.echo(f"nothing to retry: no {which} item in {', '.join(object_ids)}" if which and object_ids
                   else "nothing to retry")
        sys.exit(EXIT_OK)
    for name, ids in targets.items():
        click.echo(f"{name}: retrying {counted(len(ids), 'object')}")
    codes = []
    stop = stop_on_signals()  # one for every pipeline: once stopped, the next is not started
    for name, ids in targets.items():
        try:
            _run(ctx, (name,), HarvestOptions(object_ids=ids, redo_rejected=rejected, fresh_attempts=failed), log_json,
                 verbose, stop)
        except SystemExit as exit_:
            codes.append(exit_.code or 0)
    sys.exit(max(codes))


@main.command()
@click.argument("pipelines", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per pipeline.")
@click.option("--all", "every", is_flag=True, help="Every problem, not the first 10 of each kind.")
@click.pass_context
def status(ctx: click.Context, pipelines: tuple[str, ...], as_json: bool, every: bool) -> None:
    """Checkpoint, item counts, last run and problems of each pipeline: failed and rejected items, and objects
    whose manifest was rejected (until a later run publishes it); the first 10 of each kind, and how many
    there are (--json: problems_total).

    \b
    Example:
      gcis-etl status museum
    """
    from gcis_etl.locks import pipeline_lock
    from gcis_etl.reports import SHOWN, pipeline_status
    cfg = _config(ctx)
    names = _pipelines(cfg, pipelines)
    with _ledger_to_read(cfg) as ledger:
        for name in names:
            pipeline = cfg.pipeline(name)
            state = pipeline_status(ledger, name, pipeline_lock(cfg.state_dir, name), None if every else SHOWN,
                                    pipeline.listing_digest, pipeline.settings.max_attempts)
            click.echo(json.dumps(state.to_dict()) if as_json else state.summary())


@main.command()
@click.argument("run_id", required=False, type=int)
@click.option("--pipeline", help="The latest run of this pipeline; with RUN_ID, a check that the run is one of its.")
@click.option("--json", "as_json", is_flag=True, help="The full report as JSON.")
@click.pass_context
def report(ctx: click.Context, run_id: int | None, pipeline: str | None, as_json: bool) -> None:
    """The report of a run (the latest when RUN_ID is not given), rebuilt from the ledger: its counts, the items
    it rejected or failed, and those it deposited (and the manifests it published) with warnings.

    Exit codes: 0 the run completed and every item was deposited or skipped; 1 some items rejected or failed,
    or the run did not complete (its source or store failed, it crashed, was killed, is still running, or was
    stopped by a signal: the ledger does not keep which, so 1, not 130, 143 or 129); 2 no such run, or a
    configuration or usage error. A run stopped at its --limit or time limit exits as the harvest did.

    \b
    Examples:
      gcis-etl report                 the latest run of any pipeline
      gcis-etl report 42 --json | jq '.problems[] | .reason'
      gcis-etl report 42 --json | jq '.warned[] | .warnings[]'
    """
    from gcis_etl.locks import pipeline_lock
    from gcis_etl.reports import SHOWN, report_from_ledger, with_written_files
    cfg = _config(ctx)
    if pipeline is not None:
        _pipelines(cfg, (pipeline,))
    with _ledger_to_read(cfg) as ledger:
        run = ledger.run(run_id) if run_id is not None else next(iter(ledger.runs(pipeline, limit=1)), None)
        if run is None:
            raise click.UsageError(f"no run {run_id}" if run_id is not None else
                                   f"no run of {pipeline} recorded yet" if pipeline else "no run recorded yet")
        if pipeline is not None and run.pipeline != pipeline:
            raise click.UsageError(f"run {run_id} is a run of {run.pipeline}, not of {pipeline}")
        read = report_from_ledger(ledger, run, pipeline_lock(cfg.state_dir, run.pipeline), None if as_json else SHOWN)
        result = with_written_files(read, cfg.reports_dir)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
    sys.exit(result.exit_code)


@main.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("check")
@click.pass_context
def config_check(ctx: click.Context) -> None:
    """Validate the configuration and print it resolved (defaults filled in, secrets masked). Warned of on
    stderr: a source's credential written in the file instead of as a ${VAR} reference to the environment (its
    value is not shown), a source whose TLS certificate is not checked (verify_tls: false), and what the cache
    commands would refuse (a pipeline whose recipe writes an extension cache.extensions does not list, or HTJ2K
    without cache.server.decodes_htj2k).

    Exit code 0 when valid, 2 otherwise (the error names the file, the key and what was expected).

    \b
    Example:
      OTMM_PASSWORD=... gcis-etl --config /etc/gcis/config.yaml config check
    """
    import yaml

    from connectors import settings_model
    from connectors.redaction import written_secrets
    from gcis_etl.cache import cache_sources
    from gcis_etl.harvesting import open_sources
    from gcis_etl.logs import say
    cfg = _config(ctx)
    try:
        sources = open_sources(cfg, sorted(cfg.pipelines))
    except ConfigError as exc:
        fail_config(exc)
    try:
        cache_sources(cfg)
    except ConfigError as exc:  # only the cache commands need them mirrored: a configuration without a cache is valid
        say(f"warning: the cache (gcis-etl cache sync/serve) would refuse this: {exc}", logging.WARNING)
    for name, source in sources.items():
        written = cfg.pipelines[name].source
        for key in written_secrets(settings_model(written.kind), written.options, f"pipelines.{name}.source"):
            say(f"warning: {key}: a credential written in {cfg.source_file} itself, where whoever reads the file (or "
                f"a copy of it) reads it too: set it in an environment variable and write ${{VARIABLE}} here",
                logging.WARNING)
        if getattr(getattr(source, "settings", None), "verify_tls", True) is False:
            say(f"warning: pipelines.{name}.source.verify_tls: false: the source's TLS certificate is not checked, "
                f"so whoever is between here and the source can read and change what the harvest fetches, its "
                f"credentials among them; give the CA bundle's path instead where the certificate is your own "
                f"CA's", logging.WARNING)
    click.echo(f"# {cfg.source_file}: valid\n" + yaml.safe_dump(cfg.printable(), sort_keys=False, allow_unicode=True))
