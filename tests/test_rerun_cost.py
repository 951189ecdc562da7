"""A re-run over unchanged items (cron's overlap, `harvest --full`, a revisit) decides "skip" cheaply: an object's
skipped items are recorded in one ledger transaction and read in one query, and no object's superseded keys are
asked for when the pipeline has none; the manifest fingerprints ledgers hold stay what the formula they were made
with gives, so a re-run republishes nothing. Observed on the ledger's own connection, as the harvest runs it, and
in what the ledger holds after (bench/rerun.py for the times)."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import numpy as np
import tifffile
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, harvest
from gcis_etl.ledger import Ledger
from gcis_etl.manifests import DepositedImage

P = "museum"
BOOK_PAGES = (1, 2, 3, 9, 10)  # page10 after page9: the sidecar's order, not the names'
_traced: list[list[str]] = []  # where the statements of connections opened meanwhile go (innermost last)
_opening: list[sqlite3.Connection] = []  # connections whose __init__ has not returned yet
_hooked: list = []  # _audit, once added


def _audit(event: str, args: tuple) -> None:
    """A connection can be traced once its __init__ has returned, after it announced its handle: at the next
    event audited (the harvest takes its lock, lists the source), before the run's first statement."""
    if event == "sqlite3.connect/handle" and _traced:
        _opening.append(args[0])
    elif _opening:
        try:
            _opening[0].set_trace_callback(_traced[-1].append if _traced else None)
        except sqlite3.ProgrammingError:  # still opening
            return
        _opening.pop(0)


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL of every SQLite connection opened meanwhile (the harvest's ledger), as run: the connection is
    reached through Python's audit hook for sqlite3.connect, which cannot be removed, so it does nothing after."""
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(_audit)
    _traced.append([])
    try:
        yield _traced[-1]
    finally:
        _traced.pop()
        _opening.clear()


def transactions(sql: list[str]) -> list[list[str]]:
    """The statements of each transaction committed (BEGIN ... COMMIT)."""
    done, current = [], None
    for statement in sql:
        if statement.startswith("BEGIN"):
            current = []
        elif statement == "COMMIT":
            done.append(current or [])
            current = None
        elif current is not None:
            current.append(statement)
    return done


def master(path: Path, width: int) -> None:
    tifffile.imwrite(path, np.full((8, width, 3), 120, np.uint8), photometric="rgb")


def site(root: Path, pages: tuple[int, ...]) -> Path:
    """A sidecar-described folder of masters (the book's pages, a one-page leaflet; titles in two languages), a local
    store and manifests; harvested once. Its config file."""
    masters = root / "masters"
    masters.mkdir(parents=True)
    rows = [["object_id", "file", "sequence", "label", "title@en", "title@fr", "creator"]]
    for n, page in enumerate(pages, 1):
        master(masters / f"page{page}.tif", 8)
        rows.append(["book", f"page{page}.tif", str(n), f"p. {page}", "A book", "Un livre", "Anon."])
    master(masters / "leaflet.tif", 8)
    rows.append(["leaflet", "leaflet.tif", "1", "", "A leaflet", "", ""])
    (masters / "objects.csv").write_text("".join(",".join(row) + "\n" for row in rows))
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({
        "state_dir": str(root / "state"), "defaults": {"concurrency": 1, "transfer_slots": 0},
        "pipelines": {P: {"source": {"kind": "filesystem", "root": str(masters)},
                          "store": {"kind": "local", "root": str(root / "store")},
                          "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                                        "image_service_base_url": "https://iiif.example.org/iiif",
                                        "versions": ["3.0"], "label": ["title"]}}}}))
    first = harvest(load_config(config), P)
    assert first.counts["deposited"] == len(pages) + 1 and first.manifests == 2
    return config


def rerun(config: Path) -> tuple[object, list[str]]:
    """A `--full` re-run's report, and the SQL its ledger ran."""
    with statements() as sql:
        report = harvest(load_config(config), P, HarvestOptions(full=True))
    return report, sql


def formula_of_ledgers(config: Path, object_id: str) -> str:
    """The manifest fingerprint as ledgers hold it (asdict of the object and its images, JSON with str for what
    JSON does not know), computed here from the object as its source lists it and its items as the ledger holds
    them."""
    pipeline = load_config(config).pipeline(P)
    obj = next(iter(pipeline.source.get([object_id])))
    with Ledger.open(load_config(config)) as ledger:
        records = {r.item_id: r for r in ledger.items(P, object_id)}
    images = [DepositedImage(item.sequence, records[item.id].output_key, records[item.id].width,
                             records[item.id].height, item.label) for item in obj.items]
    described = {k: v for k, v in asdict(obj).items() if k != "listed_at"}
    document = {"object": described | {"items": None}, "images": [asdict(i) for i in images],
                "settings": pipeline.manifests.settings.model_dump_json()}
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def fingerprints(config: Path) -> dict[str, str]:
    with Ledger.open(load_config(config)) as ledger:
        return {o: ledger.object(P, o).manifest_fingerprint for o in ("book", "leaflet")}


def test_a_no_change_rerun_commits_and_reads_as_much_for_a_five_page_book_as_for_a_one_page_one(tmp_path):
    five, one = site(tmp_path / "five", BOOK_PAGES), site(tmp_path / "one", BOOK_PAGES[:1])
    (report, sql), (report_one, sql_one) = rerun(five), rerun(one)
    assert report.counts == {"deposited": 0, "skipped": 6, "rejected": 0, "failed": 0} and report.manifests == 0
    assert report_one.counts["skipped"] == 2 and report_one.manifests == 0
    skips = [t for t in transactions(sql) if any(s.startswith("INSERT INTO run_items") for s in t)]
    assert [sum(s.startswith("INSERT INTO run_items") for s in t) for t in skips] == [5, 1]  # the book, the leaflet
    assert sql.count("COMMIT") == sql_one.count("COMMIT")
    selects = [s for s in sql if s.startswith("SELECT")]
    assert len(selects) == len([s for s in sql_one if s.startswith("SELECT")])
    # the pipeline has no superseded key: one look for any, not one an object
    assert sum("FROM superseded" in s for s in selects) == 1


def test_the_skipped_items_are_all_recorded_with_their_reasons_in_the_order_decided(tmp_path):
    config = site(tmp_path, BOOK_PAGES)
    report, _ = rerun(config)
    with Ledger.open(load_config(config)) as ledger:
        rows = [(r.object_id, r.item_id, r.reason) for r in ledger.run_items(report.run_id, "skipped")]
        assert ledger.recorded_counts(report.run_id)["skipped"] == 6
    assert rows == [("book", f"page{page}.tif", "unchanged") for page in BOOK_PAGES] \
        + [("leaflet", "leaflet.tif", "unchanged")]


def test_the_fingerprints_in_the_ledger_are_what_the_formula_ledgers_hold_gives_so_a_rerun_republishes_none(
        tmp_path):
    config = site(tmp_path, BOOK_PAGES)
    assert fingerprints(config) == {o: formula_of_ledgers(config, o) for o in ("book", "leaflet")}
    report, _ = rerun(config)
    assert report.manifests == 0


def test_a_page_changed_among_unchanged_ones_is_deposited_and_its_manifest_republished_with_its_new_size(tmp_path):
    config = site(tmp_path, BOOK_PAGES)
    before = fingerprints(config)
    page3 = tmp_path / "masters" / "page3.tif"
    master(page3, 16)
    os.utime(page3, (page3.stat().st_mtime + 5,) * 2)
    report, _ = rerun(config)
    assert report.counts == {"deposited": 1, "skipped": 5, "rejected": 0, "failed": 0} and report.manifests == 1
    with Ledger.open(load_config(config)) as ledger:
        outcomes = {(r.object_id, r.item_id): (r.outcome, r.reason) for r in ledger.run_items(report.run_id)}
        assert ledger.item(P, "book", "page3.tif").width == 16
    assert outcomes == {**{("book", f"page{page}.tif"): ("skipped", "unchanged") for page in BOOK_PAGES},
                        ("book", "page3.tif"): ("deposited", None),
                        ("leaflet", "leaflet.tif"): ("skipped", "unchanged")}
    after = fingerprints(config)
    assert after["leaflet"] == before["leaflet"] and after["book"] != before["book"]
    assert after["book"] == formula_of_ledgers(config, "book")
    pipeline = load_config(config).pipeline(P)
    [version] = pipeline.manifests.settings.versions
    canvases = json.loads(pipeline.store.get_bytes(pipeline.manifests.manifest_key("book", version)))["items"]
    assert [c["width"] for c in canvases] == [8, 8, 16, 8, 8]
