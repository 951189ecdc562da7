"""What the S3 store walk found (session 32): a lost collection written again from the ledger, a killed run's
uploads aborted only where they are the pipeline's own, documents re-put with the headers they lack, and a key
too long saying what template takes it. Real MinIO, real harvests over a filesystem source."""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.harvesting import harvest
from gcis_etl.keys import KeyTemplates, UnsafeKey
from gcis_etl.ledger import Ledger
from gcis_etl.manifests import MEDIA_TYPES
from gcis_etl.stores import DOCUMENT_CACHE_CONTROL, LocalStore, LocalStoreSettings, S3Store, open_store
from tests.conftest import s3_settings

CORPUS = Path(__file__).resolve().parent / "corpus"
PREFIX = "iiif/access"


def store_block(kind: str, request) -> dict:
    if kind == "local":
        return {"kind": "local", "root": "store"}
    minio = request.getfixturevalue("minio")
    request.getfixturevalue("aws_env")
    return json.loads(s3_settings(minio, request.getfixturevalue("s3_bucket")).model_dump_json(exclude={"keys"}))


def make_site(tmp_path: Path, store: dict, image: str | None = None) -> Path:
    """A filesystem source of objects (one master each) harvested into `store`, 3.0 and 2.1 manifests."""
    if image:
        store = {**store, "keys": {"image": image}}
    config = {"pipelines": {"museum": {
        "source": {"kind": "filesystem", "root": "masters"}, "overlap_seconds": 0, "store": store,
        "manifests": {"manifest_base_url": "https://iiif.example.org/store",
                      "image_service_base_url": "https://iiif.example.org/iiif", "versions": ["3.0", "2.1"]}}}}
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
def site(request, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return make_site(tmp_path, store_block(request.param, request))


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
           "the ledger records as published (3 besides this run's)" in report.note
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


# ------------------------------------------------------------------------------------- killed runs' uploads


def killed_run(site: Path) -> None:
    """The ledger as a run killed mid-way leaves it: 'running', with nobody holding the pipeline's lock."""
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        ledger.begin_run("museum", None, None, {})


@pytest.fixture
def s3_site(request, tmp_path, monkeypatch, minio, s3_bucket):
    monkeypatch.chdir(tmp_path)
    return lambda image=None: make_site(tmp_path, store_block("s3", request), image)


def uploads(minio, bucket: str) -> list[str]:
    return [u["Key"] for u in minio.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize("image, other", [("{object_id}/{item_id}.{ext}", "big/IE1/x.tif"),
                                          ("images/{object_id}/{item_id}.{ext}", "images/IE1/x.tif")])
def test_after_a_killed_run_another_pipelines_upload_is_never_aborted(s3_site, minio, s3_bucket, image, other):
    """Images keyed "{object_id}/..." have no prefix of their own: every upload in the store was aborted,
    another pipeline's going on too, whose item then failed (walk finding 2)."""
    site = s3_site(image)
    add_object(site, "a")
    client = minio.client()
    upload = client.create_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/{other}")
    killed_run(site)
    report = run(site)
    assert uploads(minio, s3_bucket) == [f"{PREFIX}/{other}"]
    assert (f"the incomplete uploads of images run 1, which was killed, may have left were not aborted: "
            f"store.keys.image ({image!r}) does not start with {{pipeline}}, so they cannot be told from another "
            f"pipeline's uploads going on in the same store; their parts stay in the bucket (invisible, billed) "
            f"until a lifecycle rule (AbortIncompleteMultipartUpload) removes them") in report.note
    client.abort_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/{other}", UploadId=upload["UploadId"])


def test_the_uploads_a_killed_run_left_under_its_own_prefix_are_aborted_and_its_report_says_so(s3_site, minio,
                                                                                               s3_bucket):
    site = s3_site()
    add_object(site, "a")
    client = minio.client()
    client.create_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/museum/a/gone.tif")
    other = client.create_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/big/IE1/x.tif")
    killed_run(site)
    report = run(site)
    assert uploads(minio, s3_bucket) == [f"{PREFIX}/big/IE1/x.tif"]
    assert "aborted 1 incomplete uploads left by run 1, which was killed: museum/a/gone.tif" in report.note
    client.abort_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/big/IE1/x.tif", UploadId=other["UploadId"])


# ---------------------------------------------------------------------------------------- document headers


def test_a_document_stored_without_its_cache_control_is_put_again_then_left(minio, s3_bucket, aws_env):
    """A manifest deposited before DOCUMENT_CACHE_CONTROL (or by another tool, its metadata kept) kept no
    Cache-Control for ever: same bytes, same size, 'unchanged' (walk finding 3)."""
    store = open_store(s3_settings(minio, s3_bucket))
    data = b'{"id": "m"}\n'
    sha256 = hashlib.sha256(data).hexdigest()
    minio.client().put_object(Bucket=s3_bucket, Key=f"{PREFIX}/museum/a/manifest-v3.json", Body=data,
                              ContentType=MEDIA_TYPES["3.0"], Metadata={"sha256": sha256},
                              ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())
    assert isinstance(store, S3Store) and store.head("museum/a/manifest-v3.json").doubt is None
    put = store.put_bytes("museum/a/manifest-v3.json", data, content_type=MEDIA_TYPES["3.0"])
    assert not put.unchanged
    served = minio.client().head_object(Bucket=s3_bucket, Key=f"{PREFIX}/museum/a/manifest-v3.json")
    assert served["CacheControl"] == DOCUMENT_CACHE_CONTROL and served["ContentType"] == MEDIA_TYPES["3.0"]
    assert store.put_bytes("museum/a/manifest-v3.json", data, content_type=MEDIA_TYPES["3.0"]).unchanged
    # another type than the one a put gives: put again as well
    assert not store.put_bytes("museum/a/manifest-v3.json", data, content_type="application/json").unchanged


def test_a_local_documents_recorded_type_follows_the_put(tmp_path):
    store = LocalStore(LocalStoreSettings(root=tmp_path))
    store.put_bytes("collections/museum-v3.json", b"{}", content_type="application/json")
    assert not store.put_bytes("collections/museum-v3.json", b"{}", content_type=MEDIA_TYPES["3.0"]).unchanged
    assert store.head("collections/museum-v3.json").content_type == MEDIA_TYPES["3.0"]
    assert store.put_bytes("collections/museum-v3.json", b"{}", content_type=MEDIA_TYPES["3.0"]).unchanged
    # an access master's type alone is not worth its bytes again
    (tmp_path / "m.tif").write_bytes(b"II*\0")
    store.put("museum/a/p1.tif", tmp_path / "m.tif", content_type="image/x-tiff")
    assert store.put("museum/a/p1.tif", tmp_path / "m.tif").unchanged


# ---------------------------------------------------------------------------------------------- key length


def test_an_item_id_too_long_for_a_key_says_sequence_takes_it():
    with pytest.raises(UnsafeKey, match=r"its \{item_id\} in store\.keys\.image .*; \{sequence\} in place of "
                                        r"\{item_id\} .*takes an item with any id"):
        KeyTemplates().image_key("museum", "o", "\u5c71" * 90, 1, "tif")
    with pytest.raises(UnsafeKey, match=r"segment longer than 255 bytes: store\.keys\.image .*\{sequence\} in place"):
        KeyTemplates(image="{pipeline}/{object_id}-{item_id}.{ext}").image_key("museum", "o" * 150, "i" * 150, 1,
                                                                               "tif")
    with pytest.raises(UnsafeKey) as raised:
        KeyTemplates(image="{pipeline}/{object_id}/{sequence}.{ext}").image_key("museum", "o" * 300, "i", 1, "tif")
    assert "{sequence} in place" not in str(raised.value)
