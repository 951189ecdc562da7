"""The TIFF writer: classic or BigTIFF from the same tile layout, metadata carried into both; a truncated one
is reported as such by verify."""
from __future__ import annotations

import numpy as np
import pytest
import pyvips
import simplejpeg
import tifffile

from gcis_etl import tiff
from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from gcis_etl.inspection import inspect
from gcis_etl.metadata import carried_tags, exiftool_json
from gcis_etl.ptiff import level_tags
from gcis_etl.pyramid import PyramidEncoder
from gcis_etl.recipes import load_recipe
from gcis_etl.verification import verify
from tests.conftest import CORPUS


def write(path, image: np.ndarray, force_bigtiff: bool, metadata_tags) -> bool:
    recipe = load_recipe()
    encode = lambda tile: simplejpeg.encode_jpeg(tile, quality=90, colorspace="RGB", colorsubsampling="420")
    with open(path, "wb") as f:
        writer = tiff.TiffFileWriter(f)
        writer.start()
        pyramid = PyramidEncoder(image.shape[1], image.shape[0], 3, 256, encode, writer)
        for y in range(0, image.shape[0], 100):  # rows arrive in arbitrary batch sizes
            pyramid.add_rows(image[y:y + 100])
        states = pyramid.close()
        ifds = [level_tags(i, s.level, s.offsets, s.counts, recipe, srgb_profile(), metadata_tags, None)
                for i, s in enumerate(states)]
        return writer.finish(ifds, force_bigtiff=force_bigtiff)


def test_bigtiff_and_classic_hold_the_same_pixels_and_metadata(tmp_path):
    image = np.asarray(pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/flowers.jpeg")).numpy())
    recipe = load_recipe()
    carried = carried_tags(inspect(CORPUS / "metadata-rich/ExifTool.jpg"), recipe.metadata.keep,
                           recipe.metadata.exclude, tmp_path)
    assert write(tmp_path / "classic.tif", image, False, carried.tags) is False
    assert write(tmp_path / "big.tif", image, True, carried.tags) is True
    assert (tmp_path / "big.tif").read_bytes()[:4] == b"II+\x00"
    with tifffile.TiffFile(tmp_path / "classic.tif") as a, tifffile.TiffFile(tmp_path / "big.tif") as b:
        assert not a.is_bigtiff and b.is_bigtiff
        assert [p.shape for p in a.pages] == [p.shape for p in b.pages] == [
            (1080, 1920, 3), (540, 960, 3), (270, 480, 3), (135, 240, 3)]
        assert np.array_equal(a.pages[0].asarray(), b.pages[0].asarray())
    for name in ("classic.tif", "big.tif"):
        tags = exiftool_json(tmp_path / name)
        assert tags["EXIF:Artist"] == "Phil Harvey" and tags["EXIF:ColorSpace"] == 1
        assert tags["XMP:Title"] == "Test IPTC picture"
        assert pyvips.Image.new_from_file(str(tmp_path / name), page=3).width == 240


def _first_directory_only(data: bytes, path) -> bytes:
    """Cut where the second level's directory starts: the full resolution is still described, not the rest."""
    with tifffile.TiffFile(path) as tf:
        return data[:tf.pages[1].offset]


@pytest.mark.parametrize("cut", [lambda data, path: data[:len(data) * 9 // 10], _first_directory_only],
                         ids=["90%", "the first directory only"])
def test_verify_calls_a_truncated_ptiff_truncated_without_tifffile_text(tmp_path, caplog, cut):
    master, ptiff = tmp_path / "master.tif", tmp_path / "out.tif"
    pyvips.Image.xyz(700, 500).extract_band(0).cast("uchar").bandjoin([128, 64]).copy(
        interpretation="srgb").tiffsave(str(master))
    assert convert(master, ptiff, load_recipe()).ok
    truncated = tmp_path / "truncated.tif"
    truncated.write_bytes(cut(ptiff.read_bytes(), ptiff))
    report = verify(truncated)
    assert not report.ok and len(report.errors) == 1
    assert report.errors[0].startswith(f"truncated or corrupt TIFF ({truncated.stat().st_size:,} bytes): ")
    assert "<" not in report.errors[0] and "TiffFileError" not in report.errors[0]
    assert not [r for r in caplog.records if r.name == "tifffile"]  # said once, in the report, not on stderr
