"""Isolation: a crash, hang or memory blow-up is one master's failure, never the caller's."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from gcis_etl.conversion import convert
from gcis_etl.errors import ConversionFailed
from gcis_etl.isolation import IsolatedProcess, WorkerCrashed, WorkerTimeout, encoder_address_space
from gcis_etl.models import ConversionResult, Status
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from tests.conftest import CORPUS

CRASHER = CORPUS / "decoder-crash/Bretagne2_4.j2k"  # libvips 8.14 jp2kload segfaults on this valid J2K
# its origin (150, 300) keeps libvips away from it by default (see decoding._jpeg2000_origin): given to libvips
# anyway, it is the corpus's real decoder crash
TO_VIPS = {"vips_decodes_jpeg2000_origin": True}
CRASH_ATTEMPTS = 12  # libvips crashes on CRASHER in about 7 runs of 10 (where its memory lands decides)


def through_a_vips_crash(convert_once) -> ConversionResult:
    """The first conversion of CRASHER in which libvips crashed, the premise of the tests that use it; a run in
    which it did not (libvips "decoded" it, into noise: decoder "vips") is discarded, output included."""
    for _ in range(CRASH_ATTEMPTS):
        result = convert_once()
        if result.decoder != "vips":
            return result
        Path(result.output).unlink()
    pytest.fail(f"libvips decoded {CRASHER.name} without crashing {CRASH_ATTEMPTS} times in a row")


def test_segfault_is_reported_and_the_next_job_runs():
    with IsolatedProcess() as worker:
        first = worker.call("tests.jobs.pid")
        with pytest.raises(WorkerCrashed, match="crashed: SIGSEGV"):
            worker.call("tests.jobs.segfault")
        assert worker.call("tests.jobs.pid") != first  # a fresh child took over


def test_a_terminal_hang_up_leaves_the_conversion_in_flight_to_finish():
    """A closed terminal sends SIGHUP to the whole process group, the conversion process included: the command
    stops cleanly once its items in flight are done (commands._on_each), so that process must outlive it."""
    with IsolatedProcess() as worker:
        first = worker.call("tests.jobs.pid")
        os.kill(first, signal.SIGHUP)
        assert worker.call("tests.jobs.pid") == first  # the same child: the signal did not kill it


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


def test_decoder_crash_falls_back_to_the_next_decoder(tmp_path):
    result = through_a_vips_crash(lambda: convert(CRASHER, tmp_path / "a.tif", policy=ImagingPolicy(**TO_VIPS)))
    assert result.status is Status.CONVERTED
    assert result.decoder == "pillow"
    assert any("crashed (SIGSEGV)" in w for w in result.warnings)


def test_decoder_crash_without_fallback_fails_that_master_only(tmp_path):
    policy = ImagingPolicy(decoders={"J2K": ("vips",)}, **TO_VIPS)
    # a fresh child per job: a warm child that once decoded CRASHER cleanly tends to go on doing so
    with IsolatedProcess(IsolationSettings(max_jobs_per_process=1)) as worker:
        crashed = through_a_vips_crash(lambda: convert(CRASHER, tmp_path / "a.tif", policy=policy, worker=worker))
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


def test_the_address_space_limit_returns_when_the_last_of_overlapping_encoders_ends():
    """An encoder beside the main thread's (the JP2 metadata carrier's) must not leave the limit lifted, nor
    bring it back while the main encoder still runs."""
    original = resource.getrlimit(resource.RLIMIT_AS)
    limit = 64 * 2 ** 30
    if original[1] != resource.RLIM_INFINITY and original[1] <= limit:
        pytest.fail(f"the hard address-space limit {original[1]} leaves no room for the test")
    resource.setrlimit(resource.RLIMIT_AS, (limit, original[1]))
    try:
        entered, release = threading.Event(), threading.Event()

        def beside():
            with encoder_address_space():
                entered.set()
                release.wait(10)

        with encoder_address_space():
            thread = threading.Thread(target=beside)
            thread.start()
            entered.wait(10)
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == original[1]  # the beside encoder still runs
        release.set()
        thread.join()
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, original)


def test_work_beside_runs_in_a_thread_only_when_a_conversion_may_use_more_than_one():
    """isolation.vips_concurrency 1 (one process per core) keeps a conversion to one thread."""
    for threads, in_main_thread in ((1, True), (2, False)):
        with IsolatedProcess(IsolationSettings(vips_concurrency=threads)) as child:
            assert (child.call("tests.jobs.beside_thread") == "MainThread") is in_main_thread, threads


def test_an_encoder_dies_with_the_process_running_it_when_that_is_killed(tmp_path):
    """A Celery pool process hard-killed at its time limit takes its conversion child with it; the encoder
    that child started must not go on alone."""
    pid_file = tmp_path / "encoder.pid"
    encoder = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    runner = subprocess.Popen([sys.executable, "-c", "import sys; from gcis_etl.jp2 import run_encoder; "
                               "run_encoder((sys.executable, '-c', sys.argv[1], '-o', 'x.jp2'), timeout=120)",
                               encoder], cwd=tmp_path)
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        encoder_pid = int(pid_file.read_text())
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(10)
        gone = psutil.wait_procs([psutil.Process(encoder_pid)], timeout=10)[0]
        assert [p.pid for p in gone] == [encoder_pid]
    finally:
        runner.kill()
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_child_pool_whose_child_was_lost_to_an_exception_still_leases(tmp_path):
    """Celery's SoftTimeLimit is raised from a signal handler in the pool process's only thread: landing while a
    lease makes its child, it used to leave a pool of one with no room and nothing idle, and every later task
    failed with 'IndexError: pop from empty list' until the process was recycled. The exception is raised here
    at that point by a trace function (deterministic, where a timer would land anywhere)."""
    from gcis_etl import isolation
    from gcis_etl.isolation import ChildPool

    class SoftTimeLimit(Exception):
        pass

    def raise_once_in_its_making(frame, event, arg):
        if event == "line" and frame.f_code.co_name == "__init__" and frame.f_code.co_filename == isolation.__file__:
            sys.settrace(None)
            raise SoftTimeLimit("soft time limit exceeded")
        return raise_once_in_its_making

    pool = ChildPool(1)
    sys.settrace(raise_once_in_its_making)
    try:
        with pytest.raises(SoftTimeLimit), pool.lease(IsolationSettings()):
            pass
    finally:
        sys.settrace(None)
    try:
        with pool.lease(IsolationSettings()) as child:
            result = convert(CORPUS / "jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg", tmp_path / "out.tif",
                             worker=child)
        assert result.ok, result.reason
    finally:
        pool.close()
