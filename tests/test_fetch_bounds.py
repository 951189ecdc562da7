"""A hostile or broken server cannot fill the scratch space or the memory: downloads stop at the size the source
records, answers read whole at HttpSession.answer_bytes, gzip-decoded bytes counted. Over real HTTP."""
from __future__ import annotations

import re
import threading
import zlib
from functools import cache
from http.server import BaseHTTPRequestHandler

import pytest

from connectors.base import SourceItem
from connectors.errors import FetchIntegrityError, SourceDataError
from connectors.fetching import fetch_verified
from connectors.http import HttpSession, HttpSourceSettings
from connectors.retry import RetryPolicy
from tests.emulators import FAST_RETRY
from tests.emulators.server import LoopbackServer

MB = 1 << 20
ENDLESS = 64 * MB  # "endless": what the old code would write to scratch before comparing sizes
RECORDED = 726638  # the size the source records for the master


@cache
def gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return packer.compress(bytes(size)) + packer.flush()


class Hostile(BaseHTTPRequestHandler):
    """/endless streams ENDLESS zeros chunked, /lying streams them after announcing a Content-Length of 1000;
    /bomb?n= answers a gzip of n zeros (Content-Length the gzip's) to any Accept-Encoding, identity included."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith(("/endless", "/lying")):
            chunked = self.path.startswith("/endless")
            self.send_response(200)
            self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", "1000")))
            self.end_headers()
            chunk = bytes(MB)
            try:
                for _ in range(ENDLESS // MB):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                self.wfile.write(b"0\r\n\r\n" if chunked else b"")
            except OSError:
                self.close_connection = True
            return
        body = gzip_of_zeros(int(re.search(r"n=(\d+)", self.path).group(1)))
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client hung up, as it should, mid-answer
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def hostile():
    server = LoopbackServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def session(url: str) -> HttpSession:
    return HttpSession(HttpSourceSettings(base_url=url, retry=RetryPolicy(**FAST_RETRY)))


def master(size: int | None) -> SourceItem:
    return SourceItem(id="FL1", sequence=1, original_name="master.tif", size=size, modified=None)


def received(message: str) -> int:
    return int(re.search(r"received (\d+) bytes", message).group(1))


@pytest.mark.parametrize("path", ["/endless", f"/bomb?n={ENDLESS}"])
def test_a_download_stops_at_the_size_the_source_records(hostile, tmp_path, path):
    """An endless body, or a gzip of zeros answered to the identity request, is cut once it passes the recorded
    size: the failure is the size disagreement, named as it was, and nothing is left in scratch."""
    http = session(hostile)
    with pytest.raises(FetchIntegrityError, match=f"the source records {RECORDED}: stopped reading") as raised:
        fetch_verified(master(RECORDED), tmp_path, lambda budget: http.download(hostile + path, budget),
                       http.policy)
    assert RECORDED < received(str(raised.value)) <= RECORDED + 2 * MB  # the chunk that passed it, not 64 MB
    assert list(tmp_path.iterdir()) == []


def test_a_download_the_source_records_no_size_for_stops_at_the_announced_length(hostile, tmp_path):
    http = session(hostile)
    fetched = fetch_verified(master(None), tmp_path, lambda budget: http.download(f"{hostile}/lying", budget),
                             http.policy)
    assert fetched.size == 1000 and [p.stat().st_size for p in tmp_path.iterdir()] == [1000]


def test_an_answer_decoding_past_the_cap_is_refused_naming_the_request_and_the_cap(hostile):
    http = session(hostile)
    http.answer_bytes = 4 * MB
    with pytest.raises(SourceDataError) as raised:
        http.request("GET", f"{hostile}/bomb", params={"n": ENDLESS, "password": "s3cret-v4lue"})
    message = str(raised.value)
    assert message.startswith(f"GET {hostile}/bomb?n={ENDLESS}&password=")
    assert f"more than {4 * MB} bytes" in message and "s3cret-v4lue" not in message


def test_an_answer_up_to_the_cap_is_read_whole(hostile):
    http = session(hostile)
    http.answer_bytes = 4 * MB
    assert http.request("GET", f"{hostile}/bomb", params={"n": 4 * MB}).content == bytes(4 * MB)
    with pytest.raises(SourceDataError):
        http.request("GET", f"{hostile}/bomb", params={"n": 4 * MB + 1})
