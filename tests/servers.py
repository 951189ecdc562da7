"""Real servers for the test suite, started on 127.0.0.1 with a random free port and stopped afterwards."""
from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Iterator

from tests.emulators.server import LoopbackServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server did not listen on 127.0.0.1:{port} within {timeout}s")


def minio_binary() -> str:
    """The MinIO binary built by `make minio` (GCIS_MINIO_BIN), or one on PATH."""
    candidate = os.environ.get("GCIS_MINIO_BIN") or os.path.expanduser("~/.cache/gcis-etl/bin/minio")
    if os.path.exists(candidate):
        return candidate
    found = shutil.which("minio")
    if not found:
        raise RuntimeError("MinIO binary not found: run `make minio` (set GCIS_MINIO_BIN to use another)")
    return found


@dataclass
class MinioServer:
    """A running MinIO; stop()/start() on the same data dir simulate an outage."""

    data_dir: Path
    port: int
    access_key: str = "gcis-test-access"
    secret_key: str = "gcis-test-secret-key"
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        self.proc = subprocess.Popen(
            [minio_binary(), "server", str(self.data_dir), "--address", f"127.0.0.1:{self.port}", "--quiet"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("MinIO did not become ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            terminate(self.proc)

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}))


def terminate(proc: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL if the process has not exited after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def http_server(handler, **state) -> Iterator[LoopbackServer]:
    """A threaded http.server on loopback for a misbehaving `handler`, with `state` as attributes and `stopping`,
    set at the end so that a handler waiting on it (a trickle) lets the server shut down."""
    httpd = LoopbackServer(("127.0.0.1", 0), handler)
    httpd.stopping = threading.Event()
    for name, value in state.items():
        setattr(httpd, name, value)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.stopping.set()
        httpd.shutdown()
        httpd.server_close()


class _S3FaultProxy(BaseHTTPRequestHandler):
    """Forwards every request to MinIO unchanged (the Host header too, which the client signed), except those
    a fault rule of the server's `faults` (tests.emulators.faults.FaultInjector) takes: they are answered with
    the rule's status and no body, as MinIO answers a request it cut off while stopping (499), or, for a `slow`
    fault, held unanswered for its seconds (a hung server), then cut off, or, for a `truncate` fault, MinIO's
    answer with its body cut short (a connection dropped mid-transfer)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes (tests/emulators/server.py says why)

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = self.server.faults.take(self.command, self.path)
        if fault is not None and fault.kind == "slow":  # a hung server: no answer, then the connection closes
            self.server.answered.append(f"{self.command} {self.path} slow")
            self.server.stopping.wait(fault.seconds)
            self.close_connection = True
            return
        if fault is not None and fault.kind == "status":
            self.server.answered.append(f"{self.command} {self.path} {fault.status}")
            self.send_response(fault.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "expect"})
            answer = upstream.getresponse()
            content = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        head = self.command == "HEAD"  # its Content-Length is the object's, with no body
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection") and (head or name.lower() != "content-length"):
                self.send_header(name, value)
        if not head:
            self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if fault is not None and fault.kind == "truncate":
            self.server.answered.append(f"{self.command} {self.path} truncate")
            content, self.close_connection = content[:int(len(content) * fault.keep)], True
        self.wfile.write(content)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@contextmanager
def s3_fault_proxy(minio: MinioServer) -> Iterator[LoopbackServer]:
    """MinIO behind a proxy whose `faults` answer chosen requests with an error MinIO itself gives only by chance
    (during a stop); `answered` lists the requests they took. Its endpoint: http://127.0.0.1:{server_port}."""
    from tests.emulators.faults import FaultInjector
    with http_server(_S3FaultProxy, upstream_port=minio.port, faults=FaultInjector(), answered=[]) as httpd:
        yield httpd
