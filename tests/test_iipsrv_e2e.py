"""The consumer end to end, real processes on loopback: the emulated Rosetta -> `gcis-etl harvest` -> access
masters and manifests in MinIO -> `gcis-etl cache sync` -> lighttpd + iipsrv 1.1 (deploy/iipsrv/) -> IIIF
Image API answers checked against what the harvest's ledger recorded, and the IIIF community's Image API
validator run against our own pyramid and JP2."""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from urllib.parse import quote, unquote, urlsplit

import psutil
import pytest
import pyvips
import yaml

from connectors.base import SourceObject
from gcis_etl.cache import CacheSource, prune, purge, sync
from gcis_etl.config import load_config
from gcis_etl.conversion import convert
from gcis_etl.iipsrv import Consumer
from gcis_etl.isolation import IsolatedProcess
from gcis_etl.manifests import DepositedImage, Manifests
from gcis_etl.stores import LocalStore, LocalStoreSettings
from tests.conftest import CORPUS, cache_config, cache_settings
from tests.consumer import (JP2_PIPELINE, PIPELINE, VALIDATOR_ID, fit, get, image_api_validator, jpeg_size,
                            wait_logged)
from tests.measures import luma, psnr
from tests.servers import free_port
from tests.test_manifests import painted, settings, source_object, thumbnails

pytestmark = pytest.mark.slow

IMAGE_2_CONTEXT = "http://iiif.io/api/image/2/context.json"
LEVEL1 = "http://iiif.io/api/image/2/level1.json"


def info(consumer, key: str):
    return get(f"{consumer.iiif_url}/{key}/info.json")


# ------------------------------------------------------------------------------------------- the deposit


def test_every_deposited_image_is_served_with_the_size_the_ledger_recorded(deposited, consumer):
    assert len(deposited.images) == 6
    for image in deposited.images:
        r = info(consumer, image.key)
        assert r.status == 200, (image.key, r.body[:200])
        doc = r.json()
        assert (doc["width"], doc["height"]) == (image.width, image.height), image.key
        assert doc["@context"] == IMAGE_2_CONTEXT and doc["profile"][0] == LEVEL1


def test_tiles_of_the_first_two_levels_decode_as_jpeg_of_their_size(deposited, consumer):
    for image in deposited.images:
        w, h = min(256, image.width), min(256, image.height)
        r = get(f"{consumer.iiif_url}/{image.key}/0,0,256,256/{w},/0/default.jpg")
        assert r.status == 200 and r.headers["content-type"] == "image/jpeg", (image.key, r.status)
        assert jpeg_size(r.body) == (w, h), image.key
        if image.width >= 512 and image.height >= 512:  # a tile of the half-resolution level
            r = get(f"{consumer.iiif_url}/{image.key}/0,0,512,512/256,/0/default.jpg")
            assert jpeg_size(r.body) == (256, 256), image.key


def test_full_image_within_1024_decodes_at_the_best_fit(deposited, consumer):
    sizes = {}
    for image in deposited.images:
        r = get(f"{consumer.iiif_url}/{image.key}/full/!1024,1024/0/default.jpg")
        assert r.status == 200, image.key
        sizes[image.key] = jpeg_size(r.body)
        assert sizes[image.key] == fit(image.width, image.height, 1024), image.key
    assert sizes[deposited.image("kodim02").key] == (1024, 683)  # 768x512, upscaled as Image API 2 allows
    assert sizes[deposited.image("prophoto").key] == (1024, 640)  # 1680x1050, scaled down


def test_iipsrv_shows_the_edge_rows_of_a_jp2_with_grown_tiles(deposited, consumer):
    """The 594x522 master's JP2 has 512x522 tiles (a 512 grid would leave a 10-row edge tile that the
    encoder's rate allocation left flat), so tiles of two widths: iipsrv serves the bottom rows of both as the
    master has them."""
    image = deposited.image("thin-edges", JP2_PIPELINE)
    r = get(f"{consumer.iiif_url}/{image.key}/0,500,594,22/594,/0/default.jpg")  # iipsrv writes JPEG only
    assert r.status == 200, r.body[:200]
    master = pyvips.Image.new_from_file(str(CORPUS / "jpeg-baseline/jpg-rgb-594x522x8-baseline.jpg"))
    served = pyvips.Image.new_from_buffer(r.body, "")
    assert (served.width, served.height) == (594, 22)
    edge = psnr(luma(served.numpy()[12:]), luma(master.crop(0, 512, 594, 10).numpy()))
    assert edge >= 35, edge  # 39.6 dB measured; a flat edge tile gave 25.7 in the JP2 itself


def _service_ids(manifest: dict) -> list[tuple[str, int, int]]:
    """(image service id, canvas width, canvas height) of every painted image, in 3.0 or 2.1."""
    found = []
    if "items" in manifest:
        for canvas in manifest["items"]:
            for page in canvas["items"]:
                for annotation in page["items"]:
                    for service in annotation["body"]["service"]:  # an ImageService2 keeps "@id" in 3.0
                        found.append((service.get("id") or service["@id"], canvas["width"], canvas["height"]))
    else:
        for canvas in manifest["sequences"][0]["canvases"]:
            for annotation in canvas["images"]:
                found.append((annotation["resource"]["service"]["@id"], canvas["width"], canvas["height"]))
    return found


def test_every_image_service_of_every_manifest_answers_with_a_valid_info_json(deposited, consumer):
    checked = 0
    for key in deposited.manifest_keys:
        r = get(deposited.manifest_url(key), headers={"Origin": "http://viewer.example"})  # as a viewer reads it
        assert r.status == 200, key
        services = _service_ids(r.json())
        assert services, key
        for service_id, width, height in services:
            response = get(f"{service_id}/info.json", headers={"Origin": "http://viewer.example"})
            assert response.status == 200, service_id
            assert response.headers["content-type"] == "application/ld+json"
            assert response.headers["access-control-allow-origin"] == "*"
            doc = response.json()
            assert doc["@context"] == IMAGE_2_CONTEXT and doc["protocol"] == "http://iiif.io/api/image"
            assert doc["profile"][0] == LEVEL1
            assert (doc["width"], doc["height"]) == (width, height)
            assert unquote(doc["@id"]) == unquote(service_id)  # the same image (see the strict test below)
            assert doc["tiles"][0]["width"] == 256 and doc["tiles"][0]["scaleFactors"][0] == 1
            checked += 1
        for thumbnail in thumbnails(r.json()):
            url = thumbnail.get("id") or thumbnail["@id"]
            assert jpeg_size(get(url).body) == (thumbnail["width"], thumbnail["height"]), url
    assert checked == 2 * len(deposited.images)  # 3.0 and 2.1


def test_info_json_id_is_exactly_the_manifest_service_id(deposited, consumer):
    for key in deposited.manifest_keys:
        for service_id, _, _ in _service_ids(get(deposited.manifest_url(key)).json()):
            assert get(f"{service_id}/info.json").json()["@id"] == service_id


def test_with_a_small_max_cvt_every_manifest_image_is_served_at_exactly_its_declared_size(deposited, synced_cache,
                                                                                         tmp_path):
    """config.yaml's cache.server.max_cvt alone (600 here) sets iipsrv's MAX_CVT and what the manifests ask for:
    every master wider or taller (PTIFF and JP2, pyramids as deposited) is painted at a size iipsrv serves
    exactly, the others at full size; thumbnails (1000 px asked) too."""
    port = free_port()
    (tmp_path / "masters").mkdir()
    pipelines = {pipeline: {"source": {"kind": "filesystem", "root": "masters"},
                            "store": {"kind": "local", "root": "store"},
                            "manifests": {"manifest_base_url": "http://127.0.0.1/store", "versions": ["3.0", "2.1"],
                                          "image_service_base_url": f"http://127.0.0.1:{port}/iiif",
                                          "thumbnail_width": 1000}}
                 for pipeline in (PIPELINE, JP2_PIPELINE)}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"cache": cache_config(tmp_path, port, max_cvt=600),
                                                          "pipelines": pipelines}))
    config = load_config(tmp_path / "config.yaml")
    limited = set()
    with Consumer(config.cache.server, synced_cache.images_dir):
        for image in deposited.images:
            obj = SourceObject(image.object_id, datetime(2026, 1, 1, tzinfo=timezone.utc), ())
            manifests = config.pipeline(image.pipeline).manifests
            for version in ("3.0", "2.1"):
                as_deposited = DepositedImage(1, image.key, image.width, image.height)
                manifest = manifests.build(obj, [as_deposited], version).document
                for served in painted(manifest) + thumbnails(manifest):
                    url = served.get("id") or served["@id"]
                    assert jpeg_size(get(url).body) == (served["width"], served["height"]), url
                    assert max(served["width"], served["height"]) <= 600, url
                [body] = painted(manifest)
                if max(image.width, image.height) > 600:
                    limited.add((image.pipeline, image.name))
                    assert f"/full/{body['width']},{body['height']}/0/" in (body.get("id") or body["@id"])
                else:
                    assert (body["width"], body["height"]) == (image.width, image.height)
    assert limited == {(PIPELINE, "validator"), (PIPELINE, "kodim02"), (PIPELINE, "prophoto"),
                       (JP2_PIPELINE, "validator")}  # not gray or thin-edges (594x522)


# Sizes where iipsrv 1.1 renders a request a pixel off: `w,` goes through a float ratio (803x601 at "400," comes
# out 399x299, 650x10 at "400," 390x6, 1001x7 376x3); without ALLOW_UPSCALING, `w,h` is capped at the width of
# the pyramid level picked by the height (1198x400 at "600,200" reads the 599x200 level).
SIZE_WINDOWS = ((803, 601), (650, 10), (1001, 7), (1198, 400), (400, 1198))


@pytest.fixture(scope="module")
def size_windows(tmp_path_factory):
    """Access masters of SIZE_WINDOWS (PTIFF and JP2, converted now from gradients) and a consumer with the
    default server settings but MAX_CVT 600, so that the larger masters are painted scaled down too."""
    root = tmp_path_factory.mktemp("size-windows")
    server = cache_settings(root, max_cvt=600)
    images = []
    with IsolatedProcess() as worker:
        for width, height in SIZE_WINDOWS:
            master = root / f"m{width}x{height}.png"
            pyvips.Image.xyz(width, height).cast("uchar").bandjoin(128).write_to_file(str(master))
            for recipe, extension in (("ptiff-jpeg-q90", "tif"), ("jp2-openjpeg-lossy", "jp2")):
                key = f"sizes/{recipe}/m{width}x{height}.{extension}"
                result = convert(master, server.images_dir / key, recipe, worker=worker)
                assert (result.width, result.height) == (width, height), result.reason
                images.append(DepositedImage(1, key, width, height))
    with Consumer(server.server, server.images_dir) as running:
        yield images, running


def test_every_manifest_image_is_served_at_exactly_its_declared_size_in_the_sizes_iipsrv_gets_wrong(size_windows):
    images, running = size_windows
    manifests = Manifests(settings(image_service_base_url=running.iiif_url, max_image_size=600, thumbnail_width=400),
                          "sizes", LocalStore(LocalStoreSettings(root="unused")))
    requested = set()
    for image in images:
        for version in ("3.0", "2.1"):
            manifest = manifests.build(source_object(), [image], version).document
            for served in painted(manifest) + thumbnails(manifest):
                url = served.get("id") or served["@id"]
                assert jpeg_size(get(url).body) == (served["width"], served["height"]), url
                requested.add(url.rsplit("/full/", 1)[1])
    assert {"400,299/0/default.jpg", "400,6/0/default.jpg", "400,3/0/default.jpg", "600,200/0/default.jpg",
            "200,600/0/default.jpg"} <= requested  # the requests that came out a pixel off


# ------------------------------------------------------------------------------ IIIF Image API validator


@pytest.mark.parametrize("pipeline, extension", [(PIPELINE, ".tif"), (JP2_PIPELINE, ".jp2")])
def test_image_api_validator_level1_passes_on_our_conversion_of_its_test_image(deposited, consumer, pipeline,
                                                                              extension):
    """Its pixel checks request regions, sizes and rotations and compare colours: our pyramid (PTIFF) and our
    JP2 must be geometrically and colorimetrically right, as iipsrv reads them."""
    key = deposited.image("validator", pipeline).key
    assert key.endswith(f"/{VALIDATOR_ID}{extension}")
    server = urlsplit(consumer.url).netloc
    ran, failures = image_api_validator(server, consumer.server.prefix.strip("/"), key, "2.0", level=1)
    assert len(ran) == 21, ran
    assert failures == []


# ---------------------------------------------------------------------------------- the web server setup


def test_base_uri_redirects_to_info_json_in_both_identifier_forms(deposited, consumer):
    key = deposited.image("validator").key
    for identifier in (key, quote(key, safe="")):
        r = get(f"{consumer.iiif_url}/{identifier}", follow=False)
        assert r.status == 303 and r.headers["location"].endswith(f"/{key}/info.json")


def test_forged_iiif_id_header_does_not_reach_info_json(deposited, consumer):
    key = deposited.image("kodim02").key
    doc = get(f"{consumer.iiif_url}/{key}/info.json", headers={"X-IIIF-ID": "http://evil.example/x"}).json()
    assert doc["@id"] == f"{consumer.iiif_url}/{key}"


def test_cache_headers_and_unknown_or_escaping_identifiers(deposited, consumer):
    r = info(consumer, deposited.image("kodim02").key)
    assert r.headers["cache-control"] == consumer.server.info_cache_control == "max-age=600"
    assert "last-modified" in r.headers
    assert info(consumer, f"{PIPELINE}/nothing/here.tif").status == 404
    assert info(consumer, "..%2F..%2F..%2F..%2Fetc%2Fpasswd").status in (400, 403, 404)
    assert info(consumer, "..%2Fstate.sqlite").status in (400, 403, 404)


def test_production_config_runs_the_configured_iipsrv_processes_and_serves_only_iiif(deposited, synced_cache,
                                                                                    tmp_path):
    """lighttpd.conf alone (no demo documents, no viewer), two iipsrv processes behind a public base URL;
    stopping leaves none."""
    settings = cache_settings(tmp_path, processes=2, base_url="https://images.example.org/iiif")
    with Consumer(settings.server, synced_cache.images_dir) as production:
        iipsrv = [c for c in psutil.Process(production.proc.pid).children() if c.name().startswith("iipsrv")]
        deadline = time.monotonic() + 10
        while len(iipsrv) < 2 and time.monotonic() < deadline:  # spawned one after the other
            time.sleep(0.1)
            iipsrv = [c for c in psutil.Process(production.proc.pid).children() if c.name().startswith("iipsrv")]
        assert len(iipsrv) == 2
        key = deposited.image("kodim02").key
        for i in range(4):  # both answer (lighttpd balances requests over them)
            doc = get(f"{production.iiif_url}/{quote(key, safe='')}/info.json").json()
            assert doc["@id"] == f"https://images.example.org/iiif/{key}"
        assert get(f"{production.url}/store/{deposited.manifest_keys[0]}").status == 404
        assert get(f"{production.url}/viewer/").status == 404
    time.sleep(0.2)
    assert not [p for p in iipsrv if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# ------------------------------------------------------------------ the cache while iipsrv is serving it


@pytest.fixture
def small(deposited, tmp_path):
    """A local store holding two of the deposited access masters, its own cache and a running consumer."""
    store = LocalStore(LocalStoreSettings(root=tmp_path / "store"))
    for image in (deposited.image("kodim02"), deposited.image("gray")):
        store.put_bytes(image.key, deposited.store.get_bytes(image.key), content_type="image/tiff")
    settings = cache_settings(tmp_path)
    source = CacheSource(PIPELINE, store, f"{PIPELINE}/")
    assert len(sync(settings, [source]).copied) == 2
    with Consumer(settings.server, settings.images_dir) as running:
        yield store, source, settings, running


def test_a_re_deposited_image_is_served_at_its_new_size_after_the_next_sync(deposited, small):
    store, source, settings, running = small
    kodim, gray = deposited.image("kodim02"), deposited.image("gray")
    assert info(running, kodim.key).json()["width"] == kodim.width
    store.put_bytes(kodim.key, deposited.store.get_bytes(gray.key), content_type="image/tiff")
    assert info(running, kodim.key).json()["width"] == kodim.width  # the cache has not been synced yet
    assert sync(settings, [source]).copied == (kodim.key,)
    assert (info(running, kodim.key).json()["width"], info(running, kodim.key).json()["height"]) == \
        (gray.width, gray.height)
    w, h = min(256, gray.width), min(256, gray.height)  # tiles come from the new file too
    assert jpeg_size(get(f"{running.iiif_url}/{kodim.key}/0,0,256,256/{w},/0/default.jpg").body) == (w, h)


def test_a_purged_image_answers_404_at_once(deposited, small):
    store, source, settings, running = small
    key = deposited.image("kodim02").key
    assert info(running, key).status == 200
    store.delete(key)
    assert sync(settings, [source]).gone == (key,)
    assert purge(settings, [source]).removed == (key,)
    assert info(running, key).status == 404
    assert get(f"{running.iiif_url}/{key}/0,0,256,256/256,/0/default.jpg").status == 404


def test_prune_keeps_what_the_access_log_shows_requested_and_a_request_brings_an_evicted_image_back(
        deposited, small):
    store, source, settings, running = small
    kodim, gray = deposited.image("kodim02"), deposited.image("gray")
    assert sorted([kodim.key, gray.key]) == [gray.key, kodim.key]
    for image in (kodim, gray):  # atime just after mtime: relatime will not update it today, only the log knows
        st = (settings.images_dir / image.key).stat()
        os.utime(settings.images_dir / image.key, ns=(st.st_mtime_ns + 1000, st.st_mtime_ns))
    time.sleep(2.2)  # the access log counts whole seconds, from a clock lighttpd updates about once a second
    assert get(f"{running.iiif_url}/{quote(gray.key, safe='')}/full/!200,200/0/default.jpg").status == 200
    wait_logged(settings.server.access_log, f"{quote(gray.key, safe='')}/full/")
    # gray was synced first (key order), so without the log it would be the least recently used
    result = prune(settings, max_bytes=(settings.images_dir / gray.key).stat().st_size)
    assert [e.key for e in result.evicted] == [kodim.key]
    assert sync(settings, [source]).evicted == 1  # sync does not undo a prune ...
    assert info(running, gray.key).status == 200
    assert info(running, kodim.key).status == 404
    wait_logged(settings.server.access_log, f"{kodim.key}/info.json")
    assert sync(settings, [source]).copied == (kodim.key,)  # ... but brings back what was requested since
    assert info(running, kodim.key).json()["width"] == kodim.width
