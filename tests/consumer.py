"""Support for the iipsrv consumer tests: what is deposited, HTTP and image checks, the Image API validator.

The end-to-end tests start from a store filled the way a harvest leaves it: access masters and their IIIF
manifests, plus what the ledger recorded for each image (key, size, SHA-256). `deposit_by_library` builds
that with library calls (convert, store.put, Manifests.publish). It is the one place to change when the
suite moves to `gcis-etl harvest` on the emulated sources: the tests only use the `Deposit` it returns.
"""
from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from PIL import Image

from connectors.base import LangValue, SourceObject
from gcis_etl.cache import CacheSource
from gcis_etl.conversion import convert
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.manifests import DepositedImage, ManifestSettings, Manifests
from gcis_etl.recipes import load_recipe
from gcis_etl.settings import parse
from gcis_etl.stores import Provenance, Store

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
VALIDATOR_ID = "67352ccc-d1b0-11e1-89ae-279075081939"  # the identifier the validator's own server uses
# The validator's test image: the iiif-validator package does not ship it (IIIF/image-validator, Apache-2.0).
VALIDATOR_IMAGE = REPO / "tests" / "iiif_image_validator" / f"{VALIDATOR_ID}.png"
PIPELINE = "e2e"


@dataclass(frozen=True)
class Master:
    object_id: str
    item_id: str
    path: Path
    recipe: str = "ptiff-jpeg-q90"


def masters() -> tuple[Master, ...]:
    """Several tiles per level, a size above 1024 px, grey and wide-gamut inputs, the validator's image as
    PTIFF and as JP2 (the JP2 recipes)."""
    return (
        Master("validator", VALIDATOR_ID, VALIDATOR_IMAGE),
        Master("validator-jp2", VALIDATOR_ID, VALIDATOR_IMAGE, "jp2-openjpeg-lossy"),
        Master("corpus", "kodim02", CORPUS / "rgb8-tiff-lzw" / "kodim02-lzw.tif"),
        Master("corpus", "prophoto", CORPUS / "icc-prophoto" / "test_icc_prophoto.jpg"),
        Master("corpus", "gray", CORPUS / "gray8" / "gray.tif"),
    )


@dataclass(frozen=True)
class Recorded:
    """One deposited access master as the ledger records it."""

    object_id: str
    item_id: str
    key: str
    width: int
    height: int
    sha256: str


@dataclass(frozen=True)
class Deposit:
    store: Store
    source: CacheSource            # what `cache sync` mirrors
    images: tuple[Recorded, ...]
    manifest_keys: tuple[str, ...]
    manifest_base_url: str
    image_service_base_url: str

    def image(self, object_id: str, item_id: str | None = None) -> Recorded:
        return next(i for i in self.images if i.object_id == object_id and item_id in (None, i.item_id))

    def manifest_url(self, key: str) -> str:
        return f"{self.manifest_base_url}/{key}"


def deposit_by_library(store: Store, scratch: Path, manifest_base_url: str, image_service_base_url: str,
                       selection: tuple[Master, ...] | None = None) -> Deposit:
    """Convert, deposit and publish `selection` (default: masters()) the way the pipeline does."""
    settings = parse(ManifestSettings, {"manifest_base_url": manifest_base_url,
                                        "image_service_base_url": image_service_base_url,
                                        "versions": ["3.0", "2.1"]}, "test", "manifests")
    manifests = Manifests(settings, PIPELINE, store)
    recorded: list[Recorded] = []
    by_object: dict[str, list[DepositedImage]] = {}
    with IsolatedProcess() as worker:
        for master in selection or masters():
            recipe = load_recipe(master.recipe)
            output = scratch / f"{master.object_id}-{master.item_id}{recipe.extension}"
            result = convert(master.path, output, recipe, worker=worker)
            assert result.ok, f"{master.path}: {result.reason}"
            key = store.keys.image_key(PIPELINE, master.object_id, master.item_id, 1, recipe.extension[1:])
            store.put(key, output, sha256=result.sha256,
                      provenance=Provenance(source_id=master.item_id, recipe=result.recipe,
                                            recipe_digest=result.recipe_digest, width=result.width,
                                            height=result.height))
            recorded.append(Recorded(master.object_id, master.item_id, key, result.width, result.height,
                                     result.sha256))
            images = by_object.setdefault(master.object_id, [])
            images.append(DepositedImage(len(images) + 1, key, result.width, result.height, master.item_id))
    manifest_keys = []
    for object_id, images in by_object.items():
        obj = SourceObject(id=object_id, modified=datetime(2026, 1, 1, tzinfo=timezone.utc), items=(),
                           metadata={"title": (LangValue(f"e2e {object_id}"),)})
        manifest_keys.extend(s.key for s in manifests.publish(obj, images).stored)
    return Deposit(store, CacheSource(PIPELINE, store, f"{PIPELINE}/"), tuple(recorded), tuple(manifest_keys),
                   settings.manifest_base_url, settings.image_service_base_url)


# ---------------------------------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str, headers: dict[str, str] | None = None, follow: bool = True) -> Response:
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as r:
            return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def wait_logged(access_log: Path, text: str, timeout: float = 10.0) -> None:
    """lighttpd buffers its access log (it writes at least once a second): wait for a request to be there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if access_log.is_file() and text in access_log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {access_log} after {timeout}s")


def jpeg_size(body: bytes) -> tuple[int, int]:
    """The size of a JPEG, decoded in full (a truncated or non-JPEG body fails)."""
    image = Image.open(io.BytesIO(body))
    assert image.format == "JPEG", image.format
    image.load()
    return image.size


def fit(width: int, height: int, box: int) -> tuple[int, int]:
    """`!box,box` without upscaling: the largest size within box x box keeping the aspect ratio."""
    scale = min(1.0, box / width, box / height)
    return round(width * scale), round(height * scale)


# ------------------------------------------------------------------------------------- Image API validator


def image_api_validator(server: str, prefix: str, identifier: str, version: str = "2.0",
                        level: int = 1) -> tuple[list[str], list[str]]:
    """Run the IIIF Image API validator's tests up to `level`: (tests run, failures with their reasons)."""
    from iiif_validator.validator import ImageAPI, TestSuite, ValidationInfo
    tests = TestSuite(ValidationInfo()).list_tests(version)
    ran, failures = [], []
    for name in sorted(tests):
        if tests[name]["level"] > level:
            continue
        ran.append(name)
        result = ImageAPI(identifier, server, prefix, "http", "", version, debug=False)
        try:
            TestSuite(ValidationInfo()).run_test(name, result)
        except Exception as exc:  # the validator's own crash on an unexpected answer is a failure too
            failures.append(f"{name}: {type(exc).__name__}: {exc} ({result.urls})")
            continue
        if result.exception:
            e = result.exception
            failures.append(f"{name}: {e.type}: got {e.got!r}, expected {e.expected!r}: {e.message} ({result.urls})")
    return ran, failures
