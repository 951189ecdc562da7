"""What a viewer in a browser needs from the headers of the consumer (deploy/iipsrv: lighttpd + iipsrv 1.1, real
processes) and of an S3 store (MinIO): manifests and collections revalidated soon after a re-publication, while
tiles and info.json keep their own Cache-Control; CORS on the base URI's redirect; preflights (a client sending
the Accept with a profile that the IIIF specifications recommend, or Range) answered by lighttpd, never by
iipsrv, which answers OPTIONS as a GET."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
import pyvips

from gcis_etl.iipsrv import Consumer, ServerSettings
from gcis_etl.manifests import MEDIA_TYPES
from gcis_etl.stores import DOCUMENT_CACHE_CONTROL, MiB, S3Store
from tests.conftest import s3_settings
from tests.consumer import get

pytestmark = pytest.mark.slow

MANIFEST = "demo/IE1/manifest-v3.json"
ORIGIN = "http://viewer.example"
IIIF_ACCEPT = 'application/ld+json;profile="http://iiif.io/api/presentation/3/context.json"'


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    """demo.conf over one small pyramid and a local store's root holding one manifest."""
    root = tmp_path_factory.mktemp("viewer")
    (root / "images").mkdir()
    pyvips.Image.black(600, 400, bands=3).tiffsave(str(root / "images" / "a.tif"), tile=True, pyramid=True,
                                                   compression="jpeg", tile_width=256, tile_height=256)
    (root / "store" / MANIFEST).parent.mkdir(parents=True)
    (root / "store" / MANIFEST).write_text(json.dumps({"id": "x"}))
    server = ServerSettings(port=0, run_dir=root / "run", access_log=root / "run" / "access.log",
                            documents_root=root / "store")
    with Consumer(server, root / "images", demo=True) as running:
        yield running


def request(method: str, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One request as a browser's preflight sends it (tests.consumer.get sends GETs only)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        connection.request(method, parts.path, headers=headers)
        r = connection.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        connection.close()


def test_documents_are_revalidated_soon_and_images_keep_their_cache_control(consumer):
    r = get(f"{consumer.url}{consumer.server.documents_path}/{MANIFEST}", headers={"Origin": ORIGIN})
    assert r.status == 200 and r.json() == {"id": "x"}
    assert r.headers["cache-control"] == DOCUMENT_CACHE_CONTROL == "max-age=60, must-revalidate"
    assert r.headers["access-control-allow-origin"] == "*" and "etag" in r.headers
    info = get(f"{consumer.iiif_url}/a.tif/info.json")
    assert info.headers["cache-control"] == consumer.server.info_cache_control
    tile = get(f"{consumer.iiif_url}/a.tif/0,0,256,256/256,/0/default.jpg")
    assert tile.status == 200 and tile.headers["cache-control"] == consumer.server.cache_control


def test_the_base_uri_redirect_carries_cors(consumer):
    r = get(f"{consumer.iiif_url}/a.tif", headers={"Origin": ORIGIN}, follow=False)
    assert r.status == 303 and r.headers["location"].endswith("/a.tif/info.json")
    assert r.headers.get("access-control-allow-origin") == "*"


@pytest.mark.parametrize("path", ["/iiif/a.tif", "/iiif/a.tif/info.json", "/iiif/a.tif/full/300,/0/default.jpg",
                                  f"/store/{MANIFEST}"])
def test_preflights_are_answered_by_lighttpd_with_what_a_viewer_may_send(consumer, path):
    status, headers, body = request("OPTIONS", f"{consumer.url}{path}", {
        "Origin": ORIGIN, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "accept,range,if-none-match"})
    assert (status, body) == (204, b""), (status, body[:100])  # iipsrv answered OPTIONS with the image or info.json
    assert headers["access-control-allow-origin"] == "*"
    assert set(headers["access-control-allow-methods"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    allowed = {h.lower() for h in headers["access-control-allow-headers"].split(", ")}
    assert {"accept", "range", "if-none-match", "if-modified-since"} <= allowed
    assert int(headers["access-control-max-age"]) > 0
    # and the request it clears is answered, with CORS
    r = get(f"{consumer.url}{path}", headers={"Origin": ORIGIN, "Accept": IIIF_ACCEPT})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == "*", path


def test_documents_put_to_s3_carry_the_document_cache_control_and_masters_none(minio, s3_bucket, aws_env, tmp_path):
    """Manifests and collections (put_bytes, one PUT) and a document a store move copies (put; multipart when
    large): as S3 serves them. An access master keeps the bucket's default."""
    store = S3Store(s3_settings(minio, s3_bucket, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB))
    store.put_bytes(MANIFEST, b'{"id": "x"}', content_type=MEDIA_TYPES["2.1"])
    store.put_bytes("collections/demo-v3.json", b'{"items": []}', content_type="application/json")
    large = tmp_path / "large.json"
    large.write_bytes(b'{"pad": "' + b"x" * (6 * MiB) + b'"}')
    store.put("collections/large.json", large)
    master = tmp_path / "a.tif"
    master.write_bytes(b"II*\0" + bytes(100))
    store.put("demo/IE1/a.tif", master)
    client = minio.client()
    for key in (MANIFEST, "collections/demo-v3.json", "collections/large.json"):
        r = client.get_object(Bucket=s3_bucket, Key=f"iiif/access/{key}")
        assert r.get("CacheControl") == DOCUMENT_CACHE_CONTROL, key
    r = client.get_object(Bucket=s3_bucket, Key="iiif/access/demo/IE1/a.tif")
    assert "CacheControl" not in r and r["ContentType"] == "image/tiff"
