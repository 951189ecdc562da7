"""exiftool reads a master's metadata in the calling process (the CLI's, a harvest's), held to the isolation
limits: a 2 MB PNG whose zTXt chunk inflates to 2 GiB took it to 8.4 GB and minutes, holding the harvest's lock.
Over the limits, that master fails with the reason, and the next one is read by a new exiftool."""
from __future__ import annotations

import struct
import time
import zlib

import pytest

from gcis_etl.conversion import convert
from gcis_etl.errors import ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.metadata import exiftool_json
from gcis_etl.models import Status
from gcis_etl.policy import IsolationSettings

LIMITS = IsolationSettings(memory_limit_mb=200, timeout_seconds=60)  # exiftool itself runs in ~60 MB
INFLATED_MB = 256  # exiftool holds several copies of the text: well over LIMITS


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(path, *chunks: bytes, before_pixels: bytes = b""):
    """A 1x1 grey PNG with `chunks` after its pixels, and `before_pixels` between its header and its pixels."""
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + header + before_pixels + _chunk(b"IDAT", zlib.compress(b"\0\0"))
                     + b"".join(chunks) + _chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def bomb_chunk() -> bytes:
    """~1 MB, a zTXt comment of INFLATED_MB of 'A' once inflated."""
    deflate, block = zlib.compressobj(1), b"A" * (1 << 20)
    text = b"".join(deflate.compress(block) for _ in range(INFLATED_MB)) + deflate.flush()
    return _chunk(b"zTXt", b"Comment\0\0" + text)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory, bomb_chunk):
    return _png(tmp_path_factory.mktemp("bomb") / "bomb.png", bomb_chunk)


def test_a_metadata_bomb_fails_inspect_under_the_memory_limit_and_the_next_master_inspects(bomb, tmp_path):
    started = time.monotonic()
    with pytest.raises(ConversionFailed) as failed:
        inspect(bomb, limits=LIMITS)
    assert str(failed.value) == ("exiftool ran out of memory reading the metadata under isolation.memory_limit_mb "
                                 "(200 MB): raise it for metadata this large")
    assert time.monotonic() - started < 30
    plain = _png(tmp_path / "plain.png", _chunk(b"tEXt", b"Comment\0fine"))
    assert inspect(plain, limits=LIMITS).width == 1
    assert exiftool_json(plain, limits=LIMITS)["PNG:Comment"] == "fine"


def test_a_metadata_bomb_before_the_pixels_is_exiftools_to_judge_not_the_header_reads(bomb_chunk, tmp_path):
    """Where Pillow inflated text chunks on its way to the pixels (to 1 MB: MAX_TEXT_CHUNK) and rejected the
    master as a corrupt header, exiftool never reading it: the failure is the limit's, with the reason."""
    with pytest.raises(ConversionFailed, match=r"^exiftool ran out of memory reading the metadata under "):
        inspect(_png(tmp_path / "bomb.png", before_pixels=bomb_chunk), limits=LIMITS)


def test_a_metadata_bomb_fails_that_conversion_with_the_reason(bomb, tmp_path):
    result = convert(bomb, tmp_path / "out.tif", isolation_settings=LIMITS)
    assert result.status is Status.FAILED
    assert result.reason.startswith("exiftool ran out of memory reading the metadata under "
                                    "isolation.memory_limit_mb (200 MB)")
    assert not (tmp_path / "out.tif").exists()


def _held(tmp_path) -> str:
    """An exiftool -if condition holding it (it waits for a file that never comes): it stands for an exiftool that
    takes minutes over a master's metadata."""
    return f'until (-e "{tmp_path / "never"}") {{ select(undef, undef, undef, 0.05) }} 1'


def test_a_metadata_read_past_the_time_limit_kills_exiftool_and_the_next_read_gets_another(tmp_path):
    master = _png(tmp_path / "m.png", _chunk(b"tEXt", b"Comment\0fine"))
    hold = _held(tmp_path)
    started = time.monotonic()
    limits = IsolationSettings(metadata_timeout_seconds=1)  # the conversion's own time stays 1800 s
    with pytest.raises(ConversionFailed, match=r"^exiftool timed out after 1 s reading the metadata under "
                                               r"isolation\.metadata_timeout_seconds \(raise it"):
        exiftool_json(master, "-if", hold, limits=limits)
    assert time.monotonic() - started < 10
    assert inspect(master, limits=limits).width == 1


@pytest.mark.parametrize("limits, setting", [
    (IsolationSettings(metadata_timeout_seconds=1), r"metadata_timeout_seconds"),
    # the conversion's time runs out first: exiftool, still at work, stops short of it, and names it
    (IsolationSettings(timeout_seconds=5), r"timeout_seconds"),
], ids=["metadata-time", "conversion-time"])
def test_exiftool_in_the_conversion_process_has_a_time_limit_and_the_failure_names_the_metadata(limits, setting,
                                                                                                 tmp_path):
    """There it ran with no time limit of its own: a master whose metadata took exiftool minutes (28 MB of IPTC)
    failed 'timed out after 120 s under isolation.timeout_seconds', as if its pixels were the cause."""
    master = _png(tmp_path / "m.png", _chunk(b"tEXt", b"Comment\0fine"))
    hold = _held(tmp_path)
    started = time.monotonic()
    with IsolatedProcess(limits) as worker:
        with pytest.raises(ConversionFailed, match=rf"^exiftool timed out after [\d.]+ s reading the metadata under "
                                                   rf"isolation\.{setting} \(raise it for metadata this large\)$"):
            worker.call(exiftool_json, str(master), "-if", hold)
        assert time.monotonic() - started < min(limits.timeout_seconds, 20)
        assert worker.call(exiftool_json, str(master))["PNG:Comment"] == "fine"
