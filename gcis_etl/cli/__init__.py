"""Command line: a click layer over the library.

One module per command family registers its commands on `main`: imaging (inspect, convert, verify,
recipes), pipelines (harvest, demo, status, retry, report, config), cache (the iipsrv access-master cache).
Exit codes, the stop on a signal and the options gcis-migrate shares are the library's (gcis_etl.commands).
"""
from __future__ import annotations

import importlib
import sys
from datetime import timedelta

import click

from gcis_etl.commands import CONFIG, exit_on_signals, fail_config
from gcis_etl.errors import ConfigError
from gcis_etl.spans import parse_span


class EntryPoint:
    """A command line's entry (gcis-etl, gcis-migrate): its first act is exit_on_signals(), so that a Ctrl-C,
    SIGTERM or SIGHUP during the command's imports and its reading of the configuration is a clean exit 130, 143
    or 129 too.
    Not on importing gcis_etl.cli: a program or a test that imports it keeps its own signal handling."""

    def main(self, *args, **kwargs):
        exit_on_signals()
        return super().main(*args, **kwargs)


class EntryGroup(EntryPoint, click.Group):
    pass


class EntryCommand(EntryPoint, click.Command):
    pass


class MigrateCommand(EntryCommand):
    """gcis-migrate: its help ends with the scripts in migrations/, read when the help is shown (importing
    gcis_etl.migration, which no other use of the command line pays for)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from gcis_etl.migration import available
        formatter.write_paragraph()
        formatter.write_text(f"Scripts in migrations/ (each takes --help): {', '.join(available())}")


class Span(click.ParamType):
    """A span of time in the syntax every option shares (gcis_etl.spans)."""

    name = "span"

    def convert(self, value, param, ctx) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_span(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _config(ctx: click.Context, single_file: bool = False):
    """The configuration; `single_file`: only what a command on one local file uses (load_single_file_config)."""
    from gcis_etl.config import load_config, load_single_file_config
    try:
        return (load_single_file_config if single_file else load_config)(ctx.obj)
    except ConfigError as exc:
        fail_config(exc)


@click.group(cls=EntryGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="gcis-etl")
@CONFIG
@click.pass_context
def main(ctx: click.Context, config_file: str | None) -> None:
    """gcis-etl: masters from the DAMs in, verified IIIF access masters out.

    \b
    Start with:
      gcis-etl inspect master.tif          what is this file, and will it be accepted?
      gcis-etl convert master.tif out.tif  make a verified pyramidal TIFF access master
      gcis-etl verify out.tif              does a file meet the access-master contract?
      gcis-etl harvest                     bring every configured pipeline up to date (the cron job)
      gcis-etl status                      checkpoint, counts and problems of each pipeline
      gcis-etl cache sync                  copy new access masters to the folder iipsrv reads
    """
    ctx.obj = config_file


@click.command(cls=MigrateCommand, context_settings={"help_option_names": ["-h", "--help"],
                                                  "ignore_unknown_options": True, "allow_interspersed_args": False})
@CONFIG
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def migrate_main(config_file: str | None, script: str, args: tuple[str, ...]) -> None:
    """Run a migration script from migrations/ (by name or path) with its own arguments. --config may come
    before the script's name too, as with gcis-etl; the script's other options come after it.

    Exit codes: 0 done; 1 some items or keys failed or were rejected, or the migration stopped on an error;
    2 configuration or usage error; 3 another run holds the pipeline's lock; 130 (Ctrl-C), 143 (SIGTERM) or
    129 (SIGHUP) stopped by that signal before the end (what was settled is recorded: run it again to continue).

    \b
    Examples:
      gcis-migrate initial_load --help
      gcis-migrate --config /etc/gcis/config.yaml initial_load --pipeline museum
    """
    from gcis_etl.migration import run_script
    if script.startswith("-"):
        raise click.UsageError(f"{script}: the script's options go after its name: gcis-migrate SCRIPT {script} ...")
    sys.exit(run_script(script, [*(("--config", config_file) if config_file else ()), *args]))


def _register() -> None:
    for module in COMMAND_MODULES:
        importlib.import_module(f"gcis_etl.cli.{module}")


COMMAND_MODULES = ("imaging", "pipelines", "cache")
_register()
