"""The master's resolution arrives in the access master from whichever container states it (TIFF/EXIF, JFIF,
PNG pHYs, JP2 capture resolution), turned with the pixels, whatever the recipe keeps; none is ever made up.

The carrier was a tifffile TIFF whose 1/1-per-no-unit placeholder stood in for every resolution exiftool did
not copy: JFIF and pHYs (not EXIF), and any with a keep list without EXIF."""
from __future__ import annotations

import numpy as np
import pytest
import pyvips
import tifffile
from PIL import Image

from gcis_etl.conversion import convert
from gcis_etl.metadata import exiftool_json, exiftool_run
from tests.conftest import CORPUS
from tests.test_metadata import recipe_keeping

DC_ONLY = ("XMP-dc:all", "IPTC:all")  # as a recipe keeping only descriptive metadata
RECIPES = {"ptiff": ("ptiff-jpeg-q90", ".tif"), "tifffile": ("ptiff-tifffile-q90", ".tif"),
           "jp2": ("jp2-openjpeg-lossless", ".jp2")}
RESOLUTION = ("EXIF:XResolution", "EXIF:YResolution", "EXIF:ResolutionUnit")
INCH, CM = 2, 3  # TIFF ResolutionUnit


def pixels(width: int = 48, height: int = 32) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (height, width, 3), np.uint8)


def jfif_master(path):
    Image.fromarray(pixels()).save(path, "JPEG", dpi=(300, 300))  # Pillow writes the JFIF density, no EXIF
    return path


def png_master(path, dpi=(300, 300)):
    Image.fromarray(pixels()).save(path, "PNG", **({"dpi": dpi} if dpi else {}))  # pHYs in pixels per metre
    return path


def resolution_of(path) -> tuple:
    tags = exiftool_json(path, *(f"-{t}" for t in ("IFD0:XResolution", "IFD0:YResolution", "IFD0:ResolutionUnit")))
    return tuple(tags.get(t) for t in RESOLUTION)


def converted(master, tmp_path, engine: str = "ptiff", keep: tuple[str, ...] | None = None):
    name, suffix = RECIPES[engine]
    out = tmp_path / f"{master.stem}-{engine}{suffix}"
    result = convert(master, out, recipe=recipe_keeping(*keep, name=name) if keep else name)
    assert result.ok, result.reason
    return out


@pytest.mark.parametrize("engine", RECIPES)
def test_jfif_dpi_arrives(engine, tmp_path):
    master = jfif_master(tmp_path / "jfif.jpg")
    tags = exiftool_json(master)
    assert (tags["JFIF:XResolution"], tags["JFIF:ResolutionUnit"]) == (300, 1) and "EXIF:XResolution" not in tags
    out = converted(master, tmp_path, engine)
    assert resolution_of(out) == (300, 300, INCH)
    if engine != "jp2":
        assert pyvips.Image.new_from_file(str(out)).xres * 25.4 == pytest.approx(300)


@pytest.mark.parametrize("engine", RECIPES)
def test_png_phys_arrives_per_centimetre(engine, tmp_path):
    master = png_master(tmp_path / "phys.png")
    assert exiftool_json(master)["PNG:PixelsPerUnitX"] == 11811  # 300 dpi, per metre
    x, y, unit = resolution_of(converted(master, tmp_path, engine))
    assert (x, y, unit) == (pytest.approx(118.11), pytest.approx(118.11), CM)


def test_jp2_capture_resolution_arrives(tmp_path):
    master = CORPUS / "jpeg2000/jp2-6res-rgb-64x56x8-multitiled-lossy.jp2"  # a resc box: 72 dpi, per cm
    x, y, unit = resolution_of(converted(master, tmp_path))
    assert (x, y, unit) == (pytest.approx(72 / 2.54, rel=1e-6), pytest.approx(72 / 2.54, rel=1e-6), CM)


@pytest.mark.parametrize("engine", RECIPES)
def test_resolution_arrives_when_the_recipe_keeps_no_exif(engine, tmp_path):
    tiff = tmp_path / "tiff400.tif"
    tifffile.imwrite(tiff, pixels(), photometric="rgb", resolution=(400, 400), resolutionunit="INCH", metadata=None)
    assert resolution_of(converted(tiff, tmp_path, engine, keep=DC_ONLY)) == (400, 400, INCH)
    jfif = jfif_master(tmp_path / "jfif.jpg")
    assert resolution_of(converted(jfif, tmp_path, engine, keep=DC_ONLY)) == (300, 300, INCH)


@pytest.mark.parametrize("engine", RECIPES)
def test_no_resolution_is_made_up(engine, tmp_path):
    master = png_master(tmp_path / "none.png", dpi=None)
    assert not any(k.startswith("PNG:PixelsPerUnit") for k in exiftool_json(master))
    assert resolution_of(converted(master, tmp_path, engine)) == (None, None, None)


@pytest.mark.parametrize("orientation, expected", [(6, (32, 96)), (8, (32, 96)), (5, (32, 96)),
                                                   (3, (96, 32)), (2, (96, 32))])
def test_resolution_turns_with_the_pixels(orientation, expected, tmp_path):
    """A 48x32 master stored on its side, 300 dpi across and 600 down as stored: upright, 600 across, so its
    height is stretched to square pixels (tests/test_square_pixels.py), not its width; 600 dpi both ways."""
    master = tmp_path / f"orientation{orientation}.tif"
    tifffile.imwrite(master, pixels(), photometric="rgb", resolution=(300, 600), resolutionunit="INCH",
                     metadata=None, extratags=[(274, 3, 1, orientation, True)])
    exiftool_run("-q", "-overwrite_original", "-ExifIFD:ExifImageWidth=48", "-ExifIFD:ExifImageHeight=32",
                 "-XMP-exif:ExifImageWidth=48", "-XMP-exif:ExifImageHeight=32", str(master))
    out = converted(master, tmp_path)
    image = pyvips.Image.new_from_file(str(out))
    assert (image.width, image.height) == expected
    assert resolution_of(out) == (600, 600, INCH)
    tags = exiftool_json(out)
    assert not [k for k in tags if k.endswith(("ExifImageWidth", "ExifImageHeight"))]  # the master's, not these
