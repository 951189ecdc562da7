"""XMP and EXIF that describe how the master is encoded never reach the access master, which is upright 8-bit
sRGB in another format; descriptive metadata arrives untouched.

A 16-bit Adobe RGB master saved by Photoshop says so in XMP (photoshop:ICCProfileName, exif:ColorSpace
Uncalibrated, tiff:BitsPerSample 16, its dimensions, dc:format): carried as they were, they contradicted the
output's own IFD0 and ICC profile."""
from __future__ import annotations

import numpy as np
import pytest
import tifffile

from gcis_etl.conversion import convert
from gcis_etl.metadata import exiftool_json, exiftool_run, kept_tag_values
from gcis_etl.recipes import load_recipe

RECIPES = {"ptiff-jpeg-q90": ".tif", "ptiff-tifffile-q90": ".tif", "jp2-openjpeg-lossless": ".jp2"}
TRANSFER = list(range(0, 65536, 257))  # one 256-entry curve per channel
# The tester's Photoshop tags and every other tag naming the master's pixels, samples, colour or format.
ENCODING = {
    "XMP-tiff:ImageWidth": 384, "XMP-tiff:ImageHeight": 288, "XMP-tiff:BitsPerSample": [16, 16, 16],
    "XMP-tiff:Compression": 1, "XMP-tiff:PhotometricInterpretation": 2, "XMP-tiff:Orientation": 1,
    "XMP-tiff:SamplesPerPixel": 3, "XMP-tiff:PlanarConfiguration": 1, "XMP-tiff:YCbCrSubSampling": "2 2",
    "XMP-tiff:YCbCrPositioning": 1, "XMP-tiff:XResolution": 300, "XMP-tiff:YResolution": 300,
    "XMP-tiff:ResolutionUnit": 2, "XMP-tiff:TransferFunction": TRANSFER * 3,
    "XMP-tiff:WhitePoint": [0.3127, 0.329], "XMP-tiff:PrimaryChromaticities": [0.64, 0.33, 0.21, 0.71, 0.15, 0.06],
    "XMP-tiff:YCbCrCoefficients": [0.299, 0.587, 0.114], "XMP-tiff:ReferenceBlackWhite": [0, 255, 128, 255, 128, 255],
    "XMP-tiff:NativeDigest": "256,257,258;0123", "XMP-exif:ColorSpace": 65535, "XMP-exif:ExifImageWidth": 384,
    "XMP-exif:ExifImageHeight": 288, "XMP-exif:NativeDigest": "36864,40960;4567",
    "XMP-photoshop:ICCProfileName": "Adobe RGB (1998)", "XMP-photoshop:ColorMode": 3, "XMP-dc:Format": "image/tiff",
    "IFD0:TransferFunction": " ".join(map(str, TRANSFER * 3)), "IFD0:WhitePoint": "0.3127 0.329",
    "IFD0:PrimaryChromaticities": "0.64 0.33 0.21 0.71 0.15 0.06", "ExifIFD:Gamma": 2.2,
    "ExifIFD:ExifImageWidth": 384, "ExifIFD:ExifImageHeight": 288,
}
DESCRIPTIVE = {
    "XMP-dc:Title": "Irises", "XMP-dc:Rights": "© J. Paul Getty Trust", "XMP-dc:Creator": "Vincent van Gogh",
    "XMP-iptcCore:Location": "Saint-Rémy", "XMP-photoshop:Credit": "Getty Museum",
    "XMP-tiff:Artist": "Imaging Services", "XMP-tiff:Make": "Phase One",
    "XMP-exif:DateTimeOriginal": "2024:05:06 07:08:09", "IFD0:Artist": "Imaging Services", "IPTC:ObjectName": "Irises",
}


def assignments(tags: dict) -> list[str]:
    """exiftool arguments writing `tags`; a list value is written item by item (XMP lists add one per assignment)."""
    return [f"-{tag}={item}" for tag, value in tags.items() for item in (value if isinstance(value, list) else [value])]


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    """A 16-bit RGB TIFF with the encoding tags of a Photoshop master and descriptive metadata."""
    path = tmp_path_factory.mktemp("encoding") / "photoshop16.tif"
    tifffile.imwrite(path, np.random.default_rng(3).integers(0, 65536, (32, 48, 3), np.uint16), photometric="rgb",
                     metadata=None)
    exiftool_run("-q", "-n", "-overwrite_original", *assignments(ENCODING), *assignments(DESCRIPTIVE),
                 "-ExifIFD:ColorSpace=65535", str(path))
    written = exiftool_json(path, "-a", "-G1")
    assert [tag for tag in {**ENCODING, **DESCRIPTIVE} if tag not in written] == []
    return path


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_the_masters_encoding_is_not_carried(recipe_name, master, tmp_path):
    out = tmp_path / f"a{RECIPES[recipe_name]}"
    result = convert(master, out, recipe=recipe_name)
    assert result.ok, result.reason  # verification read every kept tag back from the output
    tags = exiftool_json(out, "-a", "-G1")
    assert [tag for tag in ENCODING if tag in tags] == []
    assert {tag: tags.get(tag) for tag in DESCRIPTIVE} == DESCRIPTIVE
    assert tags["ExifIFD:ColorSpace"] == 1  # sRGB


def test_verification_expects_none_of_them(master):
    """What verification compares (the kept values) has the descriptive tags and none of the encoding ones, so
    a master's encoding tags are neither expected in the output nor a reason to fail it."""
    recipe = load_recipe()
    kept = kept_tag_values(master, recipe.metadata.keep, recipe.metadata.exclude)
    assert {"XMP:XMP-dc:Title", "XMP:XMP-dc:Rights", "XMP:XMP-dc:Creator", "XMP:XMP-iptcCore:Location",
            "IPTC:ObjectName"} <= set(kept)  # family 0 and 1 alike: named once
    as_kept = {("XMP:" if tag.startswith("XMP") else "EXIF:") + tag for tag in ENCODING}  # family 0:1 names
    assert [k for k in kept if k in as_kept] == []
