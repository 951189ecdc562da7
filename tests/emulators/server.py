"""A real threaded HTTP server on 127.0.0.1 for emulators, with fault injection and a request log.

An emulator is an App: `handle(Request) -> Response`, plus `control(name, Request)` for its own
demo switches. The server adds what every emulator needs: faults (tests call `server.inject`,
people running it standalone POST JSON to /_emulator/faults), edits made between two of a client's
requests (`server.before`), a log of the requests received, streamed file bodies, and a command line
(`run_cli`).
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import struct
import sys
import threading
import traceback
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Protocol
from urllib.parse import parse_qs, urlsplit

from tests.emulators.faults import Fault, FaultInjector

CONTROL_PREFIX = "/_emulator/"
_CHUNK = 64 * 1024


class LoopbackServer(ThreadingHTTPServer):
    """A threaded server whose client hanging up mid-request (a timed-out read, a killed harvest: what the tests
    provoke) is no error: socketserver would print its traceback on the test run's stderr."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message
    body: bytes = b""
    target: str = ""

    @property
    def form(self) -> dict[str, list[str]]:
        if (self.headers.get("Content-Type") or "").startswith("application/x-www-form-urlencoded"):
            return parse_qs(self.body.decode("utf-8"), keep_blank_values=True)
        return {}

    def arg(self, name: str, default: str | None = None) -> str | None:
        """A parameter from the query string or, for form posts, the body."""
        values = self.query.get(name) or self.form.get(name)
        return values[0] if values else default


@dataclass
class Response:
    status: int = 200
    body: bytes | Path = b""
    content_type: str = "application/octet-stream"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: object, status: int = 200, headers: dict[str, str] | None = None) -> "Response":
        return cls(status, json.dumps(data).encode(), "application/json", headers or {})

    @classmethod
    def xml(cls, data: bytes, status: int = 200) -> "Response":
        return cls(status, data, "text/xml; charset=UTF-8")

    @classmethod
    def text(cls, text: str, status: int = 200, headers: dict[str, str] | None = None) -> "Response":
        return cls(status, text.encode(), "text/plain; charset=UTF-8", headers or {})

    @property
    def length(self) -> int:
        return self.body.stat().st_size if isinstance(self.body, Path) else len(self.body)


class App(Protocol):
    def handle(self, request: Request) -> Response: ...

    def control(self, name: str, request: Request) -> Response: ...


class EmulatorServer:
    """Serves an App on 127.0.0.1 (random port by default) until stopped."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0):
        self.app = app
        self.faults = FaultInjector()
        self.log: list[Request] = []
        self._log_lock = threading.Lock()
        self._before: list[tuple[re.Pattern, Callable[[], None]]] = []
        self._stopping = threading.Event()
        self._httpd = LoopbackServer((host, port), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "EmulatorServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="emulator", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread (the command line) until interrupted."""
        try:
            self._httpd.serve_forever()
        finally:
            self._stopping.set()
            self._httpd.server_close()

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "EmulatorServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def inject(self, pattern: str, fault: Fault, times: int | None = 1) -> None:
        self.faults.inject(pattern, fault, times)

    def before(self, pattern: str, action: Callable[[], None]) -> None:
        """Run `action` once, just before answering the first request whose "METHOD /path?query" matches
        `pattern`: the source changing between two requests of a client (an object edited between two pages of
        a listing), at a known point rather than after a guessed delay."""
        with self._log_lock:
            self._before.append((re.compile(pattern), action))

    def requests(self, pattern: str = "") -> list[Request]:
        """Requests received whose "METHOD /path?query" contains `pattern` (a regex), oldest first."""
        with self._log_lock:
            return [r for r in self.log if re.search(pattern, f"{r.method} {r.target}")]

    def record(self, request: Request) -> None:
        with self._log_lock:
            self.log.append(request)

    def run_before(self, request: Request) -> None:
        line = f"{request.method} {request.target}"
        with self._log_lock:
            due = [rule for rule in self._before if rule[0].search(line)]
            self._before = [rule for rule in self._before if rule not in due]
        for _, action in due:
            action()

    def wait(self, seconds: float) -> None:
        """Sleep that ends early when the server stops, so slow faults never hold a test up."""
        self._stopping.wait(seconds)


def _handler_for(server: EmulatorServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go in separate writes: with Nagle's algorithm, the client's delayed ACK held every
        # response ~40 ms (measured: 47 s per 1,000 Rosetta getIE calls, 5 s with TCP_NODELAY)
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self._dispatch()

        do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

        def log_message(self, format: str, *args) -> None:
            pass

        def _dispatch(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            request = Request(self.command, parts.path, parse_qs(parts.query, keep_blank_values=True),
                              self.headers, body, self.path)
            if parts.path.startswith(CONTROL_PREFIX):
                self._send(self._control(parts.path[len(CONTROL_PREFIX):], request))
                return
            server.record(request)
            server.run_before(request)
            fault = server.faults.take(self.command, self.path)
            if fault and fault.kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if fault and fault.kind == "slow":
                server.wait(fault.seconds)
            if fault and fault.kind == "page":
                self._send(Response(200, fault.body, fault.content_type))
                return
            if fault and fault.kind == "status":
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                self._send(Response.text(f"injected fault: HTTP {fault.status}", fault.status, headers))
                return
            try:
                response = server.app.handle(request)
            except Exception:
                traceback.print_exc()
                response = Response.text("emulator error", 500)
            self._send(response, fault)

        def _control(self, name: str, request: Request) -> Response:
            if name == "faults" and request.method == "POST":
                data = json.loads(request.body or b"{}")
                try:
                    server.inject(data.get("pattern", ""), Fault.from_dict(data), data.get("times", 1))
                except (KeyError, ValueError) as exc:
                    return Response.text(f"bad fault: {exc}", 400)
                return Response.text("ok")
            if name == "faults" and request.method == "DELETE":
                server.faults.clear()
                return Response.text("ok")
            return server.app.control(name, request)

        def _send(self, response: Response, fault: Fault | None = None) -> None:
            size = response.length
            try:
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(size))
                for name, value in response.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command == "HEAD":
                    return
                limit = int(size * fault.keep) if fault and fault.kind == "truncate" else size
                flip = size // 2 if fault and fault.kind == "corrupt" and size else None
                sent = 0
                for chunk in _chunks(response.body):
                    chunk = chunk[:max(0, limit - sent)]
                    if flip is not None and sent <= flip < sent + len(chunk):
                        i = flip - sent
                        chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    if sent >= limit:
                        break
                self.wfile.flush()
                if sent < size:
                    self.close_connection = True
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:
                pass

    return Handler


def _chunks(body: bytes | Path):
    if isinstance(body, bytes):
        yield body
        return
    with open(body, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def run_cli(description: str, app: App, banner: Callable[[str], str], fault_pattern: str) -> None:
    """`python -m tests.emulators.<name> --port N`: serve until interrupted, printing how to connect and a fault
    example whose `fault_pattern` matches one of that emulator's paths (a pattern matching none never fires)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()
    server = EmulatorServer(app, args.host, args.port)
    print(banner(server.url), flush=True)
    print(f"faults: curl -X POST {server.url}{CONTROL_PREFIX}faults "
          f"-d '{{\"pattern\": \"{fault_pattern}\", \"fault\": \"status\", \"status\": 503, \"times\": 2}}'",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)
