"""Metadata: every kept tag of the master has the same value in the access master; ColorSpace is sRGB."""
from __future__ import annotations

import pytest

from gcis_etl.conversion import convert
from gcis_etl.metadata import exiftool_json, kept_tag_values
from gcis_etl.recipes import load_recipe
from tests.conftest import CORPUS

RICH = sorted((CORPUS / "metadata-rich").iterdir())
# What exiftool does not carry by design (it describes the master's own file, or is exiftool-internal);
# see README "Metadata". Everything else must arrive with the same value.
NOT_CARRIED = {"EXIF:CompressedBitsPerPixel", "EXIF:InteropIndex", "EXIF:InteropVersion",
               "EXIF:RelatedImageWidth", "EXIF:RelatedImageHeight", "XMP:About", "XMP:HasExtendedXMP",
               "IPTC:CodedCharacterSet"}


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
