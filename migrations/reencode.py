"""Re-derive the access masters made with one recipe, using another (or a newer version of the same one).

Every item the ledger records as deposited with --from-recipe is converted again from its master with
--to-recipe (default: the pipeline's configured recipe), in harvest runs of --batch-size objects; manifests are
republished where an access master's key changed. --from-recipe may name the target recipe itself: the items
made with an older version of it (another digest) are then re-derived. Re-running continues where the last
run stopped: items already made with --to-recipe are no longer selected.

Old access masters: with the same extension, the new access master replaces the old one under the same key.
With another extension (.tif to .jp2) it goes under a new key, and the old key is deleted once no deposited
manifest of its object refers to it any more; --keep-old keeps them instead (each is listed in the report's
CSV). Until an old key can go (an item of its object failed, the run was cut short) it is noted in
<state_dir>/migrations/reencode-<pipeline>.json, and the next run finishes the job.

Set the pipeline's `recipe:` to the new recipe so new items are made with it too. Pause the pipeline's cron
harvests meanwhile: a harvest holding the pipeline stops the migration (exit 3). The pipeline's
max_run_minutes (a cron limit) does not apply; --max-minutes does.

\b
Usage:
  gcis-migrate reencode --pipeline museum --from-recipe ptiff-jpeg-q90 --to-recipe ptiff-jpeg-q90-444
  gcis-migrate reencode --from-recipe ptiff-jpeg-q90 --to-recipe jp2-openjpeg-lossy --dry-run -v
  gcis-migrate reencode --pipeline museum --from-recipe ptiff-jpeg-q90 --limit 100   (a trial)

\b
Exit codes: 0 done; 1 some items rejected or failed, or stopped on an error (run again);
2 configuration or usage error; 3 another run holds the pipeline.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import chain, groupby
from pathlib import Path
from typing import Iterable, Iterator

import click

from gcis_etl.durable import atomic_write
from gcis_etl.errors import ConfigError
from gcis_etl.ledger import Ledger
from gcis_etl.manifests import DepositedImage
from gcis_etl.migration import MigrationContext, migration
from gcis_etl.pipelines import Pipeline
from gcis_etl.recipes import Recipe, load_recipe


@migration(__doc__, budget=True)
@click.option("--pipeline", "names", multiple=True, help="Only this pipeline (repeatable; default: all).")
@click.option("--from-recipe", required=True, help="Re-derive what the ledger records as made with this recipe.")
@click.option("--to-recipe", help="The recipe to use (default: the pipeline's configured recipe).")
@click.option("--keep-old", is_flag=True, help="Keep old access masters whose key changed (listed in the report).")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="Objects per harvest run.")
def main(ctx: MigrationContext, names: tuple[str, ...], from_recipe: str, to_recipe: str | None, keep_old: bool,
         batch_size: int) -> None:
    names = names or tuple(sorted(ctx.config.pipelines))
    _known(ctx, names, from_recipe)
    for name in names:
        pipeline = ctx.pipeline(name)
        target = load_recipe(to_recipe or pipeline.settings.recipe)
        if target.name != pipeline.settings.recipe:
            ctx.report.notes.append(f"{name}: new items are still made with {pipeline.settings.recipe}: "
                                    f"set `recipe: {target.name}` in {ctx.config.source_file}")
        if not Reencode(ctx, pipeline, from_recipe, target, keep_old).run(batch_size):
            return


@dataclass(frozen=True)
class OldKey:
    """An access master about to be replaced, as the ledger knew it before the run that replaces it."""

    object_id: str
    item_id: str
    sequence: int
    key: str


class OldKeys:
    """The old keys a migration still has to deal with, on disk: noted before the harvest run that replaces
    them, forgotten once deleted (or kept, or replaced in place), so a run killed in between leaves them to the
    next run rather than in the store for ever."""

    def __init__(self, path: Path, dry_run: bool):
        self.path = path
        self.dry_run = dry_run
        entries = json.loads(path.read_text()) if path.is_file() else []
        self.entries = {(e["object_id"], e["item_id"]): OldKey(**e) for e in entries}

    def note(self, keys: Iterable[OldKey]) -> None:
        self.entries.update({(k.object_id, k.item_id): k for k in keys})
        self.save()

    def forget(self, key: OldKey) -> None:
        self.entries.pop((key.object_id, key.item_id), None)

    def save(self) -> None:
        if self.dry_run:
            return
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps([asdict(k) for k in self.entries.values()], indent=1) + "\n")


def by_object(keys: Iterable[OldKey], size: int) -> Iterator[dict[str, list[OldKey]]]:
    """Batches of `size` objects (keys ordered by object) with their old keys."""
    batch: dict[str, list[OldKey]] = {}
    for object_id, group in groupby(keys, key=lambda k: k.object_id):
        batch[object_id] = list(group)
        if len(batch) == size:
            yield batch
            batch = {}
    if batch:
        yield batch


def _known(ctx: MigrationContext, names: tuple[str, ...], recipe: str) -> None:
    """--from-recipe names a recipe that exists, or one the ledger records (since removed): a misspelt name
    would otherwise match nothing and report 'nothing to do'."""
    try:
        load_recipe(recipe)
        return
    except ConfigError:
        pass
    with ctx.ledger() as ledger:
        recorded = sorted({r for name in names for r in ledger.recipes(name)})
    if recipe not in recorded:
        raise click.BadParameter(f"no recipe {recipe!r} exists, and the ledger records none of that name for "
                                 f"{', '.join(names)} (it records: {', '.join(recorded) or 'none'})",
                                 param_hint="--from-recipe")


class Reencode:
    def __init__(self, ctx: MigrationContext, pipeline: Pipeline, from_recipe: str, target: Recipe,
                 keep_old: bool):
        self.ctx = ctx
        self.pipeline = pipeline
        self.from_recipe = from_recipe
        self.target = target
        self.keep_old = keep_old
        self.old = OldKeys(ctx.config.state_dir / "migrations" / f"reencode-{pipeline.name}.json", ctx.dry_run)

    def selected(self, ledger: Ledger) -> Iterator[OldKey]:
        for record in ledger.iter_items(self.pipeline.name, "status='deposited' AND recipe=? AND recipe_digest<>?",
                                        (self.from_recipe, self.target.digest)):
            yield OldKey(record.object_id, record.item_id, record.sequence, record.output_key)

    def run(self, batch_size: int) -> bool:
        """Old keys left by an earlier run first (their objects' manifests may still need republishing), then
        everything selected; False when the migration should go no further."""
        left = sorted(self.old.entries.values(), key=lambda k: (k.object_id, k.item_id))
        with self.ctx.ledger() as ledger:
            for batch in chain(by_object(left, batch_size), by_object(self.selected(ledger), batch_size)):
                if not self.batch(ledger, batch):
                    return False
        if self.old.entries and not self.ctx.dry_run:
            self.ctx.report.notes.append(
                f"{self.pipeline.name}: {len(self.old.entries)} old access masters wait until their objects are "
                f"re-derived and republished (see {self.old.path}): run again (after `gcis-etl retry` for items "
                f"out of attempts)")
        return True

    def batch(self, ledger: Ledger, batch: dict[str, list[OldKey]]) -> bool:
        keys = [key for object_keys in batch.values() for key in object_keys]
        if self.ctx.dry_run:
            moving = sum(k.key != self.new_key(k) for k in keys)
            if moving:
                self.ctx.report.add("old access masters to keep" if self.keep_old else "old access masters to delete",
                                    moving)
        self.old.note(keys)
        go_on = self.ctx.harvest(self.pipeline.name, object_ids=tuple(batch), recipe=self.target.name,
                                 reencode=self.from_recipe)
        if not self.ctx.dry_run:
            self.settle(ledger, keys)
        return go_on

    def new_key(self, old: OldKey) -> str:
        return self.pipeline.store.keys.image_key(self.pipeline.name, old.object_id, old.item_id, old.sequence,
                                                  self.target.extension.lstrip("."))

    def settle(self, ledger: Ledger, keys: list[OldKey]) -> None:
        """Delete (or keep) each old key nothing refers to any more; forget those replaced in place."""
        store = self.pipeline.store
        manifests = self.pipeline.manifests

        @lru_cache(maxsize=None)
        def deposited_manifests(object_id: str) -> tuple[str, ...]:
            found = [manifests.manifest_key(object_id, v) for v in manifests.settings.versions]
            return tuple(store.get_bytes(key).decode() for key in found if store.exists(key))

        for old in keys:
            record = ledger.item(self.pipeline.name, old.object_id, old.item_id)
            if record is None:
                self.old.forget(old)
            elif record.output_key == old.key:
                if record.recipe_digest == self.target.digest and record.status == "rejected":
                    self.ctx.report.event(old.key, "old access masters kept",
                                          f"{self.target.name} rejects the master ({record.reason})")
                if record.recipe_digest == self.target.digest and record.status != "failed":
                    self.old.forget(old)  # replaced in place, or rejected; a failed one waits for its retry
            elif manifests is None or not any(f'"{self.service_id(old)}"' in text
                                              for text in deposited_manifests(old.object_id)):
                if self.keep_old:
                    self.ctx.report.event(old.key, "old access masters kept", f"replaced by {record.output_key}")
                else:
                    store.delete(old.key)
                    self.ctx.report.event(old.key, "old access masters deleted", f"replaced by {record.output_key}")
                self.old.forget(old)
        self.old.save()

    def service_id(self, old: OldKey) -> str:
        return self.pipeline.manifests.image_service_id(DepositedImage(old.sequence, old.key, 0, 0))
