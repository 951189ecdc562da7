"""Metadata: every kept tag of the master has the same value in the access master; ColorSpace is sRGB."""
from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
import pyvips
import tifffile

from gcis_etl import tiff, tifffile_ptiff
from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import EncodeJob, convert, encode_in_child
from gcis_etl.inspection import inspect
from gcis_etl.metadata import carried_tags, exiftool_json, exiftool_run, kept_tag_values
from gcis_etl.policy import ImagingPolicy
from gcis_etl.ptiff import encode_ptiff
from gcis_etl.recipes import DEFAULT_RECIPE, load_recipe
from gcis_etl.verification import Expectation, verify
from tests.conftest import CORPUS

RICH = sorted((CORPUS / "metadata-rich").iterdir())
# What exiftool does not carry by design (it describes the master's own file, or is exiftool-internal);
# see README "Metadata". Everything else must arrive with the same value.
# Named as verification reads them, by family 0 and 1 groups.
NOT_CARRIED = {"EXIF:ExifIFD:CompressedBitsPerPixel", "EXIF:InteropIFD:InteropIndex", "EXIF:InteropIFD:InteropVersion",
               "EXIF:InteropIFD:RelatedImageWidth", "EXIF:InteropIFD:RelatedImageHeight",
               "XMP:XMP-xmpNote:HasExtendedXMP"}
UNDEFINED_TAGS = ("EXIF:ExifIFD:ComponentsConfiguration", "EXIF:ExifIFD:FileSource",  # TIFF type UNDEFINED
                  "EXIF:ExifIFD:SceneType")


def same(master_value, output_value) -> bool:
    if isinstance(master_value, float) or isinstance(output_value, float):
        try:  # rationals are re-approximated when written: equal to 7 significant digits
            return abs(float(master_value) - float(output_value)) <= 1e-7 * max(1.0, abs(float(master_value)))
        except (TypeError, ValueError):
            return False
    if isinstance(master_value, str) and isinstance(output_value, str) and output_value.endswith("+00:00"):
        return output_value in (master_value + "+00:00",)  # IPTC times gain their (UTC) zone
    return master_value == output_value


@pytest.mark.parametrize("master", RICH, ids=[p.name for p in RICH])
def test_kept_tags_have_the_masters_values(master, tmp_path):
    recipe = load_recipe()
    result = convert(master, tmp_path / "a.tif", recipe=recipe)
    assert result.ok, result.reason
    before = kept_tag_values(master, recipe.metadata.keep, recipe.metadata.exclude)
    after = kept_tag_values(tmp_path / "a.tif", recipe.metadata.keep, recipe.metadata.exclude)
    assert len(before) >= 7
    wrong = {k: (v, after.get(k)) for k, v in before.items() if k not in NOT_CARRIED and not same(v, after.get(k))}
    assert wrong == {}
    tags = exiftool_json(tmp_path / "a.tif")
    assert tags["EXIF:ColorSpace"] == 1  # sRGB
    assert tags["ICC_Profile:ProfileDescription"] == "sRGB"
    assert "EXIF:ThumbnailImage" not in tags and "MakerNotes:MakerNoteVersion" not in str(tags)


def test_named_tags_survive(tmp_path):
    result = convert(CORPUS / "metadata-rich/ExifTool.jpg", tmp_path / "a.tif")
    tags = exiftool_json(tmp_path / "a.tif")
    assert result.ok
    assert tags["EXIF:Artist"] == "Phil Harvey"
    assert tags["EXIF:Copyright"] == "Copyright 2004 Phil Harvey"
    assert tags["XMP:Title"] == "Test IPTC picture"
    assert "IPTC:Keywords" in tags


def test_orientation_is_reset_after_it_was_applied(tmp_path):
    assert convert(CORPUS / "exif-orientation/Landscape_6.jpg", tmp_path / "a.tif").ok
    assert exiftool_json(tmp_path / "a.tif").get("EXIF:Orientation") in (None, 1)


def test_the_thumbnails_orientation_does_not_turn_the_main_image(tmp_path):
    """IFD1 (the EXIF thumbnail) says 6, IFD0 says nothing: viewers and libvips show the image as stored.
    exiftool's family-0 EXIF:Orientation falls back to IFD1's, which turned the master 40x60."""
    master, thumb = tmp_path / "m.jpg", tmp_path / "thumb.jpg"
    pyvips.Image.black(60, 40, bands=3).jpegsave(str(master))
    pyvips.Image.black(6, 4, bands=3).jpegsave(str(thumb))
    exiftool_run("-q", "-overwrite_original", "-EXIF:Make=Canon", f"-ThumbnailImage<={thumb}", str(master))
    exiftool_run("-q", "-overwrite_original", "-IFD0:Orientation=", "-IFD1:Orientation#=6", str(master))
    assert exiftool_json(master, "-Orientation")["EXIF:Orientation"] == 6  # the fallback the bug followed
    info = inspect(master)
    assert info.orientation == 1 and not any("orientation" in r for r in info.reasons)
    result = convert(master, tmp_path / "a.tif")
    assert result.ok and (result.width, result.height) == (60, 40)
    upright = tmp_path / "upright.jpg"  # IFD0's orientation is still applied
    shutil.copy(master, upright)
    exiftool_run("-q", "-overwrite_original", "-IFD0:Orientation#=6", str(upright))
    assert inspect(upright).orientation == 6


# --- BigTIFF ---------------------------------------------------------------------------------------
# exiftool's BigTIFF reader ignores the formats its EXIF tables give UNDEFINED tags: the bytes of
# ComponentsConfiguration, FileSource and SceneType read as '\x01\x02\x03', '\x03', '\x01' there, as
# '1 2 3 0', 3, 1 in a classic TIFF. Verification reads a BigTIFF's metadata as from a classic TIFF.
# Both engines are made to write BigTIFF from 64 KiB: the main writer's threshold also applies to the
# classic copy of the metadata that verification makes (< 10 KB here), the output is ~0.5 MB.
BIGTIFF_FROM = 64 * 1024


@pytest.fixture(scope="module")
def exif_master(tmp_path_factory):
    """A 1920x1080 photograph carrying ExifTool.jpg's EXIF (the corpus JPEGs with these tags are tiny)."""
    master = tmp_path_factory.mktemp("exif") / "flowers-exif.jpg"
    shutil.copy(CORPUS / "jpeg-baseline/flowers.jpeg", master)
    exiftool_run("-q", "-overwrite_original", "-all=", "-TagsFromFile", str(CORPUS / "metadata-rich/ExifTool.jpg"),
                 "-EXIF:all", "-ComponentsConfiguration", "--Orientation", str(master))  # not in EXIF:all for a JPEG
    return master


@pytest.mark.parametrize("recipe_name", ["ptiff-jpeg-q90", "ptiff-tifffile-q90"])
def test_bigtiff_output_passes_verification_with_undefined_exif_tags(recipe_name, exif_master, monkeypatch,
                                                                     tmp_path):
    """The whole conversion stage (carrier, encoder, verification against the carried values) in this process,
    so that the engines' BigTIFF thresholds can be lowered."""
    monkeypatch.setattr(tiff, "CLASSIC_LIMIT", BIGTIFF_FROM)
    monkeypatch.setattr(tifffile_ptiff, "BIGTIFF_FROM", BIGTIFF_FROM)
    policy, recipe = ImagingPolicy(), load_recipe(recipe_name)
    kept = kept_tag_values(exif_master, recipe.metadata.keep, recipe.metadata.exclude)
    assert [kept.get(k) for k in UNDEFINED_TAGS] == ["1 2 3 0", 3, 1]
    out = tmp_path / "big.tif"
    job = EncodeJob(inspect(exif_master, policy), policy, ("vips",), output=str(out), recipe=recipe)
    outcome = encode_in_child(job)  # raises VerificationFailed when a kept tag differs
    assert "BigTIFF (over 4 GB)" in outcome.notes and out.read_bytes()[:4] == b"II+\x00"
    after = kept_tag_values(out, recipe.metadata.keep, recipe.metadata.exclude)
    wrong = {k: (v, after.get(k)) for k, v in kept.items() if k not in NOT_CARRIED and not same(v, after.get(k))}
    assert wrong == {}


def test_bigtiff_with_a_changed_undefined_tag_fails_verification(exif_master, monkeypatch, tmp_path):
    """Reading a BigTIFF as a classic TIFF compares values; it does not loosen the comparison."""
    monkeypatch.setattr(tiff, "CLASSIC_LIMIT", BIGTIFF_FROM)
    recipe = load_recipe()
    carried = carried_tags(inspect(exif_master), recipe.metadata.keep, recipe.metadata.exclude, tmp_path)
    exif = next(t for t in carried.tags if t.code == 34665).sub_ifd
    components = next(t for t in exif if t.code == 0x9101)  # ComponentsConfiguration
    assert components.values == b"\x01\x02\x03\x00"
    components.values = b"\x04\x05\x06\x00"  # YCbCr -> RGB
    image = pyvips.Image.new_from_file(str(exif_master))
    encoded = encode_ptiff(image, tmp_path / "big.tif", recipe, srgb_profile(), lambda: carried.tags)
    assert encoded.bigtiff
    report = verify(tmp_path / "big.tif", Expectation(width=image.width, height=image.height,
                                                      metadata=carried.values))
    assert report.errors == ("metadata tag EXIF:ExifIFD:ComponentsConfiguration is '4 5 6 0', master has '1 2 3 0'",)


def test_bigtiff_master_keeps_its_undefined_exif_tags(exif_master, monkeypatch, tmp_path):
    """Copied from a BigTIFF by exiftool itself, SceneType would be dropped from the carrier: a BigTIFF master's
    metadata is copied from a classic TIFF holding its first IFD, and arrives whole."""
    recipe = load_recipe()
    carried = carried_tags(inspect(exif_master), recipe.metadata.keep, recipe.metadata.exclude, tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(tiff, "CLASSIC_LIMIT", BIGTIFF_FROM)
        image = pyvips.Image.new_from_file(str(exif_master))
        assert encode_ptiff(image, tmp_path / "master.tif", recipe, srgb_profile(), lambda: carried.tags).bigtiff
    policy = ImagingPolicy()
    job = EncodeJob(inspect(tmp_path / "master.tif", policy), policy, ("vips",), output=str(tmp_path / "a.tif"),
                    recipe=recipe)
    assert "BigTIFF (over 4 GB)" not in encode_in_child(job).notes
    after = kept_tag_values(tmp_path / "a.tif", recipe.metadata.keep, recipe.metadata.exclude)
    assert {k: after.get(k) for k in UNDEFINED_TAGS} == {k: carried.values[k] for k in UNDEFINED_TAGS}
    assert after == carried.values


# --- IPTC charsets ---------------------------------------------------------------------------------
# IPTC text is bytes in the charset CodedCharacterSet (1:90) declares, Latin when it declares none (as exiftool
# reads it). The masters are made here from raw datasets, so that the expected bytes are not exiftool's.
IPTC_RECIPES = ("ptiff-jpeg-q90", "ptiff-tifffile-q90", "jp2-openjpeg-lossless")
UTF8 = b"\x1b%G"
HIGH_BYTES = bytes(range(0x80, 0x100))


def dataset(record: int, number: int, data: bytes) -> bytes:
    return b"\x1c" + bytes((record, number)) + struct.pack(">H", len(data)) + data


def iptc_master(path, charset: bytes | None, name: bytes, byline: bytes, caption: bytes):
    """A 64x64 TIFF whose IPTC-NAA tag holds these datasets; returns the datasets the output must hold as they are."""
    text = [dataset(2, 5, name), dataset(2, 80, byline), dataset(2, 120, caption)]
    declared = [dataset(1, 90, charset)] if charset else []
    block = b"".join(declared + [dataset(2, 0, b"\x00\x04")] + text)
    tifffile.imwrite(path, np.full((64, 64, 3), 128, np.uint8), photometric="rgb", metadata=None,
                     extratags=[(33723, 7, len(block), block, True)])
    return declared + text


IPTC_MASTERS = {  # name: (CodedCharacterSet, ObjectName, By-line, Caption-Abstract)
    "utf8": (UTF8, "Café 東京".encode(), "Ζωή".encode(), "Москва ✓".encode()),
    "latin-undeclared": (None, "Café München".encode("latin-1"), HIGH_BYTES[:64], HIGH_BYTES[64:]),
    "utf8-undeclared": (None, "Café 東京".encode(), "Ζωή".encode(), "Москва ✓".encode()),
    "iso-8859-1-declared": (b"\x1b-A", "Café".encode("latin-1"), HIGH_BYTES[:64], HIGH_BYTES[64:]),
    "unsupported-declared": (b"\x1b%/I", "Café 東京".encode("utf-16-be"), HIGH_BYTES[:64], "Ζωή".encode()),
}


def recipe_keeping(*keep: str, name: str = DEFAULT_RECIPE):
    recipe = load_recipe(name)
    return recipe.model_copy(update={"metadata": recipe.metadata.model_copy(update={"keep": keep})})


@pytest.mark.parametrize("recipe_name", IPTC_RECIPES)
@pytest.mark.parametrize("kind", IPTC_MASTERS)
def test_iptc_text_arrives_byte_for_byte_in_its_declared_charset(kind, recipe_name, tmp_path):
    """exiftool does not copy CodedCharacterSet with IPTC:all ('unsafe'): UTF-8 text was written as Latin,
    'Café 東京' as 'Café ??', and verification, reading the damaged carrier, passed it. Every byte 0x80-0xFF of
    an undeclared (Latin) master, UTF-8 that a master does not declare, and charsets exiftool does not decode
    must arrive unchanged too."""
    master = tmp_path / f"{kind}.tif"
    datasets = iptc_master(master, *IPTC_MASTERS[kind])
    out = tmp_path / ("a.jp2" if recipe_name.startswith("jp2") else "a.tif")
    result = convert(master, out, recipe=recipe_name)
    assert result.ok, result.reason
    written = out.read_bytes()  # IPTC is stored as it is: in the IPTC-NAA tag, or a JP2 uuid box
    assert [d for d in datasets if d not in written] == []
    tags = exiftool_json(out)
    if IPTC_MASTERS[kind][0] is None:
        assert "IPTC:CodedCharacterSet" not in tags
    if kind == "utf8":
        assert (tags["IPTC:ObjectName"], tags["IPTC:By-line"], tags["IPTC:Caption-Abstract"]) == (
            "Café 東京", "Ζωή", "Москва ✓")


def test_a_recipe_without_iptc_gets_no_iptc_record_for_the_charset(tmp_path):
    """The charset travels with IPTC text, not on its own."""
    master = tmp_path / "utf8.tif"
    iptc_master(master, *IPTC_MASTERS["utf8"])
    assert convert(master, tmp_path / "a.tif", recipe=recipe_keeping("EXIF:all", "1XMP-dc:all")).ok
    assert not any(key.startswith("IPTC:") for key in exiftool_json(tmp_path / "a.tif"))


def test_an_iptc_tag_kept_by_its_bare_name_keeps_its_charset(tmp_path):
    master = tmp_path / "utf8.tif"
    charset, name = iptc_master(master, *IPTC_MASTERS["utf8"])[:2]
    assert convert(master, tmp_path / "a.tif", recipe=recipe_keeping("EXIF:all", "ObjectName")).ok
    written = (tmp_path / "a.tif").read_bytes()
    assert charset in written and name in written
    assert exiftool_json(tmp_path / "a.tif")["IPTC:ObjectName"] == "Café 東京"


STORAGE_DESCRIPTIONS = {"imagej": dict(imagej=True), "tifffile-shaped": dict(photometric="rgb"),
                        "ome": dict(ome=True, photometric="rgb")}


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "ptiff-tifffile-q90", "jp2-openjpeg-lossless"])
@pytest.mark.parametrize("kind", sorted(STORAGE_DESCRIPTIONS))
def test_a_storage_description_is_not_carried(kind, recipe, tmp_path):
    """ImageJ's, tifffile's and OME's ImageDescription say how the master's file holds its pixels: carried into
    the access master's IFD0, tifffile read its pyramid by them and raised 'incompatible keyframe'."""
    master = tmp_path / f"{kind}.tif"
    tifffile.imwrite(master, np.full((40, 64, 3), 90, np.uint8), **STORAGE_DESCRIPTIONS[kind])
    assert exiftool_json(master, "-IFD0:ImageDescription")["EXIF:ImageDescription"]
    out = tmp_path / ("a.jp2" if recipe.startswith("jp2") else "a.tif")
    result = convert(master, out, recipe=recipe)
    assert result.ok, result.reason
    assert "EXIF:ImageDescription" not in exiftool_json(out)
    if out.suffix == ".tif":
        assert tifffile.imread(out).shape == (40, 64, 3)


@pytest.mark.parametrize("recipe", ["ptiff-jpeg-q90", "jp2-openjpeg-lossless"])
def test_an_ordinary_description_is_carried(recipe, tmp_path):
    master = tmp_path / "caption.tif"
    tifffile.imwrite(master, np.full((40, 64, 3), 90, np.uint8), photometric="rgb", metadata=None,
                     description='{"shape" is what this caption is about} ImageJ= too')
    out = tmp_path / ("a.jp2" if recipe.startswith("jp2") else "a.tif")
    assert convert(master, out, recipe=recipe).ok
    assert exiftool_json(out)["EXIF:ImageDescription"] == '{"shape" is what this caption is about} ImageJ= too'
