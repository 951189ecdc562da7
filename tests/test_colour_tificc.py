"""Colour of unusual profiled masters against LittleCMS's own TIFF applier (tificc, relative colorimetric, no
black-point compensation unless the policy asks), on both PTIFF engines: float samples with an embedded profile,
a 12-bit master only the tifffile decoder opens, black-point compensation on a CMYK master, and profiles that
open but from which LittleCMS builds no transform (rejected, never taken as sRGB)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from gcis_etl.decoding import open_master
from gcis_etl.errors import RejectedMaster
from gcis_etl.inspection import inspect
from gcis_etl.models import Status
from gcis_etl.policy import ImagingPolicy
from tests.conftest import CORPUS
from tests.imaging import decoded_level, normalised, patch_centres, tificc
from tests.measures import delta_e2000, srgb_to_lab
from tests.test_tifffile_path import _grey_profile, strips_of

PATCH, COLUMNS, ROWS = 16, 8, 6
ICC_TAG = 34675


def _icc_tag(profile: bytes) -> list[tuple]:
    return [(ICC_TAG, 7, len(profile), profile, True)]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    """Adobe RGB and ProPhoto as the corpus embeds them, a grey gamma-2.2 profile, and libvips' sRGB (the
    access masters' profile, tificc's output profile here)."""
    folder = tmp_path_factory.mktemp("icc")
    with tifffile.TiffFile(CORPUS / "icc-adobergb/example.tif") as tif:
        adobe = tif.pages[0].iccprofile
    with tifffile.TiffFile(CORPUS / "cmyk-tiff-icc/fogra-0-100-100-0.tif") as tif:
        fogra = tif.pages[0].iccprofile
    with Image.open(CORPUS / "icc-prophoto/test_icc_prophoto.jpg") as im:
        prophoto = im.info["icc_profile"]
    made = {}
    for name, data in (("adobe-rgb", adobe), ("prophoto", prophoto), ("grey-2.2", _grey_profile(2.2)),
                       ("fogra39", fogra), ("srgb", srgb_profile())):
        made[name] = folder / f"{name}.icc"
        made[name].write_bytes(data)
    return made


def _patches(bands: int, full: int) -> np.ndarray:
    """COLUMNS x ROWS flat patches of seeded random values in 0..full, black and white among them."""
    values = np.random.default_rng(7).integers(0, full + 1, (ROWS * COLUMNS, bands))
    values[0], values[1] = 0, full
    grid = values.reshape(ROWS, COLUMNS, bands).repeat(PATCH, 0).repeat(PATCH, 1)
    return grid[..., 0] if bands == 1 else grid


def delta_e(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    assert ours.shape == reference.shape
    return delta_e2000(srgb_to_lab(ours), srgb_to_lab(reference))


# CIEDE2000 mean and worst pixel against tificc. The tifffile engine rounds 16-bit samples to 8 bits before its
# transform (imagecms_colour.py); measured: libvips 0.01 / 0.17, tifffile 0.18 / 0.92 at most.
ENGINE_TOLERANCE = {"vips": (0.1, 0.5), "tifffile": (0.4, 1.5)}
FLOAT_MASTERS = {"rgb": (3, "rgb", "adobe-rgb"), "grey": (1, "minisblack", "grey-2.2")}


def float_master(folder: Path, kind: str, profiles: dict[str, Path]) -> tuple[Path, Path]:
    """A 32-bit float (0..1) master with an embedded profile, as HDR and scientific pipelines write them."""
    bands, photometric, profile = FLOAT_MASTERS[kind]
    samples = (_patches(bands, 65535) / 65535).astype(np.float32)
    path = folder / f"float-{kind}.tif"
    tifffile.imwrite(path, samples, photometric=photometric, metadata=None,
                     extratags=_icc_tag(profiles[profile].read_bytes()))
    return path, profiles[profile]


@pytest.mark.parametrize("engine", ["vips", "tifffile"])
@pytest.mark.parametrize("kind", sorted(FLOAT_MASTERS))
def test_a_profiled_float_master_matches_tificc(kind, engine, profiles, tmp_path):
    """libvips' icc_transform reads float on a 0..255 scale: a 0..1 master came out black on both engines."""
    master, profile = float_master(tmp_path, kind, profiles)
    reference = tificc(master, profile, profiles["srgb"])
    assert reference.std() > 50  # the reference is the patches, not a flat image
    ours = normalised(master) if engine == "vips" else strips_of(master)
    difference = delta_e(ours, reference)
    mean, worst = ENGINE_TOLERANCE[engine]
    assert difference.mean() <= mean and difference.max() <= worst, (difference.mean(), difference.max())
    if kind == "grey":  # grey stays grey, within a level or two of tificc's
        assert np.abs(ours.astype(int) - reference).max() <= (1 if engine == "vips" else 2)


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90-444", "ptiff-tifffile-q90"])
def test_a_profiled_float_master_converts_to_its_colours(recipe, profiles, tmp_path):
    master, profile = float_master(tmp_path, "rgb", profiles)
    result = convert(master, tmp_path / "access.tif", recipe)
    assert result.status is Status.CONVERTED, result.reason
    difference = delta_e(patch_centres(decoded_level(tmp_path / "access.tif"), PATCH),
                         patch_centres(tificc(master, profile, profiles["srgb"]), PATCH))
    assert difference.mean() <= 0.5 and difference.max() <= 1.5, (difference.mean(), difference.max())


@pytest.mark.parametrize("profile", ["adobe-rgb", "prophoto"])
def test_the_tifffile_decoder_keeps_the_embedded_profile(profile, profiles, tmp_path):
    """12-bit samples: libvips and Pillow cannot open them, tifffile can. The reference is tificc on the same
    values as a 16-bit master."""
    icc = profiles[profile].read_bytes()
    twelve = _patches(3, 4095).astype(np.uint16)
    master, sixteen = tmp_path / "rgb12.tif", tmp_path / "rgb16.tif"
    tifffile.imwrite(master, twelve, photometric="rgb", bitspersample=12, metadata=None, extratags=_icc_tag(icc))
    tifffile.imwrite(sixteen, np.round(twelve * (65535 / 4095)).astype(np.uint16), photometric="rgb",
                     metadata=None, extratags=_icc_tag(icc))
    policy = ImagingPolicy()
    info = inspect(master, policy)
    assert open_master(info, policy.decoders["TIFF"], policy.strict).decoder == "tifffile"
    reference = tificc(sixteen, profiles[profile], profiles["srgb"])
    for ours, (mean, worst) in ((normalised(master), ENGINE_TOLERANCE["vips"]),
                                (strips_of(master), ENGINE_TOLERANCE["tifffile"])):
        difference = delta_e(ours, reference)
        assert difference.mean() <= mean and difference.max() <= worst, (difference.mean(), difference.max())


def test_the_reference_tells_the_profile_apart(profiles, tmp_path):
    """Guard against a vacuous pass: the same 16-bit values taken as sRGB are far from tificc's Adobe RGB."""
    samples = _patches(3, 65535).astype(np.uint16)
    tifffile.imwrite(tmp_path / "adobe16.tif", samples, photometric="rgb", metadata=None,
                     extratags=_icc_tag(profiles["adobe-rgb"].read_bytes()))
    untransformed = np.round(samples / 257).astype(np.uint8)
    reference = tificc(tmp_path / "adobe16.tif", profiles["adobe-rgb"], profiles["srgb"])
    assert delta_e(untransformed, reference).mean() > 2.0


@pytest.mark.parametrize("engine", ["vips", "tifffile"])
@pytest.mark.parametrize("bpc", [False, True], ids=["bpc-off", "bpc-on"])
def test_black_point_compensation_follows_the_policy_on_a_cmyk_master(bpc, engine, profiles, tmp_path):
    """FOGRA39's 400% black is a dark grey in sRGB unless black-point compensation maps it to black."""
    master = tmp_path / "cmyk.tif"
    tifffile.imwrite(master, _patches(4, 255).astype(np.uint8), photometric="separated", metadata=None,
                     extratags=_icc_tag(profiles["fogra39"].read_bytes()))
    policy = ImagingPolicy(black_point_compensation=bpc)
    ours = normalised(master, policy) if engine == "vips" else strips_of(master, policy)
    asked, other = (tificc(master, profiles["fogra39"], profiles["srgb"], bpc=flag) for flag in (bpc, not bpc))
    difference = delta_e(ours, asked)
    assert difference.mean() <= 0.2 and difference.max() <= 1.0, (difference.mean(), difference.max())
    assert delta_e(ours, other).max() > 3  # the setting changes the shadows: the comparison can tell
    rich_black = ours[PATCH // 2, PATCH + PATCH // 2]  # the second patch: every ink at 100%
    assert (rich_black.max() <= 3) if bpc else (rich_black.min() >= 10), rich_black


@pytest.mark.parametrize("engine", ["vips", "tifffile"])
def test_a_profile_without_the_policys_intent_is_applied_as_littlecms_applies_it(engine, profiles, tmp_path):
    """The corpus' 'TIFF RGB' LUT profile holds only a perceptual table (A2B0). LittleCMS (tificc, ImageCms)
    falls back to it at relative colorimetric; libvips' icc_transform dropped the profile and passed the
    pixels through unconverted (mean CIEDE2000 5.1)."""
    with Image.open(CORPUS / "icc-wide-gamut-or-unusual/icc_profile_big.jpg") as im:
        icc = im.info["icc_profile"]
    profile = tmp_path / "lut.icc"
    profile.write_bytes(icc)
    samples = _patches(3, 255).astype(np.uint8)
    master = tmp_path / "lut.tif"
    tifffile.imwrite(master, samples, photometric="rgb", metadata=None, extratags=_icc_tag(icc))
    reference = tificc(master, profile, profiles["srgb"])
    assert delta_e(samples, reference).mean() > 2.0  # untransformed is far from the reference
    ours = normalised(master) if engine == "vips" else strips_of(master)
    difference = delta_e(ours, reference)
    assert difference.mean() <= 0.1 and difference.max() <= 0.5, (difference.mean(), difference.max())
    assert any("no relative rendering intent: converted with its perceptual one" in w
               for w in inspect(master).warnings)


# Damage to the corpus' Adobe RGB profile (tags: cprt, desc, wtpt, bkpt, r/g/bTRC, r/g/bXYZ) that leaves it
# opening: LittleCMS builds no transform from any of these (tificc: "Couldn't link the profiles").
DAMAGES = ["cut", "colorant-past-end", "curve-type"]
UNUSABLE = ("embedded ICC profile 'Adobe RGB (1998)' cannot be applied (LittleCMS builds no transform from it: "
            "damaged or incomplete): needs review")


def damaged_master(folder: Path, damage: str, profiles: dict[str, Path]) -> Path:
    """A 16-bit Adobe RGB master whose profile is cut short by 10 bytes (its last tag short), has its rXYZ tag
    pointing past its end, or its rTRC tag's type overwritten."""
    profile = bytearray(profiles["adobe-rgb"].read_bytes())
    tags = {bytes(profile[entry:entry + 4]): entry for entry in range(132, 132 + 12 * 9, 12)}
    assert set(tags) >= {b"rXYZ", b"rTRC"}, tags
    if damage == "cut":
        profile = profile[:-10]
    elif damage == "colorant-past-end":
        profile[tags[b"rXYZ"] + 4:tags[b"rXYZ"] + 8] = (10 ** 6).to_bytes(4, "big")
    else:
        offset = int.from_bytes(profile[tags[b"rTRC"] + 4:tags[b"rTRC"] + 8], "big")
        profile[offset:offset + 4] = b"zzzz"
    master = folder / f"{damage}.tif"
    tifffile.imwrite(master, _patches(3, 65535).astype(np.uint16), photometric="rgb", metadata=None,
                     extratags=_icc_tag(bytes(profile)))
    return master


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "ptiff-tifffile-q90", "jp2-openjpeg-lossless"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_profile_littlecms_cannot_apply_is_rejected_not_taken_as_srgb(damage, recipe, profiles, tmp_path):
    """Cut short or with a colorant past its end, libvips dropped the profile with a warning on stderr and passed
    the samples through as sRGB (mean CIEDE2000 1.2, worst 7.8) while the result said 'ICC->sRGB (Adobe RGB
    (1998))'; with a curve of an unknown type, icc_transform raised 'Couldn't link the profiles' out of convert,
    and inspect blamed the image data. The tifffile engine raised PyCMSError out of convert on all three."""
    master = damaged_master(tmp_path, damage, profiles)
    assert inspect(master).reasons == (UNUSABLE,)
    result = convert(master, tmp_path / ("access.jp2" if recipe.startswith("jp2") else "access.tif"), recipe)
    assert (result.status, result.reason) == (Status.REJECTED, UNUSABLE)


@pytest.mark.parametrize("engine", ["vips", "tifffile"])
@pytest.mark.parametrize("damage", DAMAGES)
def test_neither_engine_applies_a_profile_littlecms_cannot(damage, engine, profiles, tmp_path):
    """Should inspection's verdict be passed by, each engine rejects the master itself: libvips would take the
    samples as sRGB (or raise pyvips.Error), ImageCms raised PyCMSError."""
    master = damaged_master(tmp_path, damage, profiles)
    with pytest.raises(RejectedMaster) as raised:
        normalised(master) if engine == "vips" else strips_of(master)
    assert str(raised.value) == UNUSABLE
