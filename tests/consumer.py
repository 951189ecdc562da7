"""Support for the iipsrv consumer tests: what a harvest deposits, HTTP and image checks, the Image API validator.

The end-to-end tests start from what `gcis-etl harvest` leaves after a run over the emulated Rosetta: access
masters and IIIF manifests in MinIO, and what the ledger recorded for each image (key, size, SHA-256).
`deposit_by_harvest` runs that harvest (tests/harvests.py is the rig) and returns it as a `Deposit`.
"""
from __future__ import annotations

import io
import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image

from gcis_etl.config import load_config
from gcis_etl.stores import Store
from tests.emulators.catalogue import CorpusFile
from tests.emulators.rosetta import RosettaCatalogue, RosettaEmulator, RosettaFile
from tests.harvests import (GeneratedFile, Rig, ie, rosetta_expected, rosetta_listing, rosetta_source,
                            serving)

REPO = Path(__file__).resolve().parents[1]
VALIDATOR_ID = "67352ccc-d1b0-11e1-89ae-279075081939"  # the identifier the validator's own server uses
# The validator's test image: the iiif-validator package does not ship it (IIIF/image-validator, Apache-2.0).
VALIDATOR_IMAGE = REPO / "tests" / "iiif_image_validator" / f"{VALIDATOR_ID}.png"


@dataclass(frozen=True)
class Pipeline:
    """A pipeline of the harvest: one recipe, fed by one OAI set of the emulated Rosetta."""

    name: str
    oai_set: str
    recipe: str
    extension: str  # of the recipe's access masters


PIPELINES = (Pipeline("e2e", "gcis", "ptiff-jpeg-q90", "tif"), Pipeline("e2e-jp2", "jp2", "jp2-openjpeg-lossy", "jp2"))
PIPELINE, JP2_PIPELINE = (p.name for p in PIPELINES)


def catalogue() -> RosettaCatalogue:
    """Several tiles per level, a size above 1024 px, grey and wide-gamut inputs (in the first pipeline's set),
    a JP2 whose tiles are not the recipe's (in the second), and the validator's test image in every set, so that
    it is deposited as PTIFF and as JP2. Each file's label is the name the tests give it; the validator's image
    keeps as its file PID the identifier the validator's own server gives it. Gray's PID sorts before kodim02's:
    the prune test relies on that sync order."""
    validator = RosettaFile(VALIDATOR_ID, GeneratedFile(str(VALIDATOR_IMAGE)), "validator")
    corpus = [RosettaFile(f"FL20{n}", CorpusFile(path), name) for n, (name, path) in enumerate(
        (("gray", "gray8/gray.tif"), ("kodim02", "rgb8-tiff-lzw/kodim02-lzw.tif"),
         ("prophoto", "icc-prophoto/test_icc_prophoto.jpg")), start=2)]
    # lossy JP2 recipes grow its tiles to 512x522 (jp2.fit_to_image): iipsrv reads tiles of any size
    thin_edges = RosettaFile("FL300", CorpusFile("jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg"), "thin-edges")
    return RosettaCatalogue([
        ie(100, "2026-01-01 10:00:00", validator, title="IIIF Image API validator test image",
           sets={p.oai_set for p in PIPELINES}),
        ie(200, "2026-01-01 10:00:00", *corpus, title="Corpus masters", sets={PIPELINES[0].oai_set}),
        ie(300, "2026-01-01 10:00:00", thin_edges, title="A 10-row edge under a 512 tile grid",
           sets={PIPELINES[1].oai_set})])


@dataclass(frozen=True)
class Recorded:
    """One deposited access master as the ledger records it; `name` is its label in catalogue()."""

    pipeline: str
    object_id: str
    item_id: str
    name: str
    key: str
    width: int
    height: int
    sha256: str


@dataclass(frozen=True)
class Deposit:
    rig: Rig                       # config.yaml (the pipelines, `cache:`) and ledger of the harvest
    store: Store                   # the pipelines' store, as config.yaml configures it
    images: tuple[Recorded, ...]
    manifest_keys: tuple[str, ...]

    def image(self, name: str, pipeline: str = PIPELINE) -> Recorded:
        return next(i for i in self.images if i.name == name and i.pipeline == pipeline)

    def manifest_url(self, key: str) -> str:
        return f"{self.rig.manifest_base}/{key}"


def deposit_by_harvest(rig: Rig, cache: dict) -> Deposit:
    """Serve catalogue() from the Rosetta emulator and run `gcis-etl harvest` on both pipelines (and `cache` as
    config.yaml's cache section); what it deposited, from the ledger. The environment must carry the
    credentials (tests.harvests.harvest_environment)."""
    rosetta = catalogue()
    with serving(RosettaEmulator(rosetta)) as emulator:
        rig.write_config({p.name: rig.pipeline_config(rosetta_source(emulator.url, oai={"set": p.oai_set}),
                                                      recipe=p.recipe) for p in PIPELINES}, cache=cache)
        run = rig.cli("harvest", timeout=600)
    assert run.returncode == 0, f"harvest exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    images, keys = [], []
    for pipeline in PIPELINES:
        expected = rosetta_expected(rosetta, pipeline.oai_set)
        names = {f.pid: f.label for files in rosetta_listing(rosetta, pipeline.oai_set).values() for f in files}
        view = replace(rig, pipeline=pipeline.name, extension=pipeline.extension)
        with view.ledger() as ledger:
            records = ledger.items(pipeline.name)
        assert {(r.object_id, r.item_id): r.status for r in records} == expected.outcomes
        images += [Recorded(r.pipeline, r.object_id, r.item_id, names[r.item_id], r.output_key, r.width, r.height,
                            r.sha256) for r in records]
        keys += view.expected_keys(expected)
    assert rig.keys() == sorted(keys)  # the bucket holds what both pipelines must leave, and nothing else
    store = load_config(rig.config).pipeline(PIPELINE).store
    assert store.client  # made now, while the credentials are in the environment: it keeps them
    return Deposit(rig, store, tuple(images), tuple(k for k in keys if k.rpartition("/")[2].startswith("manifest-")))


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
            return Response(r.status, _headers(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, _headers(e.headers), e.read())


def _headers(message) -> dict[str, str]:
    """By lower-case name; a header sent twice reads as its values joined by ", " (a dict would hide one)."""
    return {k.lower(): ", ".join(message.get_all(k)) for k in message.keys()}


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
    """`!box,box` with ALLOW_UPSCALING on (the default): the largest size within box x box keeping the aspect
    ratio, above the full size too (Image API 2)."""
    scale = min(box / width, box / height)
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
        # the *_error_random tests ask with random strings, and iipsrv 1.1 reads a rotation that starts with a
        # digit as that number ("0[7@" as 0: 200, not 400): seeded, a run is reproducible
        random.seed(name)
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
