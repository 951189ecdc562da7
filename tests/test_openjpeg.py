"""In-process decoding through iipsrv's libopenjp2 (what verification uses): the pixels opj_decompress, the
library's own command-line decoder, writes for the same resolution and area; the library's complaint when
it cannot."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import pyvips
from PIL import Image

from gcis_etl.openjpeg import DecodeError, decode_rgb, version

KODIM = Path(__file__).parent / "corpus" / "rgb8-tiff-lzw" / "kodim02-lzw.tif"  # 768x512


@pytest.fixture(scope="module")
def jp2s(tmp_path_factory):
    """kodim02 as a tiled lossy RGB JP2 and as a grey one (one component)."""
    folder = tmp_path_factory.mktemp("openjpeg")
    image = pyvips.Image.new_from_file(str(KODIM))
    made = {}
    for name, pixels in (("rgb", image), ("grey", image.colourspace("b-w"))):
        source, made[name] = folder / f"{name}.tif", folder / f"{name}.jp2"
        pixels.tiffsave(str(source), compression="none", strip=True)
        subprocess.run(["opj_compress", "-i", str(source), "-o", str(made[name]), "-t", "256,256", "-n", "5",
                        "-r", "20"], check=True, capture_output=True)
    return made


def _opj_decompress(jp2: Path, folder: Path, *args: str) -> np.ndarray:
    out = folder / "decoded.ppm"
    subprocess.run(["opj_decompress", "-quiet", "-i", str(jp2), "-o", str(out), *args], check=True,
                   capture_output=True)
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"))


def test_the_library_is_the_one_iipsrv_links():
    assert version().startswith("2.")


@pytest.mark.parametrize("reduce, area", [(0, None), (2, None), (0, (300, 100, 700, 512)), (1, (256, 0, 512, 256))])
def test_decoded_pixels_are_opj_decompress_s(jp2s, tmp_path, reduce, area):
    args = (["-r", str(reduce)] if reduce else []) + (["-d", ",".join(map(str, area))] if area else [])
    expected = _opj_decompress(jp2s["rgb"], tmp_path, *args)
    decoded = decode_rgb(jp2s["rgb"], reduce, area)
    assert decoded.dtype == np.uint8 and decoded.shape == expected.shape and (decoded == expected).all()


def test_one_component_is_repeated_as_grey_rgb(jp2s, tmp_path):
    decoded = decode_rgb(jp2s["grey"], 1)
    assert decoded.shape == (256, 384, 3)
    assert (decoded[..., 0] == decoded[..., 1]).all() and (decoded[..., 0] == decoded[..., 2]).all()
    assert (decoded == _opj_decompress(jp2s["grey"], tmp_path, "-r", "1")).all()


def test_a_truncated_file_raises_the_library_s_complaint(jp2s, tmp_path):
    truncated = tmp_path / "truncated.jp2"
    truncated.write_bytes(jp2s["rgb"].read_bytes()[:400])
    with pytest.raises(DecodeError) as caught:
        decode_rgb(truncated)
    assert "inconsistent with stream length" in str(caught.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DecodeError, match="cannot open"):
        decode_rgb(tmp_path / "absent.jp2")
