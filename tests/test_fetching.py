"""The verified fetch of a local file's bytes: copied by the kernel where it can, checked all the same."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from connectors.base import Fixity, SourceItem
from connectors.errors import FetchIntegrityError
from connectors.fetching import Body, fetch_verified
from connectors.retry import RetryPolicy
from tests.emulators import FAST_RETRY

DATA = os.urandom(3 * (1 << 20) + 17)


def item(path: Path, size: int | None = len(DATA), fixity: Fixity | None = None) -> SourceItem:
    return SourceItem(id="ms-001/page1.tif", sequence=1, original_name="page1.tif", size=size, modified=None,
                      fixity=fixity, locator=str(path))


def opener(path: Path, chunks: list[bytes]):
    """A local file as a Body whose `chunks` are not its bytes: what arrives shows which of the two was read."""
    @contextmanager
    def open_body(budget):
        with open(path, "rb") as handle:
            yield Body(iter(chunks), file=handle)
    return open_body


def test_a_local_file_is_copied_by_the_kernel_and_its_copy_verified(tmp_path):
    master = tmp_path / "master.tif"
    master.write_bytes(DATA)
    md5 = Fixity("md5", hashlib.md5(DATA).hexdigest())
    fetched = fetch_verified(item(master, fixity=md5), tmp_path / "scratch", opener(master, [b"not read"]),
                             RetryPolicy(**FAST_RETRY))
    assert fetched.path.read_bytes() == DATA and fetched.sha256 == hashlib.sha256(DATA).hexdigest()
    assert fetched.size == len(DATA) and fetched.fixity_verified


def test_a_kernel_copy_of_a_truncated_or_altered_file_is_refused(tmp_path):
    master = tmp_path / "master.tif"
    master.write_bytes(DATA[:-1000])
    with pytest.raises(FetchIntegrityError, match=f"received {len(DATA) - 1000} bytes, the source records"):
        fetch_verified(item(master), tmp_path / "scratch", opener(master, []), RetryPolicy(**FAST_RETRY))
    master.write_bytes(DATA[:-1] + bytes([DATA[-1] ^ 0xFF]))  # not b"\0": random data ends in one once in 256 runs
    wrong = Fixity("sha256", hashlib.sha256(DATA).hexdigest())
    with pytest.raises(FetchIntegrityError, match="does not match the source's fixity"):
        fetch_verified(item(master, fixity=wrong), tmp_path / "scratch", opener(master, []),
                       RetryPolicy(**FAST_RETRY))
    assert list((tmp_path / "scratch").iterdir()) == []


def test_where_the_kernel_cannot_copy_the_stream_is_copied(tmp_path):
    """tmpfs to the test's filesystem: copy_file_range refuses files on two filesystems (EXDEV)."""
    elsewhere = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        assert os.stat(elsewhere).st_dev != os.stat(tmp_path).st_dev
        master = elsewhere / "master.tif"
        master.write_bytes(DATA)
        fetched = fetch_verified(item(master), tmp_path / "scratch", opener(master, [DATA[:10], DATA[10:]]),
                                 RetryPolicy(**FAST_RETRY))
    finally:
        shutil.rmtree(elsewhere)
    assert fetched.path.read_bytes() == DATA and fetched.sha256 == hashlib.sha256(DATA).hexdigest()


def test_an_empty_file_is_fetched_empty(tmp_path):
    master = tmp_path / "master.tif"
    master.write_bytes(b"")
    fetched = fetch_verified(item(master, size=0), tmp_path / "scratch", opener(master, [b"not read"]),
                             RetryPolicy(**FAST_RETRY))
    assert fetched.path.read_bytes() == b"" and fetched.sha256 == hashlib.sha256(b"").hexdigest()


PEAK_CHILD = """
import sys
from contextlib import contextmanager
from pathlib import Path
from connectors.base import SourceItem
from connectors.fetching import Body, fetch_verified
from connectors.retry import RetryPolicy

def peak_kib():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])

@contextmanager
def open_body(budget):
    with open(sys.argv[1], "rb") as handle:
        yield Body(iter([b"not read"]), file=handle)

master = Path(sys.argv[1])
item = SourceItem(id="big", sequence=1, original_name="big.tif", size=master.stat().st_size, modified=None,
                  fixity=None, locator=str(master))
before = peak_kib()
fetched = fetch_verified(item, Path(sys.argv[2]), open_body, RetryPolicy(max_attempts=1))
print(fetched.sha256, peak_kib() - before)
"""


def test_hashing_a_kernel_copy_keeps_the_fetching_process_small(tmp_path):
    """The copy was mapped whole to be hashed: a pool process's resident memory peaked at the master's size
    (1254 MB for a 1.2 GB master), which RSS-based recycling and limits count. It is read back in chunks."""
    block = os.urandom(1 << 20)
    master = tmp_path / "master.tif"
    with open(master, "wb") as out:
        for _ in range(160):
            out.write(block)
    done = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(master), str(tmp_path / "scratch")],
                          capture_output=True, text=True, check=True)
    sha256, grown_kib = done.stdout.split()
    assert sha256 == hashlib.sha256(block * 160).hexdigest()
    assert int(grown_kib) < 32 * 1024, f"peak resident memory grew by {int(grown_kib) // 1024} MiB"
