"""IIIF Presentation manifests (3.0, and 2.1 where configured) and the per-pipeline Collection.

A manifest is built from the source's descriptive metadata (which source field feeds which IIIF property is
configuration) and the recorded results of the object's deposited images. The same inputs always give the
same bytes: ids derive from configured base URLs and store keys, never from clocks or counters, so depositing
an unchanged manifest again is a no-op for the store.

Identifiers:
- manifest and collection id = ``{manifest_base_url}/{store key}``: the base URL is where the store (below
  its prefix) is published. iiif-prezi3 writes every URL of a 3.0 manifest in its normal form (pydantic's
  AnyUrl: host lower-cased, default port dropped, spaces and non-ASCII percent-encoded), and the other
  documents are plain JSON, so both base URLs must be written in that form (a ConfigError shows it) for
  every document to name the same ids; a source record's URL (the homepage) is written in it everywhere;
- canvas, annotation page and annotation ids = the manifest id without ``.json``, then ``/canvas/{sequence}``,
  ``/page/{sequence}``, ``/annotation/{sequence}``;
- image service id = ``{image_service_base_url}/{identifier}`` where the identifier is the access master's
  store key (relative to the store prefix: the iipsrv cache mirrors the store below it, so for iipsrv 1.1 it
  is the file name relative to FILESYSTEM_PREFIX), with its ``/`` kept literal. The Image API asks for them
  as ``%2F``, but iipsrv 1.1 decodes the identifier and answers with a literal ``/`` in info.json's ``@id``;
  clients and the IIIF validator require that ``@id`` to equal the service id, so the manifests say what the
  server says. Keys only contain URL-unreserved characters otherwise (see keys.py).

Sizes: the painted image (the annotation body) and the thumbnails are Image API 2 URLs of that service, each
declaring the size iipsrv returns for it. An image at its full size is asked for as ``full``; any other size as
``w,h``, which iipsrv 1.1 renders exactly with ALLOW_UPSCALING on (`cache.server.allow_upscaling`, on by
default for this reason; the manifests never ask for more than the full size, so nothing they show is
upscaled). With it off, iipsrv caps the width at that of the pyramid level it picks by the height (a
9998x3334 master at ``5000,1667`` comes out 4999x1667); ``w,`` goes through a float ratio whatever the setting
(803x601 at ``400,`` comes out 399x299, 650x10 390x6), and ``!w,h`` depends on the level read. iipsrv also
renders nothing wider or taller than its MAX_CVT (`max_image_size`, by default config.yaml's
`cache.server.max_cvt`): asked for more, it scales the image down without saying so, so a body or thumbnail
beyond that limit asks for the largest size within it. A thumbnail's longer side is at most
`thumbnail_width` (a scroll's thumbnail is as small as a landscape's). The canvas and the image service keep
the master's full size.

3.0 manifests are built with iiif-prezi3 (the IIIF community's library, which checks them against its model of
the schema as they are built). It has no 2.x model and the older iiif-prezi factory is built for authoring by
hand, so 2.1 manifests are plain JSON, as are collections (a list of references that can grow to millions).
Every manifest is checked by iiif_validation before it is deposited; of a collection, its envelope and the
entries a run adds (update_collection).

What building a manifest changes or leaves out of what the source said (a source URL that is no http(s) URL, a
broken character, a source language that is no tag) does not stop it: it is returned with the manifest as its
warnings (like iiif_validation's, never logged here), for the harvest to log and record with the object.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterable, Literal, Sequence
from urllib.parse import quote, urlsplit

from pydantic import AfterValidator, AnyUrl, Field, ValidationError, field_validator

from connectors.base import LangValue, SourceObject
from gcis_etl.errors import ManifestError
from gcis_etl.iiif_validation import CONTEXT_2, CONTEXT_3, IMAGE_CONTEXT_2, require_valid
from gcis_etl.languages import LANGUAGE, DigitSubtag, language_tag
from gcis_etl.settings import Settings, redacted
from gcis_etl.stores import Provenance, Store, StoredObject

Version = Literal["3.0", "2.1"]
MEDIA_TYPES = {"3.0": f'application/ld+json;profile="{CONTEXT_3}"',
               "2.1": f'application/ld+json;profile="{CONTEXT_2}"'}
IMAGE_2_LEVEL1 = "http://iiif.io/api/image/2/level1.json"  # iipsrv 1.1: Image API 2, level 1
# a rights URI the IIIF schema accepts, in URL-unreserved characters: what is not one is text
_RIGHTS = re.compile(r"https?://(creativecommons\.org/(licenses|publicdomain)/|rightsstatements\.org/vocab/)"
                     r"[A-Za-z0-9._~/-]+")

_HTTP_URL = re.compile(r"https?://[^/?#]", re.IGNORECASE)  # and a host (normal_url would make one of http:/x)
_SURROGATE = re.compile("[\ud800-\udfff]")


def normal_url(url: str) -> str | None:
    """`url` as iiif-prezi3 writes it into a 3.0 manifest (see Identifiers above); None if it is no URL."""
    try:
        return str(AnyUrl(url))
    except ValidationError:
        return None


def _label_languages(label: str | dict[str, str]) -> str | dict[str, str]:
    """A configured label's languages as language_tag() reads them; one that is no tag is a configuration error."""
    if isinstance(label, str):
        return label
    tags = {}
    for language, text in label.items():
        if (tag := language_tag(language)) is None:
            raise ValueError(f"{language!r} is not a language tag such as en or en-US (none: no language)")
        tags[tag] = text
    return tags


# a plain label, or one per language {"en": "Creator", "fr": "Créateur"}
LabelSetting = Annotated[str | dict[str, str], AfterValidator(_label_languages)]


class MetadataField(Settings):
    """A source field shown under a label."""

    field: str = Field(min_length=1)
    label: LabelSetting


class ManifestSettings(Settings):
    """What goes into the manifests of a pipeline, and where they are published."""

    manifest_base_url: str
    image_service_base_url: str
    versions: tuple[Version, ...] = ("3.0",)
    label: tuple[str, ...] = ("title",)            # source fields tried in order; the object id otherwise
    summary: tuple[str, ...] = ()
    metadata: tuple[MetadataField, ...] = ()
    rights: MetadataField | None = None            # a rights URI becomes `rights`; other text, a metadata entry
    required_statement: MetadataField | None = None  # e.g. the credit line
    homepage_label: LabelSetting | None = "Source record"  # a homepage to SourceObject.source_url; None: none
    default_language: str = Field("none", pattern=LANGUAGE.pattern)  # for values the source gives no language
    thumbnail_width: int = Field(400, ge=16, le=2000)  # the longer side of a thumbnail
    max_image_size: int | None = Field(None, ge=1, description="the largest width or height the image server "
                                       "renders (iipsrv MAX_CVT); unset: config.yaml's cache.server.max_cvt")
    collection_label: LabelSetting | None = None   # the pipeline name otherwise

    @field_validator("manifest_base_url", "image_service_base_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        """Both go into every manifest and collection, published: a password there would be public. Written
        other than in its normal form, the 3.0 manifests would name other URLs than the rest (module docstring)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be an http(s) URL without query or fragment")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (user:password@): it is published in every manifest")
        url = url.rstrip("/")
        normal = normal_url(url + "/")
        if normal is None:
            raise ValueError(f"{url!r} is not a URL")
        if normal != url + "/":
            raise ValueError(f"write it as {normal.rstrip('/')!r}: IIIF 3.0 manifests carry URLs in that normal "
                             f"form (host in lower case, no default port, spaces and non-ASCII "
                             f"percent-encoded), and every document must name the same")
        return url

    @field_validator("versions")
    @classmethod
    def _versions(cls, versions: tuple[str, ...]) -> tuple[str, ...]:
        if not versions or len(set(versions)) != len(versions):
            raise ValueError("list each of 3.0 and 2.1 at most once, and at least one of them")
        return versions


@dataclass(frozen=True)
class DepositedImage:
    """One access master as recorded after its deposit: what its canvas needs."""

    sequence: int
    key: str           # store key of the access master (what iipsrv serves)
    width: int
    height: int
    label: str | None = None


@dataclass(frozen=True)
class ImageRequest:
    """An Image API request for a whole image at one size, and the size the image server renders for it."""

    id: str
    width: int
    height: int


@dataclass(frozen=True)
class CollectionEntry:
    """A manifest as the collection lists it."""

    object_id: str
    label: tuple[LangValue, ...]


@dataclass(frozen=True)
class Built:
    """A manifest as a JSON-ready dict (not yet validated), and what building it warned of."""

    document: dict
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Published:
    """What the run logs and records of an object's deposited manifests (the collection lists it from the ledger)."""

    warnings: tuple[str, ...] = ()    # of all its versions, each once


def _major(version: str) -> int:
    return int(version[0])


class Manifests:
    """Builds, validates and deposits the manifests and the collection of one pipeline."""

    def __init__(self, settings: ManifestSettings, pipeline: str, store: Store):
        self.settings = settings
        self.pipeline = pipeline
        self.store = store
        # of the manifest being built, each once, in order (build starts them afresh; what the collection's
        # labels would add was said with their manifests)
        self._warnings: dict[str, None] = {}

    # ------------------------------------------------------------------------------------------ ids

    def manifest_key(self, object_id: str, version: str) -> str:
        return self.store.keys.manifest_key(self.pipeline, object_id, _major(version))

    def collection_key(self, version: str) -> str:
        return self.store.keys.collection_key(self.pipeline, _major(version))

    def manifest_id(self, object_id: str, version: str) -> str:
        return f"{self.settings.manifest_base_url}/{self.manifest_key(object_id, version)}"

    def image_service_id(self, image: DepositedImage) -> str:
        return f"{self.settings.image_service_base_url}/{quote(image.key, safe='/')}"

    # ------------------------------------------------------------------------------------------ content

    def _values(self, obj: SourceObject, field: str) -> tuple[LangValue, ...]:
        """The field's non-blank values. A lone UTF-16 surrogate (JSON's "\\ud83d" of an emoji cut in two by a
        DAM, or a filename byte that is not UTF-8) is no character and cannot be written as UTF-8: it becomes
        U+FFFD, with a warning, rather than stopping the object's manifests."""
        values = []
        for value in obj.metadata.get(field, ()):
            if not value.value.strip():
                continue
            text = _SURROGATE.sub("\ufffd", value.value)
            if text != value.value:
                self._warnings[f"{field} holds a broken character (a lone UTF-16 surrogate), written as U+FFFD: "
                               f"{value.value!r}"] = None
            values.append(LangValue(text, value.language) if text != value.value else value)
        return tuple(values)

    def _first(self, obj: SourceObject, fields: Iterable[str]) -> tuple[LangValue, ...]:
        """The values of the first of `fields` the source filled in."""
        return next((values for values in (self._values(obj, f) for f in fields) if values), ())

    def label_of(self, obj: SourceObject) -> tuple[LangValue, ...]:
        return self._first(obj, self.settings.label) or (LangValue(obj.id),)

    def _rights(self, obj: SourceObject) -> tuple[str | None, tuple[LangValue, ...]]:
        """The first rights URI (in the http form the IIIF schema requires), and the other values for the rights
        metadata entry: text, and any further URI (`rights` holds one), so nothing the source says is lost."""
        if self.settings.rights is None:
            return None, ()
        values = self._values(obj, self.settings.rights.field)
        first = next((i for i, v in enumerate(values) if _RIGHTS.fullmatch(v.value.strip())), None)
        if first is None:
            return None, values
        return values[first].value.strip().replace("https://", "http://", 1), values[:first] + values[first + 1:]

    def _metadata_pairs(self, obj: SourceObject) -> list[tuple[LabelSetting, tuple[LangValue, ...]]]:
        pairs = [(m.label, values) for m in self.settings.metadata if (values := self._values(obj, m.field))]
        _, other_rights = self._rights(obj)
        if other_rights:
            pairs.append((self.settings.rights.label, other_rights))
        return pairs

    def _credit(self, obj: SourceObject) -> tuple[LangValue, ...]:
        statement = self.settings.required_statement
        return self._values(obj, statement.field) if statement else ()

    def _homepage(self, obj: SourceObject) -> str | None:
        """The source record's URL in its normal form, so that 3.0 and 2.1 say the same, and without its
        user:password (a source URL may derive from a base_url that carries the source's credentials): the
        manifest is public. A source URL that is none is left out with a warning: an optional link must not
        keep the object's manifests out."""
        url = obj.source_url
        if self.settings.homepage_label is None or not url:
            return None
        normal = normal_url(url)
        if normal is None or not _HTTP_URL.match(url) or not url.isprintable() or " " in url:
            self._warnings[f"source URL {redacted(url)!r} is not an http(s) URL: the manifests go out without the "
                           f"link to the source record"] = None
            return None
        parts = urlsplit(normal)
        return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()

    def _language(self, value: LangValue) -> str:
        """The value's language as language_tag() reads it, or the configured default: for none, and for one
        that is no tag (with a warning; a tag with digits, es-419, goes under its nearest key, es), so that 3.0 and
        2.1 say the same and a source's stray tag never stops an object's manifests."""
        try:
            return language_tag(value.language) or self.settings.default_language
        except DigitSubtag as exc:
            self._warnings[f"source language {exc}: its values go out under that"] = None
            return exc.nearest
        except ValueError as exc:
            self._warnings[f"source language {exc}: its values go out under manifests.default_language "
                           f"{self.settings.default_language!r}"] = None
            return self.settings.default_language

    # --------------------------------------------------------------------------------------- building

    def build(self, obj: SourceObject, images: Sequence[DepositedImage], version: str) -> Built:
        """The manifest of `obj` in `version`, and what building it warned of."""
        self._warnings = {}
        return Built(self._document(obj, images, version), tuple(self._warnings))

    def _document(self, obj: SourceObject, images: Sequence[DepositedImage], version: str) -> dict:
        ordered = sorted(images, key=lambda i: i.sequence)
        where = f"{self.pipeline}/{obj.id}"
        if not ordered:
            raise ManifestError(f"{where}: no deposited image, a manifest needs at least one canvas")
        if len({i.sequence for i in ordered}) != len(ordered):
            raise ManifestError(f"{where}: two images share a sequence number: {[i.sequence for i in ordered]}")
        for image in ordered:
            if image.width <= 0 or image.height <= 0:
                raise ManifestError(f"{where}: image {image.key} has no real size ({image.width}x{image.height})")
        if version == "2.1":
            return self._build_2(obj, ordered, self.manifest_id(obj.id, version))
        try:
            return self._build_3(obj, ordered, self.manifest_id(obj.id, version))
        except ValidationError as exc:  # iiif-prezi3 checks each resource as it is built
            error = exc.errors()[0]
            raise ManifestError(f"{where}: not a valid IIIF Presentation 3.0 {exc.title}: "
                                f"{'.'.join(map(str, error['loc']))}: {error['msg']} "
                                f"(got {error.get('input')!r})") from None

    def _lang_map(self, values: Iterable[LangValue], *, html_allowed: bool) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for v in values:
            out.setdefault(self._language(v), []).append(_as_text(v.value, html_allowed))
        return out

    def _label_map(self, label: LabelSetting) -> dict[str, list[str]]:
        if isinstance(label, str):
            return {"none": [_as_text(label, html_allowed=False)]}
        return {language: [_as_text(text, html_allowed=False)] for language, text in label.items()}

    def _request(self, image: DepositedImage, longest: int | None = None) -> ImageRequest:
        """`image` at its full size, or at the largest size with no side beyond `longest` nor max_image_size (None:
        no limit known, for settings not read through config.yaml), asked for as the module docstring says
        iipsrv renders exactly."""
        width, height = image.width, image.height
        limit = min((n for n in (longest, self.settings.max_image_size) if n is not None), default=None)
        if limit is not None and max(width, height) > limit:
            if width >= height:
                width, height = limit, max(1, round(image.height * limit / image.width))
            else:
                width, height = max(1, round(image.width * limit / image.height)), limit
        size = "full" if (width, height) == (image.width, image.height) else f"{width},{height}"
        return ImageRequest(f"{self.image_service_id(image)}/full/{size}/0/default.jpg", width, height)

    def _painted(self, image: DepositedImage) -> ImageRequest:
        return self._request(image)

    def _thumbnail(self, image: DepositedImage) -> ImageRequest:
        return self._request(image, self.settings.thumbnail_width)

    def _build_3(self, obj: SourceObject, images: list[DepositedImage], manifest_id: str) -> dict:
        # Imported here: building iiif_prezi3's models takes ~0.5 s, which every command that writes no v3
        # manifest (status, report, verify) would otherwise pay at start-up.
        from iiif_prezi3 import Annotation, AnnotationPage, Canvas, Homepage, KeyValueString, Manifest
        base = manifest_id.removesuffix(".json")
        canvases = []
        for image in images:
            canvas_id = f"{base}/canvas/{image.sequence}"
            annotation = Annotation(id=f"{base}/annotation/{image.sequence}", motivation="painting",
                                    body=self._image_3(image, self._painted(image)), target=canvas_id)
            label = self._lang_map([LangValue(image.label or str(image.sequence))], html_allowed=False)
            canvases.append(Canvas(
                id=canvas_id, label=label, width=image.width, height=image.height,
                thumbnail=[self._image_3(image, self._thumbnail(image))],
                items=[AnnotationPage(id=f"{base}/page/{image.sequence}", items=[annotation])]))

        rights, _ = self._rights(obj)
        extra: dict[str, Any] = {}
        if summary := self._first(obj, self.settings.summary):
            extra["summary"] = self._lang_map(summary, html_allowed=True)
        if pairs := self._metadata_pairs(obj):
            extra["metadata"] = [KeyValueString(label=self._label_map(label),
                                                value=self._lang_map(values, html_allowed=True))
                                 for label, values in pairs]
        if rights:
            extra["rights"] = rights
        if credit := self._credit(obj):
            extra["requiredStatement"] = KeyValueString(label=self._label_map(self.settings.required_statement.label),
                                                        value=self._lang_map(credit, html_allowed=True))
        if homepage := self._homepage(obj):
            extra["homepage"] = [Homepage(id=homepage, type="Text", format="text/html",
                                          label=self._label_map(self.settings.homepage_label))]
        manifest = Manifest(id=manifest_id, label=self._lang_map(self.label_of(obj), html_allowed=False),
                            thumbnail=[self._image_3(images[0], self._thumbnail(images[0]))], items=canvases,
                            **extra)
        return json.loads(manifest.jsonld())

    def _image_3(self, image: DepositedImage, request: ImageRequest):
        """A v3 image body: `request` of `image`, with the image's service (iiif_prezi3 imported as in _build_3)."""
        from iiif_prezi3 import AnnotationBody, ServiceV2
        return AnnotationBody(id=request.id, type="Image", format="image/jpeg", width=request.width,
                              height=request.height,
                              service=[ServiceV2(id=self.image_service_id(image), type="ImageService2",
                                                 profile=IMAGE_2_LEVEL1)])

    def _values_2(self, values: Iterable[LangValue], *, html_allowed: bool) -> Any:
        """A 2.1 value: a string, or a list of strings and {"@value", "@language"} objects."""
        out = [_as_text(v.value, html_allowed) if self._language(v) == "none" else
               {"@value": _as_text(v.value, html_allowed), "@language": self._language(v)} for v in values]
        return out[0] if len(out) == 1 and isinstance(out[0], str) else out

    def _label_2(self, label: LabelSetting) -> Any:
        if isinstance(label, str):
            return _as_text(label, html_allowed=False)
        return [{"@value": _as_text(text, html_allowed=False), "@language": language}
                for language, text in label.items()]

    def _service_2(self, image: DepositedImage) -> dict:
        return {"@context": IMAGE_CONTEXT_2, "@id": self.image_service_id(image), "profile": IMAGE_2_LEVEL1}

    def _build_2(self, obj: SourceObject, images: list[DepositedImage], manifest_id: str) -> dict:
        base = manifest_id.removesuffix(".json")
        canvases = []
        for image in images:
            canvas_id = f"{base}/canvas/{image.sequence}"
            painted = self._painted(image)
            canvases.append({
                "@id": canvas_id, "@type": "sc:Canvas",
                "label": _as_text(image.label or str(image.sequence), html_allowed=False),
                "width": image.width, "height": image.height, "thumbnail": self._thumbnail_2(image),
                "images": [{
                    "@id": f"{base}/annotation/{image.sequence}", "@type": "oa:Annotation",
                    "motivation": "sc:painting", "on": canvas_id,
                    "resource": {"@id": painted.id, "@type": "dctypes:Image", "format": "image/jpeg",
                                 "width": painted.width, "height": painted.height,
                                 "service": self._service_2(image)}}]})
        manifest: dict[str, Any] = {"@context": CONTEXT_2, "@id": manifest_id, "@type": "sc:Manifest",
                                    "label": self._values_2(self.label_of(obj), html_allowed=False)}
        if summary := self._first(obj, self.settings.summary):
            manifest["description"] = self._values_2(summary, html_allowed=True)
        if pairs := self._metadata_pairs(obj):
            manifest["metadata"] = [{"label": self._label_2(label), "value": self._values_2(values, html_allowed=True)}
                                    for label, values in pairs]
        rights, _ = self._rights(obj)
        if rights:
            manifest["license"] = rights
        if credit := self._credit(obj):
            manifest["attribution"] = self._values_2(credit, html_allowed=True)
        if homepage := self._homepage(obj):
            manifest["related"] = {"@id": homepage, "format": "text/html",
                                   "label": self._label_2(self.settings.homepage_label)}
        manifest["thumbnail"] = self._thumbnail_2(images[0])
        manifest["sequences"] = [{"@id": f"{base}/sequence/normal", "@type": "sc:Sequence", "canvases": canvases}]
        return manifest

    def _thumbnail_2(self, image: DepositedImage) -> dict:
        thumbnail = self._thumbnail(image)
        return {"@id": thumbnail.id, "@type": "dctypes:Image", "format": "image/jpeg", "width": thumbnail.width,
                "height": thumbnail.height, "service": self._service_2(image)}

    # ------------------------------------------------------------------------------------ depositing

    def _validated(self, key: str, document: dict) -> bytes:
        """The bytes to deposit under `key`; ManifestError naming the key and the problems if invalid."""
        require_valid(document, self.store.describe(key))
        return _serialised(document)

    def publish(self, obj: SourceObject, images: Sequence[DepositedImage]) -> Published:
        """Build, validate and deposit every configured version; nothing is deposited if any is invalid."""
        keys = {v: self.manifest_key(obj.id, v) for v in self.settings.versions}
        built = {v: self.build(obj, images, v) for v in self.settings.versions}
        payloads = {v: self._validated(keys[v], b.document) for v, b in built.items()}
        for v, data in payloads.items():
            self.store.put_bytes(keys[v], data, content_type=MEDIA_TYPES[v], provenance=Provenance(source_id=obj.id))
        return Published(tuple(dict.fromkeys(w for b in built.values() for w in b.warnings)))

    def withdraw(self, object_id: str) -> list[str]:
        """Delete the manifests of an object (its images are the pipeline's business); returns the keys removed."""
        keys = [self.manifest_key(object_id, v) for v in self.settings.versions]
        return [key for key in keys if self.store.delete(key)]

    def update_collection(self, added: Iterable[CollectionEntry] = (), removed: Iterable[str] = (),
                          published: Callable[[], Iterable[CollectionEntry]] | None = None,
                          noted: Callable[[str], None] | None = None) -> list[StoredObject]:
        """Add (or relabel) and remove manifests in the pipeline's collection, in every configured version.

        A read-modify-write of the deposited collection: run it from one process per pipeline at a time (the
        pipeline's run lock), not from parallel workers. The entries added are checked in every version before
        anything is deposited; the entries read back are kept as deposited, checked when they were written
        (validating them again took ~0.8 ms of CPU per listed object in every run). A deposited collection that
        is missing or no JSON (deleted, expired, a store restored without it, a changed store.keys.collection) is
        written again from `published` (every object whose manifests are deposited, as the ledger records them),
        not from the entries added alone, which listed only the objects of the run; `noted` hears that it was.
        """
        added, removed = list(added), list(removed)
        new = {version: {self.manifest_id(e.object_id, version): self._collection_item(e, version) for e in added}
               for version in self.settings.versions}
        for version, items in new.items():
            self._check_added(self.collection_key(version), version, items)
        stored, changed = [], [e.object_id for e in added] + removed
        for version, items in new.items():
            key = self.collection_key(version)
            deposited = self._listed(key, version)
            if isinstance(deposited, str):
                deposited = self._rebuilt(key, version, deposited, published, set(items), noted)
            listed = self._without(deposited, changed, version) | items
            data = _serialised(self.collection(version, [listed[i] for i in sorted(listed)]))
            stored.append(self.store.put_bytes(key, data, content_type=MEDIA_TYPES[version],
                                               provenance=Provenance(source_id=self.pipeline)))
        return stored

    def _without(self, listed: dict[str, dict], object_ids: list[str], version: str) -> dict[str, dict]:
        """`listed` without the entries of `object_ids`, also those published under a manifest_base_url
        configured before: without that, a base URL changed (a new domain) left each object in the collection
        twice, once under each base, as its manifest was published again."""
        keys = {self.manifest_key(object_id, version) for object_id in object_ids}
        base = f"{self.settings.manifest_base_url}/"

        def of_these(manifest_id: str) -> bool:
            if manifest_id.startswith(base):
                return manifest_id[len(base):] in keys
            # under an earlier base, the manifest's key is what follows one of the id's slashes
            return any(manifest_id[i + 1:] in keys for i, c in enumerate(manifest_id) if c == "/")
        return {manifest_id: item for manifest_id, item in listed.items() if not of_these(manifest_id)}

    def _check_added(self, key: str, version: str, items: dict[str, dict]) -> None:
        """ManifestError naming `key` if the collection's envelope or an entry added is invalid: all are checked
        in one document (the validator's cost is per entry, plus ~2 ms per call), and only when that fails one
        by one, to name the entry at fault."""
        where = self.store.describe(key)
        try:
            require_valid(self.collection(version, list(items.values())), where)
        except ManifestError:
            require_valid(self.collection(version, []), where)
            for manifest_id, item in items.items():
                require_valid(self.collection(version, [item]), f"{where}: the entry of {manifest_id}")
            raise

    def _listed(self, key: str, version: str) -> dict[str, dict] | str:
        """The items of the deposited collection, by manifest id; why there are none to read (missing, no JSON)."""
        if not self.store.exists(key):
            return "missing"
        data = self.store.get_bytes(key)
        try:
            document = json.loads(data)
        except ValueError as exc:  # damage (a truncated or overwritten document): ours to write again
            return f"not JSON ({exc})"
        try:
            return collection_items(document, version)
        except (KeyError, TypeError) as exc:  # JSON of another's making: not ours to overwrite
            raise ManifestError(f"{self.store.describe(key)}: the deposited collection cannot be read "
                                f"({type(exc).__name__}: {exc}); it was left as it is") from None

    def _rebuilt(self, key: str, version: str, why: str, published: Callable[[], Iterable[CollectionEntry]] | None,
                 added: set[str], noted: Callable[[str], None] | None) -> dict[str, dict]:
        """The entries of every object `published` lists whose manifest of `version` is in the store, for a
        collection `why` has none to read back: an object published before `version` was configured has none
        (one HEAD an object not `added`, on this rare path only). A new collection lists only what is added; one
        that is no JSON, or that listed objects besides those `added`, was lost, which `noted` hears (the harvest
        logs it, and notes it in its report)."""
        items = {}
        for entry in published() if published else ():
            manifest_id = self.manifest_id(entry.object_id, version)
            if manifest_id in added or self.store.exists(self.manifest_key(entry.object_id, version)):
                items[manifest_id] = self._collection_item(entry, version)
        lost = len(items.keys() - added)
        if lost or why != "missing":
            message = (f"{self.store.describe(key)}: the deposited collection was {why}: written again with the "
                       f"{len(items)} objects the ledger records as published whose manifest of this version is "
                       f"deposited ({lost} besides this run's)")
            if noted:
                noted(message)
        return items

    def _collection_item(self, entry: CollectionEntry, version: str) -> dict:
        manifest_id = self.manifest_id(entry.object_id, version)
        if version == "3.0":
            return {"id": manifest_id, "type": "Manifest", "label": self._lang_map(entry.label, html_allowed=False)}
        return {"@id": manifest_id, "@type": "sc:Manifest", "label": self._values_2(entry.label, html_allowed=False)}

    def collection(self, version: str, items: list[dict]) -> dict:
        collection_id = f"{self.settings.manifest_base_url}/{self.collection_key(version)}"
        label = self.settings.collection_label or self.pipeline
        if version == "3.0":
            return {"@context": CONTEXT_3, "id": collection_id, "type": "Collection",
                    "label": self._label_map(label), "items": items}
        return {"@context": CONTEXT_2, "@id": collection_id, "@type": "sc:Collection",
                "label": self._label_2(label), "manifests": items}


def collection_items(document: Any, version: str) -> dict[str, dict]:
    """A deposited collection's entries by manifest id (KeyError or TypeError: it is not one of ours)."""
    items_name, id_name = ("items", "id") if version == "3.0" else ("manifests", "@id")
    return {item[id_name]: item for item in document[items_name]}


def painted_images(document: Any, version: str) -> list[tuple[str, int, int]]:
    """What a deposited manifest's canvases show, in order: (image service id, width, height); KeyError,
    IndexError or TypeError: it is not one of ours."""
    if version == "3.0":
        return [(c["items"][0]["items"][0]["body"]["service"][0]["@id"], c["width"], c["height"])
                for c in document["items"]]
    return [(c["images"][0]["resource"]["service"]["@id"], c["width"], c["height"])
            for c in document["sequences"][0]["canvases"]]


def _serialised(document: dict) -> bytes:
    return json.dumps(document, ensure_ascii=False, indent=2).encode("utf-8") + b"\n"


def _as_text(value: str, html_allowed: bool) -> str:
    """`value` written so that IIIF clients show it as given. Where HTML is allowed (summary/description, metadata
    values, requiredStatement/attribution), text with a '<', '>' or '&' is escaped in a span: 3.0 clients read a
    value that starts with '<' and ends with '>' as HTML, a 2.1 value "MAY contain" HTML anywhere, and Mirador 4
    reads every such value as HTML in both versions ("Curator <Test> & Co" showed as "Curator & Co"); the span
    reads right under every rule. Labels must be plain text (2.1 validators refuse markup there), so a label that
    reads as HTML gets the trailing space both specifications recommend instead ("HTML Markup in Property
    Values")."""
    if html_allowed:
        return f"<span>{html.escape(value, quote=False)}</span>" if any(c in value for c in "<>&") else value
    return value + " " if value.startswith("<") and value.endswith(">") else value
