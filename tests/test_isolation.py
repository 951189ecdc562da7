"""Isolation: a crash, hang or memory blow-up is one master's failure, never the caller's."""
from __future__ import annotations

import ctypes

import pytest

from gcis_etl.conversion import convert
from gcis_etl.errors import ConversionFailed
from gcis_etl.isolation import IsolatedProcess, WorkerCrashed, WorkerTimeout
from gcis_etl.models import Status
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from tests.conftest import CORPUS

CRASHER = CORPUS / "decoder-crash/Bretagne2_4.j2k"  # libvips 8.14 jp2kload segfaults on this valid J2K
ADDR_NO_RANDOMIZE = 0x0040000  # personality(2) flag, as `setarch -R` sets it


@pytest.fixture
def crashing_layout():
    """Whether libvips segfaults on CRASHER depends on where its memory lands: 7 runs in 10 with address
    randomisation, every run without. Children started meanwhile (they inherit the personality) get none,
    so the crash the tests are about happens every time."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.personality(0xFFFFFFFF)  # 0xffffffff: query only
    if before == -1 or libc.personality(before | ADDR_NO_RANDOMIZE) == -1:
        pytest.fail(f"personality(2) refused: errno {ctypes.get_errno()}")
    yield
    libc.personality(before)


def test_segfault_is_reported_and_the_next_job_runs():
    with IsolatedProcess() as worker:
        first = worker.call("tests.jobs.pid")
        with pytest.raises(WorkerCrashed, match="crashed: SIGSEGV"):
            worker.call("tests.jobs.segfault")
        assert worker.call("tests.jobs.pid") != first  # a fresh child took over


def test_timeout_kills_the_child():
    with IsolatedProcess() as worker:
        with pytest.raises(WorkerTimeout, match="timed out"):
            worker.call("tests.jobs.hang", 30, timeout=1)
        assert worker.call("tests.jobs.allocate", 1) == 1024 * 1024


def test_memory_blow_up_is_a_failure_not_a_crash_of_the_caller():
    with IsolatedProcess(IsolationSettings(memory_limit_mb=1024)) as worker:
        with pytest.raises(ConversionFailed, match="out of memory"):
            worker.call("tests.jobs.allocate", 4096)
        assert worker.call("tests.jobs.allocate", 10) == 10 * 1024 * 1024


def test_child_is_recycled_after_its_job_limit():
    with IsolatedProcess(IsolationSettings(max_jobs_per_process=2)) as worker:
        pids = [worker.call("tests.jobs.pid") for _ in range(4)]
    assert pids[0] == pids[1] != pids[2] == pids[3]


def test_decoder_crash_falls_back_to_the_next_decoder(tmp_path, crashing_layout):
    result = convert(CRASHER, tmp_path / "a.tif")
    assert result.status is Status.CONVERTED
    assert result.decoder == "pillow"
    assert any("crashed (SIGSEGV)" in w for w in result.warnings)


def test_decoder_crash_without_fallback_fails_that_master_only(tmp_path, crashing_layout):
    policy = ImagingPolicy(decoders={"J2K": ("vips",)})
    with IsolatedProcess() as worker:
        crashed = convert(CRASHER, tmp_path / "a.tif", policy=policy, worker=worker)
        after = convert(CORPUS / "png/png-rgb-64x56x8.png", tmp_path / "b.tif", policy=policy, worker=worker)
    assert crashed.status is Status.FAILED
    assert "crashed: SIGSEGV while reading pixels with vips" in crashed.reason
    assert not (tmp_path / "a.tif").exists() and not list(tmp_path.glob(".*partial"))
    assert after.status is Status.CONVERTED


def test_nothing_half_written_on_timeout(tmp_path):
    settings = IsolationSettings(timeout_seconds=0.5)
    result = convert(CORPUS / "jpeg-gainmap-ultrahdr/ultra-hdr.jpg", tmp_path / "a.tif", isolation_settings=settings)
    assert result.status is Status.FAILED and "timed out" in result.reason
    assert list(tmp_path.iterdir()) == []


def test_existing_destination_is_untouched_by_a_failed_conversion(tmp_path):
    dst = tmp_path / "a.tif"
    assert convert(CORPUS / "png/png-rgb-64x56x8.png", dst).ok
    before = dst.read_bytes()
    result = convert(CORPUS / "truncated/truncated.jpg", dst)
    assert result.status is Status.REJECTED
    assert dst.read_bytes() == before
