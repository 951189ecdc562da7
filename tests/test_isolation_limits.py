"""The conversion process's limits on big masters: a limit reached is the limit's failure, named so that the
operator can raise it; what a killed or crashed child left on disk is removed; a half-uploaded master is
rejected from its header."""
from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import psutil
import pytest
import pyvips
import tifffile

from gcis_etl import isolation
from gcis_etl.conversion import check_decoding, convert
from gcis_etl.errors import ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.isolation import IsolatedProcess, WorkerCrashed, WorkerTimeout
from gcis_etl.models import Status, Verdict
from gcis_etl.policy import ImagingPolicy, IsolationSettings
from tests.test_isolation import CRASHER, TO_VIPS, through_a_vips_crash

HEADROOM_MB = 16  # left to the child above what it maps once warm: less than libvips needs for single_strip_master's
                  # rows (it converts with 40 MB, not with 32)


# Jobs run in the conversion process


def leave_headroom(megabytes: int) -> None:
    """Lower the child's address-space limit to what it maps now plus `megabytes`: isolation.memory_limit_mb
    reached on a master a few Mpx large instead of several hundred."""
    mapped = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("VmSize:")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + megabytes * 2 ** 20, resource.getrlimit(resource.RLIMIT_AS)[1]))


def scratch_then(then: str) -> None:
    """Make a scratch folder with a file in it, say where (the stage a time-out names), then hang or crash."""
    folder = isolation.scratch()  # as a conversion's: removed when the job ends, unless the child is killed
    Path(folder.name, "reference.tif").write_bytes(b"\0" * 4096)
    isolation.stage(f"holding {folder.name}")
    if then == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    signal.pause()


def encode_then_hang() -> None:
    """Start an encoder (a process of the child's own), say which, and hang."""
    encoder = subprocess.Popen(["sleep", "300"])
    isolation.stage(f"encoding with pid {encoder.pid}")
    signal.pause()


# Masters


def single_strip_master(path: Path, width: int = 3000, height: int = 2000) -> Path:
    """16-bit RGB in one deflated strip (36 MB at the default size), wide enough for libvips' buffers of the rows
    the encoders fetch to outgrow HEADROOM_MB."""
    pixels = np.zeros((height, width, 3), np.uint16)
    pixels[..., 0] = np.arange(width, dtype=np.uint16) * 20
    tifffile.imwrite(path, pixels, photometric="rgb", compression="zlib", rowsperstrip=height)
    return path


def ifd_first_master(path: Path) -> Path:
    """A tiled 16-bit BigTIFF written as tifffile and Photoshop write it: the IFD before the pixels."""
    rng = np.random.default_rng(0)
    tifffile.imwrite(path, rng.integers(0, 65535, (768, 1024, 3), dtype=np.uint16), photometric="rgb",
                     tile=(256, 256), compression="zlib", bigtiff=True)
    return path


def cut(path: Path, fraction: float) -> Path:
    """The first `fraction` of the file, as an interrupted upload leaves it."""
    data = path.read_bytes()
    half = path.with_name("cut-" + path.name)
    half.write_bytes(data[:int(len(data) * fraction)])
    return half


# isolation.memory_limit_mb reached inside libvips


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "ptiff-tifffile-q90"])
def test_memory_limit_reached_in_libvips_fails_and_names_the_setting(tmp_path, recipe):
    master = single_strip_master(tmp_path / "master.tif")
    settings = IsolationSettings(memory_limit_mb=4096)
    with IsolatedProcess(settings) as worker:
        assert convert(single_strip_master(tmp_path / "small.tif", 64, 48), tmp_path / "warm.tif", recipe,
                       worker=worker).ok  # every library loaded before the limit is lowered
        worker.call(leave_headroom, HEADROOM_MB)
        result = convert(master, tmp_path / "out.tif", recipe, worker=worker)
    assert result.status is Status.FAILED, result.reason  # retried by a harvest, not rejected as corrupt
    assert result.reason == ("out of memory under isolation.memory_limit_mb (4096 MB): "
                             "raise it for masters this size")
    assert not (tmp_path / "out.tif").exists()


def progressive_jpeg(path: Path) -> Path:
    """libjpeg holds a progressive JPEG's whole coefficient buffer (here 36 MB) while it decodes, and reports a
    refused allocation as "Insufficient memory (case 4)"."""
    noise = pyvips.Image.gaussnoise(4000, 3000).cast("uchar")
    noise.bandjoin([noise, noise]).copy(interpretation="srgb").jpegsave(str(path), interlace=True, Q=90)
    return path


@pytest.mark.parametrize("check", ["inspect", "convert"])
def test_a_progressive_jpeg_too_big_for_the_memory_limit_is_not_called_corrupt(tmp_path, check):
    master = progressive_jpeg(tmp_path / "master.jpg")
    with IsolatedProcess(IsolationSettings(memory_limit_mb=4096)) as worker:
        warm = single_strip_master(tmp_path / "small.tif", 64, 48)
        assert check_decoding(warm, worker=worker).verdict is Verdict.ACCEPT_AFTER_CONVERSION
        assert convert(warm, tmp_path / "warm.tif", worker=worker).ok
        worker.call(leave_headroom, HEADROOM_MB)
        if check == "inspect":
            info = check_decoding(master, worker=worker)
            verdict, reasons = info.verdict, info.reasons
        else:
            result = convert(master, tmp_path / "out.tif", worker=worker)
            verdict, reasons = result.status, (result.reason,)
    assert verdict is (Verdict.NOT_CHECKED if check == "inspect" else Status.FAILED)
    assert reasons == ("out of memory under isolation.memory_limit_mb (4096 MB): raise it for masters this size",)


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "ptiff-tifffile-q90", None])
def test_corrupt_data_is_still_rejected_with_libvips_last_message(tmp_path, recipe):
    """The rule that tells the limit from the master, on libvips' error for a tile that does not inflate;
    None: check_decoding's full decode."""
    master = ifd_first_master(tmp_path / "master.tif")
    with tifffile.TiffFile(master) as tf:
        offset, count = tf.pages[0].dataoffsets[5], tf.pages[0].databytecounts[5]
    data = bytearray(master.read_bytes())
    data[offset + 2:offset + count] = bytes(count - 2)
    master.write_bytes(bytes(data))
    if recipe:
        result = convert(master, tmp_path / "out.tif", recipe)
        assert result.status is Status.REJECTED
        reasons = (result.reason,)
    else:
        info = check_decoding(master)
        assert info.verdict is Verdict.REJECT
        reasons = info.reasons
    assert reasons == ("corrupt or truncated image data: ZIPDecode: Decoding error at scanline 256",)


def test_time_out_names_the_setting():
    with IsolatedProcess(IsolationSettings(timeout_seconds=1)) as worker:
        with pytest.raises(WorkerTimeout) as raised:
            worker.call("tests.jobs.hang", 30)
    assert str(raised.value) == "timed out after 1 s under isolation.timeout_seconds: raise it for masters this size"


# Scratch folders of children killed or crashed


@pytest.fixture
def scratch_root(tmp_path, monkeypatch) -> Path:
    """A temporary folder of the test's own, for the children (TMPDIR) and this process (tempfile)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_scratch_of_a_child_killed_on_time_out_is_removed(scratch_root):
    with IsolatedProcess() as worker:
        worker.call("tests.jobs.pid")  # started: the time-out below is the job's alone
        with pytest.raises(WorkerTimeout) as raised:
            worker.call(scratch_then, "hang", timeout=3)
    folder = Path(re.search(r"while holding (\S+)", str(raised.value)).group(1))
    assert folder.parent == scratch_root
    assert not folder.exists()


def test_an_encoder_is_killed_with_the_child_that_timed_out():
    """It would burn a core and write into a removed scratch folder until its own time-out."""
    with IsolatedProcess() as worker:
        worker.call("tests.jobs.pid")
        with pytest.raises(WorkerTimeout) as raised:
            worker.call(encode_then_hang, timeout=3)
    encoder = psutil.Process(int(re.search(r"encoding with pid (\d+)", str(raised.value)).group(1)))
    try:
        encoder.wait(30)  # killed: gone once init reaps it
    except psutil.TimeoutExpired:
        encoder.kill()
        pytest.fail(f"the encoder {encoder.pid} outlived its conversion process")


def test_scratch_of_a_crashed_child_is_removed(scratch_root):
    with IsolatedProcess() as worker:
        with pytest.raises(WorkerCrashed, match="crashed: SIGSEGV while holding"):
            worker.call(scratch_then, "crash")
    assert list(scratch_root.iterdir()) == []


def test_scratch_of_a_conversion_crashed_in_libvips_is_removed(scratch_root, tmp_path):
    policy = ImagingPolicy(decoders={"J2K": ("vips",)}, **TO_VIPS)  # a fresh child each time: libvips varies
    crashed = through_a_vips_crash(lambda: convert(CRASHER, tmp_path / "a.tif", policy=policy))
    assert "crashed: SIGSEGV while reading pixels with vips" in crashed.reason
    assert list(scratch_root.iterdir()) == []


def test_a_new_child_removes_the_scratch_of_dead_conversion_processes_only(scratch_root):
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = scratch_root / f"gcis-scratch-{dead}@{host}-abc123"       # a child killed with its parent
    live = scratch_root / f"gcis-scratch-{os.getpid()}@{host}-def456"  # converting in another worker
    elsewhere = scratch_root / f"gcis-scratch-{dead}@other-{host}-gh78"  # another host's, on a shared TMPDIR
    unknown = scratch_root / "gcis-scratch-k9x2m_q1"                    # owner unknown
    for folder in (left, live, elsewhere, unknown):
        folder.mkdir()
        (folder / "reference.tif").write_bytes(b"\0")
    with IsolatedProcess() as worker:
        worker.call("tests.jobs.pid")
    assert sorted(p.name for p in scratch_root.iterdir()) == sorted(p.name for p in (live, elsewhere, unknown))


# A half-uploaded master whose IFD comes first


def test_half_uploaded_master_with_its_ifd_first_is_rejected_from_the_header(tmp_path):
    whole = ifd_first_master(tmp_path / "master.tif")
    half = cut(whole, 0.5)
    info = inspect(half)
    assert info.verdict is Verdict.REJECT
    with tifffile.TiffFile(whole) as tf:
        end = max(o + c for o, c in zip(tf.pages[0].dataoffsets, tf.pages[0].databytecounts))
    assert info.reasons == (f"truncated: image data runs to {end:,} bytes, the file has {half.stat().st_size:,} "
                            "(an interrupted upload?)",)
    assert inspect(whole).verdict is not Verdict.REJECT



# An allocation refused outside libvips


def start_a_thread_beyond_the_limit() -> None:
    """A thread pool's worker whose stack cannot be mapped under the limit, as tifffile's encode pool fails:
    RuntimeError("can't start new thread")."""
    threading.stack_size(2 ** 33)
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(int).result()
    finally:
        threading.stack_size(0)


def halve_beyond_the_limit() -> None:
    """OpenCV refusing a level's halved rows, as tifffile_ptiff.Halver's cv2.resize fails: cv2.error
    "Insufficient memory"."""
    cv2.resize(np.zeros((2, 2, 3), np.uint8), (60000, 60000))


@pytest.mark.parametrize("job", [start_a_thread_beyond_the_limit, halve_beyond_the_limit])
def test_an_allocation_refused_anywhere_in_the_child_fails_and_names_the_setting(job):
    """Not an internal error with Python's or OpenCV's words: the limit's failure (FAILED, retried)."""
    with IsolatedProcess(IsolationSettings(memory_limit_mb=4096)) as worker:
        with pytest.raises(ConversionFailed) as raised:
            worker.call(job)
        assert worker.call("tests.jobs.pid")  # the child lives on
    assert str(raised.value) == ("out of memory under isolation.memory_limit_mb (4096 MB): "
                                 "raise it for masters this size")
