"""Access masters an item no longer uses: retired once nothing refers to them.

An item re-derived under another key (its recipe now writes .jp2 where it wrote .tif: a `recipe:` switched, a
`harvest --force`, the reencode migration) leaves its old access master in the store, where the object's
deposited manifests may still show it until they are republished. The ledger records the old key as superseded
(Ledger.record); the harvest retires an object's superseded keys when the object settles with its manifest
published or already up to date, under the pipeline's lock. Until then (an item of the object failed, its
manifest was rejected, the run was cut short, the store refused the deletion) they wait in the ledger, and
move_store copies them with the rest. A refused deletion is a warning, not the run's failure: a policy without
s3:DeleteObject must not keep the harvest from depositing new access masters.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from gcis_etl.errors import StoreError, StoreUnavailable
from gcis_etl.ledger import Ledger
from gcis_etl.manifests import DepositedImage
from gcis_etl.pipelines import Pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retired:
    key: str
    replaced_by: str | None  # the item's access master now
    kept: bool               # forgotten but left in the store (reencode --keep-old)


def retire_superseded(ledger: Ledger, pipeline: Pipeline, object_id: str, keep: bool = False) -> Iterator[Retired]:
    """Delete (or, with `keep`, only forget) each superseded key of the object that no deposited manifest of it
    refers to any more; what waits still shows in a manifest. Each is yielded once it is gone, so what reports it
    (a migration's CSV) holds it even if the run is killed before the object's next key. Call under the
    pipeline's lock."""
    waiting = list(ledger.superseded(pipeline.name, object_id))
    if not waiting:
        return
    manifests, store = pipeline.manifests, pipeline.store
    deposited = () if manifests is None else [
        store.get_bytes(key).decode() for key in (manifests.manifest_key(object_id, version)
                                                  for version in manifests.settings.versions) if store.exists(key)]
    for old in waiting:
        if manifests is not None:
            service = manifests.image_service_id(DepositedImage(0, old.key, 0, 0))
            if any(f'"{service}"' in text for text in deposited):
                continue
        if not keep:
            try:
                store.delete(old.key)
            except StoreUnavailable:  # an outage stops the run, as it would at the next deposit
                raise
            except StoreError as exc:  # its message says what to check (S3Store._error)
                log.warning("%s/%s: superseded access master %s not deleted, it waits in the ledger for the next "
                            "run: %s", pipeline.name, object_id, old.key, exc,
                            extra={"pipeline": pipeline.name, "object_id": object_id})
                continue
        ledger.forget_superseded(pipeline.name, old.key)
        record = ledger.item(pipeline.name, old.object_id, old.item_id) or next(  # moved to another object
            iter(ledger.elsewhere(pipeline.name, old.object_id, [old.item_id])), None)
        yield Retired(old.key, record.output_key if record else None, keep)
