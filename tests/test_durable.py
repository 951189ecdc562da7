"""A converted file is on disk before it is reported verified: the fsync runs beside verification and
hashing, and _checked returns only once all three are done."""
from __future__ import annotations

import hashlib
import os
import threading

from gcis_etl import conversion
from gcis_etl.durable import fsync_path
from gcis_etl.models import VerifyReport


def _record_fsyncs(monkeypatch) -> list[tuple[int, str]]:
    """(inode, thread name) of every descriptor fsync'ed from now on; the real fsync still runs."""
    done, real = [], os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        done.append((os.fstat(fd).st_ino, threading.current_thread().name))
    monkeypatch.setattr(os, "fsync", fsync)
    return done


def test_fsync_path_flushes_files_and_directories(tmp_path, monkeypatch):
    done = _record_fsyncs(monkeypatch)
    out = tmp_path / "out.jp2"
    out.write_bytes(b"x" * 1000)
    fsync_path(out)
    fsync_path(tmp_path)
    assert [inode for inode, _ in done] == [out.stat().st_ino, tmp_path.stat().st_ino]


def test_checked_fsyncs_the_output_beside_verification(tmp_path, monkeypatch):
    done = _record_fsyncs(monkeypatch)
    out = tmp_path / "out.jp2"
    out.write_bytes(os.urandom(3 * 1024 * 1024))
    checked_in = []

    def check() -> VerifyReport:
        checked_in.append(threading.current_thread().name)
        return VerifyReport(str(out))

    report, digest = conversion._checked(out, check)
    assert report.ok and digest == hashlib.sha256(out.read_bytes()).hexdigest()
    assert [inode for inode, _ in done] == [out.stat().st_ino]
    assert done[0][1] != checked_in[0]  # in a thread of its own, not before the check in the caller's
