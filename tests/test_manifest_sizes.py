"""Manifests ask for images at sizes the image server renders exactly: a master at its full size as `full`, any
other size as `w,h` (iipsrv renders that exactly with ALLOW_UPSCALING on, the default; `w,` goes through a float
ratio and comes out a pixel short); a master wider or taller than the server's limit (iipsrv's MAX_CVT,
manifests.max_image_size) is painted, and thumbnailed, at the largest size within it; a thumbnail's longer
side is at most manifests.thumbnail_width (tests/test_iipsrv_e2e.py checks the sizes against a running iipsrv)."""
from __future__ import annotations

import pytest

from gcis_etl.errors import ConfigError
from gcis_etl.iiif_validation import validate
from gcis_etl.manifests import Manifests
from gcis_etl.stores import LocalStore, LocalStoreSettings
from tests.test_manifests import SERVICE, image, painted, settings, source_object, thumbnails


def build(version: str, *images, **overrides) -> dict:
    manifests = Manifests(settings(**overrides), "demo", LocalStore(LocalStoreSettings(root="unused")))
    manifest = manifests.build(source_object(), list(images), version).document
    assert validate(manifest).ok, validate(manifest).errors  # the bundled 3.0 schema; iiif-prezi's reader for 2.1
    return manifest


def sizes(resources: list[dict]) -> list[tuple[str, int, int]]:
    """(id, width, height) of each image resource, in 3.0 or 2.1."""
    return [(r.get("id") or r["@id"], r["width"], r["height"]) for r in resources]


def canvases(manifest: dict) -> list[tuple[int, int]]:
    found = manifest["items"] if "items" in manifest else manifest["sequences"][0]["canvases"]
    return [(c["width"], c["height"]) for c in found]


def service(sequence: int) -> str:
    return f"{SERVICE}/demo/IE~2042~2Fx/FL~20{sequence}.tif"


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_a_master_beyond_the_limit_is_painted_at_the_largest_size_the_server_renders(version):
    # 3467 * 5000 / 5200 = 3333.65: iipsrv renders "w,h" as asked, so the size asked is the size declared
    manifest = build(version, image(1, 5200, 3467), image(2, 3467, 5200), max_image_size=5000)
    assert sizes(painted(manifest)) == [(f"{service(1)}/full/5000,3334/0/default.jpg", 5000, 3334),
                                        (f"{service(2)}/full/3334,5000/0/default.jpg", 3334, 5000)]
    assert canvases(manifest) == [(5200, 3467), (3467, 5200)]  # the canvas keeps the master's full size ...
    services = [body["service"][0] if version == "3.0" else body["service"] for body in painted(manifest)]
    assert [s["@id"] for s in services] == [service(1), service(2)]  # ... as does the image service's info.json


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_masters_within_the_limit_are_painted_at_full_size_as_before(version):
    manifest = build(version, image(1, 5000, 4000), image(2, 1, 5000), image(3, 300, 500), max_image_size=5000)
    assert sizes(painted(manifest)) == [(f"{service(1)}/full/full/0/default.jpg", 5000, 4000),
                                        (f"{service(2)}/full/full/0/default.jpg", 1, 5000),
                                        (f"{service(3)}/full/full/0/default.jpg", 300, 500)]
    assert sizes(thumbnails(manifest)) == [(f"{service(1)}/full/400,320/0/default.jpg", 400, 320),
                                           (f"{service(1)}/full/400,320/0/default.jpg", 400, 320),
                                           (f"{service(2)}/full/1,400/0/default.jpg", 1, 400),
                                           (f"{service(3)}/full/240,400/0/default.jpg", 240, 400)]


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_a_thumbnail_fits_the_thumbnail_width_on_its_longer_side(version):
    """A tall image's thumbnail is as small as a wide one's (400 wide, a 2000x20000 scroll's was 400x4000), and
    still asked for at the exact w,h iipsrv renders; one within the width keeps its full size."""
    manifest = build(version, image(1, 2000, 20000), image(2, 20000, 2000), image(3, 97, 6001), image(4, 300, 200),
                     max_image_size=5000)
    assert sizes(thumbnails(manifest)) == [(f"{service(1)}/full/40,400/0/default.jpg", 40, 400),
                                           (f"{service(1)}/full/40,400/0/default.jpg", 40, 400),
                                           (f"{service(2)}/full/400,40/0/default.jpg", 400, 40),
                                           (f"{service(3)}/full/6,400/0/default.jpg", 6, 400),
                                           (f"{service(4)}/full/full/0/default.jpg", 300, 200)]


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_thumbnails_beyond_the_limit_are_scaled_into_it_too(version):
    """A limit below the thumbnail width shrinks every thumbnail, and the painted image of a scroll. The smallest
    side never rounds to nothing."""
    scroll = build(version, image(1, 1000, 60000), max_image_size=5000, thumbnail_width=2000)
    assert sizes(thumbnails(scroll)) == [(f"{service(1)}/full/33,2000/0/default.jpg", 33, 2000)] * 2
    assert sizes(painted(scroll)) == [(f"{service(1)}/full/83,5000/0/default.jpg", 83, 5000)]

    small = build(version, image(1, 6000, 4000), image(2, 200, 100), image(3, 9000, 10), thumbnail_width=400,
                  max_image_size=300)
    assert sizes(thumbnails(small)) == [(f"{service(1)}/full/300,200/0/default.jpg", 300, 200),
                                        (f"{service(1)}/full/300,200/0/default.jpg", 300, 200),
                                        (f"{service(2)}/full/full/0/default.jpg", 200, 100),
                                        (f"{service(3)}/full/300,1/0/default.jpg", 300, 1)]


def test_the_limit_must_be_a_size():
    with pytest.raises(ConfigError, match=r"pipelines\.demo\.manifests\.max_image_size: Input should be greater"):
        settings(max_image_size=0)
