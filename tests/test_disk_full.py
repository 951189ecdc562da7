"""A disk the conversion writes that refuses (full here; over quota or read-only alike) is the disk's failure, never
the master's: convert() says so (ConversionResult.disk_full, a reason naming the folder and its free space), never
rejects the master as corrupt, and a harvest stops the run as for its own scratch space, counting no attempt.

Real parts: a small tmpfs mounted (root only) where the output goes, or as TMPDIR for the conversion process's
scratch, where a JP2 recipe writes its uncompressed reference TIFF.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tifffile

from gcis_etl.conversion import convert
from gcis_etl.errors import ConversionFailed, DiskFull
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.jp2 import run_encoder
from gcis_etl.models import Status
from tests.conftest import CORPUS
from tests.harvests import peek
from tests.mounts import tmpfs
from tests.test_cron_operation import Night, fill

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")

MASTER = CORPUS / "rgb8-tiff-lzw" / "kodim02-lzw.tif"  # 768x512: a reference TIFF of 1.2 MB


@pytest.fixture
def tiny(tmp_path):
    with tmpfs(tmp_path / "tiny", "size=64k") as folder:
        yield folder


def test_an_output_folder_that_fills_is_the_disks_failure(tiny):
    result = convert(MASTER, tiny / "out" / "access.tif", "ptiff-jpeg-q90")

    assert (result.status, result.disk_full) == (Status.FAILED, True), result.reason
    assert re.fullmatch(rf"cannot write {re.escape(str(tiny / 'out'))}: No space left on device \(0\.\d MB free "
                        r"there when it began\): free space on its filesystem", result.reason), result.reason
    assert list(tiny.rglob("*")) == [tiny / "out"]  # no .partial left


def test_a_conversion_scratch_that_fills_is_the_disks_failure_not_a_corrupt_master(tiny, tmp_path, monkeypatch):
    """The reference TIFF libvips writes for the encoder fills TMPDIR: libvips' 'unix error: No space left on
    device' was a RejectedMaster ('corrupt or truncated image data')."""
    monkeypatch.setenv("TMPDIR", str(tiny))  # the conversion process inherits it
    with IsolatedProcess() as child:
        result = convert(MASTER, tmp_path / "access.jp2", "jp2-openjpeg-lossy", worker=child)

    assert (result.status, result.disk_full) == (Status.FAILED, True), result.reason
    assert re.fullmatch(rf"cannot write {re.escape(str(tiny))}: No space left on device \(0\.\d MB free there when "
                        r"it began\): free space on its filesystem \(the system temp dir: TMPDIR sets where it is\)",
                        result.reason), result.reason
    assert list(tiny.iterdir()) == [] and list(tmp_path.glob(".*.partial")) == []


def test_an_encoder_that_runs_out_of_scratch_is_the_disks_failure(tmp_path, monkeypatch):
    """The reference fits, the encoder's output does not: grk_compress removes it and says only 'failed to
    compress image'; the free space left tells."""
    with tmpfs(tmp_path / "scratch", "size=1200k") as scratch:
        monkeypatch.setenv("TMPDIR", str(scratch))
        with IsolatedProcess() as child:
            result = convert(MASTER, tmp_path / "access.jp2", "jp2-grok-lossy", worker=child)

    assert (result.status, result.disk_full) == (Status.FAILED, True), result.reason
    assert result.reason.startswith(f"cannot write {scratch}: grk_compress failed (exit 1): "), result.reason
    assert result.reason.endswith("failed to compress image (0.0 MB free there, up to 1.0 MB needed): free space "
                                  "on its filesystem (the system temp dir: TMPDIR sets where it is)"), result.reason


def test_an_encoder_failing_for_its_own_reasons_on_a_big_master_is_not_taken_for_a_full_disk(tmp_path):
    """A disk with room for any output but not for a second copy of the uncompressed input: the encoder's failure
    (memory, a bug) is the item's, counted, not a full disk that would stop every run on the same item. The
    encoder is a stand-in that fails as grk_compress does; its input a sparse 1 GB file (its output: at most a
    twentieth of that, 51 MB, against 64 MB free)."""
    with tmpfs(tmp_path / "tiny-64m", "size=64m") as big:
        reference = tmp_path / "normalised-srgb.tif"
        with open(reference, "wb") as f:
            f.truncate(1 << 30)
        encoder = tmp_path / "grk_compress"
        encoder.write_text("#!/bin/sh\necho '[error] failed to compress image' >&2\nexit 1\n")
        encoder.chmod(0o755)
        with pytest.raises(ConversionFailed) as failed:
            run_encoder((str(encoder), "-i", str(reference), "-o", str(big / "encoded.jp2")), timeout=30)
    assert not isinstance(failed.value, DiskFull)
    assert str(failed.value) == "grk_compress failed (exit 1): [error] failed to compress image"


def test_a_metadata_carrier_the_scratch_space_has_no_margin_for_is_the_disks_failure(tiny, tmp_path,
                                                                                        monkeypatch):
    """8 KB left: the master's metadata would not fit in the carrier exiftool writes, which it removes, saying
    only 'Error writing output file'; under DISK_MARGIN free, the step is refused before exiftool starts."""
    fill(tiny)
    os.truncate(tiny / "filler", (tiny / "filler").stat().st_size - 8192)
    monkeypatch.setenv("TMPDIR", str(tiny))
    with IsolatedProcess() as child:
        result = convert(CORPUS / "metadata-rich" / "ExifTool.jpg", tmp_path / "access.tif", "ptiff-jpeg-q90",
                         worker=child)

    assert (result.status, result.disk_full) == (Status.FAILED, True), result.reason
    assert result.reason == (f"cannot write {tiny}: not enough free space (0.0 MB free there when it began, up to "
                             f"1.0 MB needed): free space on its filesystem (the system temp dir: TMPDIR sets where "
                             f"it is)")


def test_a_conversion_that_fills_the_scratch_space_stops_the_harvest_and_spends_no_attempt(tmp_path):
    """The masters fit in the scratch space, their access masters do not (periodic noise: a few KB deflated,
    JPEG's worst case): the run stops (exit 1), no item is recorded, and with room again the next run deposits
    them."""
    night = Night(tmp_path)
    tile = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    for object_id in "ab":
        (tmp_path / "src" / object_id).mkdir(parents=True)
        tifffile.imwrite(tmp_path / "src" / object_id / "master.tif", np.tile(tile, (128, 128, 1)),
                         photometric="rgb", compression="zlib")
    with tmpfs(tmp_path / "state" / "scratch", "size=256k") as scratch:
        full = night.harvest()

        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr
        reason = re.search(rf"dam: run stopped: (converting: cannot write {re.escape(str(scratch / 'dam'))} \(the "
                           r"scratch space: state_dir sets where it is\): No space left on device \(0\.\d MB free "
                           r"there when it began\): free space on its filesystem: then run again \(no item's attempt "
                           r"was counted\))", full.stderr)
        assert reason, full.stderr
        assert night.runs() == [(1, "failed", f"RunHalted: {reason[1]}")]
        assert night.items() == {} and peek(night.ledger, "SELECT * FROM run_items") == []

    again = night.harvest()
    assert again.returncode == 0, again.stderr
    assert night.items() == {f"{o}/{o}/master.tif": ("deposited", 0) for o in "ab"}


def rotated_master(path) -> None:
    """2000x1500 RGB in zlib strips, EXIF orientation 6: decoded whole into a tiled intermediate in scratch
    (decoding._tiled), 16 x 12 tiles of 128 x 128 x 3 bytes and their offsets: 10.5 MB with DISK_MARGIN."""
    rows = np.linspace(0, 255, 1500, dtype=np.uint8)[:, None, None]
    tifffile.imwrite(path, np.broadcast_to(rows, (1500, 2000, 3)), photometric="rgb", compression="zlib",
                     rowsperstrip=16, extratags=[(274, 3, 1, 6, True)])


def test_a_quarter_turned_master_the_scratch_space_cannot_hold_decoded_fails_before_decoding(tmp_path, monkeypatch):
    """The step is refused before it starts, naming what it needs and what was free then: found full, 4.8 GB
    needed had read as 0.0 MB free, and nothing said how much was missing."""
    rotated_master(tmp_path / "rotated.tif")
    with tmpfs(tmp_path / "small", "size=16m") as small:
        fill(small)
        os.truncate(small / "filler", (small / "filler").stat().st_size - (4 << 20))  # 4 MB free
        monkeypatch.setenv("TMPDIR", str(small))
        with IsolatedProcess() as child:
            result = convert(tmp_path / "rotated.tif", tmp_path / "access.tif", "ptiff-jpeg-q90", worker=child)

        assert (result.status, result.disk_full) == (Status.FAILED, True), result.reason
        assert re.fullmatch(rf"cannot write {re.escape(str(small))}: not enough free space \(4\.\d MB free there "
                            r"when it began, up to 10\.5 MB needed\): free space on its filesystem \(the system temp "
                            r"dir: TMPDIR sets where it is\)", result.reason), result.reason
        assert sorted(small.iterdir()) == [small / "filler"]


def test_a_quarter_turned_master_whose_intermediate_the_whole_scratch_filesystem_cannot_hold_fails_alone(
        tmp_path, monkeypatch):
    """No room freed would let it run: the master's failure (its attempts counted), not a full disk that stops every
    run on it."""
    rotated_master(tmp_path / "rotated.tif")
    with tmpfs(tmp_path / "small", "size=4m") as small:
        monkeypatch.setenv("TMPDIR", str(small))
        with IsolatedProcess() as child:
            result = convert(tmp_path / "rotated.tif", tmp_path / "access.tif", "ptiff-jpeg-q90", worker=child)

        assert (result.status, result.disk_full) == (Status.FAILED, False), result.reason
        assert result.reason == (f"needs up to 10.5 MB in {small}, more than its whole filesystem holds (4.2 MB) (the "
                                 f"system temp dir: TMPDIR sets where it is)")
        assert list(small.iterdir()) == []
