"""IIIF manifests and the pipeline collection: built from source metadata and deposited images, validated,
deposited with the IIIF media types, stable from run to run."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from connectors.base import LangValue, SourceObject
from gcis_etl.errors import ConfigError, ManifestError
from gcis_etl.iiif_validation import validate
from gcis_etl.keys import KeyTemplates
from gcis_etl.manifests import CollectionEntry, DepositedImage, ManifestSettings, Manifests
from gcis_etl.settings import parse
from gcis_etl.stores import LocalStore, LocalStoreSettings, S3Store
from tests.conftest import s3_settings

REPO = Path(__file__).resolve().parents[1]
BASE = "https://iiif.example.org/manifests"
SERVICE = "https://iiif.example.org/iiif/2"
CONFIG = {
    "manifest_base_url": BASE + "/", "image_service_base_url": SERVICE, "versions": ["3.0", "2.1"],
    "label": ["dc:title", "title"], "summary": ["dc:description"],
    "metadata": [{"field": "dc:creator", "label": {"en": "Creator", "fr": "Créateur"}},
                 {"field": "dc:date", "label": "Date"}, {"field": "dc:identifier", "label": "Identifier"}],
    "rights": {"field": "dc:rights", "label": "Rights"},
    "required_statement": {"field": "credit", "label": {"en": "Credit line"}},
}
KEYS = KeyTemplates()


def settings(**overrides) -> ManifestSettings:
    return parse(ManifestSettings, {**CONFIG, **overrides}, "config.yaml", "pipelines.demo.manifests")


def source_object(object_id: str = "IE 42/x", **metadata) -> SourceObject:
    fields = {
        "dc:title": (LangValue("La Joconde", "fr"), LangValue("Mona Lisa", "en")),
        "dc:description": (LangValue("Portrait of Lisa Gherardini"),),
        "dc:creator": (LangValue("Leonardo da Vinci"),),
        "dc:date": (LangValue("1503"),),
        "dc:identifier": (LangValue("INV 779"), LangValue("IE42")),
        "dc:rights": (LangValue("https://creativecommons.org/publicdomain/zero/1.0/"),),
        "credit": (LangValue("Gift of the artist", "en"),),
    }
    fields.update(metadata)
    return SourceObject(id=object_id, modified=datetime(2026, 1, 2, tzinfo=timezone.utc), items=(),
                        metadata={k: v for k, v in fields.items() if v is not None},
                        source_url="https://dam.example.org/delivery/IE42")


def image(sequence: int, width: int = 6000, height: int = 4000, object_id: str = "IE 42/x",
          label: str | None = None) -> DepositedImage:
    return DepositedImage(sequence=sequence, key=KEYS.image_key("demo", object_id, f"FL {sequence}", sequence, "tif"),
                          width=width, height=height, label=label)


def painted(manifest: dict) -> list[dict]:
    """The image painted on each canvas, in 3.0 or 2.1."""
    if "items" in manifest:
        return [annotation["body"] for canvas in manifest["items"] for page in canvas["items"]
                for annotation in page["items"]]
    return [annotation["resource"] for canvas in manifest["sequences"][0]["canvases"]
            for annotation in canvas["images"]]


def deposited(manifests: Manifests, object_id: str) -> tuple[dict, dict]:
    """The 3.0 and 2.1 manifests of an object, as the store holds them."""
    v3, v2 = (json.loads(manifests.store.get_bytes(manifests.manifest_key(object_id, v))) for v in ("3.0", "2.1"))
    return v3, v2


def entry(manifests: Manifests, obj: SourceObject) -> CollectionEntry:
    """An object's collection entry, as a harvest makes it from what the ledger recorded of its publishing."""
    return CollectionEntry(obj.id, manifests.label_of(obj))


def thumbnails(manifest: dict) -> list[dict]:
    """The manifest's thumbnail, then each canvas's, in 3.0 or 2.1."""
    if "items" in manifest:
        return manifest["thumbnail"] + [t for c in manifest["items"] for t in c["thumbnail"]]
    return [manifest["thumbnail"]] + [c["thumbnail"] for c in manifest["sequences"][0]["canvases"]]


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(LocalStoreSettings(root=tmp_path / "store"))


def documents() -> str:
    """Every document built for a fixed input; a fresh interpreter prints the same (see the stability test)."""
    manifests = Manifests(settings(), "demo", LocalStore(LocalStoreSettings(root=Path("unused"))))
    images = [image(2, 3000, 2000, label="verso"), image(1, label="recto")]
    built = {v: manifests.build(source_object(), images, v).document for v in ("3.0", "2.1")}
    built["collection"] = manifests.collection("3.0", [])
    return json.dumps(built, ensure_ascii=False, indent=1)


def test_single_image_manifest_3_0(store):
    manifest = Manifests(settings(), "demo", store).build(source_object(), [image(1)], "3.0").document
    assert validate(manifest).ok, validate(manifest).errors

    manifest_id = f"{BASE}/demo/IE~2042~2Fx/manifest-v3.json"
    service_id = f"{SERVICE}/demo/IE~2042~2Fx/FL~201.tif"
    assert manifest["@context"] == "http://iiif.io/api/presentation/3/context.json"
    assert (manifest["id"], manifest["type"]) == (manifest_id, "Manifest")
    assert manifest["label"] == {"fr": ["La Joconde"], "en": ["Mona Lisa"]}
    [canvas] = manifest["items"]
    assert canvas["id"] == f"{BASE}/demo/IE~2042~2Fx/manifest-v3/canvas/1"
    assert (canvas["width"], canvas["height"]) == (6000, 4000)
    [page] = canvas["items"]
    [annotation] = page["items"]
    assert (page["id"], annotation["id"]) == (f"{BASE}/demo/IE~2042~2Fx/manifest-v3/page/1",
                                              f"{BASE}/demo/IE~2042~2Fx/manifest-v3/annotation/1")
    assert (annotation["motivation"], annotation["target"]) == ("painting", canvas["id"])
    body = annotation["body"]
    assert body["id"] == f"{service_id}/full/full/0/default.jpg"
    assert (body["type"], body["format"], body["width"], body["height"]) == ("Image", "image/jpeg", 6000, 4000)
    assert body["service"] == [{"@id": service_id, "@type": "ImageService2",
                                "profile": "http://iiif.io/api/image/2/level1.json"}]
    thumbnail = {"id": f"{service_id}/full/400,267/0/default.jpg", "type": "Image", "format": "image/jpeg",
                 "width": 400, "height": 267, "service": body["service"]}
    assert manifest["thumbnail"] == [thumbnail] and canvas["thumbnail"] == [thumbnail]


def test_descriptive_metadata_follows_the_configured_mapping(store):
    manifest = Manifests(settings(), "demo", store).build(source_object(), [image(1)], "3.0").document
    assert manifest["summary"] == {"none": ["Portrait of Lisa Gherardini"]}
    assert manifest["metadata"] == [
        {"label": {"en": ["Creator"], "fr": ["Créateur"]}, "value": {"none": ["Leonardo da Vinci"]}},
        {"label": {"none": ["Date"]}, "value": {"none": ["1503"]}},
        {"label": {"none": ["Identifier"]}, "value": {"none": ["INV 779", "IE42"]}},
    ]
    assert manifest["rights"] == "http://creativecommons.org/publicdomain/zero/1.0/"  # the form the schema wants
    assert manifest["requiredStatement"] == {"label": {"en": ["Credit line"]}, "value": {"en": ["Gift of the artist"]}}
    assert manifest["homepage"] == [{"id": "https://dam.example.org/delivery/IE42", "type": "Text",
                                     "label": {"none": ["Source record"]}, "format": "text/html"}]


def test_mapping_edge_cases(store):
    manifests = Manifests(settings(default_language="en", label=["missing", "title"]), "demo", store)
    obj = source_object(**{"title": (LangValue("Carte", "fr_CA"), LangValue("Map")),
                           "dc:rights": (LangValue("All rights reserved by the museum"),),
                           "dc:date": None, "credit": ()})
    manifest = manifests.build(obj, [image(1)], "3.0").document
    assert validate(manifest).ok, validate(manifest).errors
    assert manifest["label"] == {"fr-CA": ["Carte"], "en": ["Map"]}      # first configured field present
    assert "rights" not in manifest and "requiredStatement" not in manifest
    assert {"label": {"none": ["Rights"]}, "value": {"en": ["All rights reserved by the museum"]}} \
        in manifest["metadata"]                                          # text that is not a rights URI
    assert [m["label"] for m in manifest["metadata"]][1] == {"none": ["Identifier"]}  # absent fields are skipped

    untitled = Manifests(settings(label=["nothing"]), "demo", store).build(source_object(), [image(1)], "3.0").document
    assert untitled["label"] == {"none": ["IE 42/x"]}
    bare = Manifests(settings(homepage_label=None), "demo", store).build(source_object(), [image(1)], "3.0").document
    assert "homepage" not in bare


def test_rights_hold_the_first_rights_uri_and_the_rights_entry_all_else_the_source_says(store):
    """`rights` (3.0) and `license` (2.1) hold one URI: a second one is shown, not dropped; a value that only
    starts like a rights URI is text, never a URI in the manifest."""
    manifests = Manifests(settings(), "demo", store)
    obj = source_object(**{"dc:rights": (
        LangValue("https://creativecommons.org/licenses/by/4.0/"),
        LangValue("http://rightsstatements.org/vocab/InC/1.0/"),
        LangValue('https://creativecommons.org/licenses/by/4.0/"><script>x</script>'))})
    v3, v2 = (manifests.build(obj, [image(1)], v).document for v in ("3.0", "2.1"))
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)
    assert v3["rights"] == v2["license"] == "http://creativecommons.org/licenses/by/4.0/"
    junk = 'https://creativecommons.org/licenses/by/4.0/"><script>x</script>'
    shown = ["http://rightsstatements.org/vocab/InC/1.0/",  # as text, which may be read as HTML
             '<span>https://creativecommons.org/licenses/by/4.0/"&gt;&lt;script&gt;x&lt;/script&gt;</span>']
    assert {"label": {"none": ["Rights"]}, "value": {"none": shown}} in v3["metadata"]
    assert {"label": "Rights", "value": shown} in v2["metadata"]

    only_junk = manifests.build(source_object(**{"dc:rights": (LangValue(junk),)}), [image(1)], "2.1").document
    assert "license" not in only_junk and {"label": "Rights", "value": shown[1]} in only_junk["metadata"]


def test_text_that_looks_like_html_stays_text_where_html_is_allowed(store):
    obj = source_object(**{"dc:description": (LangValue("<script>alert(1)</script>"),),
                           "dc:date": (LangValue("<unknown>"),), "credit": (LangValue("<anonymous>", "en"),)})
    manifests = Manifests(settings(), "demo", store)
    v3, v2 = (manifests.build(obj, [image(1)], v).document for v in ("3.0", "2.1"))
    assert v3["summary"] == {"none": ["<span>&lt;script&gt;alert(1)&lt;/script&gt;</span>"]}
    assert v2["description"] == "<span>&lt;script&gt;alert(1)&lt;/script&gt;</span>"
    assert {"label": {"none": ["Date"]}, "value": {"none": ["<span>&lt;unknown&gt;</span>"]}} in v3["metadata"]
    assert {"label": "Date", "value": "<span>&lt;unknown&gt;</span>"} in v2["metadata"]
    assert v3["requiredStatement"]["value"] == {"en": ["<span>&lt;anonymous&gt;</span>"]}
    assert v2["attribution"] == [{"@value": "<span>&lt;anonymous&gt;</span>", "@language": "en"}]
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)


def test_text_with_markup_characters_anywhere_reads_as_given_where_html_is_allowed(store):
    """A 2.1 value "MAY contain" HTML anywhere, and Mirador 4 reads every such value as HTML in 3.0 too:
    "Curator <Test> & Co" showed as "Curator & Co". Text without '<', '>' or '&' and labels are left as they are."""
    obj = source_object(**{"dc:title": (LangValue("Tom & Jerry <1>"),), "dc:description": (LangValue("1 < 2"),),
                           "dc:date": (LangValue("Curator <Test> & Co"), LangValue("1901")),
                           "credit": (LangValue("A&amp;B", "en"),)})
    manifests = Manifests(settings(), "demo", store)
    v3, v2 = (manifests.build(obj, [image(1)], v).document for v in ("3.0", "2.1"))
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)
    assert v3["summary"] == {"none": ["<span>1 &lt; 2</span>"]} and v2["description"] == "<span>1 &lt; 2</span>"
    dates = ["<span>Curator &lt;Test&gt; &amp; Co</span>", "1901"]
    assert {"label": {"none": ["Date"]}, "value": {"none": dates}} in v3["metadata"]
    assert {"label": "Date", "value": dates} in v2["metadata"]
    assert v3["requiredStatement"]["value"] == {"en": ["<span>A&amp;amp;B</span>"]}
    assert v2["attribution"] == [{"@value": "<span>A&amp;amp;B</span>", "@language": "en"}]
    assert (v3["label"], v2["label"]) == ({"none": ["Tom & Jerry <1>"]}, "Tom & Jerry <1>")


@pytest.mark.parametrize("language", [None, "en"])
def test_labels_that_look_like_html_stay_plain_text(store, language):
    """Labels cannot hold HTML: markup there is shown as such by viewers and refused in 2.1 when the value has a
    language, which left the object unpublished. Text reading as HTML gets the space the specifications
    recommend, in every label of both versions."""
    manifests = Manifests(settings(metadata=[{"field": "dc:creator", "label": {"en": "<Creator>"}}],
                                   homepage_label="<Record>", collection_label="<Demo>"), "demo", store)
    obj = source_object(**{"dc:title": (LangValue("<Untitled>", language),)})
    manifests.publish(obj, [image(1, label="<recto>")])
    manifests.update_collection(added=[entry(manifests, obj)])
    v3, v2 = deposited(manifests, obj.id)
    c3, c2 = (json.loads(store.get_bytes(f"collections/demo-v{major}.json")) for major in (3, 2))

    title_3 = {language or "none": ["<Untitled> "]}
    title_2 = [{"@value": "<Untitled> ", "@language": language}] if language else "<Untitled> "
    assert (v3["label"], c3["items"][0]["label"]) == (title_3, title_3)
    assert (v2["label"], c2["manifests"][0]["label"]) == (title_2, title_2)
    assert (v3["items"][0]["label"], v2["sequences"][0]["canvases"][0]["label"]) == ({"none": ["<recto> "]},
                                                                                      "<recto> ")
    assert (v3["metadata"][0]["label"], v2["metadata"][0]["label"]) == (
        {"en": ["<Creator> "]}, [{"@value": "<Creator> ", "@language": "en"}])
    assert (v3["homepage"][0]["label"], v2["related"]["label"]) == ({"none": ["<Record> "]}, "<Record> ")
    assert (c3["label"], c2["label"]) == ({"none": ["<Demo> "]}, "<Demo> ")


def test_multi_image_manifests_in_both_versions(store):
    manifests = Manifests(settings(), "demo", store)
    images = [image(3, 1200, 1600, label="back"), image(1, 6000, 4000, label="front"), image(2, 300, 500)]
    v3 = manifests.build(source_object(), images, "3.0").document
    v2 = manifests.build(source_object(), images, "2.1").document
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)

    assert [(c["label"], c["width"], c["height"]) for c in v3["items"]] == [
        ({"none": ["front"]}, 6000, 4000), ({"none": ["2"]}, 300, 500), ({"none": ["back"]}, 1200, 1600)]
    assert [c["thumbnail"][0]["id"].split("/full/", 1)[1] for c in v3["items"]] == [
        "400,267/0/default.jpg", "240,400/0/default.jpg", "300,400/0/default.jpg"]  # the longer side: 400

    assert v2["@context"] == "http://iiif.io/api/presentation/2/context.json"
    assert v2["@id"] == f"{BASE}/demo/IE~2042~2Fx/manifest-v2.json"
    [sequence] = v2["sequences"]
    canvases = sequence["canvases"]
    assert [(c["label"], c["width"], c["height"]) for c in canvases] == [
        ("front", 6000, 4000), ("2", 300, 500), ("back", 1200, 1600)]
    resource = canvases[2]["images"][0]["resource"]
    service_id = f"{SERVICE}/demo/IE~2042~2Fx/FL~203.tif"
    assert resource["service"] == {"@context": "http://iiif.io/api/image/2/context.json", "@id": service_id,
                                   "profile": "http://iiif.io/api/image/2/level1.json"}
    assert (resource["@id"], resource["width"], resource["height"]) == (
        f"{service_id}/full/full/0/default.jpg", 1200, 1600)
    assert canvases[2]["images"][0]["on"] == canvases[2]["@id"] == f"{BASE}/demo/IE~2042~2Fx/manifest-v2/canvas/3"
    assert v2["label"] == [{"@value": "La Joconde", "@language": "fr"}, {"@value": "Mona Lisa", "@language": "en"}]
    assert v2["license"] == "http://creativecommons.org/publicdomain/zero/1.0/"
    assert v2["attribution"] == [{"@value": "Gift of the artist", "@language": "en"}]
    assert v2["related"]["@id"] == "https://dam.example.org/delivery/IE42"
    assert v2["metadata"][0]["label"] == [{"@value": "Creator", "@language": "en"},
                                          {"@value": "Créateur", "@language": "fr"}]


def test_ids_are_stable_across_runs(store):
    first = documents()
    Manifests(settings(), "other", store).build(source_object("IE99"), [image(1, object_id="IE99")], "3.0")
    assert documents() == first
    fresh = subprocess.run([sys.executable, "-c", "from tests.test_manifests import documents; print(documents())"],
                           cwd=REPO, capture_output=True, text=True, check=True)
    assert fresh.stdout.rstrip("\n") == first


def test_source_languages_go_out_as_tags_and_the_same_in_both_versions(store):
    """POSIX locales lose their codeset and modifier; XMP's x-default and an empty tag are no language; what is
    still no tag takes the default language with a warning (once), in 3.0 as in 2.1, never failing the object."""
    manifests = Manifests(settings(default_language="en"), "demo", store)
    title = tuple(LangValue(f"t{n}", language) for n, language in enumerate(
        ["en_US.UTF-8", "de_DE@euro", "fr_FR.ISO-8859-1@euro", "x-default", "", "en US", "*", "en US"]))
    obj = source_object(**{"dc:title": title})
    built = [manifests.build(obj, [image(1)], version) for version in ("3.0", "2.1")]
    v3, v2 = (b.document for b in built)
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)
    assert v3["label"] == {"en-US": ["t0"], "de-DE": ["t1"], "fr-FR": ["t2"], "en": ["t3", "t4", "t5", "t6", "t7"]}
    assert [(v["@language"], v["@value"]) for v in v2["label"]] == [
        ("en-US", "t0"), ("de-DE", "t1"), ("fr-FR", "t2"), ("en", "t3"), ("en", "t4"), ("en", "t5"), ("en", "t6"),
        ("en", "t7")]
    for warnings in (b.warnings for b in built):
        assert warnings == tuple(f"source language {tag!r} is not a language tag such as en or en-US: its values "
                                 f"go out under manifests.default_language 'en'" for tag in ("en US", "*"))


def test_configured_label_languages_are_read_as_tags_and_a_wrong_one_is_a_config_error():
    configured = settings(metadata=[{"field": "dc:date", "label": {"en_GB.UTF-8": "Date", "none": "Datum"}}],
                          homepage_label={"fr_FR": "Notice"})
    assert configured.metadata[0].label == {"en-GB": "Date", "none": "Datum"}
    assert configured.homepage_label == {"fr-FR": "Notice"}
    with pytest.raises(ConfigError, match=r"pipelines\.demo\.manifests\.metadata\.0\.label: "
                                          r"'en US' is not a language tag such as en or en-US"):
        settings(metadata=[{"field": "dc:date", "label": {"en US": "Date"}}])
    with pytest.raises(ConfigError, match=r"pipelines\.demo\.manifests\.collection_label: .*'x-default' is not"):
        settings(collection_label={"x-default": "Collection"})


@pytest.mark.parametrize("images, problem", [
    ([], "no deposited image"),
    ([image(1), image(1)], "share a sequence number"),
    ([image(1, width=0)], "no real size"),
])
def test_impossible_manifests_are_errors(store, images, problem):
    with pytest.raises(ManifestError, match=problem):
        Manifests(settings(), "demo", store).build(source_object(), images, "3.0")


def test_a_manifest_that_cannot_be_made_is_an_error_naming_the_problem_and_nothing_is_deposited(store):
    manifests = Manifests(settings(), "demo", store)
    with pytest.raises(ManifestError, match=r"demo/IE1: image .* has no real size \(6000x0\)"):
        manifests.publish(source_object("IE1"), [image(1, object_id="IE1"), image(2, 6000, 0, object_id="IE1")])
    assert not store.root.exists()  # nothing was deposited, not even the store's folder


@pytest.mark.parametrize("source_url", [
    "https://dam.example.org/otmm/ux-html/?p=asset&id=84.PA.1 20a",   # an id put in a template as it is
    "https://dam.example.org/a\r\nSet-Cookie: x",
    "ftp://records.example.org/IE1",
    "javascript:alert(1)",
    "https://etl:Hunter2-secret@[dam.example.org/IE1",
    "http:/records.example.org/IE1",
])
def test_a_source_url_that_is_no_http_url_is_left_out_with_a_warning_and_the_manifests_go_out(store, source_url):
    """The link to the source record is optional: without it the manifests are still worth publishing."""
    record = SourceObject(id="IE1", modified=datetime(2026, 1, 1, tzinfo=timezone.utc), items=(),
                          source_url=source_url)
    manifests = Manifests(settings(), "demo", store)
    published = manifests.publish(record, [image(1, object_id="IE1")])
    v3, v2 = deposited(manifests, "IE1")
    assert "homepage" not in v3 and "related" not in v2
    [warning] = published.warnings  # once for both versions
    assert warning.startswith("source URL ") and warning.endswith(
        "is not an http(s) URL: the manifests go out without the link to the source record")
    assert "Hunter2" not in warning


def test_publish_deposits_both_versions_and_a_second_publish_is_a_noop(store):
    manifests = Manifests(settings(), "demo", store)
    manifests.publish(source_object(), [image(1), image(2)])
    keys = ["demo/IE~2042~2Fx/manifest-v3.json", "demo/IE~2042~2Fx/manifest-v2.json"]
    assert sorted(listed.key for listed in store.list()) == sorted(keys)
    assert [store.head(key).content_type for key in keys] == [
        'application/ld+json;profile="http://iiif.io/api/presentation/3/context.json"',
        'application/ld+json;profile="http://iiif.io/api/presentation/2/context.json"']
    for key in keys:
        assert validate(store.get_bytes(key)).ok
    written = [((store.root / key).stat().st_ino, (store.root / key).stat().st_mtime_ns) for key in keys]
    manifests.publish(source_object(), [image(1), image(2)])
    # the local store writes by renaming a new file over the key: the same inode is a document not written again
    assert [((store.root / key).stat().st_ino, (store.root / key).stat().st_mtime_ns) for key in keys] == written

    assert manifests.withdraw("IE 42/x") == keys
    assert list(store.list()) == []


def test_manifests_are_deposited_in_s3_with_the_iiif_media_type_next_to_the_images(minio, s3_bucket, aws_env):
    store = S3Store(s3_settings(minio, s3_bucket))
    manifests = Manifests(settings(), "demo", store)
    manifests.publish(source_object(), [image(1)])
    v3_key = manifests.manifest_key(source_object().id, "3.0")
    raw = minio.client().head_object(Bucket=s3_bucket, Key="iiif/access/" + v3_key)
    assert raw["ContentType"] == 'application/ld+json;profile="http://iiif.io/api/presentation/3/context.json"'
    assert v3_key.rsplit("/", 1)[0] == image(1).key.rsplit("/", 1)[0]
    assert deposited(manifests, source_object().id)[1]["@type"] == "sc:Manifest"


def test_the_collection_follows_objects_added_and_removed(store):
    manifests = Manifests(settings(collection_label={"en": "Demo collection"}), "demo", store)
    objects = (source_object("A"), source_object("B", **{"dc:title": (LangValue("Bee"),)}))
    for obj in objects:
        manifests.publish(obj, [image(1, object_id=obj.id)])
    a, b = (entry(manifests, obj) for obj in objects)
    manifests.update_collection(added=[b, a])

    v3 = json.loads(store.get_bytes("collections/demo-v3.json"))
    v2 = json.loads(store.get_bytes("collections/demo-v2.json"))
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)
    assert (v3["id"], v3["label"]) == (f"{BASE}/collections/demo-v3.json", {"en": ["Demo collection"]})
    assert v3["items"] == [
        {"id": f"{BASE}/demo/A/manifest-v3.json", "type": "Manifest", "label": {"fr": ["La Joconde"],
                                                                               "en": ["Mona Lisa"]}},
        {"id": f"{BASE}/demo/B/manifest-v3.json", "type": "Manifest", "label": {"none": ["Bee"]}}]
    assert [m["@id"] for m in v2["manifests"]] == [f"{BASE}/demo/A/manifest-v2.json", f"{BASE}/demo/B/manifest-v2.json"]
    assert all(s.unchanged for s in manifests.update_collection(added=[a]))

    relabelled = CollectionEntry("B", (LangValue("Abeille", "fr"),))
    manifests.update_collection(added=(e for e in [relabelled]), removed=["A"])  # the harvest passes a generator
    v3 = json.loads(store.get_bytes("collections/demo-v3.json"))
    v2 = json.loads(store.get_bytes("collections/demo-v2.json"))
    assert v3["items"] == [{"id": f"{BASE}/demo/B/manifest-v3.json", "type": "Manifest",
                            "label": {"fr": ["Abeille"]}}]
    assert v2["manifests"] == [{"@id": f"{BASE}/demo/B/manifest-v2.json", "@type": "sc:Manifest",
                                "label": [{"@value": "Abeille", "@language": "fr"}]}]
    manifests.update_collection(removed=["B"])
    for major, items in ((3, "items"), (2, "manifests")):
        empty = json.loads(store.get_bytes(f"collections/demo-v{major}.json"))
        assert empty[items] == [] and validate(empty).ok, validate(empty).errors


def test_a_manifest_published_again_under_a_new_base_url_leaves_the_collection_once(store):
    """A new domain: each object republished moves to the new base; those not yet republished keep theirs."""
    before = Manifests(settings(), "demo", store)
    objects = [source_object(object_id) for object_id in ("A", "B/1")]
    before.update_collection(added=[entry(before, obj) for obj in objects])
    moved = "https://images.example.net/iiif/manifests"
    after = Manifests(settings(manifest_base_url=moved), "demo", store)

    after.update_collection(added=[entry(after, objects[0])])
    v3 = json.loads(store.get_bytes("collections/demo-v3.json"))
    v2 = json.loads(store.get_bytes("collections/demo-v2.json"))
    assert [item["id"] for item in v3["items"]] == [f"{BASE}/{before.manifest_key('B/1', '3.0')}",
                                                   f"{moved}/demo/A/manifest-v3.json"]
    assert [m["@id"] for m in v2["manifests"]] == [f"{BASE}/{before.manifest_key('B/1', '2.1')}",
                                                  f"{moved}/demo/A/manifest-v2.json"]
    after.update_collection(added=[entry(after, objects[1])])
    v3 = json.loads(store.get_bytes("collections/demo-v3.json"))
    assert [item["id"] for item in v3["items"]] == [f"{moved}/demo/A/manifest-v3.json",
                                                   f"{moved}/{after.manifest_key('B/1', '3.0')}"]
    assert v3["id"] == f"{moved}/collections/demo-v3.json" and validate(v3).ok, validate(v3).errors


def test_an_unreadable_collection_is_reported_and_left_alone(store):
    store.put_bytes("collections/demo-v3.json", b'{"items": [{"no id": 1}]}', content_type="application/json")
    with pytest.raises(ManifestError, match=r"collections/demo-v3.json: the deposited collection cannot be read"):
        Manifests(settings(), "demo", store).update_collection(added=[CollectionEntry("A", (LangValue("A"),))])
    assert store.get_bytes("collections/demo-v3.json") == b'{"items": [{"no id": 1}]}'


def collections(store: LocalStore) -> dict[str, bytes]:
    return {major: store.get_bytes(f"collections/demo-v{major}.json") for major in (3, 2)}


@pytest.mark.parametrize("bad, named", [
    ({"default_language": "en US"}, r"collections/demo-v3\.json: the entry of "
                                    rf"{re.escape(BASE)}/demo/C/manifest-v3\.json: not a valid IIIF Presentation "
                                    r"3\.0 document: /items/0/label: "),
    ({"collection_label": {"en US": "Demo"}}, r"collections/demo-v3\.json: not a valid IIIF Presentation 3\.0 "
                                              r"document: /label: "),
])
def test_an_invalid_entry_added_or_envelope_is_refused_naming_it_and_no_collection_changes(store, bad, named):
    """The builder makes no invalid entry from validated settings and string labels: settings that slipped past
    their check (model_copy does not validate) stand in for a builder bug. 2.1 comes first and takes them, so
    nothing of one version may be deposited before every version's entries are checked."""
    good = settings(versions=["2.1", "3.0"])
    Manifests(good, "demo", store).update_collection(added=[CollectionEntry("A", (LangValue("Ant"),))])
    before = collections(store)
    with pytest.raises(ManifestError, match=named):
        Manifests(good.model_copy(update=bad), "demo", store).update_collection(
            added=[CollectionEntry("B", (LangValue("Bee", "en"),)), CollectionEntry("C", (LangValue("Sea"),))])
    assert collections(store) == before


def test_entries_read_back_are_kept_as_deposited(store):
    """Only what a run adds is built and checked: the rest of the collection is carried over as it was written
    (here with a property gcis-etl does not write, and a label the 3.0 schema would refuse), in its order."""
    manifests = Manifests(settings(), "demo", store)
    manifests.update_collection(added=[CollectionEntry("A", (LangValue("Ant"),)),
                                       CollectionEntry("B", (LangValue("Bee"),))])
    deposited_v3 = json.loads(store.get_bytes("collections/demo-v3.json"))
    deposited_v3["items"][0]["navDate"] = "1503-01-01T00:00:00Z"
    deposited_v3["items"][1]["label"] = {"en US": ["Bee"]}
    store.put_bytes("collections/demo-v3.json", json.dumps(deposited_v3).encode(), content_type="application/json")
    kept = {3: deposited_v3["items"], 2: json.loads(store.get_bytes("collections/demo-v2.json"))["manifests"]}

    manifests.update_collection(added=[CollectionEntry("C", (LangValue("Sea"),))])
    for major, items in ((3, "items"), (2, "manifests")):
        written = json.loads(store.get_bytes(f"collections/demo-v{major}.json"))[items]
        assert [json.dumps(item) for item in written[:2]] == [json.dumps(item) for item in kept[major]]
        assert written[2]["id" if major == 3 else "@id"] == f"{BASE}/demo/C/manifest-v{major}.json"


@pytest.mark.parametrize("override, key", [
    ({"manifest_base_url": "ftp://iiif.example.org"}, "manifest_base_url"),
    ({"image_service_base_url": "https://iiif.example.org/iiif?x=1"}, "image_service_base_url"),
    ({"versions": []}, "versions"),
    ({"versions": ["3.0", "3.0"]}, "versions"),
    ({"versions": ["4.0"]}, "versions.0"),
    ({"metadata": [{"field": "dc:creator"}]}, "metadata.0.label"),
    ({"thumbnail_width": 5}, "thumbnail_width"),
])
def test_bad_manifest_settings_name_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"config.yaml: pipelines\.demo\.manifests\.{key}"):
        settings(**override)


@pytest.mark.parametrize("key", ["manifest_base_url", "image_service_base_url"])
def test_credentials_in_a_published_base_url_are_refused_and_not_shown(key):
    with pytest.raises(ConfigError, match=rf"pipelines\.demo\.manifests\.{key}: .*must not carry credentials") as err:
        settings(**{key: "https://stage:Hunter2-secret@cdn.example.org/x"})
    assert "Hunter2-secret" not in str(err.value)


@pytest.mark.parametrize("configured, normal", [
    ("http://IIIF.Example.org/store", "http://iiif.example.org/store"),
    ("https://iiif.example.org:443/store/", "https://iiif.example.org/store"),
    ("http://127.0.0.1:80/gcis store/ü", "http://127.0.0.1/gcis%20store/%C3%BC"),
    ("http://bücher.example.org/iiif", "http://xn--bcher-kva.example.org/iiif"),
])
@pytest.mark.parametrize("key", ["manifest_base_url", "image_service_base_url"])
def test_a_base_url_not_in_the_normal_form_of_3_0_manifests_is_refused_showing_that_form(key, configured, normal):
    """iiif-prezi3 writes the 3.0 manifests' URLs in that form, the collection and 2.1 as configured: they would
    name other ids."""
    with pytest.raises(ConfigError, match=rf"pipelines\.demo\.manifests\.{key}: write it as "
                                          rf"'{re.escape(normal)}': IIIF 3.0 manifests carry URLs in that normal"):
        settings(**{key: configured})


def test_every_document_names_the_same_ids(store):
    """A base URL with a port, an escaped space and escaped non-ASCII: the same in 3.0, 2.1 and the
    collections; the source record's URL too, written in the normal form whatever the source gave."""
    base, service = "http://127.0.0.1:8182/gcis%20store/%C3%BC", "http://127.0.0.1:8182/iiif"
    manifests = Manifests(settings(manifest_base_url=base, image_service_base_url=service), "demo", store)
    record = SourceObject(id="IE1", modified=datetime(2026, 1, 1, tzinfo=timezone.utc), items=(),
                          source_url="https://DAM.example.org:443/delivery/Bücher?id=IE1")
    manifests.publish(record, [image(1, object_id="IE1")])
    manifests.update_collection([entry(manifests, record)])
    v3, v2 = deposited(manifests, "IE1")
    c3, c2 = (json.loads(store.get_bytes(manifests.collection_key(v))) for v in ("3.0", "2.1"))
    assert v3["id"] == c3["items"][0]["id"] == f"{base}/demo/IE1/manifest-v3.json"
    assert v2["@id"] == c2["manifests"][0]["@id"] == f"{base}/demo/IE1/manifest-v2.json"
    assert (c3["id"], c2["@id"]) == (f"{base}/collections/demo-v3.json", f"{base}/collections/demo-v2.json")
    service_id = f"{service}/demo/IE1/FL~201.tif"
    assert [b["service"][0]["@id"] for b in painted(v3)] == [b["service"]["@id"] for b in painted(v2)] == [service_id]
    assert v3["homepage"][0]["id"] == v2["related"]["@id"] == "https://dam.example.org/delivery/B%C3%BCcher?id=IE1"


def test_the_homepage_leaves_the_source_urls_credentials_out(store):
    """A Rosetta source_url derives from its base_url, which may carry the source's user:password."""
    record = SourceObject(id="IE1", modified=datetime(2026, 1, 1, tzinfo=timezone.utc), items=(),
                          source_url="https://etl:Hunter2-secret@dam.example.org/delivery/IE1?x=1")
    manifests = Manifests(settings(), "demo", store)
    manifests.publish(record, [image(1, object_id="IE1")])
    v3, v2 = deposited(manifests, "IE1")
    assert v3["homepage"][0]["id"] == v2["related"]["@id"] == "https://dam.example.org/delivery/IE1?x=1"
    assert not [path for path in store.root.rglob("*") if path.is_file() and b"Hunter2" in path.read_bytes()]


def test_a_lone_surrogate_in_a_value_goes_out_as_a_replacement_character_with_one_warning(store):
    """JSON's "\\ud83d" (an emoji a DAM cut in two) decodes to a lone surrogate, which UTF-8 cannot write."""
    manifests = Manifests(settings(), "demo", store)
    obj = source_object(**{"dc:title": (LangValue("Mona \ud83d Lisa", "en"),),
                           "dc:creator": (LangValue("Leonardo \udce9"),)})
    published = manifests.publish(obj, [image(1)])
    manifests.update_collection([entry(manifests, obj)])
    v3 = json.loads(store.get_bytes(manifests.manifest_key(obj.id, "3.0")))
    assert v3["label"] == {"en": ["Mona \ufffd Lisa"]}
    assert {"none": ["Leonardo \ufffd"]} in [pair["value"] for pair in v3["metadata"]]
    collection = json.loads(store.get_bytes(manifests.collection_key("3.0")))
    assert [item["label"] for item in collection["items"]] == [{"en": ["Mona \ufffd Lisa"]}]
    assert sorted(w.split(" holds")[0] for w in published.warnings) == ["dc:creator", "dc:title"]


def test_a_source_language_with_digits_goes_out_under_its_nearest_key_which_the_schema_accepts(store):
    """BCP 47 has region and variant subtags of digits (es-419, de-CH-1996) that IIIF 3.0's schema refuses in a
    key: the values keep their language (es, de-CH), with a warning, rather than taking the default one."""
    manifests = Manifests(settings(default_language="en"), "demo", store)
    title = (LangValue("Título", "es-419"), LangValue("Titel", "de-CH-1996"))
    built = [manifests.build(source_object(**{"dc:title": title}), [image(1)], version) for version in ("3.0", "2.1")]
    v3, v2 = (b.document for b in built)
    assert validate(v3).ok and validate(v2).ok, (validate(v3).errors, validate(v2).errors)
    assert v3["label"] == {"es": ["Título"], "de-CH": ["Titel"]}
    assert [(v["@language"], v["@value"]) for v in v2["label"]] == [("es", "Título"), ("de-CH", "Titel")]
    assert built[0].warnings[0] == ("source language 'es-419' has a subtag with digits, which IIIF 3.0 does not "
                                    "accept in a language key (the nearest it accepts: 'es'): its values go out "
                                    "under that")


def test_a_configured_language_with_digits_is_a_config_error_naming_the_key_iiif_accepts():
    with pytest.raises(ConfigError, match=r"manifests\.homepage_label: .*'es-419' has a subtag with digits.*"
                                          r"the nearest it accepts: 'es'"):
        settings(homepage_label={"es-419": "Registro"})
