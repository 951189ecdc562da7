"""Commands on single files: inspect, convert, verify, recipes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gcis_etl.cli import _config, main
from gcis_etl.commands import (EXIT_ITEM_FAILED, EXIT_OK, VERBOSE, Interrupted, SharedOption, fail_config,
                               raise_on_signals)
from gcis_etl.errors import ConfigError

# gcis-etl's -v, said of a conversion's stages rather than of items
STAGES_VERBOSE = SharedOption(*VERBOSE.decls, **{
    **VERBOSE.attrs, "help": "-v: a log line per stage, with the time elapsed; -vv: debug."})


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file (JSON Lines).")
@click.option("--header-only", is_flag=True,
              help="Judge from the header alone (fast); by default every pixel is also decoded, "
                   "strictly and in an isolated process, as a conversion would.")
@click.pass_context
def inspect(ctx: click.Context, files: tuple[str, ...], as_json: bool, header_only: bool) -> None:
    """Describe masters and give the verdict: accept, accept-after-conversion or reject; not-checked when the
    full decode ran out of memory or time under the isolation limits (the reason names the setting to raise).

    Exit code 0 when every file is accepted (possibly after conversion), 1 when any is rejected or not checked,
    2 when there was no file to inspect. Folders among FILES (from a shell glob) are passed over with a note.

    \b
    Example:
      gcis-etl inspect --json masters/*.tif | jq -r 'select(.verdict=="reject") | .path'
    """
    from gcis_etl.conversion import check_decoding
    from gcis_etl.errors import ConversionFailed
    from gcis_etl.inspection import inspect as inspect_header
    from gcis_etl.isolation import IsolatedProcess
    from gcis_etl.models import Verdict
    cfg = _config(ctx, single_file=True)
    unpassed = 0
    folders = [path for path in files if os.path.isdir(path)]
    if len(folders) == len(files):
        raise click.UsageError("no file to inspect: every argument is a folder (give its files, e.g. masters/*.tif)")
    with IsolatedProcess(cfg.isolation) as worker:
        for path in files:
            if path in folders:
                click.echo(f"{path}: a folder, passed over", err=True)
                continue
            try:
                info = (inspect_header(path, cfg.imaging, cfg.isolation) if header_only
                        else check_decoding(path, cfg.imaging, worker=worker))
            except OSError as exc:  # a FIFO or device (from a glob), a file gone or unreadable since listed
                click.echo(f"{path}: cannot read: {exc.strerror or exc}, not checked", err=True)
                unpassed += 1
                continue
            except ConversionFailed as exc:  # exiftool past the isolation limits on its metadata
                click.echo(f"{path}: {exc}, not checked", err=True)
                unpassed += 1
                continue
            unpassed += info.verdict in (Verdict.REJECT, Verdict.NOT_CHECKED)
            if as_json:
                click.echo(json.dumps(info.to_dict()))
            else:
                size = f"{info.width}x{info.height}" if info.width else "?"
                blocks = ",".join(name for name, present in
                                  (("EXIF", info.exif), ("XMP", info.xmp), ("IPTC", info.iptc)) if present)
                click.echo(f"{path}: {info.format} {size} {info.bands or '?'}x{info.bit_depth or '?'}-bit "
                           f"{info.interpretation or ''} icc={info.icc or 'none'} pages={info.pages or '?'} "
                           f"metadata={blocks or 'none'} -> {info.verdict.value}")
                for reason in info.reasons:
                    click.echo(f"    reason: {reason}")
                for warning in info.warnings:
                    click.echo(f"    warning: {warning}")
    sys.exit(EXIT_ITEM_FAILED if unpassed else EXIT_OK)


@main.command()
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--recipe", "-r", default="ptiff-jpeg-q90", show_default=True,
              help="Recipe name (recipes/NAME.yaml beside the config file, or shipped) or path to a recipe YAML file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@STAGES_VERBOSE
@click.pass_context
def convert(ctx: click.Context, src: str, dst: str, recipe: str, as_json: bool, verbose: int) -> None:
    """Convert one master SRC into a verified access master DST.

    DST appears only once the output has been verified (it is written under a temporary name first, removed
    if the conversion fails or is stopped).

    While it runs, a terminal shows one line on stderr with the stage and the time elapsed (e.g. "master.tif:
    encoding with grk_compress, 1 min 12 s"), redrawn each second and erased before the result is printed. -v
    logs a line per stage with the time elapsed, also without a terminal (where nothing is shown otherwise).

    Exit code 0 when converted, 1 when rejected or failed, 2 on a usage or configuration error (SRC missing,
    an unknown recipe), 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP) when stopped by that signal.

    \b
    Example:
      gcis-etl convert --recipe ptiff-jpeg-q90 master.tif access/master.tif
    """
    from gcis_etl.conversion import convert as convert_master
    from gcis_etl.conversion import output_name_problem
    from gcis_etl.logs import configure
    from gcis_etl.models import pyramid_levels
    from gcis_etl.progress import ConversionLine
    if verbose:
        configure(False, verbose)
    cfg = _config(ctx, single_file=True)
    rec = _recipe(ctx, recipe)
    unservable = output_name_problem(dst)
    if unservable:
        raise click.BadParameter(unservable, param_hint="DST")
    raise_on_signals()  # `timeout`, systemd: the temporary output is removed as on Ctrl-C
    try:
        with ConversionLine(Path(src).name, live=sys.stderr.isatty(), log_stages=bool(verbose)) as line:
            result = convert_master(src, dst, rec, cfg.imaging, isolation_settings=cfg.isolation,
                                    on_stage=line.stage)
    except Interrupted as exc:
        click.echo(f"{src}: stopped by {exc}: {dst} not written", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    elif result.ok:
        click.echo(f"converted {src} -> {result.output}: {result.width}x{result.height}, "
                   f"{pyramid_levels(result.levels, rec.jp2 is not None)}, "
                   f"{result.bytes:,} bytes in {result.seconds:.2f} s (decoder {result.decoder})")
    else:
        click.echo(f"{result.status.value} {src}: {result.reason}", err=True)
    if not as_json:
        for warning in result.warnings:
            click.echo(f"    warning: {warning}", err=True)
    sys.exit(EXIT_OK if result.ok else EXIT_ITEM_FAILED)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--recipe", "-r", default=None,
              help="Also check the recipe's tile size and chroma subsampling (a JP2 recipe: its layers, "
                   "progression, block coder and wavelet).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_context
def verify(ctx: click.Context, file: str, recipe: str | None, as_json: bool) -> None:
    """Check that FILE is a valid access master: tiled JPEG page pyramid, ceil-halving levels, sRGB ICC,
    every level decodable through libtiff (as iipsrv reads it). A JP2 (known by its signature): valid for
    jpylyzer, sRGB colour box, one reduced resolution and five full-resolution regions decodable by
    OpenJPEG (compared with nothing: convert compares them with the image it encoded).

    Exit code 0 when valid, 1 when not valid or not verified (a decoder crashed, or memory or time ran out
    under the isolation limits), 2 on a usage or configuration error (FILE missing or a folder, an unknown
    recipe, a recipe for another format than FILE's: a JP2 recipe for a TIFF, say).

    \b
    Examples:
      gcis-etl verify --recipe ptiff-jpeg-q90 access/master.tif
      gcis-etl verify --recipe jp2-grok-htj2k access/master.jp2
    """
    from gcis_etl import verify as verify_file
    from gcis_etl.conversion import recipe_mismatch
    from gcis_etl.errors import ConversionFailed
    from gcis_etl.formats import sniff
    from gcis_etl.verification import unreadable
    rec = _recipe(ctx, recipe) if recipe else None
    cannot = unreadable(Path(file))  # a FIFO, say: reading it to compare with the recipe would wait for ever
    mismatch = recipe_mismatch(file, rec) if rec and cannot is None else None
    if mismatch:
        raise click.UsageError(mismatch)
    try:
        report = cannot or verify_file(file, rec, _config(ctx, single_file=True).isolation)
    except ConversionFailed as exc:  # a decoder crashed, or memory or time ran out under the limits
        click.echo(f"{file}: not verified: {exc}", err=True)
        sys.exit(EXIT_ITEM_FAILED)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        click.echo(report.summary(cannot is None and sniff(file) == "JP2"))  # by content, whatever the name says
        for error in report.errors:
            click.echo(f"    error: {error}")
        for warning in report.warnings:  # on stderr, as convert's
            click.echo(f"    warning: {warning}", err=True)
    sys.exit(EXIT_OK if report.ok else EXIT_ITEM_FAILED)


@main.command()
@click.pass_context
def recipes(ctx: click.Context) -> None:
    """List the recipes found (GCIS_RECIPES, the recipes folder beside the config file or ./recipes without
    one, the shipped ones) with their digests."""
    from gcis_etl.recipes import load_recipe, recipe_files
    for name, path in recipe_files(_recipe_folder(ctx)).items():
        try:
            recipe = load_recipe(path)
            click.echo(f"{recipe.name:24} {recipe.digest}  {recipe.description[:70]}")
        except ConfigError as exc:
            head = f"{name:24} INVALID: "
            click.echo(head + str(exc).replace("\n", "\n" + " " * len(head)))  # each error under the first


def _recipe_folder(ctx: click.Context):
    """Recipe names are looked up beside the config file first, as its pipelines' are (recipe_dirs)."""
    from gcis_etl.config import config_path
    from gcis_etl.pipelines import config_folder
    found = config_path(ctx.obj)
    return config_folder(found) if found else None


def _recipe(ctx: click.Context, name_or_path: str):
    from gcis_etl.recipes import load_recipe
    try:
        return load_recipe(name_or_path, _recipe_folder(ctx))
    except ConfigError as exc:
        fail_config(exc)
