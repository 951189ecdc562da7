"""Store.digest: an object's SHA-256 and size read back from the store, streamed through the hash and written
nowhere (the fixity audit's read: it needed scratch room for a copy of every key, and a full scratch disk made
every key unreadable). From a local store and from MinIO, a multipart object in ranged parts too, and through a
proxy that cuts a body short."""
from __future__ import annotations

import pytest

from gcis_etl.errors import StoreError, StoreUnavailable
from gcis_etl.stores import LocalStore, LocalStoreSettings, S3Store
from tests.conftest import MiB, s3_settings
from tests.emulators.faults import Fault
from tests.servers import s3_fault_proxy
from tests.test_stores import random_file


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return LocalStore(LocalStoreSettings(root=tmp_path / "store"))


@pytest.fixture(params=["local", "s3"])
def store(request, local_store):
    if request.param == "local":
        return local_store
    request.getfixturevalue("aws_env")
    return S3Store(s3_settings(request.getfixturevalue("minio"), request.getfixturevalue("s3_bucket")))


@pytest.mark.parametrize("size", [0, 1000, 20 * MiB])  # 20 MiB: above the multipart threshold, read in ranged parts
def test_the_digest_is_the_sha256_and_size_of_the_bytes_deposited(store, tmp_path, size):
    path, sha256 = random_file(tmp_path / "a.tif", size)
    store.put("demo/IE1/a.tif", path, sha256=sha256)
    assert store.digest("demo/IE1/a.tif") == (sha256, size)


def test_a_missing_object_has_no_digest(store):
    with pytest.raises(StoreError, match=r"demo/IE1/none\.tif") as raised:
        store.digest("demo/IE1/none.tif")
    assert not isinstance(raised.value, StoreUnavailable)


def test_a_local_key_that_cannot_be_read_says_so(local_store):
    (local_store.root / "demo" / "IE1" / "dir.tif").mkdir(parents=True)
    with pytest.raises(StoreError, match=r"demo/IE1/dir\.tif: cannot read: Is a directory"):
        local_store.digest("demo/IE1/dir.tif")


@pytest.mark.parametrize("size", [MiB, 20 * MiB])
def test_a_body_cut_short_is_read_again(minio, s3_bucket, aws_env, tmp_path, size):
    """s3transfer's retries of a body cut short apply to the non-seekable sink, which never hashes a byte twice
    (a single GET retried wrote the bytes seen again: a 1 MiB object read as 1.5 MiB)."""
    path, sha256 = random_file(tmp_path / "a.tif", size)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"mode": "standard", "max_attempts": 3}))
        store.put("demo/IE1/a.tif", path, sha256=sha256)
        proxy.faults.inject(r"^GET ", Fault.truncate(0.5), times=1)
        assert store.digest("demo/IE1/a.tif") == (sha256, size)
    assert [line.split()[-1] for line in proxy.answered if line.startswith("GET")] == ["truncate"]


def test_a_body_cut_short_every_time_is_a_store_error(minio, s3_bucket, aws_env, tmp_path):
    path, sha256 = random_file(tmp_path / "small.tif", MiB)
    with s3_fault_proxy(minio) as proxy:
        store = S3Store(s3_settings(minio, s3_bucket, endpoint_url=f"http://127.0.0.1:{proxy.server_port}",
                                    retry={"mode": "standard", "max_attempts": 3}))
        store.put("demo/IE1/small.tif", path, sha256=sha256)
        proxy.faults.inject(r"^GET ", Fault.truncate(0.5), times=None)
        with pytest.raises(StoreError, match=r"demo/IE1/small\.tif: read"):
            store.digest("demo/IE1/small.tif")
    assert [line.split()[-1] for line in proxy.answered if line.startswith("GET")] == ["truncate"] * 3


def test_a_store_down_is_unavailable(minio, s3_bucket, aws_env):
    store = S3Store(s3_settings(minio, s3_bucket, endpoint_url="http://127.0.0.1:9",
                                retry={"mode": "standard", "max_attempts": 2, "connect_timeout": 1}))
    with pytest.raises(StoreUnavailable, match=r"demo/IE1/a\.tif: read failed after 2 attempts"):
        store.digest("demo/IE1/a.tif")
