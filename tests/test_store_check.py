"""Store.check(): the one request that tells, before any item is converted, that a store cannot be used: a
mistyped bucket, refused credentials, a server down, a local root missing (an unmounted volume) or read-only.
Real MinIO (with a deposit-only session policy from its STS), real filesystems, the real CLI."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.errors import StoreError
from gcis_etl.ledger import Ledger
from gcis_etl.stores import LocalStore, LocalStoreSettings, S3Store
from tests.conftest import CORPUS, s3_settings
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[1]


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


# ------------------------------------------------------------------------------------------------------ S3


def test_a_missing_bucket_fails_the_check_and_is_not_created(minio, aws_env):
    store = S3Store(s3_settings(minio, "no-such-bucket-here"))
    with pytest.raises(StoreError) as err:
        store.check(create=True)
    message = one_line(err)
    assert message.startswith("s3://no-such-bucket-here/iiif/access/: ") and "NoSuchBucket" in message
    assert "check store.bucket" in message
    assert "no-such-bucket-here" not in [b["Name"] for b in minio.client().list_buckets()["Buckets"]]


def test_refused_credentials_fail_the_check_without_echoing_the_secret(minio, s3_bucket, aws_env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-that-must-not-leak")
    with pytest.raises(StoreError) as err:
        S3Store(s3_settings(minio, s3_bucket)).check()
    message = one_line(err)
    assert "check the store's credentials" in message and "wrong-secret-that-must-not-leak" not in message


def test_a_server_down_fails_the_check_once_its_retries_are_spent(minio, aws_env):
    port = free_port()  # nothing listens there
    store = S3Store(s3_settings(minio, "bucket", endpoint_url=f"http://127.0.0.1:{port}",
                                retry={"max_attempts": 2, "connect_timeout": 1}))
    with pytest.raises(StoreError) as err:
        store.check()
    message = one_line(err)
    assert f"127.0.0.1:{port}" in message and "after 2 attempts" in message and "is the server up" in message


def deposit_only_credentials(minio, bucket: str, prefix: str) -> dict[str, str]:
    """Temporary credentials (MinIO's STS AssumeRole) allowed to list, read and write only under `prefix`:
    the least a deposit needs, since without s3:ListBucket a HEAD of a key not yet there answers 403."""
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": [f"arn:aws:s3:::{bucket}/{prefix}/*"]}]}
    sts = boto3.client("sts", endpoint_url=minio.endpoint, region_name="us-east-1",
                       aws_access_key_id=minio.access_key, aws_secret_access_key=minio.secret_key)
    granted = sts.assume_role(RoleArn="arn:minio:iam:::role/deposit", RoleSessionName="deposit-only",
                              Policy=json.dumps(policy))["Credentials"]
    return {"AWS_ACCESS_KEY_ID": granted["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": granted["SecretAccessKey"],
            "AWS_SESSION_TOKEN": granted["SessionToken"]}


def test_the_check_passes_with_a_deposit_only_policy_that_head_bucket_would_not(minio, s3_bucket, aws_env,
                                                                                  monkeypatch, tmp_path):
    for name, value in deposit_only_credentials(minio, s3_bucket, "iiif/access").items():
        monkeypatch.setenv(name, value)
    store = S3Store(s3_settings(minio, s3_bucket))
    store.check()
    with pytest.raises(store.client.exceptions.ClientError, match="403"):
        store.client.head_bucket(Bucket=s3_bucket)  # why the check does not use it
    (tmp_path / "a.tif").write_bytes(b"II*\x00 pretend tiff")
    assert store.put("demo/IE1/a.tif", tmp_path / "a.tif").size == 17  # the policy is enough to deposit
    with pytest.raises(StoreError, match="check the store's credentials"):
        S3Store(s3_settings(minio, s3_bucket, prefix="elsewhere")).check()  # and it is checked against


# --------------------------------------------------------------------------------------------------- local


def test_a_missing_local_root_fails_the_check_and_is_created_only_when_asked(tmp_path):
    volume = tmp_path / "mnt" / "volume"  # the empty mount point of a volume not mounted
    volume.mkdir(parents=True)
    store = LocalStore(LocalStoreSettings(root=volume / "gcis"))
    with pytest.raises(StoreError) as err:
        store.check()
    assert one_line(err) == (f"{volume / 'gcis'}: cannot use the store: the store's root folder is missing "
                             f"(its volume not mounted? if the store is new, create the folder)")
    assert list(volume.iterdir()) == []

    store.check(create=True)
    assert (volume / "gcis").is_dir() and list((volume / "gcis").iterdir()) == []  # the probe left nothing
    store.check()


def _without_dac_override() -> None:
    """In the child: even root is then held to the folders' permission bits (PR_CAPBSET_DROP before exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0 and ctypes.get_errno() != 1:  # EPERM: not root anyway
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


CHECK_CHILD = """
import sys
from gcis_etl.errors import StoreError
from gcis_etl.stores import LocalStore, LocalStoreSettings
try:
    LocalStore(LocalStoreSettings(root=sys.argv[1])).check(create=True)
    print("usable")
except StoreError as exc:
    print(exc)
"""


def test_a_local_root_that_cannot_be_written_fails_the_check(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    root.chmod(0o555)
    try:
        child = subprocess.run([sys.executable, "-c", CHECK_CHILD, str(root)], cwd=REPO, capture_output=True,
                               text=True, timeout=60, preexec_fn=_without_dac_override)
    finally:
        root.chmod(0o755)
    assert child.stdout == f"{root}: cannot write into the store's root folder: Permission denied\n", child.stderr
    assert list(root.iterdir()) == []


# ---------------------------------------------------------------------------------------------- harvests


def site(tmp_path: Path, store: dict) -> Path:
    for name in ("a", "b"):
        (tmp_path / "masters" / name).mkdir(parents=True)
        shutil.copy(CORPUS / "gray8/hopper_gray.jpg", tmp_path / "masters" / name / "p1.jpg")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"state_dir": "state", "pipelines": {"p": {"source": {"kind": "filesystem", "root": "masters"},
                                                   "store": store}}}))
    return tmp_path


def harvest(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcis_etl.cli", "--config", str(site / "config.yaml"), "harvest",
                           *args], capture_output=True, text=True, cwd=site, timeout=300)


def items(site: Path) -> dict[str, int]:
    with Ledger.open(load_config(site / "config.yaml"), read_only=True) as ledger:
        return {f"{i.object_id}/{i.item_id}": i.attempts for i in ledger.items("p")}


def test_a_harvest_into_a_missing_bucket_stops_before_any_item(minio, aws_env, tmp_path):
    here = site(tmp_path, {"kind": "s3", "bucket": "mistyped-bucket", "prefix": "access", "region": "us-east-1",
                           "endpoint_url": minio.endpoint, "addressing_style": "path"})
    run = harvest(here)
    assert run.returncode == 1 and "p: run stopped: s3://mistyped-bucket/access/: " in run.stderr, run.stderr
    assert "NoSuchBucket" in run.stderr and "check store.bucket" in run.stderr
    assert items(here) == {}  # nothing converted, no attempt spent


def test_a_harvest_creates_its_local_root_on_the_first_run_only(tmp_path):
    here = site(tmp_path, {"kind": "local", "root": "volume/store"})
    first = harvest(here)
    assert first.returncode == 0 and "2 deposited" in first.stdout, first.stdout + first.stderr
    deposited = items(here)

    (here / "volume").rename(here / "unmounted")  # the volume's mount point is empty again
    (here / "volume").mkdir()
    again = harvest(here, "--force")
    assert again.returncode == 1, again.stdout + again.stderr
    assert f"p: run stopped: {here / 'volume/store'}: cannot use the store: the store's root folder is missing" \
           in again.stderr
    assert list((here / "volume").iterdir()) == []  # not made on the mount point, where it would be hidden
    assert items(here) == deposited and len(deposited) == 2
