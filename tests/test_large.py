"""Large masters stream: a 300 Mpx master converts in bounded memory (measured in the child)."""
from __future__ import annotations

import pyvips

from gcis_etl.conversion import convert
from gcis_etl.isolation import IsolatedProcess


def make_master(path, width: int, height: int) -> None:
    """A synthetic photograph-sized master: gradients and texture, written as a JPEG."""
    xy = pyvips.Image.xyz(width, height)
    x, y = xy[0], xy[1]
    image = (x % 251).bandjoin([(y % 241), ((x + y) // 7) % 256]).cast("uchar")
    image.copy(interpretation="srgb").jpegsave(str(path), Q=85)


def test_300_megapixel_master_streams_in_bounded_memory(tmp_path):
    master = tmp_path / "big.jpg"
    make_master(master, 20000, 15000)
    with IsolatedProcess() as worker:  # a fresh child: its peak RSS is this conversion's
        result = convert(master, tmp_path / "big.tif", worker=worker)
    assert result.ok, result.reason
    assert (result.width, result.height) == (20000, 15000) and result.levels == 8
    uncompressed_mb = 20000 * 15000 * 3 / 1e6
    assert result.peak_rss_mb < 1000, f"peak RSS {result.peak_rss_mb:.0f} MB for a {uncompressed_mb:.0f} MB master"
