"""What a killed run's uploads leave (multipart parts in S3, hidden temporary files in a local store) is removed
only where it is the pipeline's own: under a prefix no other pipeline's keys start with. Without one, the run's
report says the uploads found were left, and what removes them; with none found it says nothing. Real harvests
and gcis-migrate move_store into a real MinIO."""
from __future__ import annotations

import json

import pytest

from gcis_etl.config import load_config
from gcis_etl.ledger import Ledger
from tests.test_collection_rebuild import add_object, make_site, run, store_block
from tests.test_migrations import PIPELINE, folder_site, ok, report_of, s3_store

PREFIX = "iiif/access"
NO_OWN_PREFIX = "{object_id}/{item_id}.{ext}"


def killed_run(site) -> None:
    """The ledger as a run killed mid-way leaves it: 'running', with nobody holding the pipeline's lock."""
    with Ledger.open(load_config(site / "config.yaml")) as ledger:
        ledger.begin_run("museum", None, None, {})


@pytest.fixture
def s3_site(request, tmp_path, monkeypatch, minio, s3_bucket):
    monkeypatch.chdir(tmp_path)
    return lambda image=None: make_site(tmp_path, store_block("s3", request), image)


def uploads(minio, bucket: str) -> list[str]:
    return [u["Key"] for u in minio.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize("image, other", [(NO_OWN_PREFIX, "big/IE1/x.tif"),
                                          ("images/{object_id}/{item_id}.{ext}", "images/IE1/x.tif"),
                                          ("{pipeline}-{object_id}/{item_id}.{ext}", "museum-prints-IE1/x.tif")])
def test_after_a_killed_run_another_pipelines_upload_is_never_aborted(s3_site, minio, s3_bucket, image, other):
    """Images keyed "{object_id}/..." have no prefix of their own: every upload in the store was aborted,
    another pipeline's going on too, whose item then failed (walk finding 2); "{pipeline}-..." gave "museum-",
    which pipeline "museum-prints"'s keys start with too."""
    site = s3_site(image)
    add_object(site, "a")
    client = minio.client()
    upload = client.create_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/{other}")
    killed_run(site)
    report = run(site)
    assert uploads(minio, s3_bucket) == [f"{PREFIX}/{other}"]
    assert (f"1 incomplete uploads of images were not aborted, though run 1, which was killed, may have left some: "
            f"store.keys.image ({image!r}) does not begin, after any fixed text, with {{pipeline}} and a character "
            f"no pipeline name has (such as \"/\"), so they cannot be told from another pipeline's uploads going on "
            f"in the same store; their parts stay in the bucket (invisible, billed) until a lifecycle rule "
            f"(AbortIncompleteMultipartUpload) removes them") in report.note
    client.abort_multipart_upload(Bucket=s3_bucket, Key=f"{PREFIX}/{other}", UploadId=upload["UploadId"])


def test_after_a_killed_run_without_uploads_left_nothing_is_said_of_them(s3_site):
    site = s3_site(NO_OWN_PREFIX)
    add_object(site, "a")
    killed_run(site)
    assert run(site).note is None


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


def test_move_store_says_it_left_uploads_in_a_target_without_an_own_prefix_only_when_there_are_some(
        tmp_path, minio, s3_bucket, aws_env):
    """It said so on every move with such a template, uploads or none."""
    site = folder_site(tmp_path)
    keys = {"keys": {"image": NO_OWN_PREFIX}}
    site.configure({"kind": "local", "root": "store", **keys})
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    target = json.dumps({**s3_store(minio, s3_bucket), **keys})
    assert not [n for n in report_of(ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target)))[
        "notes"] if "incomplete uploads" in n]

    client = minio.client()
    upload = client.create_multipart_upload(Bucket=s3_bucket, Key="iiif/IE1/x.tif")  # another pipeline's
    notes = report_of(ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", target)))["notes"]
    assert [n for n in notes if "incomplete uploads" in n] == [
        f"the target: 1 incomplete uploads of images were not aborted, though a killed run may have left some: "
        f"store.keys.image ({NO_OWN_PREFIX!r}) does not begin, after any fixed text, with {{pipeline}} and a "
        f"character no pipeline name has (such as \"/\"), so they cannot be told from another pipeline's uploads "
        f"going on in the same store; their parts stay in the bucket (invisible, billed) until a lifecycle rule "
        f"(AbortIncompleteMultipartUpload) removes them"]
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])] == [
        "iiif/IE1/x.tif"]
    client.abort_multipart_upload(Bucket=s3_bucket, Key="iiif/IE1/x.tif", UploadId=upload["UploadId"])
