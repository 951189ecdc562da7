"""Validation of IIIF Presentation documents before they are deposited: errors and warnings, never prints.

3.0: the official JSON Schema of the IIIF Presentation Validator (bundled as schemas/iiif_3_0.json), checked
with jsonschema's Draft 7 validator as the official validator does. Where the schema offers alternatives
(oneOf/anyOf), the error reported is the one from the alternative written for the resource's own `type`,
so the message names the property that is wrong rather than "is not valid under any of the given schemas".

2.1 (and 2.0): no official JSON Schema exists; the official validator reads the document with iiif-prezi's
ManifestReader (structure, required properties, HTTP(S) identifiers, types, integer dimensions, viewing
directions and hints, startCanvas, language values, HTML safety), serialises it again, and expands it as
JSON-LD. The same calls are made here, with the JSON-LD contexts served from bundled copies (never fetched).
One check is added because the reader lets it through (official error fixture 34): an image on a canvas must
be painted (motivation "sc:painting").
"""
from __future__ import annotations

import copy
import io
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from iiif_prezi.factory import ManifestFactory
from iiif_prezi.loader import ManifestReader
from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError
from pyld import jsonld

from gcis_etl.errors import ManifestError

CONTEXT_3 = "http://iiif.io/api/presentation/3/context.json"
CONTEXT_2 = "http://iiif.io/api/presentation/2/context.json"
IMAGE_CONTEXT_2 = "http://iiif.io/api/image/2/context.json"
_BUNDLED_CONTEXTS = {CONTEXT_2: "presentation-2-context.json", IMAGE_CONTEXT_2: "image-2-context.json"}
_MAX_MESSAGE = 300


@dataclass(frozen=True)
class ValidationReport:
    version: str | None           # "3.0", "2.1", or None when the document says neither
    errors: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


def validate(document: Any, version: str | None = None) -> ValidationReport:
    """Validate a IIIF Presentation 3.0 or 2.x document (parsed JSON, or JSON text) as `version` ("3.0",
    "2.1"; "2.0" is read as 2.1), or as the version its @context names."""
    if isinstance(document, (str, bytes)):
        try:
            document = json.loads(document)
        except ValueError as exc:
            return ValidationReport(None, (f"not JSON: {exc}",))
    if not isinstance(document, dict):
        return ValidationReport(None, (f"not a JSON object but a {type(document).__name__}",))
    contexts = document.get("@context")
    contexts = contexts if isinstance(contexts, list) else [contexts]
    if version == "3.0" or (version is None and CONTEXT_3 in contexts):
        return _validate_3(document)
    if version in ("2.0", "2.1") or (version is None and CONTEXT_2 in contexts):
        return _validate_2(document)
    if version is not None:
        raise ValueError(f"unknown IIIF Presentation version {version!r}")
    return ValidationReport(None, (f"@context {document.get('@context')!r} is neither IIIF Presentation 3 "
                                   f"({CONTEXT_3}) nor 2 ({CONTEXT_2})",))


def require_valid(document: Any, what: str) -> ValidationReport:
    """The report of a valid document; ManifestError naming `what` and every problem otherwise."""
    report = validate(document)
    if not report.ok:
        version = f"IIIF Presentation {report.version}" if report.version else "IIIF Presentation"
        raise ManifestError(f"{what}: not a valid {version} document: " + "; ".join(report.errors))
    return report


def _bundled(name: str) -> Any:
    return json.loads(resources.files("gcis_etl").joinpath("schemas", name).read_text(encoding="utf-8"))


@cache
def _schema_3() -> Draft7Validator:
    return Draft7Validator(_bundled("iiif_3_0.json"))


def _validate_3(document: dict) -> ValidationReport:
    messages: list[str] = []
    for error in _schema_3().iter_errors(document):
        for cause in _causes(error):
            where = "/" + "/".join(str(p) for p in cause.absolute_path)
            message = f"{where}: {_short(cause.message)}"
            if message not in messages:
                messages.append(message)
    return ValidationReport("3.0", tuple(messages))


def _causes(error: ValidationError) -> list[ValidationError]:
    """Follow oneOf/anyOf into the alternative whose `type` matches the resource (fewest errors wins)."""
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    relevant = [subs for subs in branches.values() if not any(list(s.relative_path) == ["type"] for s in subs)]
    if not relevant:
        return [error]
    return [cause for sub in min(relevant, key=len) for cause in _causes(sub)]


def _short(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def _load_context(url: str, options: Any = None) -> dict:
    if url not in _BUNDLED_CONTEXTS:
        raise ValueError(f"JSON-LD context {url} is not bundled with gcis-etl (contexts are never fetched)")
    return {"contextUrl": None, "documentUrl": url, "document": _bundled(_BUNDLED_CONTEXTS[url])}


def _validate_2(document: dict) -> ValidationReport:
    reader = ManifestReader(document, version="2.1")
    errors = []
    try:
        reader.getVersion(document)
        reader.factory = _factory_2(reader)
        resource = reader.readObject(copy.deepcopy(document))
        jsonld.expand(copy.deepcopy(document), {"documentLoader": _load_context})
        resource.toJSON()
    except jsonld.JsonLdError as exc:
        errors.append(_short(f"JSON-LD: {exc.code or exc.type}: {exc.__cause__ or exc.details}"))
    except Exception as exc:  # the reader signals every problem with an exception, as the validator expects
        errors.append(_short(f"{type(exc).__name__}: {exc}"))
    errors.extend(_unpainted_images(document))
    return ValidationReport("2.1", tuple(errors), tuple(w.strip() for w in reader.get_warnings()))


@cache
def _prototype_factory_2() -> ManifestFactory:
    return ManifestFactory(version="2.1")


def _factory_2(reader: ManifestReader) -> ManifestFactory:
    """What reader.buildFactory("2.1") makes, without the shell (`which identify`) that every ManifestFactory
    runs when it is built: a copy of one built once, writing its warnings into the reader's own stream."""
    factory = copy.copy(_prototype_factory_2())
    reader.debug_stream = io.StringIO()
    factory.set_debug("warn")
    factory.set_debug_stream(reader.debug_stream)
    return factory


def _unpainted_images(document: dict) -> list[str]:
    found = []
    for s, sequence in enumerate(_dicts(document.get("sequences"))):
        for c, canvas in enumerate(_dicts(sequence.get("canvases"))):
            for i, annotation in enumerate(_dicts(canvas.get("images"))):
                if annotation.get("motivation") != "sc:painting":
                    found.append(f"/sequences/{s}/canvases/{c}/images/{i}: motivation must be 'sc:painting', "
                                 f"got {annotation.get('motivation')!r}")
    return found


def _dicts(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
