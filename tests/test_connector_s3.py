"""The S3 source against a real MinIO on loopback: grouping, LastModified changes, ETag-verified fetch."""
from __future__ import annotations

import hashlib
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from connectors import open_source
from connectors.errors import (AuthenticationFailed, FetchIntegrityError, ObjectNotFound, SourceRequestFailed,
                               SourceUnavailable)
from connectors.s3 import S3Settings, S3Source
from gcis_etl.errors import ConfigError
from gcis_etl.settings import parse
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS
from tests.servers import free_port

MASTERS = {
    "ms-001/page10.tif": "rgb8-tiff-lzw/hopper_lzw.tif",
    "ms-001/page2.tif": "rgb8-tiff-uncompressed/hopper.tif",
    "ms-001/page1.jpg": "jpeg-baseline/flowers.jpeg",
    "ms-001/.DS_Store": "README.md",
    "ms-002/a.png": "png/png-rgb-64x56x8.png",
    "loose.jpg": "gray8/hopper_gray.jpg",
}


def upload(minio, bucket: str, files: dict[str, str], prefix: str = "masters/") -> None:
    client = minio.client()
    for key, corpus in files.items():
        client.put_object(Bucket=bucket, Key=prefix + key, Body=(CORPUS / corpus).read_bytes())


def s3(minio, bucket: str, **overrides) -> S3Source:
    options = {"bucket": bucket, "prefix": "masters", "endpoint_url": minio.endpoint, "access_key_id": minio.access_key,
               "secret_access_key": minio.secret_key, "addressing_style": "path", "retry": FAST_RETRY, **overrides}
    return open_source("s3", options, name="s3-test")


@pytest.fixture
def bucket(minio, s3_bucket):
    upload(minio, s3_bucket, MASTERS)
    client = minio.client()
    client.put_object(Bucket=s3_bucket, Key="masters/ms-002/", Body=b"")  # a console-made "folder"
    client.put_object(Bucket=s3_bucket, Key="elsewhere/not-mine.tif", Body=b"outside the prefix")
    return s3_bucket


def test_keys_under_the_prefix_are_grouped_like_folders(minio, bucket):
    objects = {o.id: o for o in s3(minio, bucket).changes(None)}
    assert sorted(objects) == ["loose.jpg", "ms-001", "ms-002"]
    assert [i.id for i in objects["ms-001"].items] == ["ms-001/page1.jpg", "ms-001/page2.tif", "ms-001/page10.tif"]
    page1 = objects["ms-001"].items[0]
    data = (CORPUS / MASTERS["ms-001/page1.jpg"]).read_bytes()
    assert page1.locator == "masters/ms-001/page1.jpg" and page1.size == len(data)
    assert page1.fixity.algorithm == "md5" and page1.fixity.value == hashlib.md5(data).hexdigest()


def test_fetch_streams_the_object_and_verifies_its_etag(minio, bucket, tmp_path):
    source = s3(minio, bucket)
    (obj,) = source.get(["ms-001"])
    fetched = [source.fetch(item, tmp_path) for item in obj.items]
    assert all(f.fixity_verified for f in fetched)
    assert [f.path.read_bytes() for f in fetched] == [(CORPUS / MASTERS[i.id]).read_bytes() for i in obj.items]


def test_changes_follow_last_modified(minio, bucket):
    source = s3(minio, bucket)
    first = max(o.modified for o in source.changes(None))
    time.sleep(1.1)  # LastModified has one-second resolution
    upload(minio, bucket, {"ms-003/new.tif": "gray8/gray.tif", "ms-001/page11.tif": "gray8/gray.tif"})
    changed = list(source.changes(first + timedelta(seconds=1)))
    assert sorted(o.id for o in changed) == ["ms-001", "ms-003"]
    assert len(next(o for o in changed if o.id == "ms-001").items) == 4


def test_a_sidecar_in_the_bucket_groups_objects(minio, bucket):
    minio.client().put_object(Bucket=bucket, Key="masters/objects.csv", Body=(
        "object_id,file,sequence,label,title@en\n"
        "2019.M.1,ms-001/page2.tif,2,Verso,Irises\n"
        "2019.M.1,ms-001/page1.jpg,1,Recto,Irises\n").encode())
    (obj,) = s3(minio, bucket).changes(None)
    assert obj.id == "2019.M.1" and [i.label for i in obj.items] == ["Recto", "Verso"]
    assert obj.metadata["title"][0].language == "en"


def test_multipart_etags_are_not_taken_for_md5_but_size_is_still_checked(minio, s3_bucket, tmp_path):
    client = minio.client()
    data = (CORPUS / "gray8/gray.tif").read_bytes()
    upload_id = client.create_multipart_upload(Bucket=s3_bucket, Key="masters/mp/one.tif")["UploadId"]
    part = client.upload_part(Bucket=s3_bucket, Key="masters/mp/one.tif", UploadId=upload_id, PartNumber=1, Body=data)
    client.complete_multipart_upload(Bucket=s3_bucket, Key="masters/mp/one.tif", UploadId=upload_id,
                                     MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    source = s3(minio, s3_bucket)
    (obj,) = source.get(["mp"])
    assert obj.items[0].fixity is None and obj.items[0].size == len(data)
    fetched = source.fetch(obj.items[0], tmp_path)
    assert fetched.path.read_bytes() == data and not fetched.fixity_verified


def test_etags_are_ignored_when_configured(minio, bucket):
    (obj,) = s3(minio, bucket, etag_is_md5=False).get(["loose.jpg"])
    assert obj.items[0].fixity is None


def test_an_object_overwritten_after_listing_is_not_handed_on(minio, bucket, tmp_path):
    source = s3(minio, bucket)
    (obj,) = source.get(["ms-002"])
    upload(minio, bucket, {"ms-002/a.png": "png/exif.png"})
    with pytest.raises(FetchIntegrityError, match="ms-002/a.png"):
        source.fetch(obj.items[0], tmp_path)
    assert list(tmp_path.iterdir()) == []
    minio.client().delete_object(Bucket=bucket, Key="masters/ms-002/a.png")
    with pytest.raises(ObjectNotFound, match="NoSuchKey"):
        source.fetch(obj.items[0], tmp_path)


def test_refused_credentials_and_missing_buckets_are_clear_errors(minio, bucket):
    wrong = "not-the-secret-key-at-all"
    with pytest.raises(AuthenticationFailed, match="SignatureDoesNotMatch") as raised:
        list(s3(minio, bucket, secret_access_key=wrong).changes(None))
    text = "".join(traceback.format_exception(raised.value))
    assert wrong not in text and minio.secret_key not in text
    with pytest.raises(SourceRequestFailed, match="NoSuchBucket"):
        list(s3(minio, "no-such-bucket").changes(None))


def test_an_unreachable_endpoint_is_a_bounded_outage():
    source = open_source("s3", {"bucket": "masters", "endpoint_url": f"http://127.0.0.1:{free_port()}",
                                "access_key_id": "k", "secret_access_key": "s",
                                "retry": {**FAST_RETRY, "max_attempts": 2}}, name="down")
    with pytest.raises(SourceUnavailable, match="EndpointConnectionError after 2 attempt"):
        list(source.changes(None))


def test_reachable_asks_for_one_listing_page_where_get_lists_the_whole_bucket(minio, s3_bucket):
    """What a worker asks after a download outlasted its retries: on a big bucket, one page, not the listing."""
    client = minio.client()
    with ThreadPoolExecutor(8) as pool:  # just over one page of 1,000 keys
        list(pool.map(lambda n: client.put_object(Bucket=s3_bucket, Key=f"masters/obj{n:04d}/p.tif", Body=b""),
                      range(1001)))
    source = s3(minio, s3_bucket)
    pages: list[str] = []
    source.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: pages.append("page"))

    source.reachable()
    assert len(pages) == 1
    list(source.get(["obj0000"]))
    assert len(pages) == 3  # get lists it all: the 2 pages after reachable's one


def test_reachable_raises_source_unavailable_when_the_endpoint_is_down():
    source = open_source("s3", {"bucket": "masters", "endpoint_url": f"http://127.0.0.1:{free_port()}",
                                "access_key_id": "k", "secret_access_key": "s",
                                "retry": {**FAST_RETRY, "max_attempts": 2}}, name="down")
    with pytest.raises(SourceUnavailable, match="EndpointConnectionError after 2 attempt"):
        source.reachable()


@pytest.mark.parametrize("written, validated", [("false", False), ("YES", True), ("certs/ca.pem", "certs/ca.pem")])
def test_verify_tls_from_the_environment_is_a_switch_when_it_spells_one(written, validated, tmp_path, monkeypatch):
    """${VAR} fills in strings: 'false' stayed a string, read as the path of a CA bundle (verification on)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("")  # a bundle must be there
    assert parse(S3Settings, {"bucket": "masters", "verify_tls": written}, "config.yaml").verify_tls == validated


def test_a_ca_bundle_that_is_not_there_is_refused_when_the_settings_load(tmp_path):
    """As for the HTTP sources: at the first request it was an SSLError retried as an outage, "source unavailable"."""
    with pytest.raises(ConfigError, match=r"verify_tls: .*no CA bundle at /nonexistent/ca\.pem"):
        open_source("s3", {"bucket": "masters", "verify_tls": "/nonexistent/ca.pem"}, name="s3-test")
    (tmp_path / "ca.pem").write_text("")
    assert open_source("s3", {"bucket": "masters", "verify_tls": str(tmp_path / "ca.pem")},
                       name="s3-test").settings.verify_tls == str(tmp_path / "ca.pem")
    assert open_source("s3", {"bucket": "masters", "verify_tls": "off"}, name="s3-test").settings.verify_tls is False
