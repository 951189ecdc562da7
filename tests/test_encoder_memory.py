"""An external JPEG 2000 encoder runs without the child's address-space limit (grk_compress reserves more than
8 GB on 40 Mpx) but is held to isolation.encoder_memory_limit_mb, its resident memory: killed over it, or refused
at once when its measured bytes a pixel cannot fit, as the limit's failure naming the key. Its memory counts in
peak_rss_mb. An mmap refused under isolation.memory_limit_mb is that limit's failure, not the output's."""
from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import psutil
import pytest
import pyvips
import tifffile

from gcis_etl.conversion import _own_peak_rss_mb, convert
from gcis_etl.errors import ConversionFailed
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.jp2 import build_command, run_encoder
from gcis_etl.models import Status
from gcis_etl.policy import IsolationSettings
from gcis_etl.recipes import load_recipe
from gcis_etl.verification import _reference_pixels


def photograph(path: Path, width: int, height: int) -> Path:
    """Gradients under noise, as an uncompressed 8-bit sRGB TIFF: an encoder's input, or a master."""
    xy = pyvips.Image.xyz(width, height)
    red = (xy[0] * 255 / width + pyvips.Image.gaussnoise(width, height, sigma=20)).cast("uchar")
    green = (xy[1] * 255 / height + pyvips.Image.gaussnoise(width, height, sigma=20)).cast("uchar")
    red.bandjoin([green, ((red + green) / 2).cast("uchar")]).copy(interpretation="srgb").tiffsave(
        str(path), compression="none")
    return path


# Jobs run in the conversion process


def encode(argv: tuple[str, ...]) -> None:
    """An encoder run as a conversion runs it, the image size unknown (no estimate beforehand): only watched."""
    run_encoder(argv, timeout=600)


def own_peak_rss_mb() -> float:
    return _own_peak_rss_mb()


def map_reference(path: str) -> None:
    _reference_pixels(Path(path))


def test_an_encoder_over_its_memory_limit_is_killed_and_the_failure_names_the_key(tmp_path):
    """opj_compress holds ~60 MB from its first tenth of a second on this 3.8 Mpx image, for a second or more:
    whatever the machine's speed, it is read over the 8 MB limit."""
    source = photograph(tmp_path / "source.tif", 2400, 1600)
    argv = build_command(load_recipe("jp2-openjpeg-lossy"), source, tmp_path / "out.jp2", size=(2400, 1600)).argv
    with IsolatedProcess(IsolationSettings(encoder_memory_limit_mb=8)) as worker:
        with pytest.raises(ConversionFailed) as raised:
            worker.call(encode, argv)
        assert worker.call("tests.jobs.pid")  # the child lives on
    reached = re.fullmatch(r"out of memory under isolation\.encoder_memory_limit_mb \(8 MB\): opj_compress reached "
                           r"(\d+) MB; raise it for masters this size", str(raised.value))
    assert reached, raised.value
    assert int(reached.group(1)) > 8


def test_the_oom_killer_takes_an_encoder_first_and_its_kill_is_named(tmp_path):
    """Should the host run out of memory all the same (concurrency x the limit over what it has), the kernel's OOM
    killer takes an encoder, not the harvest or a neighbour: its SIGKILL is not called a crash."""
    source = photograph(tmp_path / "source.tif", 4000, 3000)  # encoded in seconds: killed long before
    argv = build_command(load_recipe("jp2-openjpeg-lossy"), source, tmp_path / "out.jp2", size=(4000, 3000)).argv
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(encode, argv)
        adjusted = None
        while not running.done() and adjusted != "1000":
            time.sleep(0.01)
            with suppress(psutil.Error, OSError):  # not yet exec'ed, or ended
                encoder = next((p for p in psutil.Process().children(recursive=True) if p.name() == "opj_compress"),
                               None)
                adjusted = encoder and Path(f"/proc/{encoder.pid}/oom_score_adj").read_text().strip()
        assert adjusted == "1000"
        os.kill(encoder.pid, signal.SIGKILL)  # as the OOM killer does
        with pytest.raises(ConversionFailed) as raised:
            running.result()
    assert str(raised.value) == ("opj_compress was killed (SIGKILL): when the host runs out of memory, the kernel's "
                                 "OOM killer takes an encoder first; lower concurrency or "
                                 "isolation.encoder_memory_limit_mb")


def test_a_watched_encoder_still_times_out(tmp_path):
    """opj_compress opening an input no one writes (a FIFO) waits for ever: it is killed at its time-out."""
    fifo = tmp_path / "source.tif"
    os.mkfifo(fifo)
    with pytest.raises(ConversionFailed, match=r"^opj_compress timed out after 1 s$"):
        run_encoder(("opj_compress", "-i", str(fifo), "-o", str(tmp_path / "out.jp2")), timeout=1)
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "opj_compress"]


def test_a_master_too_big_for_the_encoders_memory_limit_fails_before_it_is_encoded(tmp_path):
    """grk_compress holds at least 33 bytes a pixel: 121 MB for this 3.8 Mpx master, over a 64 MB limit. The
    conversion fails at once (FAILED: a harvest retries it once the limit is raised), naming the key."""
    master = photograph(tmp_path / "master.tif", 2400, 1600)
    result = convert(master, tmp_path / "out.jp2", "jp2-grok-lossy",
                     isolation_settings=IsolationSettings(encoder_memory_limit_mb=64))
    assert result.status is Status.FAILED
    assert result.reason == ("out of memory under isolation.encoder_memory_limit_mb (64 MB): grk_compress needs "
                             "about 121 MB (33 bytes a pixel) on a 4 Mpx image; raise it for masters this size")
    assert not (tmp_path / "out.jp2").exists()


def test_peak_rss_counts_the_encoder(tmp_path):
    """grk_compress holds ~37 bytes a pixel (~440 MB on 12 Mpx), the conversion process a few: the reported
    peak is above anything the conversion process itself ever held (read after the conversion, it can only be
    higher than during it)."""
    master = photograph(tmp_path / "master.tif", 4200, 2800)
    with IsolatedProcess() as worker:
        result = convert(master, tmp_path / "out.jp2", "jp2-grok-lossy", worker=worker)
        assert result.ok, result.reason
        own = worker.call(own_peak_rss_mb)
    assert result.peak_rss_mb > own


def test_an_mmap_refused_under_the_memory_limit_names_the_setting(tmp_path):
    """Verification maps the reference TIFF; over the child's address-space limit mmap fails with ENOMEM, which was
    reported as 'cannot write <output>: Cannot allocate memory'."""
    reference = tmp_path / "normalised-srgb.tif"
    tifffile.memmap(reference, shape=(40000, 40000, 3), dtype="uint8", photometric="rgb").flush()  # 4.8 GB, sparse
    with IsolatedProcess(IsolationSettings(memory_limit_mb=4096)) as worker:
        with pytest.raises(ConversionFailed) as raised:
            worker.call(map_reference, str(reference))
    assert str(raised.value) == ("out of memory under isolation.memory_limit_mb (4096 MB): "
                                 "raise it for masters this size")
