"""Identifiers from a source become store keys that cannot escape or corrupt the key space."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from gcis_etl.errors import ConfigError, StoreError
from gcis_etl.keys import KeyTemplates, UnsafeKey, check_key, check_prefix, escape_identifier
from gcis_etl.settings import parse

HOSTILE = [
    "../../etc/passwd", "/etc/passwd", "..", ".", ".hidden", "a/b", "a\\b", "C:\\Windows\\x",
    "nul\x00byte", "line\nbreak", "crlf\r\nX-Injected: 1", "tab\there", "\x7f", "a?b#c&d=e", "100%", "%2e%2e%2f",
    "sp ace", "plus+sign", "ü文字", "\u202eevil.tif", "emoji\U0001F600", "img_pyr_001", "IMG_PYR_X", "_pyr_",
    "a_pyr_pyr_b", "~", "~7E", "~2F", "a~b", "a%2Fb", "a_b", "-rf", "x" * 80, "'quoted'", '"dq"', "<tag>",
    "undecodable\udcff", "lone\ud800",
]


@pytest.mark.parametrize("identifier", HOSTILE)
def test_hostile_identifier_becomes_one_safe_segment(identifier, tmp_path):
    segment = escape_identifier(identifier)
    assert check_key(segment) == segment
    assert "/" not in segment and not segment.startswith(".")
    assert "_pyr_" not in segment.lower()
    assert quote(segment, safe="~") == segment  # nothing a URL or an HTTP header would reinterpret
    resolved = (tmp_path / "root" / segment).resolve()
    assert resolved.parent == (tmp_path / "root").resolve()


def test_escaping_is_injective_and_deterministic():
    escaped = [escape_identifier(i) for i in HOSTILE]
    assert len(set(escaped)) == len(HOSTILE)
    assert escaped == [escape_identifier(i) for i in HOSTILE]


@pytest.mark.parametrize("identifier, expected", [
    ("IE12345_001", "IE12345_001"),
    ("a/b", "a~2Fb"),
    ("../x", "~2E.~2Fx"),
    ("~", "~7E"),
    ("é", "~C3~A9"),
    ("img_pyr_001", "img~5Fpyr_001"),
    ("a b?c", "a~20b~3Fc"),
])
def test_escaping_rules(identifier, expected):
    assert escape_identifier(identifier) == expected


def test_empty_and_overlong_identifiers_are_refused():
    with pytest.raises(UnsafeKey, match="empty"):
        escape_identifier("")
    with pytest.raises(UnsafeKey, match="too long"):
        escape_identifier("é" * 100)
    assert issubclass(UnsafeKey, StoreError)


@pytest.mark.parametrize("key, problem", [
    ("", "empty"), ("/abs/key", "empty segment"), ("a//b", "empty segment"), ("a/b/", "empty segment"),
    ("a/../b", "starts with '.'"), ("./a", "starts with '.'"), ("a/.meta/b", "starts with '.'"),
    ("a/b c", "outside"), ("a/b?c", "outside"), ("a/b%2F", "outside"), ("a\x00b", "outside"),
    ("a\\b", "outside"), ("ü", "outside"), ("a/~zz", "not an escape"), ("a/~2f", "not an escape"),
    ("p/o/x_pyr_1.tif", "_pyr_"), ("p/o/X_PYR_1.tif", "_pyr_"), ("a/" + "b" * 256, "longer than 255"),
    ("/".join(["abcdefghi"] * 110), "longer than 1024"),
])
def test_check_key_refuses(key, problem):
    with pytest.raises(UnsafeKey, match=problem):
        check_key(key)


def test_prefix_is_a_key_without_slashes_or_empty():
    assert check_prefix("/iiif/access/") == "iiif/access"
    assert check_prefix("") == ""
    with pytest.raises(UnsafeKey):
        check_prefix("iiif/../other")


def test_default_templates_place_objects_with_escaped_identifiers():
    keys = KeyTemplates()
    assert keys.image_key("rosetta", "IE 1/2", "FL_pyr_3", 1, "tif") == "rosetta/IE~201~2F2/FL~5Fpyr_3.tif"
    assert keys.manifest_key("rosetta", "IE1", 3) == "rosetta/IE1/manifest-v3.json"
    assert keys.manifest_key("rosetta", "IE1", 2) == "rosetta/IE1/manifest-v2.json"
    assert keys.collection_key("rosetta", 3) == "collections/rosetta-v3.json"


def test_templates_from_configuration():
    keys = parse(KeyTemplates, {"image": "{pipeline}/{object_id}/{sequence:04d}-{item_id}.{ext}",
                                "manifest": "{pipeline}/{object_id}/manifest.json"}, "config.yaml", "store.keys")
    assert keys.image_key("otmm", "a1", "../x", 7, "jp2") == "otmm/a1/0007-~2E.~2Fx.jp2"
    assert keys.manifest_key("otmm", "a1", 3) == "otmm/a1/manifest.json"


def test_an_item_id_too_long_for_a_key_is_named_and_a_template_without_it_places_the_item():
    """28 Japanese characters of path pass 255 bytes escaped; a template naming items by {sequence} is the way out,
    but it refused the item all the same: every value was escaped, the unused {item_id} too."""
    item = "葛飾北斎「富嶽三十六景」/神奈川沖浪裏（初摺・ボストン美術館本）.tif"
    with pytest.raises(UnsafeKey) as refused:
        KeyTemplates().image_key("prints", "hokusai", item, 1, "tif")
    assert str(refused.value).endswith("is too long for a key segment (286 bytes escaped, at most 255): its "
                                       "{item_id} in store.keys.image ('{pipeline}/{object_id}/{item_id}.{ext}'); "
                                       "{sequence} in place of {item_id} (an image's place in its object, as in "
                                       "\"{pipeline}/{object_id}/{sequence}.{ext}\") takes an item with any id")

    by_place = parse(KeyTemplates, {"image": "{pipeline}/{object_id}/{sequence:04d}.{ext}"}, "config.yaml", "store.keys")
    assert by_place.image_key("prints", "hokusai", item, 1, "tif") == "prints/hokusai/0001.tif"


@pytest.mark.parametrize("field, template, problem", [
    ("image", "{pipeline}/{object}/{item_id}.tif", "unknown placeholder"),
    ("manifest", "{pipeline}/{item_id}.json", "unknown placeholder"),
    ("image", "/abs/{pipeline}/{item_id}.tif", "empty segment"),
    ("image", "{pipeline}/../{item_id}.tif", "starts with '.'"),
    ("image", "{pipeline}/x_pyr_{item_id}.tif", "_pyr_"),
    ("collection", "{pipeline} collection.json", "outside"),
    # templates that would put two things on one key, the later overwriting the earlier
    ("image", "{pipeline}/{object_id}.{ext}", "must use {item_id} or {sequence}, or the images of one object"),
    ("image", "{pipeline}/{item_id}.{ext}", "must use {object_id}, or two objects' images"),
    ("manifest", "{pipeline}/manifest-v{version}.json", "must use {object_id}, or two objects' manifests"),
])
def test_bad_templates_are_configuration_errors(field, template, problem):
    with pytest.raises(ConfigError) as err:
        parse(KeyTemplates, {field: template}, "config.yaml", "pipelines.demo.store.keys")
    message = str(err.value)
    assert f"config.yaml: pipelines.demo.store.keys.{field}" in message and problem in message


def test_templates_of_per_version_documents_need_version_when_both_versions_are_deposited():
    keys = parse(KeyTemplates, {"manifest": "{pipeline}/{object_id}/manifest.json",
                                "collection": "collections/{pipeline}.json"}, "config.yaml", "store.keys")
    assert keys.version_problems(("3.0",)) == {}
    problems = keys.version_problems(("3.0", "2.1"))
    assert sorted(problems) == ["collection", "manifest"]
    assert all(problem.startswith("must use {version} when manifests.versions lists 3.0, 2.1")
               for problem in problems.values())
    assert KeyTemplates().version_problems(("3.0", "2.1")) == {}
    assert {keys.manifest_key("p", "o", v) for v in (3, 2)} == {"p/o/manifest.json"}  # what is refused


def test_hostile_identifiers_in_every_placeholder_stay_below_the_root(tmp_path):
    keys = KeyTemplates()
    root = tmp_path.resolve()
    for hostile in HOSTILE:
        key = keys.image_key("demo", hostile, hostile, 1, "tif")
        assert Path(root, key).resolve().is_relative_to(root / "demo")
        assert len(key.split("/")) == 3


def test_converting_and_verifying_load_no_store_module():
    """The '_pyr_' rule is a file name's (gcis_etl.formats), which keys and imaging both follow: an access master
    made or checked on a workstation needs nothing of the store."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, gcis_etl.conversion, gcis_etl.verification; "
                             "print(' '.join(sys.modules))"], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout.split()
    assert "gcis_etl.formats" in loaded and not {"gcis_etl.keys", "gcis_etl.stores"} & set(loaded)


@pytest.mark.parametrize("image, own", [
    ("{pipeline}/{object_id}/{item_id}.{ext}", "museum/"),
    ("images/{pipeline}/{object_id}/{item_id}.{ext}", "images/museum/"),
    ("images/{pipeline}.{object_id}/{item_id}.{ext}", "images/museum."),
    ("{pipeline}-{object_id}/{item_id}.{ext}", None),  # "museum-": pipeline "museum-prints" too
    ("{pipeline}_{object_id}/{item_id}.{ext}", None),
    ("{pipeline}{object_id}/{item_id}.{ext}", None),  # "museum": "museum2/" too
    ("{pipeline}X{object_id}/{item_id}.{ext}", None),  # a file system that ignores case: "museumx..."
    ("{object_id}/{item_id}.{ext}", None),
    ("images/{object_id}/{pipeline}-{item_id}.{ext}", None),
])
def test_a_pipelines_own_image_prefix_is_one_no_other_pipelines_keys_start_with(image, own):
    """A killed run's uploads are aborted under it: "{pipeline}-..." gave "museum-", which the uploads of
    pipeline "museum-prints" going on in the same store start with too."""
    assert KeyTemplates(image=image).own_image_prefix("museum") == own


def test_an_item_id_too_long_for_a_key_says_sequence_takes_it():
    with pytest.raises(UnsafeKey, match=r"its \{item_id\} in store\.keys\.image .*; \{sequence\} in place of "
                                        r"\{item_id\} .*takes an item with any id"):
        KeyTemplates().image_key("museum", "o", "\u5c71" * 90, 1, "tif")
    with pytest.raises(UnsafeKey, match=r"segment longer than 255 bytes: store\.keys\.image .*\{sequence\} in place"):
        KeyTemplates(image="{pipeline}/{object_id}-{item_id}.{ext}").image_key("museum", "o" * 150, "i" * 150, 1,
                                                                               "tif")
    with pytest.raises(UnsafeKey) as raised:
        KeyTemplates(image="{pipeline}/{object_id}/{sequence}.{ext}").image_key("museum", "o" * 300, "i", 1, "tif")
    assert "{sequence} in place" not in str(raised.value)
