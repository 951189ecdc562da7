"""imaging.decoders: every format has a decoder to try, trying none never reads as the master's fault, and libvips
is not given the masters it decodes wrongly."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import pyvips
import tifffile
from PIL import Image

from gcis_etl.conversion import convert
from gcis_etl.decoding import open_master
from gcis_etl.errors import ConfigError, ConversionFailed
from gcis_etl.inspection import inspect
from gcis_etl.policy import ImagingPolicy
from gcis_etl.settings import parse
from tests.imaging import decoded_level


@pytest.mark.parametrize("order", [[], ["vips", "pillow", "vips"]], ids=["none", "one twice"])
def test_a_decoder_order_lists_each_decoder_once_and_at_least_one(order):
    with pytest.raises(ConfigError, match=r"config.yaml: imaging.decoders: JPEG: list each decoder "
                                          r"at most once, and at least one of them"):
        parse(ImagingPolicy, {"decoders": {"JPEG": order}}, "config.yaml", "imaging")


def test_no_decoder_to_try_is_a_failure_not_a_rejection(tmp_path):
    path = tmp_path / "small.jpg"
    pyvips.Image.black(32, 24, bands=3).jpegsave(str(path))
    info = inspect(path, ImagingPolicy())
    with pytest.raises(ConversionFailed, match=r"no decoder to try for JPEG \(imaging.decoders\)"):
        open_master(info, (), strict=True)
    assert open_master(info, ("pillow",), strict=True).decoder == "pillow"


def test_an_sycc_jpeg2000_master_is_not_given_to_libvips(tmp_path):
    """libvips 8.14 (with OpenJPEG 2.5.0) decodes the Y, Cb, Cr samples of a JP2 whose colour box says sYCC as
    R, G, B: a strong colour cast, and verification, comparing the output with the same decode, passed it. Such
    masters go to Pillow; OpenJPEG's own decoder is the reference (Pillow's YCbCr->RGB rounds differently)."""
    y, x = np.mgrid[0:64, 0:96]
    rgb = np.dstack([x * 255 // 95, y * 255 // 63, 255 - x * 255 // 95]).astype(np.uint8)
    master = tmp_path / "sycc.jp2"
    Image.fromarray(rgb).convert("YCbCr").save(master, irreversible=False, mct=0)  # colr box: sYCC (18)
    subprocess.run(["opj_decompress", "-i", str(master), "-o", str(tmp_path / "openjpeg.tif")], check=True,
                   capture_output=True)
    reference = tifffile.imread(tmp_path / "openjpeg.tif").astype(int)
    assert np.abs(reference - rgb).max() <= 4  # the reference is right
    result = convert(master, tmp_path / "access.tif")  # in the conversion worker, as in production
    assert result.ok and result.decoder == "pillow", result.reason
    assert any("sYCC" in w for w in result.warnings)
    assert np.abs(decoded_level(tmp_path / "access.tif").astype(int) - reference).mean() <= 1.5  # JPEG Q90
