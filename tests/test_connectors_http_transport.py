"""The HTTP transport under downloads: redirects to other hosts, transport encodings and trickling bodies,
over real loopback HTTP servers."""
from __future__ import annotations

import gzip
import hashlib
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import pytest
import requests

from connectors.base import Fixity, SourceItem
from connectors.errors import FetchIntegrityError, SourceRequestFailed, SourceUnavailable
from connectors.fetching import fetch_verified
from connectors.http import HttpSession, HttpSourceSettings
from connectors.retry import RetryPolicy
from tests.emulators import FAST_RETRY
from tests.emulators.server import EmulatorServer, Request, Response
from tests.servers import http_server

MASTER = bytes(range(256)) * 2048  # 512 KiB that gzip shrinks a lot: the encoded length is far from the size
SECRETS = {"otmmauthtoken": "TOKENSECRET", "X-Requested-By": "4711", "X-Api-Key": "GATEWAYKEYSECRET"}


class Origin:
    """A DAM: /login sets a session cookie, /master redirects to `target`, /moved to /master on the same origin,
    /gzip sends the master gzip-encoded whatever the client asked for, /upload answers a POST with a 307."""

    def __init__(self) -> None:
        self.target = ""

    def handle(self, request: Request) -> Response:
        if request.path == "/login":
            return Response.text("ok", headers={"Set-Cookie": "JSESSIONID=COOKIESECRET; Path=/"})
        if request.path == "/master":
            return Response(302, headers={"Location": self.target})
        if request.path == "/moved":
            return Response(302, headers={"Location": "/blob"})
        if request.path == "/upload":
            return Response(307, headers={"Location": self.target})
        if request.path == "/gzip":
            return Response(200, gzip.compress(MASTER), headers={"Content-Encoding": "gzip"})
        if request.path == "/blob":
            return Response(200, MASTER)
        return Response.text("no such thing", 404)

    def control(self, name: str, request: Request) -> Response:
        return Response.text("no controls", 404)


class Cdn(Origin):
    """A presigned-URL store: serves /blob to anyone."""


@pytest.fixture
def origin():
    with EmulatorServer(Origin()) as running:
        yield running


@pytest.fixture
def cdn():
    with EmulatorServer(Cdn()) as running:
        yield running


def session(url: str, **retry) -> HttpSession:
    http = HttpSession(HttpSourceSettings(base_url=url, retry=RetryPolicy(**{**FAST_RETRY, **retry})))
    http.headers.update(SECRETS)
    http.auth = requests.auth.HTTPBasicAuth("harvester", "PASSWORDSECRET")
    return http


def item(url: str, **fields) -> SourceItem:
    return SourceItem(**{"id": "FL1", "sequence": 1, "original_name": "m.tif", "size": len(MASTER),
                         "modified": None, "fixity": Fixity("md5", hashlib.md5(MASTER).hexdigest()),
                         "locator": url, **fields})


def fetch(http: HttpSession, url: str, tmp_path, **fields):
    return fetch_verified(item(url, **fields), tmp_path, lambda budget: http.download(url, budget), http.policy)


def credentials(request: Request) -> set[str]:
    names = {name.lower() for name in request.headers.keys()}
    return names & {"otmmauthtoken", "x-requested-by", "x-api-key", "authorization", "cookie"}


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["another-host", "another-port"])
def test_a_redirect_to_another_origin_is_followed_without_the_credentials(origin, cdn, tmp_path, host):
    origin.app.target = f"http://{host}:{urlsplit(cdn.url).port}/blob"
    http = session(origin.url)
    http.request("GET", f"{origin.url}/login")  # the session cookie: the jar would send it to the same IP
    fetched = fetch(http, f"{origin.url}/master", tmp_path)
    assert fetched.path.read_bytes() == MASTER and fetched.fixity_verified
    assert credentials(origin.requests("GET /master")[0]) == {"otmmauthtoken", "x-requested-by", "x-api-key",
                                                              "authorization", "cookie"}
    [received] = cdn.requests("GET /blob")
    assert credentials(received) == set()
    assert received.headers["User-Agent"] == "gcis-etl"


def test_a_redirect_on_the_same_origin_keeps_the_credentials(origin, tmp_path):
    http = session(origin.url)
    http.request("GET", f"{origin.url}/login")
    assert fetch(http, f"{origin.url}/moved", tmp_path).path.read_bytes() == MASTER
    [received] = origin.requests("GET /blob")
    assert credentials(received) == {"otmmauthtoken", "x-requested-by", "x-api-key", "authorization", "cookie"}


def test_a_request_body_is_never_redirected_to_another_origin(origin, cdn):
    origin.app.target = f"{cdn.url}/blob"
    with pytest.raises(SourceRequestFailed, match=r"POST http://127\.0\.0\.1:\d+/upload was redirected to "
                                                  r"another host .* with its request body"):
        session(origin.url).request("POST", f"{origin.url}/upload", data={"password": "PASSWORDSECRET"})
    assert cdn.requests() == []


def test_a_gzip_encoded_body_is_checked_against_its_encoded_length_and_kept_decoded(origin, tmp_path):
    """Content-Length counts the gzip bytes, the source's size and fixity the decoded master."""
    fetched = fetch(session(origin.url), f"{origin.url}/gzip", tmp_path)
    assert len(gzip.compress(MASTER)) < len(MASTER) // 10
    assert fetched.path.read_bytes() == MASTER and fetched.size == len(MASTER) and fetched.fixity_verified


def test_a_gzip_encoded_body_is_still_checked_against_the_source(origin, tmp_path):
    with pytest.raises(FetchIntegrityError, match=f"received {len(MASTER)} bytes, the source records 1000"):
        fetch(session(origin.url), f"{origin.url}/gzip", tmp_path, size=1000)


class Trickle(BaseHTTPRequestHandler):
    """Announces the master, then sends a byte at a time, each well within the read timeout; stops after 250 (5 s)
    so that a client without a deadline fails on a short body instead of hanging the suite."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(MASTER)))
        self.end_headers()
        try:
            for byte in MASTER[:250]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                self.server.stopping.wait(0.02)
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def trickle():
    with http_server(Trickle) as httpd:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"


def test_a_trickling_body_is_cut_off_by_its_pace_and_leaves_no_file(trickle, tmp_path):
    """50 bytes a second, never silent for the read timeout: under the floor of 1000 over each 0.5 s window."""
    http = session(trickle, read_timeout_seconds=0.5, min_transfer_bytes_per_second=1000, max_attempts=2)
    with pytest.raises(SourceUnavailable, match=r"FL1: transfer too slow: \d+ bytes in the last [\d.]+s, under "
                                                r"min_transfer_bytes_per_second=1000"):
        fetch(http, f"{trickle}/master", tmp_path)
    assert list(tmp_path.iterdir()) == []
