"""A folder source as operators fill it: masters staged elsewhere and moved in, or copied with their times, are
harvested by the next incremental run; a file renamed or deleted in an object republishes its manifest; a chmod
re-lists a master but converts nothing. Real files, a local store, `harvest` with no overlap before the checkpoint
(so that only what the source lists as changed since the last run is listed at all)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import unquote

import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from gcis_etl.ledger import Ledger
from tests.emulators.catalogue import CORPUS

IMAGES = "https://iiif.example.org/iiif"
MASTERS = {"objA/p1.tif": "gray8/gray.tif", "objA/p2.tif": "rgb8-tiff-uncompressed/hopper.tif",
           "objB/p1.tif": "gray8/gray.tif"}


def site(tmp_path: Path):
    """Two objects in `masters/`, harvested once; the next run lists from that run's start, no overlap."""
    for relative, corpus in MASTERS.items():
        (tmp_path / "masters" / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CORPUS / corpus, tmp_path / "masters" / relative)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"fs": {
        "source": {"kind": "filesystem", "root": str(tmp_path / "masters")},
        "store": {"kind": "local", "root": str(tmp_path / "store")}, "overlap_seconds": 0,
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": IMAGES}}}}))
    cfg = load_config(tmp_path / "config.yaml")
    tick()
    assert harvest(cfg, "fs").counts["deposited"] == 3
    tick()
    return cfg


def tick() -> None:
    """File times come from a coarse clock: what happens after this is stamped after what came before."""
    time.sleep(0.05)


def staged(tmp_path: Path, corpus: str, hours_before_checkpoint: float, cfg) -> Path:
    """A master prepared outside the harvest folder, last modified well before the checkpoint."""
    path = tmp_path / "staging" / Path(corpus).name
    path.parent.mkdir(exist_ok=True)
    shutil.copyfile(CORPUS / corpus, path)
    with Ledger.open(cfg) as ledger:
        old = ledger.checkpoint("fs").timestamp() - hours_before_checkpoint * 3600
    os.utime(path, (old, old))
    return path


def run(cfg) -> tuple[dict[tuple[str, str], str], int]:
    """The next incremental run: each listed item's outcome (a skipped one's with why), and how many manifests it
    published."""
    report = harvest(cfg, "fs")
    assert report.status == "completed", report.note
    with Ledger.open(cfg) as ledger:
        return ({(i.object_id, i.item_id): i.outcome + (f" ({i.reason})" if i.outcome == "skipped" else "")
                 for i in ledger.run_items(report.run_id)}, report.manifests)


def canvases(tmp_path: Path, cfg, object_id: str) -> list[str]:
    """The items the object's deposited manifest shows, in order (by their access masters' keys)."""
    manifest = json.loads((tmp_path / "store" / "fs" / object_id / "manifest-v3.json").read_text())
    services = [c["items"][0]["items"][0]["body"]["service"][0]["@id"] for c in manifest["items"]]
    with Ledger.open(cfg) as ledger:
        items = {r.output_key: r.item_id for r in ledger.items("fs", object_id)}
    return [items[unquote(service.removeprefix(IMAGES + "/"))] for service in services]


def test_a_master_staged_elsewhere_and_moved_in_with_its_old_time_is_harvested(tmp_path):
    cfg = site(tmp_path)
    master = staged(tmp_path, "png/png-rgb-64x56x8.png", 1, cfg)
    (tmp_path / "masters" / "objF").mkdir()
    master.rename(tmp_path / "masters" / "objF" / "f.png")  # mv staging/objF src/, as one folder or file by file
    assert run(cfg) == ({("objF", "objF/f.png"): "deposited"}, 1)
    assert canvases(tmp_path, cfg, "objF") == ["objF/f.png"]


def test_a_master_copied_with_its_times_into_an_object_is_harvested(tmp_path):
    cfg = site(tmp_path)
    master = staged(tmp_path, "png/png-rgb-64x56x8.png", 24, cfg)
    shutil.copy2(master, tmp_path / "masters" / "objA" / "p3.png")  # cp -p, rsync -a, tar x
    assert run(cfg) == ({("objA", "objA/p1.tif"): "skipped (unchanged)", ("objA", "objA/p2.tif"): "skipped (unchanged)",
                         ("objA", "objA/p3.png"): "deposited"}, 1)
    assert canvases(tmp_path, cfg, "objA") == ["objA/p1.tif", "objA/p2.tif", "objA/p3.png"]


def test_a_master_renamed_in_its_object_is_deposited_under_its_new_name(tmp_path):
    cfg = site(tmp_path)
    (tmp_path / "masters" / "objA" / "p2.tif").rename(tmp_path / "masters" / "objA" / "p0.tif")
    assert run(cfg) == ({("objA", "objA/p0.tif"): "deposited", ("objA", "objA/p1.tif"): "skipped (unchanged)"}, 1)
    assert canvases(tmp_path, cfg, "objA") == ["objA/p0.tif", "objA/p1.tif"]


def test_a_master_deleted_from_its_object_leaves_its_manifest(tmp_path):
    cfg = site(tmp_path)
    (tmp_path / "masters" / "objA" / "p1.tif").unlink()
    assert run(cfg) == ({("objA", "objA/p2.tif"): "skipped (unchanged)"}, 1)
    assert canvases(tmp_path, cfg, "objA") == ["objA/p2.tif"]


def test_a_chmod_relists_a_master_that_is_skipped_as_unchanged(tmp_path):
    cfg = site(tmp_path)
    (tmp_path / "masters" / "objB" / "p1.tif").chmod(0o600)
    assert run(cfg) == ({("objB", "objB/p1.tif"): "skipped (unchanged)"}, 0)  # nor is its manifest published again


def test_a_rejected_master_deleted_from_its_object_leaves_the_ledger(tmp_path):
    """Its record stayed 'rejected' in status for ever (and a failed one's object was revisited on every run),
    for a master that is no longer there."""
    cfg = site(tmp_path)
    (tmp_path / "masters" / "objA" / "p3.tif").write_bytes(b"II*\x00" + b"\x00" * 100)  # no image in it
    tick()
    outcomes, _ = run(cfg)
    assert outcomes[("objA", "objA/p3.tif")] == "rejected"
    (tmp_path / "masters" / "objA" / "p3.tif").unlink()
    tick()
    outcomes, _ = run(cfg)
    assert ("objA", "objA/p3.tif") not in outcomes
    with Ledger.open(cfg) as ledger:
        assert ledger.counts("fs") == {"deposited": 3, "skipped": 0, "rejected": 0, "failed": 0}
        assert [r.item_id for r in ledger.items("fs", "objA")] == ["objA/p1.tif", "objA/p2.tif"]
