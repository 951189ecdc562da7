"""A pipeline's collection lost from the store (deleted, expired, a restore without it, no JSON) is written again
from the objects the ledger records as published whose manifest of that version is deposited, not from the next
run's objects alone. Real harvests over a filesystem source, into a local store and a real MinIO."""
from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from gcis_etl.progress import TerminalProgress
from tests.conftest import s3_settings

CORPUS = Path(__file__).resolve().parent / "corpus"


def store_block(kind: str, request) -> dict:
    if kind == "local":
        return {"kind": "local", "root": "store"}
    minio = request.getfixturevalue("minio")
    request.getfixturevalue("aws_env")
    return json.loads(s3_settings(minio, request.getfixturevalue("s3_bucket")).model_dump_json(exclude={"keys"}))


def make_site(tmp_path: Path, store: dict, image: str | None = None,
              versions: tuple[str, ...] = ("3.0", "2.1")) -> Path:
    """A filesystem source of objects (one master each) harvested into `store`, with manifests of `versions`."""
    if image:
        store = {**store, "keys": {"image": image}}
    config = {"pipelines": {"museum": {
        "source": {"kind": "filesystem", "root": "masters"}, "overlap_seconds": 0, "store": store,
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": "https://iiif.example.org/iiif", "versions": list(versions)}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def add_object(site: Path, name: str) -> None:
    (site / "masters" / name).mkdir(parents=True)
    shutil.copy(CORPUS / "gray8/hopper_gray.jpg", site / "masters" / name / "p1.jpg")


def run(site: Path):
    return harvest(load_config(site / "config.yaml"), "museum")


def the_store(site: Path):
    return load_config(site / "config.yaml").pipeline("museum").store


def listed(site: Path, major: int) -> list[str]:
    document = json.loads(the_store(site).get_bytes(f"collections/museum-v{major}.json"))
    entries = document["items"] if major == 3 else document["manifests"]
    return [(e["id"] if major == 3 else e["@id"]).split("/")[-2] for e in entries]


@pytest.fixture(params=["local", "s3"])
def store(request) -> dict:
    return store_block(request.param, request)


@pytest.fixture
def site(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return make_site(tmp_path, store)


def test_a_collection_gone_from_the_store_is_written_again_with_every_object_published(site):
    """It was written again with the next run's objects alone (walk finding 1): harvest, initial_load, audit
    and --full all left it so, silently."""
    for name in ("a", "b", "c"):
        add_object(site, name)
    assert run(site).counts["deposited"] == 3
    store = the_store(site)
    assert store.delete("collections/museum-v3.json")
    add_object(site, "d")
    report = run(site)
    assert report.counts["deposited"] == 1
    assert listed(site, 3) == ["a", "b", "c", "d"] and listed(site, 2) == ["a", "b", "c", "d"]
    assert "collections/museum-v3.json: the deposited collection was missing: written again with the 4 objects " \
           "the ledger records as published whose manifest of this version is deposited (3 besides this run's)" \
           in report.note
    assert "museum-v2.json" not in report.note


def test_a_run_with_nothing_new_writes_a_lost_collection_again_and_one_no_json_too(site):
    for name in ("a", "b"):
        add_object(site, name)
    run(site)
    store = the_store(site)
    store.delete("collections/museum-v2.json")
    report = run(site)
    assert report.counts["deposited"] == 0 and report.manifests == 0
    assert listed(site, 2) == ["a", "b"] and "museum-v2.json: the deposited collection was missing" in report.note
    assert run(site).note is None  # there again: nothing to say

    store.put_bytes("collections/museum-v3.json", b'{"items": [', content_type="application/json")
    add_object(site, "c")
    report = run(site)
    assert listed(site, 3) == ["a", "b", "c"]
    assert "museum-v3.json: the deposited collection was not JSON (" in report.note


def test_a_first_collection_is_no_loss_to_report(site):
    add_object(site, "a")
    assert run(site).note is None and listed(site, 3) == ["a"]


def test_a_version_added_later_lists_only_the_objects_published_in_it(store, tmp_path, monkeypatch):
    """Its collection, new, was written from every object the ledger records as published: museum-v2.json listed
    a and b, which have no manifest-v2.json, and the run warned of 2 objects lost."""
    monkeypatch.chdir(tmp_path)
    site = make_site(tmp_path, store, versions=("3.0",))
    for name in ("a", "b"):
        add_object(site, name)
    run(site)
    make_site(tmp_path, store, versions=("3.0", "2.1"))
    add_object(site, "c")
    report = run(site)
    assert report.counts["deposited"] == 1
    store = the_store(site)
    assert store.exists("museum/c/manifest-v2.json") and not store.exists("museum/a/manifest-v2.json")
    assert listed(site, 2) == ["c"] and listed(site, 3) == ["a", "b", "c"]
    assert report.note is None


def test_on_a_terminal_the_warning_of_a_lost_collection_is_on_a_line_of_its_own(tmp_path, monkeypatch, capsys):
    """It was logged over the live line, glued to its end."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    site = make_site(tmp_path, {"kind": "local", "root": "store"})
    add_object(site, "a")
    run(site)
    the_store(site).delete("collections/museum-v3.json")
    add_object(site, "b")
    handler = logging.StreamHandler(sys.stderr)  # as the CLI logs: to the terminal the line is drawn on
    logging.getLogger("gcis_etl").addHandler(handler)
    try:
        progress = TerminalProgress("museum", live=True)
        harvest(load_config(site / "config.yaml"), "museum", progress=progress)
        progress.clear()
    finally:
        logging.getLogger("gcis_etl").removeHandler(handler)
    err = capsys.readouterr().err
    assert re.search(r"(^|\n)museum: \S*collections/museum-v3\.json: the deposited collection was missing", err), err
