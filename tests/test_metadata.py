"""Metadata: every kept tag of the master has the same value in the access master; ColorSpace is sRGB."""
from __future__ import annotations

import shutil

import pytest
import pyvips

from gcis_etl import tiff, tifffile_ptiff
from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import EncodeJob, convert, encode_in_child
from gcis_etl.inspection import inspect
from gcis_etl.metadata import carried_tags, exiftool_json, exiftool_run, kept_tag_values
from gcis_etl.policy import ImagingPolicy
from gcis_etl.ptiff import encode_ptiff
from gcis_etl.recipes import load_recipe
from gcis_etl.verification import Expectation, verify
from tests.conftest import CORPUS

RICH = sorted((CORPUS / "metadata-rich").iterdir())
# What exiftool does not carry by design (it describes the master's own file, or is exiftool-internal);
# see README "Metadata". Everything else must arrive with the same value.
NOT_CARRIED = {"EXIF:CompressedBitsPerPixel", "EXIF:InteropIndex", "EXIF:InteropVersion",
               "EXIF:RelatedImageWidth", "EXIF:RelatedImageHeight", "XMP:About", "XMP:HasExtendedXMP",
               "IPTC:CodedCharacterSet"}
UNDEFINED_TAGS = ("EXIF:ComponentsConfiguration", "EXIF:FileSource", "EXIF:SceneType")  # TIFF type UNDEFINED


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
    assert {k: kept.get(k) for k in UNDEFINED_TAGS} == {"EXIF:ComponentsConfiguration": "1 2 3 0",
                                                        "EXIF:FileSource": 3, "EXIF:SceneType": 1}
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
    carried = carried_tags(exif_master, recipe.metadata.keep, recipe.metadata.exclude, tmp_path)
    exif = next(t for t in carried.tags if t.code == 34665).sub_ifd
    components = next(t for t in exif if t.code == 0x9101)  # ComponentsConfiguration
    assert components.values == b"\x01\x02\x03\x00"
    components.values = b"\x04\x05\x06\x00"  # YCbCr -> RGB
    image = pyvips.Image.new_from_file(str(exif_master))
    encoded = encode_ptiff(image, tmp_path / "big.tif", recipe, srgb_profile(), lambda: carried.tags)
    assert encoded.bigtiff
    report = verify(tmp_path / "big.tif", Expectation(width=image.width, height=image.height,
                                                      metadata=carried.values))
    assert report.errors == ("metadata tag EXIF:ComponentsConfiguration is '4 5 6 0', master has '1 2 3 0'",)


def test_bigtiff_master_keeps_its_undefined_exif_tags(exif_master, monkeypatch, tmp_path):
    """Copied from a BigTIFF by exiftool itself, SceneType would be dropped from the carrier: a BigTIFF master's
    metadata is copied from a classic TIFF holding its first IFD, and arrives whole."""
    recipe = load_recipe()
    carried = carried_tags(exif_master, recipe.metadata.keep, recipe.metadata.exclude, tmp_path)
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
