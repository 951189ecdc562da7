"""What a walk of move_store found: --delete-source stopped on a pipeline's S3 store whose policy has no
s3:DeleteObject (the check that the source is another store wrote, and failed to delete, an object there);
nothing showed while keys were copied, even on a terminal; a harvest's live line lost the items in flight at 80
columns; a replaced key's reason read "SHA-256 None". Real MinIO (restricted credentials from its STS, as in
tests/test_store_hostile.py), local stores, gcis-migrate in a subprocess (on a pseudo-terminal for the line)."""
from __future__ import annotations

import csv
import json
import logging
import os
import re

import boto3
import pytest

from gcis_etl.migration import shows_through
from gcis_etl.progress import TerminalProgress
from gcis_etl.stores import LocalStoreSettings, open_store
from tests.conftest import run_on_a_terminal, s3_settings
from tests.test_migrations import BIN, PIPELINE, bucket_objects, folder_site, ok, report_of, s3_store

DEPOSIT_ONLY = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]


def restricted(minio, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on S3 is reached with credentials allowed to deposit under iiif/ and list it, not to delete
    (README's deposit-only policy), as MinIO's STS grants them."""
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": DEPOSIT_ONLY, "Resource": [f"arn:aws:s3:::{bucket}/iiif/*"]},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
         "Condition": {"StringLike": {"s3:prefix": ["iiif/*"]}}},
        {"Effect": "Allow", "Action": ["s3:ListBucketMultipartUploads"], "Resource": [f"arn:aws:s3:::{bucket}"]}]}
    sts = boto3.client("sts", endpoint_url=minio.endpoint, region_name="us-east-1",
                       aws_access_key_id=minio.access_key, aws_secret_access_key=minio.secret_key)
    granted = sts.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName="gcis-tests", Policy=json.dumps(policy),
                              DurationSeconds=900)["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", granted["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", granted["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", granted["SessionToken"])


def test_delete_source_needs_no_delete_in_the_pipelines_store_and_leaves_no_check_object_there(tmp_path, minio,
                                                                                              s3_bucket, aws_env,
                                                                                              monkeypatch):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    local = site.stored()
    ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", json.dumps(s3_store(minio, s3_bucket))))
    site.configure(s3_store(minio, s3_bucket))  # the switch
    restricted(minio, s3_bucket, monkeypatch)

    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                          "--delete-source"))
    assert out.startswith("move_store: completed: 8 present, 8 deleted from the source"), out
    assert site.stored() == {}
    assert bucket_objects(minio, s3_bucket) == local  # no gcis-etl-store-check-* object among them


def test_a_check_object_that_cannot_be_deleted_is_a_warning_naming_it(tmp_path, minio, s3_bucket, aws_env,
                                                                       monkeypatch, caplog):
    restricted(minio, s3_bucket, monkeypatch)
    written = open_store(s3_settings(minio, s3_bucket, prefix="iiif"))
    with caplog.at_level(logging.WARNING, logger="gcis_etl.migration"):
        assert shows_through(written, open_store(LocalStoreSettings(root=tmp_path))) is False
    [left] = [key for key in bucket_objects(minio, s3_bucket) if key.startswith("gcis-etl-store-check-")]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("the store check object was left behind: ") and left in warning
    assert "AccessDenied" in warning and warning.endswith("; delete it by hand"), warning


def on_a_terminal(site, *args: str, columns: int = 80) -> tuple[str, list[str]]:
    """gcis-migrate with its stderr on a pseudo-terminal `columns` wide: its stdout, and what the terminal
    showed, split at carriage returns and newlines."""
    run, shown = run_on_a_terminal([str(BIN / "gcis-migrate"), *args], text=True, cwd=site.root,
                               env={**os.environ, "GCIS_CONFIG": str(site.config), "COLUMNS": str(columns)})
    out = run.stdout.read()
    assert run.wait(180) == 0, out + shown
    return out, [line for line in re.split(r"[\r\n]+", shown) if line.strip()]


def test_move_store_shows_a_live_line_on_a_terminal_and_nothing_without_one(tmp_path):
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    out, shown = on_a_terminal(site, "move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: a}")
    assert out.startswith("move_store: completed: 8 copied"), out
    assert shown and all(line.startswith(f"{PIPELINE}: ") and len(line) <= 79 for line in shown), shown
    assert re.fullmatch(rf"{PIPELINE}: 8 of 8 keys \(copied 8(?: kept 0 failed 0)?\), \d+/min, \d+ s elapsed *",
                        shown[-1]), shown

    site.configure({"kind": "local", "root": "a"})
    out, shown = on_a_terminal(site, "move_store", "--pipeline", PIPELINE, "--from-store", "{kind: local, root: store}",
                               "--delete-source", columns=200)
    assert out.startswith("move_store: completed: 8 present, 8 deleted from the source"), out
    assert re.fullmatch(rf"{PIPELINE}: 8 of 8 keys \(copied 0 kept 8 failed 0 deleted 8\), \d+/min, \d+ s elapsed *",
                        shown[-1]), shown

    quiet = site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", "{kind: local, root: b}")
    assert ok(quiet).startswith("move_store: completed: 8 copied") and quiet.stderr == ""


def test_the_harvest_line_keeps_the_items_in_flight_and_the_time_elapsed_at_80_columns(capsys, monkeypatch):
    """Four-digit counts used to push ", 1 in flight, oldest ..." past the width, where it was cut."""
    monkeypatch.setenv("COLUMNS", "80")
    progress = TerminalProgress("coll", live=True)
    for _ in range(645):
        progress.planned(None, 4)
    for n in range(2494):
        progress.item("obj", f"{n}", "deposited" if n < 17 else "skipped", None)
    progress.started("obj", "slow")
    progress.clear()
    last = capsys.readouterr().err.split("\r")[-1].rstrip("\n")
    assert len(last) <= 79 and re.fullmatch(r"coll: .*2494 items.*, 1 in flight, oldest \d+ s, \d+ s elapsed *",
                                            last), last


def test_a_replaced_key_without_a_recorded_sha256_says_so(tmp_path, minio, s3_bucket, aws_env):
    """The same bytes put in the target by another tool, without the metadata gcis-etl records: copied over."""
    site = folder_site(tmp_path)
    ok(site.migrate("initial_load", "--pipeline", PIPELINE))
    key, data = next(iter(site.stored().items()))
    minio.client().put_object(Bucket=s3_bucket, Key=f"iiif/{key}", Body=data)
    out = ok(site.migrate("move_store", "--pipeline", PIPELINE, "--to-store", json.dumps(s3_store(minio, s3_bucket))))
    with open(report_of(out)["csv_path"], newline="") as f:
        [row] = [row for row in csv.DictReader(f) if row["subject"] == key]
    assert row["outcome"] == "replaced"
    assert row["reason"] == "the target's copy had no SHA-256 recorded (not deposited by gcis-etl)", row
    assert bucket_objects(minio, s3_bucket)[key] == data

