"""A master whose X and Y resolutions differ (a fax's 204x98 dpi) is resampled to square pixels, the lower-resolution
axis stretched, on every engine: IIIF's pixels are square, and viewers drew the fax's portrait page as a landscape one
squashed 2x. Its resolution tags then both say the higher value, and inspection says what is done."""
from __future__ import annotations

import numpy as np
import pytest
import pyvips
import tifffile

from gcis_etl.conversion import convert
from gcis_etl.inspection import inspect
from gcis_etl.metadata import exiftool_json
from gcis_etl.models import Verdict
from gcis_etl.policy import ImagingPolicy
from gcis_etl.verification import verify, verify_jp2_alone
from tests.conftest import CORPUS

FAX = CORPUS / "bilevel-1bit/fax2d.tif"  # 1728x1082 at 204x98 dpi: a portrait Letter page
ENGINES = {"ptiff": ("ptiff-jpeg-q90", ".tif"), "tifffile": ("ptiff-tifffile-q90", ".tif"),
           "jp2": ("jp2-openjpeg-lossless", ".jp2")}
INCH = 2
FAX_NOTE = "non-square pixels 204x98 dpi: resampled to square"


def resolution_of(path) -> tuple:
    tags = exiftool_json(path, "-IFD0:XResolution", "-IFD0:YResolution", "-IFD0:ResolutionUnit")
    return tuple(tags.get(f"EXIF:{t}") for t in ("XResolution", "YResolution", "ResolutionUnit"))


def converted(master, tmp_path, engine: str):
    name, suffix = ENGINES[engine]
    out = tmp_path / f"{master.stem}-{engine}{suffix}"
    result = convert(master, out, recipe=name)
    assert result.ok, result.reason
    report = verify_jp2_alone(out) if suffix == ".jp2" else verify(out)
    assert report.ok, report.errors
    assert (report.width, report.height) == (result.width, result.height)
    return result, out


def square_master(path, resolution: tuple[float, float], orientation: int = 1):
    """White, with a black rectangle that is a square on paper: 10 x 20 pixels at 100 x 200 dpi (as stored)."""
    x, y = resolution
    stored = np.full((int(4 * y / 10), int(4 * x / 10), 3), 255, np.uint8)  # 0.4 x 0.4 inch
    stored[int(y / 10):int(2 * y / 10), int(x / 10):int(2 * x / 10)] = 0
    tifffile.imwrite(path, stored, photometric="rgb", resolution=resolution, resolutionunit="INCH", metadata=None,
                     extratags=[(274, 3, 1, orientation, True)])
    return path


def dark_box(path) -> tuple[int, int, int, int]:
    """The black rectangle's bounding box (left, top, width, height) in the access master."""
    luma = pyvips.Image.new_from_file(str(path))[1].numpy()
    rows, cols = np.nonzero(luma < 128)
    return cols.min(), rows.min(), cols.max() - cols.min() + 1, rows.max() - rows.min() + 1


def test_inspect_says_the_fax_is_resampled_to_square():
    info = inspect(FAX)
    assert info.resolution == (204, 98, INCH)
    assert info.verdict is Verdict.ACCEPT_AFTER_CONVERSION
    assert "resample to square pixels" in info.reasons
    assert FAX_NOTE in info.warnings


@pytest.mark.parametrize("engine", ENGINES)
def test_the_fax_comes_out_a_portrait_page_at_204_dpi_both_ways(engine, tmp_path):
    result, out = converted(FAX, tmp_path, engine)
    assert (result.width, result.height) == (1728, round(1082 * 204 / 98)) == (1728, 2252)
    assert resolution_of(out) == (204, 204, INCH)
    assert FAX_NOTE in result.warnings


@pytest.mark.parametrize("engine", ENGINES)
def test_a_two_to_one_master_has_its_square_kept_square(engine, tmp_path):
    """100 dpi across, 200 down: 40x80 pixels become 80x80, the 10x20 rectangle a 20x20 square."""
    result, out = converted(square_master(tmp_path / "two-to-one.tif", (100, 200)), tmp_path, engine)
    assert (result.width, result.height) == (80, 80)
    assert resolution_of(out) == (200, 200, INCH)
    left, top, width, height = dark_box(out)
    assert (left, top) == pytest.approx((20, 20), abs=1) and (width, height) == pytest.approx((20, 20), abs=2)
    assert "non-square pixels 100x200 dpi: resampled to square" in result.warnings


def test_the_axis_stretched_is_the_upright_one(tmp_path):
    """Stored 80x40 at 200 x 100 dpi and turned (orientation 6): upright 40x80 at 100 x 200, so its width is
    stretched, not its height (which would make it 40x160)."""
    master = square_master(tmp_path / "turned.tif", (200, 100), orientation=6)
    result, out = converted(master, tmp_path, "ptiff")
    assert (result.width, result.height) == (80, 80)
    assert resolution_of(out) == (200, 200, INCH)


def test_a_difference_of_rounding_is_left_alone(tmp_path):
    master = square_master(tmp_path / "rounding.tif", (300, 298))
    info = inspect(master)
    assert info.verdict is Verdict.ACCEPT and not info.warnings
    result, out = converted(master, tmp_path, "ptiff")
    assert (result.width, result.height) == (120, 119)
    assert resolution_of(out) == (300, 298, INCH)


def test_the_pixel_limit_counts_the_square_pixels(tmp_path):
    """40x80 is 0.0032 Mpx; squared, 80x80 is 0.0064: over a 0.005 Mpx limit, refused before decoding."""
    info = inspect(square_master(tmp_path / "big.tif", (100, 200)), ImagingPolicy(max_megapixels=0.005))
    assert info.verdict is Verdict.REJECT
    assert "40x80 (with square pixels 80x80) = 0.0064 Mpx is over the 0.005 Mpx limit" in info.reasons[0]
    # stored on its side, the squared size is given in the stored frame too (it read 160x80)
    turned = inspect(square_master(tmp_path / "turned.tif", (100, 200), orientation=6),
                     ImagingPolicy(max_megapixels=0.005))
    assert "40x80 (with square pixels 80x80) = 0.0064 Mpx is over the 0.005 Mpx limit" in turned.reasons[0]
