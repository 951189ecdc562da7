"""Commands on the iipsrv consumer: the access-master cache (sync, prune, purge) and the demo server (serve)."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import timedelta

import click
from pydantic import ByteSize, TypeAdapter, ValidationError

from gcis_etl.cli import Span, _config, main
from gcis_etl.commands import EXIT_ITEM_FAILED, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, fail_config, raise_on_signals
from gcis_etl.errors import ConfigError, GcisError
from gcis_etl.spans import SPAN_FORMATS


class _Parsed(click.ParamType):
    """A value parsed the way config.yaml parses it (pydantic), so '500G' means the same in both."""

    def __init__(self, kind: type, name: str, hint: str):
        self.adapter = TypeAdapter(kind)
        self.name = name
        self.hint = hint

    def convert(self, value, param, ctx):
        try:
            return self.adapter.validate_python(value)
        except ValidationError:
            self.fail(f"{value!r} is not {self.hint}", param, ctx)


SIZE = _Parsed(ByteSize, "size", "a size such as 500G, 20GiB or 1000000")


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _setup(ctx: click.Context, names: tuple[str, ...]):
    """The configuration and the cache sources of the pipelines named (gcis_etl.cache.cache_sources)."""
    from gcis_etl.cache import cache_sources
    cfg = _config(ctx)
    try:
        return cfg, cache_sources(cfg, names)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _run(action, *args, **kwargs):
    """Call the library; a lock held by another cache command, a cache folder it cannot use (its lock cannot be
    taken, its disk full or read-only, its state failing: exit 2, as for a configuration error) or a store failure
    ends the command."""
    from gcis_etl.cache import CacheUnusable
    from gcis_etl.locks import LockHeld
    try:
        return action(*args, **kwargs)
    except LockHeld as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_LOCKED)
    except CacheUnusable as exc:  # one line, as cron mails it: not a configuration error
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except ConfigError as exc:
        fail_config(exc)
    except GcisError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ITEM_FAILED)


@main.group()
def cache() -> None:
    """The access-master cache iipsrv reads (iipsrv cannot read S3), and the demo consumer.

    Settings: config.yaml `cache:` (where the cache is, which pipelines it mirrors, prune limits, and the
    lighttpd/iipsrv settings). The web server configuration is deploy/iipsrv/lighttpd.conf.

    Exit codes of sync, prune and purge: 0 done; 1 an image or a store failed; 2 configuration error, or
    the cache folder cannot be used (its disk full or read-only, its lock or state.sqlite unusable: one line
    says what to do); 3 another cache command holds the lock.

    \b
    Example (cron, after harvest; with cache.max_bytes and max_age set, `cache prune` alone):
      */10 * * * *  gcis-etl --config /etc/gcis/config.yaml cache sync --purge
      30 3 * * *    gcis-etl --config /etc/gcis/config.yaml cache prune --max-bytes 500G --max-age 90d
    """


@cache.command()
@click.option("--pipeline", "-p", "names", multiple=True, help="Only these pipelines (repeatable).")
@click.option("--purge", "purge_gone", is_flag=True,
              help="Also remove the cached images no longer in their store (as `cache purge` does, without "
                   "listing the stores a second time).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.pass_context
def sync(ctx: click.Context, names: tuple[str, ...], purge_gone: bool, as_json: bool) -> None:
    """Copy new or changed access masters from the pipelines' stores into the cache.

    Each copy is downloaded beside the cache, checked against the SHA-256 recorded when it was deposited
    and renamed into place, so iipsrv never reads a half-written file. Only what changed since the last
    sync is copied. Images `prune` evicted come back once the access log shows a request for them.
    Exit code 0, or 1 when any image could not be copied (the others are), or 2 when the cache's disk
    fills or refuses writes: the sync stops at the first such copy, one line saying what makes room.

    \b
    Example:
      gcis-etl cache sync --purge --pipeline samples
    """
    from gcis_etl.cache import sync as sync_cache
    cfg, sources = _setup(ctx, names)
    result = _run(sync_cache, cfg.cache, sources, purge_gone=purge_gone)
    if as_json:
        click.echo(json.dumps(asdict(result)))
    else:
        click.echo(f"copied {len(result.copied)} ({_human(result.bytes_copied)}), unchanged {result.unchanged}, "
                   f"adopted {len(result.adopted)}, evicted and not requested {result.evicted}, "
                   f"failed {len(result.failed)} in {result.seconds:.1f}s")
        if result.gone and purge_gone:
            click.echo(f"removed {len(result.gone)} cached image(s) no longer in their store")
        elif result.gone:
            click.echo(f"{len(result.gone)} cached image(s) no longer in their store: `gcis-etl cache purge` "
                       f"(or `sync --purge`) removes them")
        if result.foreign:
            click.echo(f"{result.foreign} file(s) in the cache's images/ are not its own (no record, under no synced "
                       f"pipeline's prefix, or not access masters): left alone")
        for failure in result.failed:
            click.echo(f"  failed: {failure.source}: {failure.key or '(whole source)'}: {failure.reason}",
                       err=True)
    sys.exit(EXIT_ITEM_FAILED if result.failed else EXIT_OK)


@cache.command()
@click.option("--max-bytes", type=SIZE, help="Evict until the cache holds at most this much, e.g. 500G "
                                             "(decimal: 500 x 10^9 bytes; 500GiB: x 2^30; default: "
                                             "cache.max_bytes).")
@click.option("--max-age", type=Span(), help=f"Evict what was not accessed for this long: {SPAN_FORMATS} "
                                              "(default: cache.max_age).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.pass_context
def prune(ctx: click.Context, max_bytes: int | None, max_age: timedelta | None, as_json: bool) -> None:
    """Evict the least recently accessed images from the cache.

    Last access is the latest of: the web server's access log (exact), the file's atime (coarse: relatime
    updates it at most daily, noatime never) and the time it was synced. Evicted images stay in their store;
    the next sync copies one back once it is requested again.

    \b
    Example:
      gcis-etl cache prune --max-bytes 500G --max-age 90d
    """
    from gcis_etl.cache import prune as prune_cache
    cfg = _config(ctx)
    max_bytes = max_bytes if max_bytes is not None else cfg.cache.max_bytes
    max_age = max_age if max_age is not None else cfg.cache.max_age
    if max_bytes is None and max_age is None:
        raise click.UsageError("nothing to prune by: give --max-bytes and/or --max-age "
                               "(or set cache.max_bytes / cache.max_age in the configuration)")
    result = _run(prune_cache, cfg.cache, max_bytes=max_bytes, max_age=max_age)
    if as_json:
        click.echo(json.dumps({**asdict(result), "freed_bytes": result.freed_bytes}))
    else:
        click.echo(f"evicted {len(result.evicted)} ({_human(result.freed_bytes)}); "
                   f"kept {result.kept} ({_human(result.kept_bytes)})")
        if result.unrecorded:
            click.echo(f"not recorded, not evicted: {result.unrecorded} file(s) ({_human(result.unrecorded_bytes)}): "
                       f"`cache sync` records those still in a store, `cache sync --purge` removes those gone from it")
    sys.exit(EXIT_OK)


@cache.command()
@click.argument("keys", nargs=-1)
@click.option("--pipeline", "-p", "names", multiple=True, help="Only these pipelines (without KEYS).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.pass_context
def purge(ctx: click.Context, keys: tuple[str, ...], names: tuple[str, ...], as_json: bool) -> None:
    """Remove cached images: those no longer in their store, or the KEYS given.

    A KEY is a store key or the identifier of a IIIF URL (samples/obj/1.tif or samples%2Fobj%2F1.tif).
    iipsrv answers 404 for a purged image at once; a purged image still in its store is copied again by
    the next sync.

    \b
    Example:
      gcis-etl cache purge                           # every image deleted from its store
      gcis-etl cache purge samples/IE42/FL7.tif      # one image, now
    """
    from gcis_etl.cache import purge as purge_cache
    if keys and names:
        raise click.UsageError("give KEYS or --pipeline, not both: a KEY already names its pipeline's image "
                               "(--pipeline chooses whose images gone from their store are removed)")
    cfg, sources = _setup(ctx, names)
    result = _run(purge_cache, cfg.cache, sources, keys)
    if as_json:
        click.echo(json.dumps(asdict(result)))
    else:
        click.echo(f"removed {len(result.removed)} ({_human(result.freed_bytes)})")
        for key in result.not_cached:
            click.echo(f"  not cached: {key}")
    sys.exit(EXIT_OK)


@cache.command()
@click.option("--port", type=click.IntRange(0, 65535), help="Listen here (default: cache.server.port; 0: any).")
@click.option("--no-sync", is_flag=True, help="Serve the cache as it is, without syncing it first.")
@click.pass_context
def serve(ctx: click.Context, port: int | None, no_sync: bool) -> None:
    """Sync the cache, then serve it over IIIF on loopback for a demo, until Ctrl-C.

    Runs deploy/iipsrv/demo.conf: lighttpd and iipsrv (cache.server), the JSON documents of a local store
    (cache.server.documents_root, at /store) and Mirador at /viewer/ (deploy/iipsrv/install-mirador).
    The viewer loads the manifests from the pipelines' manifests.manifest_base_url, and their images from
    manifests.image_service_base_url: serve on the port those name (cache.server.port). Where one names this
    host on another port (--port) for what this server serves (the images it caches; the manifests of the
    store at cache.server.documents_root), a warning names the keys to change (then `harvest --since` an
    early date publishes the manifests again).

    \b
    Example:
      gcis-etl harvest && gcis-etl cache serve      # then open the viewer URL it prints
    """
    from gcis_etl.cache import sync as sync_cache
    from gcis_etl.iipsrv import Consumer
    cfg, sources = _setup(ctx, ())
    if not no_sync:
        result = _run(sync_cache, cfg.cache, sources)
        click.echo(f"cache: copied {len(result.copied)}, unchanged {result.unchanged}, failed {len(result.failed)}")
    server = cfg.cache.server if port is None else cfg.cache.server.model_copy(update={"port": port})
    consumer = Consumer(server, cfg.cache.images_dir, demo=True)

    # `kill`, systemd: stop lighttpd and iipsrv too, from the moment lighttpd may be running (a SIGTERM's
    # default action would leave it serving, orphaned)
    raise_on_signals()
    try:
        _run(consumer.start)
        _announce(cfg, consumer)
        consumer.wait()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.stop()
    sys.exit(EXIT_OK)


def _announce(cfg, consumer) -> None:
    """Where the demo serves what, and a warning when the manifests name another port of this host."""
    click.echo(f"IIIF Image API: {consumer.iiif_url}/{{store key}}/info.json")
    for name in sorted(cfg.pipelines):
        manifests = cfg.pipeline(name).manifests
        if manifests is not None:
            key = manifests.collection_key(manifests.settings.versions[0])
            click.echo(f"{name}: {consumer.url}/viewer/?manifest={manifests.settings.manifest_base_url}/{key}")
    elsewhere = consumer.misaddressed(cfg)
    if elsewhere:
        ports = ", ".join(sorted({str(port) for port in elsewhere.values()}))
        click.echo(f"warning: {', '.join(elsewhere)} name port {ports} of this host, but this server listens on "
                   f"{consumer.port}: the viewer cannot load what they name. Serve on port {ports} (--port, or "
                   f"cache.server.port), or change those keys and publish the manifests again (gcis-etl harvest "
                   f"--since <a date before the first harvest>)", err=True)
    click.echo("Ctrl-C stops")
