"""Re-derive the access masters made with one recipe, using another (or a newer version of the same one).

Every item the ledger records as deposited with --from-recipe is converted again from its master with
--to-recipe (default: the pipeline's configured recipe), in harvest runs of --batch-size objects; manifests are
republished where an access master's key changed. --from-recipe may name the target recipe itself: the items
made with an older version of it (another digest) are then re-derived. Re-running continues where the last
run stopped: items already made with --to-recipe are no longer selected.

Old access masters: with the same extension, the new access master replaces the old one under the same key.
With another extension (.tif to .jp2) it goes under a new key, and the old key is deleted once no deposited
manifest of its object refers to it any more; --keep-old keeps them instead (each is listed in the report's
CSV). Until an old key can go (an item of its object failed, the run was cut short) the ledger records it as
superseded, and the next run (or harvest of the object) finishes the job.

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
2 configuration or usage error; 3 another run holds the pipeline; 130 (Ctrl-C) or 143 (SIGTERM) stopped
by that signal after the items in flight, or at once on a second Ctrl-C, which abandons them (what was
settled is recorded: run it again to continue).
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from itertools import groupby
from typing import Iterable, Iterator

import click

from gcis_etl.errors import ConfigError
from gcis_etl.ledger import Ledger
from gcis_etl.migration import MigrationContext, migration
from gcis_etl.pipelines import Pipeline, config_folder
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
        target = pipeline.recipe if to_recipe is None else load_recipe(to_recipe, config_folder(pipeline.config_file))
        if target.name != pipeline.recipe.name:
            ctx.report.notes.append(f"{name}: new items are still made with {pipeline.settings.recipe}: "
                                    f"set `recipe: {target.name}` in {ctx.config.source_file}")
        if not Reencode(ctx, pipeline, from_recipe, target, keep_old).run(batch_size):
            return


@dataclass(frozen=True)
class OldKey:
    """An access master the migration replaces: a selected item's key before the run that re-derives it (with
    the key it will have), or one the ledger records as superseded already (new_key None)."""

    object_id: str
    item_id: str
    key: str
    new_key: str | None


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
        load_recipe(recipe, config_folder(ctx.config.source_file))
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

    def selected(self, ledger: Ledger) -> Iterator[OldKey]:
        """What was deposited with --from-recipe, and what failed to be re-derived with the target (its old
        access master is still the item's: the harvest retries it within its attempts)."""
        extension = self.target.extension.lstrip(".")
        for record in ledger.iter_items(self.pipeline.name, "output_key IS NOT NULL AND ((status='deposited' AND "
                                        "recipe=? AND recipe_digest<>?) OR (status='failed' AND recipe_digest=?))",
                                        (self.from_recipe, self.target.digest, self.target.digest)):
            new_key = self.pipeline.store.keys.image_key(self.pipeline.name, record.object_id, record.item_id,
                                                         record.sequence, extension)
            yield OldKey(record.object_id, record.item_id, record.output_key, new_key)

    def waiting(self, ledger: Ledger) -> list[OldKey]:
        """The keys already superseded (an earlier run cut short, an item of the object failed), whose objects
        are harvested again so their manifests are republished and the keys retired. An older version noted
        them in a file of its own: those no item uses any more are taken into the ledger, once."""
        name = self.pipeline.name
        notes = self.ctx.config.state_dir / "migrations" / f"reencode-{name}.json"
        noted = json.loads(notes.read_text()) if notes.is_file() else []
        superseded = [OldKey(e["object_id"], e["item_id"], e["key"], None) for e in noted
                      if getattr(ledger.item(name, e["object_id"], e["item_id"]), "output_key", None) != e["key"]]
        if not self.ctx.dry_run:
            for old in superseded:
                ledger.supersede(name, old.object_id, old.item_id, old.key, None)
            notes.unlink(missing_ok=True)
            superseded = []
        superseded += [OldKey(s.object_id, s.item_id, s.key, None) for s in ledger.superseded(name)]
        return sorted(set(superseded), key=lambda k: (k.object_id, k.key))

    def run(self, batch_size: int) -> bool:
        """Each object once, in order, whether it has keys waiting or items selected; False when the migration
        should go no further."""
        with self.ctx.ledger() as ledger:
            keys = heapq.merge(self.waiting(ledger), self.selected(ledger), key=lambda k: k.object_id)
            for batch in by_object(keys, batch_size):
                if not self.batch(ledger, batch):
                    return False
            waiting = ledger.superseded_count(self.pipeline.name)
        if waiting and not self.ctx.dry_run:
            self.ctx.report.notes.append(
                f"{self.pipeline.name}: {waiting} old access masters wait until their objects are re-derived and "
                f"republished: run again (after `gcis-etl retry` for items out of attempts)")
        return True

    def batch(self, ledger: Ledger, batch: dict[str, list[OldKey]]) -> bool:
        keys = [key for object_keys in batch.values() for key in object_keys]
        if self.ctx.dry_run:
            moving = sum(k.key != k.new_key for k in keys)
            if moving:
                self.ctx.report.add("old access masters to keep" if self.keep_old else "old access masters to delete",
                                    moving)
        go_on = self.ctx.harvest(self.pipeline.name, object_ids=tuple(batch), recipe=self.target.name,
                                 reencode=self.from_recipe, keep_superseded=self.keep_old)
        if not self.ctx.dry_run:
            self.settle(ledger, batch)
        return go_on

    def settle(self, ledger: Ledger, batch: dict[str, list[OldKey]]) -> None:
        """Report what became of each old key in the run: retired (a key that is neither superseded nor an
        item's any more: deleted, or kept with --keep-old), or kept because the target recipe rejects the
        master. The others still wait in the ledger."""
        name = self.pipeline.name
        waiting = {s.key for object_id in batch for s in ledger.superseded(name, object_id)}
        for old in (key for keys in batch.values() for key in keys if key.key not in waiting):
            record = ledger.item(name, old.object_id, old.item_id)
            if record is None or record.output_key != old.key:
                self.ctx.report.event(old.key, "old access masters kept" if self.keep_old
                                      else "old access masters deleted",
                                      f"replaced by {record.output_key}" if record else "its item is gone")
            elif record.status == "rejected" and record.recipe_digest == self.target.digest:
                self.ctx.report.event(old.key, "old access masters kept",
                                      f"{self.target.name} rejects the master ({record.reason})")
