"""One object's problem fails that object alone: a sidecar row naming a missing master, a key that is both a root
file and a folder. A sidecar typed in NFC names masters uploaded from a Mac (NFD), which keep their stored names."""
from __future__ import annotations

import shutil
import unicodedata
from datetime import datetime, timezone
from pathlib import Path

import yaml

from connectors import open_source
from connectors.base import SourceObject
from connectors.grouping import GroupedSource, GroupingSettings, StoredFile
from connectors.retry import RetryPolicy
from gcis_etl.config import load_config
from gcis_etl.harvesting import OBJECT, harvest
from gcis_etl.ledger import Ledger
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS

JAN = datetime(2024, 1, 1, tzinfo=timezone.utc)
MASTER = CORPUS / "gray8/gray.tif"
CAFE = "Café Müller/façade.tif"  # as typed in the sidecar (NFC)
CAFE_NFD = unicodedata.normalize("NFD", CAFE)  # as a Mac names the file it uploads


def masters(root: Path, *paths: str) -> Path:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MASTER, root / path)
    return root


def config(tmp_path: Path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "pipelines": {"fs": {
        "source": {"kind": "filesystem", "root": str(tmp_path / "masters")},
        "store": {"kind": "local", "root": str(tmp_path / "store")},
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": "https://iiif.example.org/iiif"}}}}))
    return load_config(tmp_path / "config.yaml")


def deposited(config) -> set[tuple[str, str]]:
    with Ledger.open(config) as ledger:
        return {(r.object_id, r.item_id) for r in ledger.items("fs") if r.status == "deposited"}


def test_a_master_gone_from_the_sidecar_fails_its_object_alone_until_the_sidecar_is_fixed(tmp_path):
    root = masters(tmp_path / "masters", "a/1.tif", "b/1.tif", "b/2.tif", "c/1.tif")
    (root / "b/2.tif").unlink()  # deleted by another team
    (root / "objects.csv").write_text("object_id,file,sequence\n"
                                      "A,a/1.tif,1\nB,b/1.tif,1\nB,b/2.tif,2\nC,c/1.tif,1\n")
    settings = config(tmp_path)
    report = harvest(settings, "fs")
    assert report.status == "completed" and report.exit_code == 1
    assert deposited(settings) == {("A", "a/1.tif"), ("C", "c/1.tif")}
    (problem,) = report.problems
    assert (problem.object_id, problem.item_id, problem.outcome) == ("B", OBJECT, "failed")
    assert problem.reason == ("the source cannot describe it: fs: objects.csv row 4: "
                              "file 'b/2.tif' does not exist (or is hidden)")

    assert harvest(settings, "fs").counts["failed"] == 1  # retried, still failing, the others skipped
    (root / "objects.csv").write_text("object_id,file,sequence\nA,a/1.tif,1\nB,b/1.tif,1\nC,c/1.tif,1\n")
    report = harvest(settings, "fs")
    assert report.exit_code == 0 and report.counts["deposited"] == 1 and not report.problems
    assert deposited(settings) == {("A", "a/1.tif"), ("B", "b/1.tif"), ("C", "c/1.tif")}
    with Ledger.open(settings) as ledger:
        assert ledger.item("fs", "B", OBJECT) is None  # its failure is forgotten once the source describes it


def test_a_sidecar_in_nfc_names_masters_stored_in_nfd_which_are_deposited_under_their_stored_names(tmp_path):
    root = masters(tmp_path / "masters", CAFE_NFD, "other.tif")
    assert sorted(p.name for p in root.iterdir()) == [unicodedata.normalize("NFD", "Café Müller"), "other.tif"]
    (root / "objects.csv").write_text(f"object_id,file\nM1,{CAFE}\nM2,other.tif\n", encoding="utf-8")
    settings = config(tmp_path)
    report = harvest(settings, "fs")
    assert report.exit_code == 0 and report.counts["deposited"] == 2
    assert deposited(settings) == {("M1", CAFE_NFD), ("M2", "other.tif")}


def test_a_name_matching_several_stored_names_under_nfc_only_fails_its_object(tmp_path):
    root = masters(tmp_path / "masters", CAFE, CAFE_NFD, "other.tif")  # two files Linux tells apart
    (root / "objects.csv").write_text(f"object_id,file\nM1,{CAFE}\nM2,{CAFE_NFD}\nM3,other.tif\n", encoding="utf-8")
    fs = open_source("filesystem", {"root": str(root), "retry": FAST_RETRY}, name="fs-test")
    listed = {o.id: o for o in fs.changes(None)}
    assert [i.id for i in listed["M1"].items] == [CAFE] and [i.id for i in listed["M2"].items] == [CAFE_NFD]
    mixed = "Café Müller/" + unicodedata.normalize("NFD", "façade.tif")  # neither as it is, both under NFC
    (root / "objects.csv").write_text(f"object_id,file\nM1,{mixed}\nM3,other.tif\n", encoding="utf-8")
    listed = {o.id: o for o in fs.changes(None)}
    assert isinstance(listed["M3"], SourceObject) and listed["M1"].reason == (
        f"fs-test: objects.csv row 2: file {mixed!r} may be any of {CAFE_NFD!r}, {CAFE!r}, which differ only in "
        "Unicode normalisation: rename all but one")


def test_nfc_sidecar_names_nfd_keys_over_minio(minio, s3_bucket, tmp_path):
    client = minio.client()
    for key in (CAFE_NFD, "other.tif"):
        client.put_object(Bucket=s3_bucket, Key=f"masters/{key}", Body=MASTER.read_bytes())
    client.put_object(Bucket=s3_bucket, Key="masters/objects.csv",
                      Body=f"object_id,file\nM1,{CAFE}\nM2,other.tif\n".encode())
    s3 = open_source("s3", {"bucket": s3_bucket, "prefix": "masters", "endpoint_url": minio.endpoint,
                            "access_key_id": minio.access_key, "secret_access_key": minio.secret_key,
                            "addressing_style": "path", "retry": FAST_RETRY}, name="s3-test")
    (obj,) = s3.get(["M1"])
    assert [(i.id, i.locator) for i in obj.items] == [(CAFE_NFD, f"masters/{CAFE_NFD}")]
    assert s3.fetch(obj.items[0], tmp_path / "scratch").path.read_bytes() == MASTER.read_bytes()


class Keys(GroupedSource):
    """A store of keys as S3 lists them: AWS S3 holds a key `a` beside keys `a/...`, which MinIO (whose keys are
    files and folders) refuses, so the listing is given."""

    name = "keys"
    grouping = GroupingSettings(mode="folder")
    retry = RetryPolicy()

    def __init__(self, *keys: str):
        self.keys = keys

    def _files(self):
        return (StoredFile(key, 0, JAN) for key in self.keys)

    def _read(self, path):
        raise AssertionError("no sidecar")

    def _locate(self, path):
        return path

    def _open(self, item, budget):
        raise AssertionError("not fetched")


def test_a_key_both_a_root_file_and_a_folder_fails_that_object_alone():
    listed = list(Keys("b/1.tif", "a", "a/1.tif", "c").changes(None))
    assert [(o.id, type(o).__name__) for o in listed] == [
        ("a", "UnreadableObject"), ("b", "SourceObject"), ("c", "SourceObject")]
    assert listed[0].reason == ("keys: 'a' is both a file at the root and a folder: rename the file (or the folder) so "
                                "that each is an object of its own")
    assert listed[0].modified == JAN
