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
superseded, and the next run (or harvest of the object) finishes the job. Each deletion goes to the report's
CSV as it happens, so the CSV of a killed run holds what it deleted.

An item or object the source no longer has is not re-derived: it is listed in the report (no longer in the
source) and its access master is left as it is, as the ledger records it; that is no failure, and each run lists
it again.

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
2 configuration or usage error; 3 another run holds the pipeline; 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP)
stopped by that signal after the items in flight, or at once on a second Ctrl-C, which abandons them (what was
settled is recorded: run it again to continue).
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from itertools import groupby
from typing import Iterable, Iterator

import click

from connectors.base import Source, SourceObject, UnreadableObject, described
from gcis_etl.errors import ConfigError
from gcis_etl.ledger import Ledger
from gcis_etl.migration import MigrationContext, migration
from gcis_etl.models import item_label
from gcis_etl.pipelines import Pipeline, config_folder
from gcis_etl.recipes import Recipe, load_recipe
from gcis_etl.reports import counted


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


def in_source(source: Source, object_ids: list[str]) -> dict[str, SourceObject | UnreadableObject]:
    """The objects as the source describes them now, by id, for the harvest to take as they are (asking again
    is a second round-trip an object); one it cannot describe too (the harvest fails it, within its attempts);
    one it no longer has is left out."""
    return {obj.id: obj for obj in described(source, object_ids)
            if not (isinstance(obj, UnreadableObject) and obj.gone)}


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
        self.lost = 0          # keys of items the source no longer has
        self.lost_waiting = 0  # among them, keys the ledger holds as superseded

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
            waiting = ledger.superseded_count(self.pipeline.name) - self.lost_waiting
        name = self.pipeline.name
        if self.lost:
            self.ctx.report.notes.append(f"{name}: {counted(self.lost, 'access master')} of items no longer in "
                                         f"the source are left as they are (each run lists them again)")
        if waiting and not self.ctx.dry_run:
            self.ctx.report.notes.append(
                f"{name}: {waiting} old access masters wait until their objects are re-derived and republished: "
                f"run again (after `gcis-etl retry` for items out of attempts)")
        return True

    def batch(self, ledger: Ledger, batch: dict[str, list[OldKey]]) -> bool:
        """The keys whose items the source still has are taken further; the others are listed and left as they
        are: asked for by id, an object the source no longer has would fail the run, and every run after it."""
        present = in_source(self.pipeline.source, list(batch))
        items = {object_id: {item.id for item in obj.items} if isinstance(obj, SourceObject) else None
                 for object_id, obj in present.items()}
        kept: dict[str, list[OldKey]] = {}
        for object_id, keys in batch.items():
            for key in keys:
                if self.gone(items, key):
                    self.lost += 1
                    self.lost_waiting += key.new_key is None
                    self.ctx.report.event(item_label(key.object_id, key.item_id), "no longer in the source",
                                          f"its {'old ' if key.new_key is None else ''}access master {key.key} "
                                          f"is left as it is")
                else:
                    kept.setdefault(object_id, []).append(key)
        if self.ctx.dry_run:
            moving = sum(k.key != k.new_key for keys in kept.values() for k in keys)
            if moving:
                self.ctx.report.add("old access masters to keep" if self.keep_old else "old access masters to delete",
                                    moving)
        if not kept:  # object_ids=() would harvest the whole source
            return True
        go_on = self.ctx.harvest(self.pipeline.name, object_ids=tuple(kept),
                                 described=tuple(present[object_id] for object_id in kept), recipe=self.target.name,
                                 reencode=self.from_recipe, keep_superseded=self.keep_old)
        if not self.ctx.dry_run:
            self.settle(ledger, kept)
        return go_on

    @staticmethod
    def gone(present: dict[str, set[str] | None], key: OldKey) -> bool:
        """The key's object, or (for a selected key) its item, is no longer in the source (`present`: the ids of
        the items the source has, by object; None for an object it cannot describe). A key waiting for its
        object's manifest goes with the object: its item may be gone from a manifest republished since."""
        if key.object_id not in present:
            return True
        items = present[key.object_id]
        return key.new_key is not None and items is not None and key.item_id not in items

    def settle(self, ledger: Ledger, batch: dict[str, list[OldKey]]) -> None:
        """Report the old keys kept because the target recipe rejects the master. Those retired in the run were
        reported as the harvest retired them (MigrationContext.harvest); the others still wait in the ledger."""
        name = self.pipeline.name
        for old in (key for keys in batch.values() for key in keys):
            record = ledger.item(name, old.object_id, old.item_id)
            if (record is not None and record.output_key == old.key and record.status == "rejected"
                    and record.recipe_digest == self.target.digest):
                self.ctx.report.event(old.key, "old access masters kept",
                                      f"{self.target.name} rejects the master ({record.reason})")
