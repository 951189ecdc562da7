"""What a pipeline has deposited in its store, as the ledger knows it: every key a move of the store copies
(migrations/move_store.py) and a fixity audit reads (migrations/audit.py), with what the ledger recorded of it.
Read from the ledger, never from a listing of the store: a key the store lost is found missing, not forgotten."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterator

from gcis_etl.ledger import ItemRecord, Ledger
from gcis_etl.pipelines import Pipeline


@dataclass(frozen=True)
class StoreKey:
    key: str
    sha256: str | None  # what the ledger recorded, for access masters
    required: bool      # the ledger says it is deposited: absent from the store is a problem
    object_id: str | None = None  # whose access master or manifest it is; None: a collection
    version: str | None = None    # of a manifest or collection; None: an access master
    size: int | None = None       # bytes the ledger recorded, for access masters

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StoreKey:
        return cls(**json.loads(text))


def item_key(record: ItemRecord) -> StoreKey:
    """An item's access master: its last deposit, required whatever the item's status (an output_key is only
    ever recorded by a deposit, and a failed or rejected re-derivation leaves the old one serving, in the store
    and in the published manifest)."""
    return StoreKey(record.output_key, record.sha256, True, record.object_id, size=record.bytes)


def pipeline_keys(ledger: Ledger, pipeline: Pipeline) -> Iterator[StoreKey]:
    """Access masters, those superseded but not retired yet (a manifest may still show them; one retired
    meanwhile is absent, which is fine), then manifests, then the collections: what refers to an object goes
    after it."""
    for record in ledger.iter_items(pipeline.name, "output_key IS NOT NULL"):
        yield item_key(record)
    for superseded in ledger.superseded(pipeline.name):
        yield StoreKey(superseded.key, None, False, superseded.object_id)
    manifests = pipeline.manifests
    if manifests is None:
        return
    published = False
    for object_id in ledger.published(pipeline.name):
        published = True
        for version in manifests.settings.versions:
            yield StoreKey(manifests.manifest_key(object_id, version), None, True, object_id, version)
    for version in manifests.settings.versions:
        yield StoreKey(manifests.collection_key(version), None, published, version=version)
