"""The shared HTTP session and verified download, over real HTTP against an emulator with injected faults."""
from __future__ import annotations

import base64
import email.utils
import hashlib
import logging
import re
import socket
import time
import traceback
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from connectors.base import Fixity, SourceItem
from connectors.errors import (AuthenticationFailed, FetchIntegrityError, PermissionDenied, SourceRequestFailed,
                               SourceUnavailable)
from connectors.fetching import fetch_verified, fixity, scratch_name
from connectors.http import HttpSession, HttpSourceSettings
from connectors.redaction import register
from connectors.retry import RetryPolicy
from tests.emulators import FAST_RETRY
from tests.emulators.catalogue import CORPUS
from tests.emulators.faults import Fault
from tests.emulators.server import EmulatorServer, Request, Response
from tests.servers import free_port, http_server

MASTER = CORPUS / "rgb8-tiff-lzw" / "kodim02-lzw.tif"


class Files:
    """The smallest emulator: /master streams a corpus file, /ok answers JSON, /echo refuses what it was sent in
    words that put it across the 200th character of the body (where an error's excerpt of the body ends)."""

    def handle(self, request: Request) -> Response:
        if request.path == "/master":
            return Response(200, MASTER, "image/tiff")
        if request.path == "/ok":
            return Response.json({"ok": True})
        if request.path == "/echo":
            return Response.text(f"{'the request was refused. ' * 7}token {request.arg('token')} is unknown", 400)
        return Response.text("no such thing", 404)

    def control(self, name: str, request: Request) -> Response:
        return Response.text("no controls", 404)


@pytest.fixture
def server():
    with EmulatorServer(Files()) as running:
        yield running


def session(url: str, **retry) -> HttpSession:
    return HttpSession(HttpSourceSettings(base_url=url, retry=RetryPolicy(**{**FAST_RETRY, **retry})))


def item(size: int | None = None, digest: Fixity | None = None, **kw) -> SourceItem:
    data = MASTER.read_bytes()
    return SourceItem(id=kw.get("id", "FL1"), sequence=1, original_name="kodim02.tif",
                      size=len(data) if size is None else size, modified=None,
                      fixity=digest if digest is not None else Fixity("md5", hashlib.md5(data).hexdigest()),
                      locator=kw.get("locator", ""))


def logged_delays(caplog) -> list[float]:
    return [float(m) for m in re.findall(r"retrying in ([\d.]+)s", caplog.text)]


# --- retry policy --------------------------------------------------------------------------------------------

def test_backoff_doubles_up_to_the_cap_and_jitter_stays_within_its_fraction():
    policy = RetryPolicy(backoff_base_seconds=1, backoff_max_seconds=8, jitter=0.5)
    for retry, full in ((1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (9, 8)):
        delays = [policy.backoff(retry) for _ in range(200)]
        assert all(full * 0.5 <= d <= full for d in delays)
        assert max(delays) - min(delays) > 0  # jitter actually varies the delay
    assert RetryPolicy(backoff_base_seconds=2, jitter=0).backoff(3) == 8


def test_policy_refuses_to_retry_auth_errors():
    with pytest.raises(ValueError, match="401/403"):
        RetryPolicy(retry_statuses=frozenset({401, 503}))


# --- retried failures ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_retryable_statuses_are_retried_until_success(server, status):
    server.inject("GET /ok", Fault.http(status), times=2)
    response = session(server.url).request("GET", f"{server.url}/ok")
    assert response.json() == {"ok": True}
    assert len(server.requests("GET /ok")) == 3


def test_attempts_are_bounded(server):
    server.inject("GET /ok", Fault.http(503), times=None)
    with pytest.raises(SourceUnavailable, match=r"HTTP 503.*gave up after 4 attempt\(s\)"):
        session(server.url).request("GET", f"{server.url}/ok")
    assert len(server.requests("GET /ok")) == 4


def test_total_time_is_bounded_before_attempts_run_out(server):
    server.inject("GET /ok", Fault.http(500), times=None)
    slow_backoff = session(server.url, max_attempts=10, backoff_base_seconds=0.3, backoff_max_seconds=10, jitter=0,
                           max_total_seconds=0.75)
    with pytest.raises(SourceUnavailable, match="max_total_seconds=0.75"):
        slow_backoff.request("GET", f"{server.url}/ok")
    # waits of 0.3 s then 0.6 s: the second would end past 0.75 s, so only two attempts are made
    assert len(server.requests("GET /ok")) == 2


def test_retry_after_seconds_is_honoured(server, caplog):
    server.inject("GET /ok", Fault.http(429, retry_after=1))
    with caplog.at_level(logging.INFO, logger="connectors"):
        assert session(server.url).request("GET", f"{server.url}/ok").status_code == 200
    assert logged_delays(caplog) and logged_delays(caplog)[0] >= 1.0


def test_retry_after_http_date_is_honoured(server, caplog):
    when = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=2), usegmt=True)
    server.inject("GET /ok", Fault("status", status=503, retry_after=when))
    with caplog.at_level(logging.INFO, logger="connectors"):
        assert session(server.url).request("GET", f"{server.url}/ok").status_code == 200
    assert logged_delays(caplog)[0] >= 0.5  # the date has second resolution; far above the 0.01 s backoff


def test_retry_after_beyond_the_budget_gives_up_at_once(server):
    server.inject("GET /ok", Fault.http(429, retry_after=3600))
    with pytest.raises(SourceUnavailable, match="waiting 3600.0s more would exceed max_total_seconds=5"):
        session(server.url, max_total_seconds=5).request("GET", f"{server.url}/ok")
    assert len(server.requests("GET /ok")) == 1


def test_connection_reset_is_retried(server):
    server.inject("GET /ok", Fault.reset(), times=2)
    assert session(server.url).request("GET", f"{server.url}/ok").json() == {"ok": True}
    assert len(server.requests("GET /ok")) == 3


def test_read_timeout_is_retried(server, caplog):
    server.inject("GET /ok", Fault.slow(3))
    with caplog.at_level(logging.INFO, logger="connectors"):
        response = session(server.url, read_timeout_seconds=0.3).request("GET", f"{server.url}/ok")
    assert response.json() == {"ok": True}
    assert "read timed out after 0.3s" in caplog.text
    assert len(server.requests("GET /ok")) == 2


def test_connect_timeouts_are_retried_and_bounded():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepts: once its queue is full, new connections hang in SYN
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/ok"
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
        try:
            with pytest.raises(SourceUnavailable, match=r"connect timed out after 0.2s; gave up after 3 attempt"):
                session(url, connect_timeout_seconds=0.2, max_attempts=3).request("GET", url)
        finally:
            for filler in fillers:
                filler.close()


def test_refused_connections_fail_clearly_after_the_bounded_attempts():
    url = f"http://127.0.0.1:{free_port()}/ok"
    with pytest.raises(SourceUnavailable, match=r"connection failed \(ConnectionRefusedError\).*4 attempt"):
        session(url).request("GET", url)


class Trickle(BaseHTTPRequestHandler):
    """/json answers 200, any other path 404, each with a 300-byte JSON body; while `server.trickles` is above
    zero a body goes a byte every 20 ms (never silent for the read timeout) and stops after 150 (3 s), so that a
    client without a pace fails on a short body instead of hanging the suite; after that, at once. `server.sent`:
    the bytes of each trickled body that went out before the client hung up (150: it never did)."""

    protocol_version = "HTTP/1.1"
    body = b'{"ok": true, "padding": "' + b"x" * 273 + b'"}'

    def do_GET(self) -> None:
        self.send_response(200 if self.path.startswith("/json") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.server.requests += 1
        if self.server.trickles <= 0:
            self.wfile.write(self.body)
            return
        self.server.trickles -= 1
        sent = 0
        try:
            for byte in self.body[:150]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                sent += 1
                if self.server.stopping.wait(0.02):
                    break
        except OSError:
            pass
        self.server.sent.append(sent)
        self.close_connection = True

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def trickle():
    with http_server(Trickle, requests=0, trickles=1_000, sent=[]) as httpd:
        yield httpd


def trickle_url(httpd: ThreadingHTTPServer, path: str) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}{path}"


def wait_for_hang_ups(httpd: ThreadingHTTPServer, bodies: int) -> None:
    """Each trickled body was cut off by the client before its end (the server notices at its next byte)."""
    deadline = time.monotonic() + 10
    while len(httpd.sent) < bodies and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(httpd.sent) == bodies and all(sent < 150 for sent in httpd.sent), httpd.sent


def test_a_body_read_for_the_caller_is_cut_off_by_its_pace_like_a_download(trickle):
    """A search or a login answer trickling in at 50 bytes a second: under the floor of 1000 over each 0.5 s
    window, it is cut off and retried within the policy, and the error says what came in how long, and where."""
    http = session(trickle_url(trickle, ""), read_timeout_seconds=0.5, min_transfer_bytes_per_second=1000,
                   max_attempts=2)
    too_slow = (r"^GET http://127\.0\.0\.1:\d+/json\?token=\*\*\*: transfer too slow: \d+ bytes in the last "
                r"0\.\d+s, under min_transfer_bytes_per_second=1000; gave up after 2 attempt")
    with pytest.raises(SourceUnavailable, match=too_slow) as raised:
        http.request("GET", trickle_url(trickle, "/json"), params={"token": "t0k3n-value"})
    assert trickle.requests == 2 and "t0k3n-value" not in str(raised.value)
    wait_for_hang_ups(trickle, 2)


def test_a_body_cut_off_for_its_pace_is_retried_and_the_next_answer_taken(trickle):
    trickle.trickles = 1
    http = session(trickle_url(trickle, ""), read_timeout_seconds=0.5, min_transfer_bytes_per_second=1000)
    assert http.request("GET", trickle_url(trickle, "/json")).json()["ok"] is True
    assert trickle.requests == 2
    wait_for_hang_ups(trickle, 1)


def test_the_error_body_of_a_streamed_request_is_read_at_the_same_pace(trickle):
    """A download's 404 quotes the source's words, read as they come: a trickle ends the excerpt, not the run."""
    http = session(trickle_url(trickle, ""), read_timeout_seconds=0.5, min_transfer_bytes_per_second=1000)
    with pytest.raises(SourceRequestFailed, match=r"HTTP 404 Not Found$"):
        http.request("GET", trickle_url(trickle, "/missing"), stream=True)
    wait_for_hang_ups(trickle, 1)


# --- errors that are not retried -----------------------------------------------------------------------------

def test_401_is_an_authentication_error_without_retry(server):
    server.inject("GET /ok", Fault.http(401), times=None)
    with pytest.raises(AuthenticationFailed, match="refused the configured credentials"):
        session(server.url).request("GET", f"{server.url}/ok")
    assert len(server.requests("GET /ok")) == 1


def test_403_is_a_permission_error_without_retry(server):
    server.inject("GET /ok", Fault.http(403), times=None)
    with pytest.raises(PermissionDenied, match="not allowed"):
        session(server.url).request("GET", f"{server.url}/ok")
    assert len(server.requests("GET /ok")) == 1


def test_other_client_errors_are_not_retried_and_carry_the_status(server):
    with pytest.raises(SourceRequestFailed, match="HTTP 404.*no such thing") as raised:
        session(server.url).request("GET", f"{server.url}/missing")
    assert raised.value.status == 404
    assert len(server.requests("/missing")) == 1


def test_an_accepted_error_answer_is_returned_not_retried(server):
    server.inject("GET /ok", Fault.http(500))
    response = session(server.url).request("GET", f"{server.url}/ok", accept_error=lambda r: r.status_code == 500)
    assert response.status_code == 500
    assert len(server.requests("GET /ok")) == 1


def test_401_triggers_one_relogin_then_the_request_is_repeated(server):
    http = session(server.url)
    logins = []
    http.on_unauthorized = lambda response: logins.append(response.status_code)
    server.inject("GET /ok", Fault.http(401))
    assert http.request("GET", f"{server.url}/ok").json() == {"ok": True}
    assert logins == [401]
    server.inject("GET /ok", Fault.http(401), times=2)
    with pytest.raises(AuthenticationFailed):
        http.request("GET", f"{server.url}/ok")
    assert logins == [401, 401]


def test_a_secret_across_the_end_of_an_error_excerpt_is_masked_whole(server):
    """The excerpt was cut to 200 characters before it was scrubbed: a secret the cut split no longer matched,
    and its first part was shown."""
    token = "t0k3n-across-the-cut"
    register(token)
    with pytest.raises(SourceRequestFailed, match=r"HTTP 400.*: (the request was refused\. ){7}token \*\*\*") as raised:
        session(server.url).request("GET", f"{server.url}/echo", params={"token": token})
    assert "t0k3n" not in str(raised.value)


def test_credentials_never_reach_logs_or_exceptions(server, caplog):
    password = "Pa55-w0rd!secret"
    http = session(server.url, max_attempts=2)
    basic = base64.b64encode(f"svc:{password}".encode()).decode()
    http.auth = requests.auth.HTTPBasicAuth("svc", password)
    register(password, basic)
    server.inject("", Fault.http(503), times=None)
    failures = []
    with caplog.at_level(logging.DEBUG):
        for params in ({"password": password}, {"q": password}, {"token": "t0k3n-value"}):
            with pytest.raises(SourceUnavailable) as raised:
                http.request("GET", f"{server.url}/ok", params=params)
            failures.append(raised.value)
        server.faults.clear()
        server.inject("", Fault.http(401), times=None)
        with pytest.raises(AuthenticationFailed) as raised:
            http.request("GET", f"http://svc:{password}@127.0.0.1:{server.url.rsplit(':', 1)[1]}/ok")
        failures.append(raised.value)
    assert server.requests("password=")  # the secret was really sent, so the test can fail
    texts = [caplog.text] + [str(e) for e in failures] + [repr(e) for e in failures] + \
            ["".join(traceback.format_exception(e)) for e in failures]
    for text in texts:
        assert password not in text and basic not in text and "t0k3n-value" not in text
        assert "Pa55-w0rd%21secret" not in text
    assert "password=***" in caplog.text


# --- verified downloads --------------------------------------------------------------------------------------

def download(http: HttpSession, url: str):
    return lambda budget: http.download(url, budget)


def test_download_is_streamed_verified_and_renamed_into_place(server, tmp_path):
    fetched = fetch_verified(item(), tmp_path, download(session(server.url), f"{server.url}/master"),
                             RetryPolicy(**FAST_RETRY))
    assert fetched.path == tmp_path / "FL1.tif"
    assert fetched.path.read_bytes() == MASTER.read_bytes()
    assert fetched.sha256 == hashlib.sha256(MASTER.read_bytes()).hexdigest()
    assert fetched.fixity_verified and fetched.size == MASTER.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FL1.tif"]


@pytest.mark.parametrize("fault", [Fault.truncate(0.3), Fault.corrupt(), Fault.reset(), Fault.http(503)])
def test_a_failed_transfer_is_retried_and_only_the_good_copy_is_kept(server, tmp_path, fault):
    server.inject("GET /master", fault, times=2)
    fetched = fetch_verified(item(), tmp_path, download(session(server.url), f"{server.url}/master"),
                             RetryPolicy(**FAST_RETRY))
    assert fetched.path.read_bytes() == MASTER.read_bytes()
    assert len(server.requests("GET /master")) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["FL1.tif"]


def test_persistent_truncation_fails_and_leaves_no_file(server, tmp_path):
    server.inject("GET /master", Fault.truncate(0.5), times=None)
    with pytest.raises(SourceUnavailable, match="body ended early"):
        fetch_verified(item(), tmp_path, download(session(server.url), f"{server.url}/master"),
                       RetryPolicy(**FAST_RETRY))
    assert list(tmp_path.iterdir()) == []
    assert len(server.requests("GET /master")) == 4


def test_persistent_fixity_failure_is_an_integrity_error_and_leaves_no_file(server, tmp_path):
    server.inject("GET /master", Fault.corrupt(), times=None)
    with pytest.raises(FetchIntegrityError, match="md5 .* does not match the source's fixity"):
        fetch_verified(item(), tmp_path, download(session(server.url), f"{server.url}/master"),
                       RetryPolicy(**FAST_RETRY))
    assert list(tmp_path.iterdir()) == []


def test_a_size_that_disagrees_with_the_source_record_is_refused(server, tmp_path):
    with pytest.raises(FetchIntegrityError, match="the source records 1000"):
        fetch_verified(item(size=1000), tmp_path, download(session(server.url), f"{server.url}/master"),
                       RetryPolicy(**FAST_RETRY))
    assert list(tmp_path.iterdir()) == []


def test_without_source_fixity_the_size_is_still_checked_and_sha256_computed(server, tmp_path):
    unverified = SourceItem(id="x", sequence=1, original_name="x.tif", size=None, modified=None)
    fetched = fetch_verified(unverified, tmp_path, download(session(server.url), f"{server.url}/master"),
                             RetryPolicy(**FAST_RETRY))
    assert not fetched.fixity_verified
    assert fetched.sha256 == hashlib.sha256(MASTER.read_bytes()).hexdigest()


def test_fixity_spellings_are_normalised_and_unknown_ones_kept_unchecked():
    md5 = "D41D8CD98F00B204E9800998ECF8427E"
    assert fixity("MD5", md5) == Fixity("md5", md5.lower())
    assert fixity("SHA-256", "a" * 64) == Fixity("sha256", "a" * 64)
    assert fixity("sha1", "b" * 40) == Fixity("sha1", "b" * 40)
    assert fixity("CRC32", "1234ABCD") == Fixity("crc32", "1234abcd")
    assert fixity("md5", "not-hex") is None
    assert fixity("md5", "a" * 40) is None


def test_scratch_names_stay_inside_the_scratch_dir_and_do_not_collide():
    hostile = SourceItem(id="../../etc/passwd", sequence=1, original_name="passwd", size=1, modified=None)
    a = SourceItem(id="a/b_c.tif", sequence=1, original_name="b_c.tif", size=1, modified=None)
    b = SourceItem(id="a_b/c.tif", sequence=1, original_name="c.tif", size=1, modified=None)
    assert "/" not in scratch_name(hostile) and not scratch_name(hostile).startswith(".")
    assert scratch_name(a) != scratch_name(b)
    assert scratch_name(a).endswith(".tif") and scratch_name(b).endswith(".tif")
    assert Path("/scratch", scratch_name(hostile)).parent == Path("/scratch")
