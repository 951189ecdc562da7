"""Colour a master does not state with an ICC profile, and that the conversion assumes: each assumption is a
warning in the verdict and the result, so that a colour sign-off can list the masters whose colour rests on one.
CMYK without a profile goes through imaging.cmyk_fallback_profile; a PNG's gAMA and cHRM are not applied."""
from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import pyvips
import tifffile
from PIL import Image, ImageCms

from gcis_etl.conversion import convert
from gcis_etl.inspection import LIBVIPS_CMYK, inspect
from gcis_etl.metadata import exiftool_run
from gcis_etl.models import Status
from gcis_etl.policy import ImagingPolicy
from tests.conftest import CORPUS

BUILT_IN_CMYK = ("no embedded ICC profile: CMYK converted through libvips' built-in 'Chemical proof' "
                 "(imaging.cmyk_fallback_profile)")


def cmyk_master(folder: Path) -> Path:
    master = folder / "cmyk.tif"
    inks = np.random.default_rng(3).integers(0, 256, (48, 64, 4)).astype(np.uint8)
    tifffile.imwrite(master, inks, photometric="separated", metadata=None)
    return master


def test_the_built_in_cmyk_profile_is_the_one_the_warning_names():
    """Inspection does not load libvips (nothing there touches it): the description is written down, and must
    stay libvips' own."""
    built_in = ImageCms.ImageCmsProfile(io.BytesIO(pyvips.Operation.call("profile_load", "cmyk")))
    assert ImageCms.getProfileDescription(built_in).strip() == LIBVIPS_CMYK


def test_cmyk_without_a_profile_names_the_fallback_it_is_converted_through(tmp_path):
    """It went through libvips' 'Chemical proof' (a bluish rich black: mean CIEDE2000 4.3 from Coated FOGRA39)
    with only 'CMYK->sRGB' to show for it."""
    master = cmyk_master(tmp_path)
    assert BUILT_IN_CMYK in inspect(master).warnings
    result = convert(master, tmp_path / "access.tif", "ptiff-jpeg-q90")
    assert result.status is Status.CONVERTED and BUILT_IN_CMYK in result.warnings, (result.status, result.reason)


def test_a_configured_cmyk_fallback_is_named_by_its_description(tmp_path):
    with tifffile.TiffFile(CORPUS / "cmyk-tiff-icc/fogra-0-100-100-0.tif") as tif:
        (tmp_path / "fogra39.icc").write_bytes(tif.pages[0].iccprofile)
    policy = ImagingPolicy(cmyk_fallback_profile=str(tmp_path / "fogra39.icc"))
    assert ("no embedded ICC profile: CMYK converted through 'Coated FOGRA39 (ISO 12647-2:2004)' "
            "(imaging.cmyk_fallback_profile)") in inspect(cmyk_master(tmp_path), policy).warnings


def test_cmyk_with_its_own_profile_has_no_fallback_warning():
    info = inspect(CORPUS / "cmyk-tiff-icc/fogra-0-100-100-0.tif")
    assert not any("cmyk_fallback_profile" in w for w in info.warnings), info.warnings


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


SRGB_GAMA = struct.pack(">I", 45455)
SRGB_CHRM = struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)
ADOBE_CHRM = struct.pack(">8I", 31270, 32900, 64000, 33000, 21000, 71000, 15000, 6000)
PNG_CHUNKS = {
    "linear": ([(b"gAMA", struct.pack(">I", 100000)), (b"cHRM", SRGB_CHRM)],
               "PNG gAMA 1 (sRGB's is 0.45455) with no iCCP or sRGB chunk: not applied, the samples taken as sRGB"),
    "adobe-primaries": ([(b"gAMA", SRGB_GAMA), (b"cHRM", ADOBE_CHRM)],
                        "PNG cHRM chromaticities other than sRGB's with no iCCP or sRGB chunk: not applied, the "
                        "samples taken as sRGB"),
    "srgb-values": ([(b"gAMA", SRGB_GAMA), (b"cHRM", SRGB_CHRM)], None),
    "srgb-chunk": ([(b"sRGB", b"\0"), (b"gAMA", SRGB_GAMA), (b"cHRM", ADOBE_CHRM)], None),
}


@pytest.mark.parametrize("kind", sorted(PNG_CHUNKS))
def test_png_gamma_and_chromaticities_other_than_srgbs_are_a_warning(kind, tmp_path):
    """A PNG of linear samples (gAMA 1.0) or Adobe RGB primaries (cHRM), with no iCCP: its samples are taken as
    sRGB (mean CIEDE2000 12.3 for the linear one), and it was accepted with no word of it."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (32, 32, 3)).astype(np.uint8)).save(buffer, "PNG")
    plain = buffer.getvalue()
    chunks, expected = PNG_CHUNKS[kind]
    master = tmp_path / f"{kind}.png"
    master.write_bytes(plain[:33] + b"".join(_chunk(*c) for c in chunks) + plain[33:])  # after the IHDR
    info = inspect(master)
    assert info.verdict.value == "accept"
    assert info.warnings == ((expected,) if expected else ()), info.warnings


EXIF_COLOUR = {
    "adobe-rgb-dcf": (("-EXIF:ColorSpace#=65535", "-InteropIndex=R03"), False,
                      "no embedded ICC profile; EXIF says Adobe RGB (ColorSpace Uncalibrated, InteropIndex R03): "
                      "converted as sRGB"),
    "adobe-rgb-2": (("-EXIF:ColorSpace#=2",), False,
                    "no embedded ICC profile; EXIF says Adobe RGB (ColorSpace 2): converted as sRGB"),
    "srgb": (("-EXIF:ColorSpace#=1", "-InteropIndex=R98"), False, None),
    "adobe-rgb-with-a-profile": (("-EXIF:ColorSpace#=65535", "-InteropIndex=R03"), True, None),
}


@pytest.mark.parametrize("kind", sorted(EXIF_COLOUR))
def test_an_untagged_master_whose_exif_says_adobe_rgb_is_a_warning(kind, tmp_path):
    """Cameras in their Adobe RGB mode write no ICC profile, only EXIF ColorSpace Uncalibrated and InteropIndex
    R03 (DCF): the samples are taken as sRGB (mean CIEDE2000 2.2 on a photograph), the access master's EXIF says
    sRGB, and the master was accepted with no word of it."""
    tags, profiled, expected = EXIF_COLOUR[kind]
    master = tmp_path / f"{kind}.jpg"
    icc = {"icc_profile": ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()} if profiled else {}
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(master, quality=95, **icc)
    exiftool_run("-overwrite_original", *tags, str(master))
    warnings = inspect(master).warnings
    assert warnings == ((expected,) if expected else ()), warnings
