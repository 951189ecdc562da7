"""Colour: the normaliser agrees with an independent LittleCMS transform (Pillow ImageCms)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageCms

from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from tests.conftest import CORPUS
from tests.imaging import decoded_level, normalised
from tests.measures import mean_delta_e

MASTERS = {
    "adobe-rgb": CORPUS / "icc-adobergb/example.tif",
    "cmyk-fogra39": CORPUS / "cmyk-tiff-icc/fogra-0-100-100-0.tif",
    "prophoto": CORPUS / "icc-prophoto/test_icc_prophoto.jpg",
}


def pillow_srgb(path) -> np.ndarray:
    """Embedded profile -> sRGB by Pillow's own LittleCMS binding, relative colorimetric."""
    with Image.open(path) as im:
        source = ImageCms.ImageCmsProfile(io.BytesIO(im.info["icc_profile"]))
        target = ImageCms.ImageCmsProfile(io.BytesIO(srgb_profile()))
        out = ImageCms.profileToProfile(im, source, target, renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC,
                                        outputMode="RGB")
        return np.asarray(out)


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_normaliser_matches_independent_littlecms(name):
    reference = pillow_srgb(MASTERS[name])
    ours = normalised(MASTERS[name])
    assert ours.shape == reference.shape
    assert mean_delta_e(ours, reference) <= 1.0


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_access_master_colour_within_jpeg_tolerance(name, tmp_path):
    result = convert(MASTERS[name], tmp_path / "a.tif")
    assert result.ok, result.reason
    assert mean_delta_e(decoded_level(tmp_path / "a.tif"), pillow_srgb(MASTERS[name])) <= 3.0


def test_conversion_is_not_a_no_op():
    """Guard against a vacuous pass: Adobe RGB pixels taken as sRGB are measurably off."""
    with Image.open(MASTERS["adobe-rgb"]) as im:
        untransformed = np.asarray(im.convert("RGB"))
    assert mean_delta_e(untransformed, pillow_srgb(MASTERS["adobe-rgb"])) > 1.0


@pytest.mark.parametrize("name", ["hopper_orientation_5.jpg", "Landscape_6.jpg"])
def test_a_turned_master_leaves_no_orientation_for_a_writer_to_copy(name, tmp_path):
    """libvips writes an image's orientation field into any TIFF saved from it (the JP2 path's reference):
    once the pixels are upright, a reader honouring that tag would turn them again."""
    import tifffile

    from gcis_etl.colour import normalise
    from gcis_etl.decoding import open_master
    from gcis_etl.inspection import inspect
    from gcis_etl.policy import ImagingPolicy
    policy = ImagingPolicy()
    info = inspect(CORPUS / "exif-orientation" / name, policy)
    decoded = open_master(info, policy.decoders[info.format], policy.strict)
    assert info.orientation in (5, 6) and decoded.image.get_typeof("orientation")
    upright = normalise(decoded.image, info, policy)
    assert not upright.get_typeof("orientation")
    upright.tiffsave(str(tmp_path / "reference.tif"), compression="none", strip=True)
    with tifffile.TiffFile(tmp_path / "reference.tif") as tif:
        orientation = tif.pages[0].tags.get("Orientation")
        assert orientation is None or orientation.value == 1  # libvips writes 1 (top-left) by default
        assert tif.pages[0].shape[:2] == (upright.height, upright.width)
