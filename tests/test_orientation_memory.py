"""Masters turned a quarter (EXIF orientations 5-8): converted in bounded memory, with the pixels and the
decoded image's header of the master read upright."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import pyvips

from gcis_etl.colour import normalise
from gcis_etl.conversion import DecodeJob, _run_with_fallbacks, convert
from gcis_etl.decoding import open_master
from gcis_etl.inspection import inspect
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.policy import ImagingPolicy
from tests.conftest import CORPUS
from tests.imaging import as_array


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "ptiff-tifffile-q90"])
def test_a_turned_strip_master_converts_in_about_the_memory_of_an_upright_one(recipe, tmp_path):
    """Turned a quarter, an output band is a band of the master's columns: a strip-based master read at random
    was decoded whole into a libvips temp file mapped into memory, and the conversion grew by its uncompressed
    size (120 Mpx 16-bit: 829 MB, 216 upright). Both engines, 36 Mpx 16-bit (216 MB): grows alike either way."""
    xyz = pyvips.Image.xyz(6000, 6000)
    rgb = (xyz[0] * 10).bandjoin([xyz[1] * 10, (xyz[0] * 7 + xyz[1] * 13) % 65535]).cast("ushort")
    uncompressed_mb = rgb.width * rgb.height * 6 / 2 ** 20
    growth = {}
    for orientation in (1, 6):
        master = tmp_path / f"o{orientation}.tif"
        image = rgb.copy(interpretation="rgb16")
        image.set_type(pyvips.GValue.gint_type, "orientation", orientation)
        image.tiffsave(str(master), compression="deflate", level=1, predictor="horizontal")
        with IsolatedProcess() as fresh:  # its peak RSS is over its life: warm it up on a small master first
            warm = convert(CORPUS / "rgb16-tiff/rgb-3c-16b.tiff", tmp_path / "warm.tif", recipe, worker=fresh)
            result = convert(master, tmp_path / f"o{orientation}-out.tif", recipe, worker=fresh)
        assert warm.ok and result.ok, (warm.reason, result.reason)
        growth[orientation] = result.peak_rss_mb - warm.peak_rss_mb
    assert growth[6] - growth[1] < 0.25 * uncompressed_mb, \
        f"grew {growth[6]:.0f} MB turned, {growth[1]:.0f} upright, on a {uncompressed_mb:.0f} MB master"


@pytest.mark.parametrize("master", [
    "rgb8-tiff-lzw/hopper_lzw.tif", "rgb16-tiff/tif-rgb-1res-64x56x16-striped-lzw.tif", "gray16/16bit.MM.deflate.tif",
    "cmyk-tiff-icc/fogra-0-100-100-0.tif", "lab-tiff/hopper.Lab.tif", "alpha/strike.tif", "alpha/rgba.png",
    "unusual-sample-format/int8_rgb.tif", "unusual-sample-format/predictor-3-rgb-f32.tif",
    "icc-adobergb/example.tif", "jpeg2000/relax.jp2", "cmyk-jpeg/pil_sample_cmyk.jpg", "bilevel-1bit/miniswhite-1c-1b.tiff",
    "tiled-tiff/tiled-rgb-u8.tif", "tiled-tiff/tiff_tiled_raw.tif"])  # tiled: turned from themselves
def test_a_turned_master_is_decoded_as_it_is_upright(master):
    """libvips decodes a master to be turned a quarter into a tiled TIFF in scratch, read back from there (a
    tiled TIFF is read at random as it is): the image the colour stage gets has the master's samples, bands,
    colour space and profile."""
    policy = ImagingPolicy()
    info = inspect(CORPUS / master, policy)
    upright = open_master(replace(info, orientation=1), ("vips",), policy.strict).image
    turned = open_master(replace(info, orientation=6), ("vips",), policy.strict).image
    header = ("interpretation", "format", "bands", "coding")
    assert [turned.get(f) for f in header] == [upright.get(f) for f in header]
    profile = [bytes(i.get("icc-profile-data")) if i.get_typeof("icc-profile-data") else None for i in (turned, upright)]
    assert profile[0] == profile[1]
    expected = np.rot90(as_array(normalise(upright, replace(info, orientation=1), policy)), -1)
    np.testing.assert_array_equal(as_array(normalise(turned, replace(info, orientation=6), policy)), expected)


def test_libvips_crashing_while_it_decodes_a_turned_master_is_retried_with_the_next_decoder():
    """The decode into the tiled intermediate is libvips reading the pixels: a crash there (libvips segfaults on
    some real files) is that decoder's, and Pillow is tried, as for a crash while encoding."""
    policy = ImagingPolicy()
    info = replace(inspect(CORPUS / "rgb8-tiff-lzw/hopper_lzw.tif", policy), orientation=6)
    with IsolatedProcess() as worker:
        decoder, notes = _run_with_fallbacks(worker, "tests.jobs.decode_crashing_in_libvips_writes",
                                             DecodeJob(info, policy, ("vips", "pillow")))
    assert decoder == "pillow" and notes == ("decoder vips crashed (SIGSEGV); retried with pillow",), notes
