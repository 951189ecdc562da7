"""Colour: the normaliser agrees with an independent LittleCMS transform (Pillow ImageCms)."""
from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image, ImageCms

from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from gcis_etl.inspection import encodes_srgb, inspect
from gcis_etl.policy import ImagingPolicy
from tests.conftest import CORPUS
from tests.imaging import decoded_level, normalised, tificc
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


# --- masters the corpus lacks, made at test time --------------------------------------------------------

RECIPES = ("ptiff-jpeg-q90", "ptiff-tifffile-q90")
_D50 = (0.9642, 1.0, 0.8249)
_SRGB_COLORANTS = {b"rXYZ": (0.4361, 0.2225, 0.0139), b"gXYZ": (0.3851, 0.7169, 0.0971),
                   b"bXYZ": (0.1431, 0.0606, 0.7141)}  # sRGB's primaries, Bradford-adapted to D50


def icc_profile(description: str, gamma: float, space: str = "RGB") -> bytes:
    """A minimal ICC v2 monitor profile: matrix/TRC RGB with sRGB's primaries, or grey, of one gamma."""
    def xyz(values: tuple[float, float, float]) -> bytes:
        return b"XYZ " + bytes(4) + b"".join(struct.pack(">i", round(v * 65536)) for v in values)
    text = description.encode()
    curve = b"curv" + bytes(4) + struct.pack(">IH", 1, round(gamma * 256))
    tags = {b"desc": b"desc" + bytes(4) + struct.pack(">I", len(text) + 1) + text + bytes(1 + 8 + 3 + 67),
            b"wtpt": xyz(_D50), b"cprt": b"text" + bytes(4) + b"none\0"}
    if space == "RGB":
        tags.update({tag: xyz(v) for tag, v in _SRGB_COLORANTS.items()})
        tags.update({tag: curve for tag in (b"rTRC", b"gTRC", b"bTRC")})
    else:
        tags[b"kTRC"] = curve
    table, data, start = b"", b"", 128 + 4 + 12 * len(tags)
    for signature, body in tags.items():
        table += signature + struct.pack(">II", start + len(data), len(body))
        data += body + bytes(-len(body) % 4)
    header = (struct.pack(">I", start + len(data)) + b"lcms" + struct.pack(">I", 0x02100000) + b"mntr"
              + space.ljust(4).encode() + b"XYZ " + bytes(12) + b"acsp" + bytes(28) + xyz(_D50)[8:] + bytes(48))
    return header + struct.pack(">I", len(tags)) + table + data


def _converted(master, recipe: str, tmp_path) -> np.ndarray:
    result = convert(master, tmp_path / f"{recipe}.tif", recipe)
    assert result.ok, result.reason
    return decoded_level(tmp_path / f"{recipe}.tif")


def _lab_ramp() -> np.ndarray:
    """Float Lab (D50), 96x64: L* 0..100 across, a* and b* -40..40 down; the first 16 rows (a JPEG
    MCU) neutral, the first 16 columns L* = 0, the last 16 L* = 100."""
    L = np.repeat(np.clip(np.linspace(-25, 125, 96, dtype=np.float32), 0, 100)[None, :], 64, 0)
    chroma = np.linspace(-40, 40, 64, dtype=np.float32)[:, None] * np.ones((1, 96), np.float32)
    lab = np.stack([L, chroma, -chroma * 0.5], -1)
    lab[:16, :, 1:] = 0
    return lab


def _write_lab(path, lab: np.ndarray, photometric: str, bits: int) -> None:
    """Lab samples as TIFF stores them: CIELab (8) a*, b* signed; ICCLab (9) unsigned, offset by half the range."""
    full, scale = (255, 1) if bits == 8 else (65535, 256)
    L = np.round(lab[..., 0] / 100 * full)
    ab = np.round(lab[..., 1:] * scale)
    if photometric == "icclab":
        ab = ab + (full + 1) // 2
    dtype = np.uint8 if bits == 8 else np.uint16
    signed = np.int8 if bits == 8 else np.int16
    ab = ab.astype(signed).view(dtype) if photometric == "cielab" else ab.astype(dtype)
    tifffile.imwrite(path, np.concatenate([L.astype(dtype)[..., None], ab], -1), photometric=photometric)


def tificc_srgb(lab: np.ndarray, folder: Path, bits: int = 16) -> np.ndarray:
    """tificc of float Lab, through a CIELab TIFF of `bits` (_write_lab: as a master of those bits holds it)."""
    _write_lab(folder / f"reference-lab{bits}.tif", lab, "cielab", bits)
    profile = folder / "srgb.icc"
    profile.write_bytes(srgb_profile())
    return tificc(folder / f"reference-lab{bits}.tif", "*Lab", profile)[..., :3]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("photometric, bits", [("cielab", 16), ("icclab", 16), ("icclab", 8), ("cielab", 8)])
def test_lab_master_is_converted_from_its_lab_values(photometric, bits, recipe, tmp_path):
    """TIFF Lab as Photoshop writes it (16-bit CIELab with signed a*, b*) and ICCLab: the access master is
    LittleCMS's Lab (D50) -> sRGB of the same Lab values, black where L* = 0 and white where L* = 100."""
    lab = _lab_ramp()
    _write_lab(tmp_path / "lab.tif", lab, photometric, bits)
    expected = tificc_srgb(lab, tmp_path, bits)
    ours = _converted(tmp_path / "lab.tif", recipe, tmp_path)
    assert ours.shape == expected.shape
    assert mean_delta_e(ours, expected) <= 2.0
    assert ours[:8, :4].max() <= 3 and ours[:8, -4:].min() >= 248  # L* 0 -> black, L* 100 -> white


@pytest.mark.parametrize("recipe", RECIPES)
def test_float_grey_is_linear_like_float_rgb(recipe, tmp_path):
    """Float samples are linear light 0..1 (libvips' scRGB): grey and RGB alike, sRGB-encoded on output."""
    ramp = np.repeat(np.linspace(0, 1, 96, dtype=np.float32)[None, :], 64, 0)
    tifffile.imwrite(tmp_path / "grey.tif", ramp, photometric="minisblack")
    encoded = np.where(ramp <= 0.0031308, 12.92 * ramp, 1.055 * ramp ** (1 / 2.4) - 0.055) * 255
    ours = _converted(tmp_path / "grey.tif", recipe, tmp_path)
    assert np.abs(ours.astype(np.float64) - encoded[..., None]).mean() <= 1.5
    assert ours[:, 0].max() <= 2 and ours[:, -1].min() >= 253
    tifffile.imwrite(tmp_path / "rgb.tif", np.repeat(ramp[..., None], 3, 2), photometric="rgb")
    (tmp_path / "rgb").mkdir()
    rgb = _converted(tmp_path / "rgb.tif", recipe, tmp_path / "rgb")
    assert np.abs(rgb.astype(np.int16) - ours).max() <= 2


@pytest.mark.parametrize("recipe", RECIPES)
def test_float_cmyk_converts_like_its_16_bit_twin(recipe, tmp_path):
    """Float CMYK samples are ink 0..1 (tifffile, ImageMagick). Read on libvips' 0..255 float scale they were
    no ink at all: the access master came out white, and verified, as verification decodes the same way."""
    ink = np.random.default_rng(7).random((64, 96, 4), dtype=np.float32)
    tifffile.imwrite(tmp_path / "f32.tif", ink, photometric="separated")
    tifffile.imwrite(tmp_path / "u16.tif", (ink * 65535).round().astype(np.uint16), photometric="separated")
    (tmp_path / "u16").mkdir()
    ours, twin = _converted(tmp_path / "f32.tif", recipe, tmp_path), _converted(tmp_path / "u16.tif", recipe,
                                                                               tmp_path / "u16")
    assert twin.mean() < 200  # the twin is not white either: the comparison can tell
    assert np.abs(ours.astype(np.int16) - twin).max() <= 2


def _linear_srgb_master(tmp_path) -> Path:
    x, y = np.meshgrid(np.linspace(0, 1, 96), np.linspace(0, 1, 64))
    rgb = (np.stack([x, y, (x + y) / 2], -1) * 255).round().astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "linear.tif", icc_profile=icc_profile("GIMP built-in Linear sRGB", 1.0))
    return tmp_path / "linear.tif"


@pytest.mark.parametrize("recipe", RECIPES)
def test_profile_named_srgb_but_linear_is_transformed(recipe, tmp_path):
    """'GIMP built-in Linear sRGB' has sRGB's primaries and name but a linear tone curve: its samples are
    not sRGB, and inspection and conversion both say so."""
    master = _linear_srgb_master(tmp_path)
    assert "ICC->sRGB (GIMP built-in Linear sRGB)" in inspect(master).reasons
    ours = _converted(master, recipe, tmp_path)
    assert mean_delta_e(ours, pillow_srgb(master)) <= 3.0
    with Image.open(master) as im:
        assert mean_delta_e(np.asarray(im), pillow_srgb(master)) > 10.0  # passing through would be far off


@pytest.mark.parametrize("source", ["rgb8-tiff-deflate/tiff_adobe_deflate.tif", "icc-srgb/jpg-icc.jpg",
                                    "jpeg-gainmap-ultrahdr/ultra-hdr.jpg"])
def test_real_srgb_profiles_encode_srgb(source):
    """IEC 61966-2.1 (v2), the v4 appearance profile (whose black sits above v2's) and a 588-byte
    'sRGB Gamut with sRGB Transfer' all pass 8-bit samples through."""
    with Image.open(CORPUS / source) as im:
        assert encodes_srgb(im.info["icc_profile"], ImagingPolicy())


def test_what_encodes_srgb_is_decided_by_content():
    policy = ImagingPolicy()
    assert encodes_srgb(srgb_profile(), policy)  # libvips' built-in, which every access master carries
    assert not encodes_srgb(icc_profile("GIMP built-in Linear sRGB", 1.0), policy)
    assert not encodes_srgb(icc_profile("sRGB-like", 1.8), policy)
    assert not encodes_srgb(icc_profile("Display P2.2", 2.2), policy)  # the description still filters
    assert not encodes_srgb(icc_profile("sRGB grey", 2.2, "GRAY"), policy)
