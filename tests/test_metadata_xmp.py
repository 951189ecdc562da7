"""XMP kept whole travels as a packet: in-house namespaces and same-named tags of different namespaces arrive as
they were, encoding and excluded tags do not.

Copied tag by tag, exiftool dropped every namespace it has no table for (a museum's own) and moved tags into
its preferred namespace: XMP-pdf:Title beside XMP-dc:Title was merged into it. The masters are made here from a
packet written by hand, so the expected properties are not exiftool's."""
from __future__ import annotations

import numpy as np
import pytest
import pyvips
import tifffile

from gcis_etl.colour import srgb_profile
from gcis_etl.conversion import convert
from gcis_etl.inspection import inspect
from gcis_etl.metadata import carried_tags, exiftool_json, exiftool_run, kept_tag_values, keeps_all_xmp
from gcis_etl.ptiff import encode_ptiff
from gcis_etl.recipes import load_recipe
from gcis_etl.verification import Expectation, verify
from tests.test_metadata import recipe_keeping

GETTY = "http://ns.getty.edu/gcis/1.0/"
PACKET = f"""<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about=""
    xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:pdf="http://ns.adobe.com/pdf/1.3/"
    xmlns:tiff="http://ns.adobe.com/tiff/1.0/" xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/"
    xmlns:getty="{GETTY}">
   <dc:title><rdf:Alt><rdf:li xml:lang="x-default">Irises</rdf:li></rdf:Alt></dc:title>
   <pdf:Title>Irises, conservation scan</pdf:Title>
   <photoshop:Credit>Getty Museum</photoshop:Credit>
   <tiff:ImageWidth>384</tiff:ImageWidth>
   <photoshop:ICCProfile>Adobe RGB (1998)</photoshop:ICCProfile>
   <getty:ObjectNumber>89.PA.33</getty:ObjectNumber>
   <getty:Label><rdf:Alt><rdf:li xml:lang="x-default">Irises</rdf:li><rdf:li xml:lang="fr">Les Iris</rdf:li></rdf:Alt></getty:Label>
   <getty:Keywords><rdf:Bag><rdf:li>flowers</rdf:li><rdf:li>Saint-Rémy</rdf:li></rdf:Bag></getty:Keywords>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
<?xpacket end="w"?>"""
IN_HOUSE = {"XMP-getty:ObjectNumber": "89.PA.33", "XMP-getty:Label": "Irises", "XMP-getty:Label-fr": "Les Iris",
            "XMP-getty:Keywords": ["flowers", "Saint-Rémy"]}
TITLES = {"XMP-dc:Title": "Irises", "XMP-pdf:Title": "Irises, conservation scan"}
ENCODING = ("XMP-tiff:ImageWidth", "XMP-photoshop:ICCProfileName")
RECIPES = {"ptiff-jpeg-q90": ".tif", "jp2-openjpeg-lossy": ".jp2"}


@pytest.fixture(scope="module", params=["tif", "jpg"])
def master(request, tmp_path_factory):
    """A 48x32 master (TIFF or JPEG) whose XMP is PACKET; exiftool reads every property of it back."""
    folder = tmp_path_factory.mktemp("xmp")
    packet = folder / "packet.xmp"
    packet.write_text(PACKET, encoding="utf-8")
    path = folder / f"master.{request.param}"
    pixels = np.random.default_rng(5).integers(0, 256, (32, 48, 3), np.uint8)
    if request.param == "tif":
        tifffile.imwrite(path, pixels, photometric="rgb", metadata=None)
    else:
        pyvips.Image.new_from_array(pixels).copy(interpretation="srgb").jpegsave(str(path), strip=True)
    exiftool_run("-q", "-overwrite_original", "-TagsFromFile", str(packet), "-XMP", str(path))
    tags = xmp(path)
    assert {k: tags.get(k) for k in (*IN_HOUSE, *TITLES)} == {**IN_HOUSE, **TITLES}
    assert all(tag in tags for tag in ENCODING)
    return path


def xmp(path) -> dict:
    """A file's XMP properties by namespace prefix (family 1), its toolkit left out."""
    tags = exiftool_json(path, "-a", "-G1", "-XMP:all")
    return {k: v for k, v in tags.items() if k.startswith("XMP-") and k != "XMP-x:XMPToolkit"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_in_house_namespaces_and_both_titles_arrive(recipe, master, tmp_path):
    out = tmp_path / f"a{RECIPES[recipe]}"
    result = convert(master, out, recipe=recipe)
    assert result.ok, result.reason  # verification read the kept tags back from the output
    tags = xmp(out)
    assert {k: tags.get(k) for k in (*IN_HOUSE, *TITLES)} == {**IN_HOUSE, **TITLES}
    assert GETTY in exiftool_json(out, "-b", "-XMP")["XMP:XMP"]  # under its own namespace URI
    assert [tag for tag in ENCODING if tag in tags] == []
    assert tags.get("XMP-photoshop:Credit") == "Getty Museum"


def test_verification_compares_the_in_house_tags_and_both_titles(master):
    """What verification expects of the output includes the in-house properties (exiftool reads them with the
    kept selection) and each title under its own namespace, so an output that lost any of them would fail."""
    recipe = load_recipe()
    kept = kept_tag_values(master, recipe.metadata.keep, recipe.metadata.exclude)
    expected = {"XMP:XMP-getty:ObjectNumber": "89.PA.33", "XMP:XMP-getty:Label-fr": "Les Iris",
                **{f"XMP:{tag}": title for tag, title in TITLES.items()}}
    assert {k: kept.get(k) for k in expected} == expected


@pytest.mark.parametrize("element, tag", [
    (b"<getty:ObjectNumber>89.PA.33</getty:ObjectNumber>", "XMP:XMP-getty:ObjectNumber"),
    # Read by family-0 names, both titles were one key, XMP:Title: the one left in the output answered for both.
    (b"<pdf:Title>Irises, conservation scan</pdf:Title>", "XMP:XMP-pdf:Title"),
], ids=["in-house", "pdf-title-beside-dc-title"])
def test_an_output_that_lost_a_kept_xmp_tag_fails_verification(element, tag, master, tmp_path):
    recipe = load_recipe()
    carried = carried_tags(inspect(master), recipe.metadata.keep, recipe.metadata.exclude, tmp_path)
    packet = next(t for t in carried.tags if t.code == 700)  # XMP
    lost = packet.values.replace(element, b"")
    assert lost != packet.values
    packet.values = lost
    image = pyvips.Image.new_from_file(str(master))
    encode_ptiff(image, tmp_path / "a.tif", recipe, srgb_profile(), lambda: carried.tags)
    report = verify(tmp_path / "a.tif", Expectation(width=image.width, height=image.height, metadata=carried.values))
    assert report.errors == (f"metadata tag {tag} was not kept",)


def test_an_excluded_namespace_is_deleted_from_the_whole_packet(master, tmp_path):
    recipe = load_recipe()
    excluding = recipe.model_copy(update={"metadata": recipe.metadata.model_copy(
        update={"exclude": (*recipe.metadata.exclude, "XMP-pdf:all")})})
    result = convert(master, tmp_path / "a.tif", recipe=excluding)
    assert result.ok, result.reason
    tags = xmp(tmp_path / "a.tif")
    assert "XMP-pdf:Title" not in tags
    assert {k: tags.get(k) for k in (*IN_HOUSE, "XMP-dc:Title")} == {**IN_HOUSE, "XMP-dc:Title": "Irises"}


def test_a_recipe_keeping_one_namespace_carries_only_it(master, tmp_path):
    result = convert(master, tmp_path / "a.tif", recipe=recipe_keeping("EXIF:all", "XMP-dc:all"))
    assert result.ok, result.reason
    assert xmp(tmp_path / "a.tif") == {"XMP-dc:Title": "Irises"}


@pytest.mark.parametrize("entry", ["XMP:all", "xmp:*", "0XMP:all", "all", "all:all", "*", "XMP", "1all:all"])
def test_entries_keeping_all_of_xmp(entry):
    assert keeps_all_xmp(("EXIF:all", entry))


@pytest.mark.parametrize("entry", ["XMP-dc:all", "XMP:XMP-dc:all", "Author:all", "Title", "EXIF:all", "XMP:Title"])
def test_entries_keeping_part_of_xmp(entry):
    assert not keeps_all_xmp(("IPTC:all", entry))
