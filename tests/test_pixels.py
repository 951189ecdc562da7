"""Pixels and geometry: the access master is faithful to the normalised master at every level."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tifffile

from gcis_etl.conversion import convert
from gcis_etl.pyramid import levels_for, shrink2
from tests.conftest import CORPUS
from tests.imaging import decoded_level, normalised
from tests.measures import luma, psnr

PHOTOGRAPHS = ["jpeg-baseline/flowers.jpeg", "icc-adobergb/sample.jpg", "icc-prophoto/test_icc_prophoto.jpg",
               "exif-orientation/Landscape_6.jpg", "icc-adobergb/example.tif", "jpeg-gainmap-ultrahdr/ultra-hdr.jpg",
               "rgb8-tiff-lzw/kodim02-lzw.tif", "decoder-crash/Bretagne2_4.j2k"]


@pytest.mark.parametrize("name", PHOTOGRAPHS)
def test_full_resolution_luma_psnr(name, tmp_path):
    result = convert(CORPUS / name, tmp_path / "a.tif")
    assert result.ok, result.reason
    reference = normalised(CORPUS / name, decoders=(result.decoder,))  # the decoder the conversion used
    assert psnr(luma(decoded_level(tmp_path / "a.tif")), luma(reference)) >= 38.0


def test_every_level_has_ceil_halving_dimensions(tmp_path):
    result = convert(CORPUS / "jpeg-gainmap-ultrahdr/ultra-hdr.jpg", tmp_path / "a.tif")
    assert result.ok
    w, h = 3840, 2160
    expected = [(w, h)]
    while w > 256 or h > 256:
        w, h = math.ceil(w / 2), math.ceil(h / 2)
        expected.append((w, h))
    with tifffile.TiffFile(tmp_path / "a.tif") as tf:
        assert [(p.imagewidth, p.imagelength) for p in tf.pages] == expected
        assert all(p.is_tiled and p.tilewidth == 256 and p.tilelength == 256 for p in tf.pages)
        assert [int(p.subfiletype) & 1 for p in tf.pages] == [0] + [1] * (len(expected) - 1)
    assert result.levels == len(expected) == 5


def test_lower_levels_are_box_shrinks_of_the_level_above(tmp_path):
    assert convert(CORPUS / "jpeg-baseline/flowers.jpeg", tmp_path / "a.tif").ok
    top = normalised(CORPUS / "jpeg-baseline/flowers.jpeg")
    expected = shrink2(shrink2(top))
    assert psnr(luma(decoded_level(tmp_path / "a.tif", 2)), luma(expected)) >= 38.0


def test_odd_sizes_and_orientation(tmp_path):
    """Landscape_6 is 600x450 stored as 450x600 with orientation 6: the access master is upright."""
    result = convert(CORPUS / "exif-orientation/Landscape_6.jpg", tmp_path / "a.tif")
    assert (result.width, result.height) == (600, 450)
    assert [(lv.width, lv.height) for lv in levels_for(600, 450, 256)] == [(600, 450), (300, 225), (150, 113)]


def test_chroma_444_recipe_keeps_full_chroma(tmp_path):
    """Fine red/blue stripes: 4:2:0 smears their chroma, 4:4:4 keeps it."""
    import pyvips
    from gcis_etl.recipes import load_recipe
    stripes = (pyvips.Image.xyz(512, 512)[0] % 4 < 2).ifthenelse([220, 30, 30], [30, 30, 220])
    src = tmp_path / "stripes.png"
    stripes.cast("uchar").copy(interpretation="srgb").pngsave(str(src))
    a = convert(src, tmp_path / "420.tif")
    b = convert(src, tmp_path / "444.tif", recipe=load_recipe("ptiff-jpeg-q90-444"))
    with tifffile.TiffFile(tmp_path / "444.tif") as tf:
        assert tuple(tf.pages[0].tags[530].value) == (1, 1)
    with tifffile.TiffFile(tmp_path / "420.tif") as tf:
        assert tuple(tf.pages[0].tags[530].value) == (2, 2)
    reference = normalised(src).astype(np.float64)
    chroma_error = [np.abs(decoded_level(p).astype(np.float64) - reference).mean()
                    for p in (tmp_path / "420.tif", tmp_path / "444.tif")]
    assert chroma_error[1] < chroma_error[0]
    assert b.bytes > a.bytes
