"""Items named in the store by their place (`store.keys.image` with `{sequence}`): a page inserted, removed or
moved shifts the pages after it to other keys, so those pages are converted again under their new keys (their
old key holds another page's image by then), and no key a page still has is retired. Real files in a folder
source (pages ordered by file name), a local store, the harvest run again after each edit as cron would."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
import pyvips
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import HarvestOptions, harvest
from gcis_etl.ledger import Ledger
from tests.emulators.catalogue import CORPUS

IMAGES = "https://iiif.example.org/iiif"
PAGES = {"p1.png": "png/png-rgb-64x56x8.png", "p2.tif": "rgb8-tiff-uncompressed/hopper.tif",
         "p3.tif": "gray8/gray.tif"}  # told apart by their sizes


def site(tmp_path: Path, pages: list[str], manifests: bool = True, image: str = "{pipeline}/{object_id}/{sequence}.{ext}"):
    book = tmp_path / "masters" / "book"
    book.mkdir(parents=True, exist_ok=True)
    for page in pages:
        shutil.copyfile(CORPUS / PAGES[page], book / page)
    pipeline = {"source": {"kind": "filesystem", "root": str(tmp_path / "masters")},
                "store": {"kind": "local", "root": str(tmp_path / "store"),
                          "keys": {"image": image}},
                "overlap_seconds": 0}
    if manifests:
        pipeline["manifests"] = {"manifest_base_url": "https://iiif.example.org/store",
                                 "image_service_base_url": IMAGES}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"),
                                                          "pipelines": {"fs": pipeline}}))
    cfg = load_config(tmp_path / "config.yaml")
    run(cfg)
    return cfg


def run(cfg, full: bool = False) -> dict[str, str]:
    """The next run, after the folder changed (`full`: listing every page): each listed page's outcome, with
    its reason."""
    time.sleep(0.05)  # file times come from a coarse clock
    report = harvest(cfg, "fs", HarvestOptions(full=full))
    assert report.status == "completed" and report.counts["failed"] == report.counts["rejected"] == 0, report
    with Ledger.open(cfg) as ledger:
        return {Path(i.item_id).name: f"{i.outcome}: {i.reason}" for i in ledger.run_items(report.run_id)}


def size(page: str) -> tuple[int, int]:
    image = pyvips.Image.new_from_file(str(CORPUS / PAGES[page]))
    return image.width, image.height


def opened(tmp_path: Path, key: str) -> pyvips.Image:
    """From the bytes: libvips caches what it opened by file name, and a key is written over here."""
    return pyvips.Image.new_from_buffer((tmp_path / "store" / key).read_bytes(), "")


def stored(tmp_path: Path, key: str) -> tuple[int, int]:
    image = opened(tmp_path, key)
    return image.width, image.height


def keys(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path / "store")) for p in (tmp_path / "store" / "fs" / "book").glob("*.tif"))


def shown(tmp_path: Path) -> list[tuple[int, int]]:
    """What each canvas of the deposited manifest shows, in order: the size of the image under its key."""
    manifest = json.loads((tmp_path / "store" / "fs" / "book" / "manifest-v3.json").read_text())
    services = [c["items"][0]["items"][0]["body"]["service"][0]["@id"] for c in manifest["items"]]
    return [stored(tmp_path, unquote(s.removeprefix(IMAGES + "/"))) for s in services]


def test_a_page_inserted_in_front_moves_the_pages_after_it_to_their_new_keys_converted_again(tmp_path):
    cfg = site(tmp_path, ["p2.tif", "p3.tif"])
    assert [stored(tmp_path, k) for k in keys(tmp_path)] == [size("p2.tif"), size("p3.tif")]
    shutil.copyfile(CORPUS / PAGES["p1.png"], tmp_path / "masters" / "book" / "p1.png")

    outcomes = run(cfg)

    assert set(outcomes.values()) == {"deposited: None"}, outcomes  # p2 and p3 too, moved (test_decide: why)
    assert keys(tmp_path) == ["fs/book/1.tif", "fs/book/2.tif", "fs/book/3.tif"]
    assert shown(tmp_path) == [stored(tmp_path, k) for k in keys(tmp_path)] == [size(p) for p in sorted(PAGES)]
    assert run(cfg, full=True) == dict.fromkeys(PAGES, "skipped: unchanged")  # settled: nothing is redone


def test_a_page_removed_moves_the_pages_after_it_back_and_retires_the_last_key(tmp_path):
    cfg = site(tmp_path, sorted(PAGES))
    (tmp_path / "masters" / "book" / "p1.png").unlink()

    outcomes = run(cfg)

    assert outcomes == {"p2.tif": "deposited: None", "p3.tif": "deposited: None"}
    assert keys(tmp_path) == ["fs/book/1.tif", "fs/book/2.tif"]  # 3.tif, p3's old key, shown by no canvas now
    assert shown(tmp_path) == [size("p2.tif"), size("p3.tif")]


def test_a_withdrawn_page_whose_key_another_page_took_leaves_the_ledger(tmp_path):
    """Its access master is gone (written over): the ledger counts as deposited only what the store holds, one
    item a key, as status and move_store read it."""
    cfg = site(tmp_path, sorted(PAGES))
    (tmp_path / "masters" / "book" / "p2.tif").unlink()

    assert run(cfg) == {"p1.png": "skipped: unchanged", "p3.tif": "deposited: None"}  # p3 to 2.tif

    with Ledger.open(cfg) as ledger:
        records = {Path(r.item_id).name: r.output_key for r in ledger.items("fs", "book") if r.status == "deposited"}
    assert records == {"p1.png": "fs/book/1.tif", "p3.tif": "fs/book/2.tif"} and keys(tmp_path) == sorted(records.values())


def test_a_page_rejected_in_the_run_that_gave_its_key_to_another_page_is_not_shown_with_that_image(tmp_path):
    """p1 inserted in front takes p2's key while p2's new version is rejected: p2's last deposit is written over,
    so its canvas goes (its rejection is listed), rather than show p1's image twice, in this run and later ones."""
    cfg = site(tmp_path, ["p2.tif", "p3.tif"])
    book = tmp_path / "masters" / "book"
    shutil.copyfile(CORPUS / PAGES["p1.png"], book / "p1.png")
    (book / "p2.tif").write_bytes(b"II*\x00garbage" * 10)
    time.sleep(0.05)
    report = harvest(cfg, "fs", HarvestOptions())
    assert (report.counts["deposited"], report.counts["rejected"]) == (2, 1), report  # p1 to 1.tif, p3 to 3.tif

    assert shown(tmp_path) == [size("p1.png"), size("p3.tif")]
    again = run(cfg, full=True)
    assert again.pop("p2.tif").startswith("skipped: rejected before (")
    assert again == {"p1.png": "skipped: unchanged", "p3.tif": "skipped: unchanged"}
    assert shown(tmp_path) == [size("p1.png"), size("p3.tif")]


def test_a_key_another_page_had_before_it_was_withdrawn_is_retired_all_the_same(tmp_path):
    """A page deleted from the folder keeps its record (withdrawals are not acted on): not a holder of its key."""
    cfg = site(tmp_path, sorted(PAGES))
    (tmp_path / "masters" / "book" / "p2.tif").unlink()
    run(cfg)  # p3 moves to 2.tif, where p2 was
    (tmp_path / "masters" / "book" / "p1.png").unlink()

    assert run(cfg) == {"p3.tif": "deposited: None"}  # p3 moves to 1.tif

    assert keys(tmp_path) == ["fs/book/1.tif"] and shown(tmp_path) == [size("p3.tif")]


def test_pages_that_only_change_places_under_item_id_keys_are_not_converted_again(tmp_path):
    """Keys that do not follow the place (here also with {ext} not a file suffix) are not moved."""
    cfg = site(tmp_path, ["p2.tif", "p3.tif"], image="{pipeline}/{object_id}/{item_id}_{ext}")
    shutil.copyfile(CORPUS / PAGES["p1.png"], tmp_path / "masters" / "book" / "p1.png")

    assert run(cfg) == {"p1.png": "deposited: None", "p2.tif": "skipped: unchanged", "p3.tif": "skipped: unchanged"}


@pytest.mark.parametrize("manifests", [True, False], ids=["with manifests", "without manifests"])
def test_pages_that_swap_places_keep_both_keys(tmp_path, manifests):
    """Each page's old key is the other's new one: neither is retired, with or without manifests to consult."""
    cfg = site(tmp_path, ["p2.tif", "p3.tif"], manifests)
    book = tmp_path / "masters" / "book"
    book.joinpath("p2.tif").rename(book / "p9.tif")  # p3 comes first now

    run(cfg)
    run(cfg)  # superseded keys are retired once their object settled: a run that skips all of it too

    assert keys(tmp_path) == ["fs/book/1.tif", "fs/book/2.tif"]
    assert [stored(tmp_path, k) for k in keys(tmp_path)] == [size("p3.tif"), size("p2.tif")]
    if manifests:
        assert shown(tmp_path) == [size("p3.tif"), size("p2.tif")]


def test_a_key_holding_another_page_of_the_same_size_and_time_is_not_taken_for_the_moved_pages_own(tmp_path):
    """A folder source knows a master's version by its size and time alone: two scans written by one batch (same
    dimensions, uncompressed, same second) have the same, so what is under a key must be the page's own
    (its provenance names it) to be reused."""
    book = tmp_path / "masters" / "book"
    book.mkdir(parents=True)
    for name, value in (("a.tif", 0), ("b.tif", 255)):
        pyvips.Image.black(64, 64).new_from_image(value).cast("uchar").tiffsave(str(book / name))
        os.utime(book / name, (1700000000, 1700000000))
    cfg = site(tmp_path, [])
    book.joinpath("a.tif").rename(book / "c.tif")  # b first now, and c (a renamed) second

    run(cfg)

    assert [opened(tmp_path, k).avg() for k in keys(tmp_path)] == [255, 0]
