"""An S3 store that is hostile after the run's store check passed (what a walk found): a policy without
s3:DeleteObject, a server that hangs, credentials or a policy that refuse deposits, and objects another tool
overwrote keeping their metadata. Real MinIO throughout: restricted credentials from its STS (AssumeRole with a
session policy), faults through tests/servers.s3_fault_proxy."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import ssl
import subprocess
from http.server import BaseHTTPRequestHandler

import boto3
import numpy as np
import pytest
import tifffile

from gcis_etl.errors import StoreRefused
from gcis_etl.stores import S3Store
from tests.conftest import MiB, s3_settings
from tests.emulators.faults import Fault
from tests.harvests import PREFIX, Rig
from tests.servers import http_server, s3_fault_proxy

pytest_plugins = ("tests.harvests",)  # the `rig` fixture

DEPOSIT = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]


def restricted(rig: Rig, monkeypatch: pytest.MonkeyPatch, actions: list[str]) -> None:
    """From now on the harvest runs with credentials allowed `actions` on <prefix>/* and the listing of the prefix
    (README's deposit-only policy), as MinIO's STS grants them."""
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": actions, "Resource": [f"arn:aws:s3:::{rig.bucket}/{PREFIX}/*"]},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{rig.bucket}"],
         "Condition": {"StringLike": {"s3:prefix": [f"{PREFIX}/*"]}}}]}
    sts = boto3.client("sts", endpoint_url=rig.minio.endpoint, region_name="us-east-1",
                       aws_access_key_id=rig.minio.access_key, aws_secret_access_key=rig.minio.secret_key)
    granted = sts.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName="gcis-tests", Policy=json.dumps(policy),
                              DurationSeconds=900)["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", granted["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", granted["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", granted["SessionToken"])


def masters(rig: Rig, *objects: str) -> None:
    for number, name in enumerate(objects):
        path = rig.root / "src" / name / "p1.tif"
        path.parent.mkdir(parents=True, exist_ok=True)
        tifffile.imwrite(path, np.full((200, 300, 3), 40 + 20 * number, np.uint8), photometric="rgb")


def folder_pipeline(rig: Rig, store: dict | None = None, **settings) -> None:
    rig.write({"kind": "filesystem", "root": "src"}, store, concurrency=1, **settings)


def ok(run) -> str:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run.stderr


def test_a_policy_without_delete_leaves_superseded_masters_waiting_and_deposits_the_rest(rig, monkeypatch):
    """A recipe switched to .jp2 supersedes the .tif access masters; the store's policy has no s3:DeleteObject.
    Each refused deletion is a warning naming the key, the refusal and the permission, the key waits in the
    ledger, and the run completes with the new masters deposited (it stopped at the first refusal, every run)."""
    masters(rig, "A", "B")
    folder_pipeline(rig)
    ok(rig.cli("harvest"))
    old = [key for key in rig.keys() if key.endswith(".tif")]
    assert len(old) == 2

    masters(rig, "A", "B", "C")
    folder_pipeline(rig, recipe="jp2-openjpeg-lossless")
    restricted(rig, monkeypatch, DEPOSIT)
    err = ok(rig.cli("harvest", "--force"))

    for key in old:
        assert f"superseded access master {key} not deleted, it waits in the ledger" in err, err
    assert "AccessDenied" in err and "needs s3:DeleteObject on <prefix>/*" in err, err
    assert "run stopped" not in err, err
    keys = rig.keys()
    assert set(old) <= set(keys) and len([key for key in keys if key.endswith(".jp2")]) == 3, keys
    assert sorted(key for key, in rig.peek("SELECT key FROM superseded")) == sorted(old)
    assert set(rig.statuses().values()) == {"deposited"}


def test_a_store_that_hangs_stops_the_run_and_spends_no_attempt(rig):
    """Every PUT hangs (MinIO stopped with SIGSTOP looks so): each item's deposit times out past its retries. The
    run stops as for an unreachable store, counting no attempt; it used to fail every item, spending one
    attempt each, and call the run completed."""
    masters(rig, "A", "B")
    with s3_fault_proxy(rig.minio) as proxy:
        proxy.faults.inject(r"^PUT ", Fault.slow(60), times=None)
        folder_pipeline(rig, {"endpoint_url": f"http://127.0.0.1:{proxy.server_port}",
                              "retry": {"max_attempts": 2, "read_timeout": 1}})
        run = rig.cli("harvest")
    assert run.returncode == 1, run.stderr
    assert "run stopped: depositing: s3://" in run.stderr and "Read timeout" in run.stderr, run.stderr
    assert "run again once it is back (no item's attempt was counted)" in run.stderr, run.stderr
    assert rig.peek("SELECT object_id, item_id, status, attempts FROM items") == []


def test_a_store_refusing_deposits_after_its_check_stops_the_run_and_spends_no_attempt(rig, monkeypatch):
    """Credentials that may list and read the prefix but not write it pass the store check (a listing); every
    PUT is then refused. The run stops naming the refusal and what to check, counting no attempt, rather than
    failing every item (three runs later all waited for `gcis-etl retry`)."""
    masters(rig, "A", "B")
    folder_pipeline(rig)
    restricted(rig, monkeypatch, ["s3:GetObject"])
    run = rig.cli("harvest")
    assert run.returncode == 1, run.stderr
    assert "run stopped: depositing: s3://" in run.stderr and "put refused by the server: AccessDenied" in run.stderr
    assert "(check the store's credentials and its bucket policy): then run again (no item's attempt was counted)" \
        in run.stderr, run.stderr
    assert rig.peek("SELECT object_id, item_id, status, attempts FROM items") == []


def test_a_refused_head_or_put_is_a_refusal_not_an_items_failure(minio, s3_bucket, aws_env, tmp_path, monkeypatch):
    """A HEAD refused (403 without a body, as S3 answers one) and a PUT with a session token the server does not
    know (an expired one's kin): StoreRefused, which stops a run, saying what to check."""
    master = tmp_path / "a.tif"
    master.write_bytes(b"x" * 1000)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"max_attempts": 2}))
        proxy.faults.inject(r"^HEAD ", Fault.http(403), times=None)
        with pytest.raises(StoreRefused, match=r"head refused by the server: 403: .*bucket policy"):
            store.head("p/o/a.tif")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "no-such-token")
    with pytest.raises(StoreRefused, match=r"put refused by the server: .*credentials and its bucket policy"):
        S3Store(s3_settings(minio, s3_bucket)).put("p/o/a.tif", master, overwrite=True)  # no HEAD first


@pytest.fixture
def s3_store(minio, s3_bucket, aws_env) -> S3Store:
    return S3Store(s3_settings(minio, s3_bucket))


@pytest.mark.parametrize("checksum", [None, "SHA256"])
def test_an_object_overwritten_keeping_its_metadata_is_not_taken_for_ours(s3_store, minio, s3_bucket, tmp_path,
                                                                          checksum, caplog):
    """Another tool overwrites an access master and a manifest with other bytes, keeping their metadata (its
    SHA-256 of our bytes): the server's checksum, missing or another, gives it away, so the same content is
    deposited again, with a warning, instead of "already there"."""
    client = minio.client()
    master = tmp_path / "a.tif"
    master.write_bytes(b"ours" * 1000)
    sha = hashlib.sha256(master.read_bytes()).hexdigest()
    s3_store.put("p/o/a.tif", master, sha256=sha)
    s3_store.put_bytes("p/o/manifest.json", b'{"ours": 1}', content_type="application/json")
    for key, other in (("p/o/a.tif", b"theirs" * 1000), ("p/o/manifest.json", b'{"theirs": 1}')):
        full = f"iiif/access/{key}"
        kept = client.head_object(Bucket=s3_bucket, Key=full)["Metadata"]
        client.put_object(Bucket=s3_bucket, Key=full, Body=other, Metadata=kept,
                          **({"ChecksumAlgorithm": checksum} if checksum else {}))
        head = s3_store.head(key)
        assert "another tool" in head.doubt, head

    with caplog.at_level(logging.WARNING, logger="gcis_etl.stores"):
        assert not s3_store.put("p/o/a.tif", master, sha256=sha).unchanged
        assert not s3_store.put_bytes("p/o/manifest.json", b'{"ours": 1}', content_type="application/json").unchanged
    assert s3_store.get_bytes("p/o/a.tif") == master.read_bytes()
    assert s3_store.get_bytes("p/o/manifest.json") == b'{"ours": 1}'
    assert s3_store.head("p/o/a.tif").sha256 == sha
    assert [r.getMessage().endswith("; deposited again") for r in caplog.records] == [True, True]


def test_a_multipart_objects_composite_checksum_is_accepted(s3_store, tmp_path):
    """Its server checksum is composite ("-N"), never the whole object's SHA-256: not a doubt, and depositing the
    same bytes again is still a no-op."""
    master = tmp_path / "big.tif"
    master.write_bytes(np.random.default_rng(1).bytes(9 * MiB))
    sha = hashlib.sha256(master.read_bytes()).hexdigest()
    s3_store.put("p/o/big.tif", master, sha256=sha)
    head = s3_store.head("p/o/big.tif")
    assert (head.sha256, head.doubt) == (sha, None)
    assert s3_store.put("p/o/big.tif", master, sha256=sha).unchanged


def test_a_harvest_does_not_reuse_an_access_master_overwritten_keeping_its_metadata(rig):
    """The master is only touched (a new version, the same bytes); meanwhile another tool overwrote its access
    master keeping the metadata. The harvest converts and deposits it again, with a warning saying why, where it
    said "already in the store from the same master bytes and recipe"."""
    masters(rig, "A")
    folder_pipeline(rig)
    ok(rig.cli("harvest"))
    key, = (key for key in rig.keys() if key.endswith(".tif"))
    full = f"{PREFIX}/{key}"
    kept = rig.client.head_object(Bucket=rig.bucket, Key=full)["Metadata"]
    rig.client.put_object(Bucket=rig.bucket, Key=full, Body=b"not an access master", Metadata=kept)
    master = rig.root / "src" / "A" / "p1.tif"
    os.utime(master, (master.stat().st_atime, master.stat().st_mtime + 10))

    ok(rig.cli("harvest"))
    (warnings,), = rig.peek("SELECT warnings FROM items")
    assert "not reused: the server holds no SHA-256 of the object" in warnings, warnings
    assert "already in the store" not in warnings
    assert rig.client.get_object(Bucket=rig.bucket, Key=full)["Body"].read()[:2] in (b"II", b"MM")


def test_an_endpoint_whose_certificate_is_not_trusted_is_a_refusal_not_an_outage(minio, s3_bucket, aws_env,
                                                                                  tmp_path):
    """A TLS endpoint with a self-signed certificate: every request fails alike, so StoreRefused (a run stops)
    saying to check the certificate; it was a plain StoreError, each item failing and spending an attempt."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    with http_server(BaseHTTPRequestHandler) as server:
        server.socket = context.wrap_socket(server.socket, server_side=True)
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"https://127.0.0.1:{server.server_port}",
                                    retry={"max_attempts": 1}))
        with pytest.raises(StoreRefused, match="check the endpoint's certificate"):
            store.head("p/o/a.tif")


def test_a_policy_without_the_multipart_listing_makes_the_clean_up_after_a_killed_run_a_warning(rig, monkeypatch):
    """The README's deposit policy grants no s3:ListBucketMultipartUploads: the clean-up of a killed run's uploads
    stopped the next run ("list_multipart_uploads refused"), and every run after it. Now it is a warning saying
    what is left and what to grant, and the run deposits."""
    from gcis_etl.config import load_config
    from gcis_etl.ledger import Ledger
    masters(rig, "A")
    folder_pipeline(rig)
    rig.client.create_multipart_upload(Bucket=rig.bucket, Key=f"{PREFIX}/{rig.pipeline}/A/left.tif")
    with Ledger.open(load_config(rig.config)) as ledger:  # a run killed -9: it never finished
        ledger.begin_run(rig.pipeline, None, None, {})
    restricted(rig, monkeypatch, DEPOSIT)
    run = rig.cli("harvest")
    stderr = ok(run)
    assert stderr.count("list_multipart_uploads refused by the server: AccessDenied") == 1, stderr  # one listing
    assert "grant s3:ListBucketMultipartUploads on the bucket and s3:AbortMultipartUpload on <prefix>/*" in stderr
    assert "completed: 1 deposited" in run.stdout, run.stdout
