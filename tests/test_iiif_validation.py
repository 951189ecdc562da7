"""The validator itself, exercised with the official IIIF fixtures: good ones pass, broken ones fail."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gcis_etl.errors import ManifestError
from gcis_etl.iiif_validation import require_valid, validate

FIXTURES = Path(__file__).parent / "iiif_fixtures"
V21 = FIXTURES / "presentation-2.1"
V3 = FIXTURES / "validator" / "3"

# The presentation-validator's own tests list these as valid and invalid.
VALID_3 = ["simple_video", "full_example", "choice", "collection", "collection_of_collections", "version2image",
           "annoPage", "anno_pointselector", "annoPageMultipleMotivations", "old_cc_license",
           "rightsstatement_license", "extension_anno", "multi_bodies", "publicdomain", "navPlace", "anno_source",
           "range_range", "accompanyingCanvas", "placeholderCanvas", "point_selector", "annotation_full",
           "content_state"]
INVALID_3 = {
    "broken_simple_image": "/provider/0/logo/0: 'id' is a required property",
    "broken_choice": "/items/0: 'height' is a dependency of 'width'",
    "broken_collection": "/: 'label' is a required property",
    "broken_embedded_annos": "('annotations' was unexpected)",
    "non_cc_license": "/rights: 'https://en.wikipedia.org/wiki/License' does not match",
    "collection_of_canvases": "/items/0: ",
    "broken_service": "/thumbnail/0/service: ",
    "old_format_label": "/label: \"Old table label which doesn't have a language\" is not of type 'object'",
    "rights_lang_issues": "/metadata/0/label: '@none' does not match",
}
# What each official 2.1 error manifest gets wrong (errors/collection.json names them), as our message says it.
ERRORS_21 = {
    0: "not JSON", 1: "@context None", 2: "@context None", 3: "@context ''", 4: "example.com/context.json",
    5: "must have @type", 6: "Unknown resource class fish", 7: "identifier '' is not an HTTP(S) URI",
    8: "identifier 'fish' is not an HTTP(S) URI", 9: "sc:Manifest['label'] not present",
    10: "Unknown type for label", 11: "sc:Manifest['sequences'] not present",
    12: "'sc:Manifest' requires 'sequences'", 13: "Can't create object for: 1",
    14: "sc:Manifest['sequences'] must be a list", 15: "Unknown resource class fish",
    16: "sc:Manifest['sequences'] must be a list", 17: "sc:Sequence['canvases'] not present",
    18: "'sc:Sequence' requires 'canvases'", 19: "sc:Sequence['canvases'] must be a list",
    20: "Can't create object for: 'asdf'", 21: "sc:Sequence['canvases'] must be a list",
    22: "Canvases must have a real identity", 23: "identifier 'asdf' is not an HTTP(S) URI",
    24: "sc:Canvas['label'] not present", 25: "Unknown type for label", 26: "sc:Canvas['height'] not present",
    27: "sc:Canvas['height'] does not accept a str", 28: "sc:Canvas['width'] not present",
    29: "sc:Canvas['width'] does not accept a str", 30: "sc:Canvas['images'] must be a list",
    31: "Can't create object for: 'asdfasdf'", 32: "sc:Canvas['images'] must be a list",
    33: "oa:Annotation['motivation'] not present", 34: "motivation must be 'sc:painting', got 'somethingElse'",
    35: "oa:Annotation['on'] not present", 36: "oa:Annotation['on'] has broken value",
    37: "oa:Annotation['resource'] not present", 38: "oa:Annotation['resource'] has broken value",
    39: "must have @type", 40: "must have Images for their resources",
    41: "Images must have a real identity", 42: "identifier 'asdf' is not an HTTP(S) URI",
    43: "dctypes:Image['height'] does not accept a str", 44: "dctypes:Image['width'] does not accept a str",
    45: "Attributes not allowed on plain tag", 46: "Missing @value", 47: "Attributes not allowed on span tag",
    48: "HTML vulnerability 'script'", 49: "HTML Comment vulnerability",
    50: "'upside-down' not a known viewing direction", 51: "Cannot set the startCanvas",
}


@pytest.mark.parametrize("name", VALID_3)
def test_valid_3_0_fixtures_pass(name):
    report = validate((V3 / f"{name}.json").read_bytes(), version="3.0")
    assert (report.version, report.errors) == ("3.0", ())


@pytest.mark.parametrize("name, problem", INVALID_3.items())
def test_broken_3_0_fixtures_fail_naming_the_problem(name, problem):
    report = validate((V3 / f"{name}.json").read_bytes(), version="3.0")
    assert not report.ok
    assert any(problem in e for e in report.errors), report.errors


@pytest.mark.parametrize("number, problem", ERRORS_21.items())
def test_official_2_1_error_manifests_fail_naming_the_problem(number, problem):
    report = validate((V21 / "errors" / f"{number}.json").read_bytes())
    assert not report.ok
    assert any(problem in e for e in report.errors), report.errors


GOOD_21 = sorted(p.name for p in (V21 / "fixtures").glob("*.json") if p.name != "65.json")


@pytest.mark.parametrize("name", GOOD_21)
def test_official_2_1_fixtures_pass(name):
    report = validate((V21 / "fixtures" / name).read_bytes())
    assert (report.version, report.errors) == ("2.1", ())


def test_2_1_fixture_65_is_rejected_for_its_dangling_start_canvas():
    """Published as valid, but its startCanvas is a 2.0 URI absent from the sequence: the reader refuses it."""
    document = json.loads((V21 / "fixtures" / "65.json").read_text())
    assert document["sequences"][0]["startCanvas"] not in [c["@id"] for c in document["sequences"][0]["canvases"]]
    assert "Cannot set the startCanvas" in validate(document).errors[0]
    document["sequences"][0]["startCanvas"] = document["sequences"][0]["canvases"][0]["@id"]
    assert validate(document).ok


@pytest.mark.parametrize("path", ["validator/1/manifest.json", "validator/2/manifest.json"])
def test_validator_2_x_fixtures_pass(path):
    assert validate((FIXTURES / path).read_bytes()).ok


def test_2_1_warnings_are_returned_not_printed(capsys):
    report = validate((V21 / "fixtures" / "1.json").read_bytes())
    assert report.ok
    assert "WARNING: Resource type 'sc:Manifest' should have 'description' set" in report.warnings
    assert capsys.readouterr() == ("", "")


def test_2_1_contexts_are_never_fetched():
    document = json.loads((V21 / "fixtures" / "1.json").read_text())
    document["sequences"][0]["@context"] = "http://example.org/unbundled-context.json"
    report = validate(document)
    assert any("not bundled" in e for e in report.errors), report.errors


def test_the_version_comes_from_the_context_unless_given():
    document = json.loads((V3 / "simple_video.json").read_text())
    assert validate(document).version == "3.0"
    assert validate(document, version="2.1").version == "2.1" and not validate(document, version="2.1").ok
    assert validate([1, 2]).errors == ("not a JSON object but a list",)


def test_require_valid_raises_a_manifest_error_naming_the_document_and_the_problem():
    document = json.loads((V3 / "non_cc_license.json").read_text())
    with pytest.raises(ManifestError, match=r"s3://b/p/m.json: not a valid IIIF Presentation 3.0 document: "
                                            r"/rights: 'https://en.wikipedia.org/wiki/License'"):
        require_valid(document, "s3://b/p/m.json")
    assert require_valid(json.loads((V3 / "full_example.json").read_text()), "x").ok


def test_2_1_validation_starts_no_process_and_keeps_each_documents_warnings(monkeypatch):
    """iiif-prezi's factory runs a shell (`which identify`) each time one is built: validating every manifest
    of a harvest must not, and the one factory reused must not carry one document's warnings to the next."""
    validate((V21 / "fixtures" / "1.json").read_bytes())  # what is built once per process is built
    started = []
    monkeypatch.setattr(subprocess, "check_output", lambda *a, **k: started.append(a) or b"")
    warned = validate((V21 / "fixtures" / "1.json").read_bytes())
    described = json.loads((V21 / "fixtures" / "1.json").read_text())
    described["description"] = "A description"
    quiet = validate(described)
    assert started == []
    assert "WARNING: Resource type 'sc:Manifest' should have 'description' set" in warned.warnings
    assert quiet.ok and not any("'sc:Manifest' should have 'description'" in w for w in quiet.warnings)
