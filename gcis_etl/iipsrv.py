"""The iipsrv consumer: lighttpd in front of iipsrv processes, serving the access-master cache over IIIF.

The web server configuration lives in deploy/iipsrv/ (lighttpd.conf, and demo.conf which adds the documents
of a local store and the Mirador viewer). Both read every deployment value from the environment; this
module turns the `cache.server` settings into that environment and runs lighttpd in the foreground, which
spawns and supervises the iipsrv processes. Production runs the same lighttpd.conf under systemd.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import psutil
from pydantic import Field, field_validator

from gcis_etl.errors import GcisError
from gcis_etl.isolation import dying_with_thread
from gcis_etl.settings import Settings
from gcis_etl.stores import DOCUMENT_CACHE_CONTROL

if TYPE_CHECKING:
    from gcis_etl.config import Config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "iipsrv"


class ConsumerError(GcisError):
    """The web server or iipsrv could not be started."""


class ServerSettings(Settings):
    """lighttpd and iipsrv settings (iipsrv's own names are given where they differ)."""

    host: str = "127.0.0.1"
    port: int = Field(8182, ge=0, le=65535, description="0: any free port")
    prefix: str = Field("/iiif", pattern=r"^(/[A-Za-z0-9._~-]+)+$", description="URL path of the Image API")
    base_url: str | None = Field(None, description="BASE_URL: the public URL of `prefix` when a proxy or CDN "
                                                   "is in front; by default iipsrv uses the request's Host")
    processes: int = Field(2, ge=1, le=64, description="iipsrv processes lighttpd spawns: more than one, so that "
                                                       "a request iipsrv crashes on fails only what waits on its process")
    cors: str = "*"                                       # CORS (Access-Control-Allow-Origin)
    cache_control: str = "max-age=86400"                  # CACHE_CONTROL
    info_cache_control: str = Field("max-age=600", description="Cache-Control of info.json: a replaced image keeps "
                                    "its URL, and its manifest (with the new size) is published at once")
    image_cache_mb: int = Field(10, ge=0)                 # MAX_IMAGE_CACHE_SIZE: tiles kept in RAM per process
    jpeg_quality: int = Field(90, ge=1, le=100)           # JPEG_QUALITY of regions and sizes (tiles are as stored)
    max_cvt: int = Field(5000, ge=1)                      # MAX_CVT: largest width/height rendered
    allow_upscaling: bool = Field(True, description="ALLOW_UPSCALING. On, iipsrv 1.1 renders a `w,h` size exactly, "
                                  "as the manifests ask for scaled images (they never ask above the full size); off, "
                                  "it caps the width at that of the pyramid level it reads, a pixel short at times")
    interpolation: Literal["nearest", "bilinear"] = "bilinear"  # INTERPOLATION 0 | 1
    threads: int | None = Field(None, ge=1, description="OMP_NUM_THREADS per iipsrv process; all cores if unset")
    verbosity: int = Field(1, ge=0, le=10)                # VERBOSITY of iipsrv's log
    memcached_servers: str = ""                           # MEMCACHED_SERVERS; empty: none (see lighttpd.conf)
    reload_command: tuple[str, ...] | None = Field(
        None, description="what restarts iipsrv after an image was replaced or removed (e.g. [systemctl, "
                          "reload, lighttpd]); by default SIGUSR1 to the lighttpd of run_dir/lighttpd.pid")
    run_dir: Path = Path("var/iipsrv")                    # sockets, logs
    access_log: Path = Path("var/iipsrv/access.log")      # written by lighttpd, read by `cache prune`
    iipsrv: Path = Path("/usr/lib/iipimage-server/iipsrv.fcgi")
    lighttpd: str = "lighttpd"
    documents_path: str = Field("/store", pattern=r"^(/[A-Za-z0-9._~-]+)+$")  # demo only (demo.conf)
    documents_root: Path | None = None                    # demo only: a local store's root, JSON served
    mirador_dir: Path = Path("~/.cache/gcis-etl/mirador")  # demo only: where install-mirador put Mirador
    decodes_htj2k: bool = Field(False, description="whether the iipsrv reading the cache renders regions of HTJ2K "
                                "tiles right: Debian 12's (OpenJPEG 2.5.0) serves every full-resolution tile of "
                                "one flat grey, so the cache refuses pipelines with an HTJ2K recipe; true for an "
                                "iipsrv linked with Kakadu or a later OpenJPEG (deploy/iipsrv/README.md)")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return url.rstrip("/") + "/"  # iipsrv appends the identifier to it as it is


def environment(server: ServerSettings, images_dir: Path, port: int) -> dict[str, str]:
    """The variables deploy/iipsrv/lighttpd.conf and demo.conf read (see the head of lighttpd.conf)."""
    run_dir = server.run_dir.resolve()
    env = {
        "GCIS_IIIF_HOST": server.host,
        "GCIS_IIIF_PORT": str(port),
        "GCIS_IIIF_PREFIX": server.prefix,
        "GCIS_IIIF_RUN_DIR": str(run_dir),
        "GCIS_IIIF_ACCESS_LOG": str(server.access_log.resolve()),
        "GCIS_IIPSRV": str(server.iipsrv),
        "GCIS_IIPSRV_PROCESSES": str(server.processes),
        "GCIS_IIIF_GUARD": str(DEPLOY / "region-guard.lua"),
        "GCIS_IIIF_INFO_CACHE_CONTROL": server.info_cache_control,
        "FILESYSTEM_PREFIX": f"{images_dir.resolve()}/",
        "MAX_IMAGE_CACHE_SIZE": str(server.image_cache_mb),
        "JPEG_QUALITY": str(server.jpeg_quality),
        "MAX_CVT": str(server.max_cvt),
        "ALLOW_UPSCALING": "1" if server.allow_upscaling else "0",
        "INTERPOLATION": "1" if server.interpolation == "bilinear" else "0",
        "CORS": server.cors,
        "CACHE_CONTROL": server.cache_control,
        "BASE_URL": server.base_url or "",
        "VERBOSITY": str(server.verbosity),
        "LOGFILE": str(run_dir / "iipsrv.log"),
        "MEMCACHED_SERVERS": server.memcached_servers,
        "GCIS_DOCUMENTS_PATH": server.documents_path,
        "GCIS_DOCUMENTS_ROOT": str((server.documents_root or run_dir / "empty").resolve()),
        "GCIS_DOCUMENTS_CACHE_CONTROL": DOCUMENT_CACHE_CONTROL,
        "GCIS_VIEWER_DIR": str(DEPLOY / "viewer"),
        "GCIS_MIRADOR_DIR": str(server.mirador_dir.expanduser().resolve()),
    }
    if server.threads:
        env["OMP_NUM_THREADS"] = str(server.threads)
    return env


class Consumer:
    """lighttpd (foreground) and the iipsrv processes it spawns, started and stopped together.

    `demo` adds demo.conf's documents and viewer. Usable as a context manager.
    """

    def __init__(self, server: ServerSettings, images_dir: Path, *, demo: bool = False):
        self.server = server
        self.images_dir = images_dir
        self.config = DEPLOY / ("demo.conf" if demo else "lighttpd.conf")
        self.port = server.port
        self.proc: subprocess.Popen | None = None
        self._group: int | None = None  # lighttpd's process group until stop() ends it (the id may name another later)

    @property
    def url(self) -> str:
        return f"http://{self.server.host}:{self.port}"

    @property
    def iiif_url(self) -> str:
        return f"{self.url}{self.server.prefix}"

    def misaddressed(self, config: Config) -> dict[str, int]:
        """The manifests' base URLs (their config keys: the port each names) that name this host but another port
        for what this server serves: the manifests were made for a server elsewhere, where nothing may listen."""
        hosts = {self.server.host, "127.0.0.1", "localhost", "::1"}
        found = {}
        for name in sorted(config.pipelines):
            manifests = config.pipelines[name].manifests
            if manifests is None:
                continue
            for key in self._served(config, name):
                url = urlsplit(getattr(manifests, key))
                port = url.port or {"https": 443}.get(url.scheme, 80)
                if url.hostname in hosts and port != self.port:
                    found[f"pipelines.{name}.manifests.{key}"] = port
        return found

    def _served(self, config: Config, name: str) -> list[str]:
        """Which base URLs of the pipeline's manifests name what this server serves: the images of the pipelines
        the cache mirrors, and the documents of the local store that is server.documents_root. Documents
        published by something else (a bucket in MinIO, a CDN) are none of its business."""
        store = config.pipelines[name].store
        keys = ["image_service_base_url"] if name in (config.cache.pipelines or config.pipelines) else []
        documents = self.server.documents_root
        if documents is not None and store.kind == "local" and store.root.resolve() == documents.resolve():
            keys.insert(0, "manifest_base_url")
        return keys

    def start(self, timeout: float = 30.0) -> Consumer:
        if not self.server.iipsrv.is_file():
            raise ConsumerError(f"iipsrv not found at {self.server.iipsrv} (Debian package iipimage-server)")
        if self.port == 0:
            self.port = _free_port(self.server.host)
        for folder in (self.server.run_dir / "empty", self.server.access_log.parent, self.images_dir):
            folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **environment(self.server, self.images_dir, self.port)}
        lighttpd = shutil.which(self.server.lighttpd)
        if lighttpd is None:
            raise ConsumerError(f"cannot run {self.server.lighttpd}: not found (Debian package lighttpd)")
        # SIGTERM to lighttpd (which stops its iipsrv processes) when the thread starting it ends: a signal that
        # interrupts this start before self.proc is set (cache serve stopped at once) must not leave it serving
        command = dying_with_thread([lighttpd, "-D", "-f", str(self.config)], "TERM")
        errors = self.server.run_dir / "lighttpd.stderr"
        try:
            with open(errors, "wb") as stderr:
                self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=stderr, start_new_session=True)  # a group stop() can end
                self._group = self.proc.pid
        except OSError as exc:
            raise ConsumerError(f"cannot run {self.server.lighttpd}: {exc.strerror} (Debian package lighttpd)")
        try:
            self._wait_listening(timeout, errors)
        except BaseException:  # a signal meanwhile (Interrupted) too: __exit__ is not called when start raises
            self.stop()
            raise
        return self

    def _wait_listening(self, timeout: float, errors: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                detail = _tail(errors) or _tail(self.server.run_dir / "error.log")
                raise ConsumerError(f"lighttpd exited with code {self.proc.returncode}: {detail}")
            try:
                with socket.create_connection((self.server.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise ConsumerError(f"lighttpd did not listen on {self.server.host}:{self.port} within {timeout:.0f}s")

    def stop(self) -> None:
        """SIGTERM: lighttpd stops the iipsrv processes it spawned, then exits. What is left of its process group
        is killed: an iipsrv lighttpd was spawning as the signal came (stopped as it starts) outlived it."""
        group, self._group = self._group, None
        if group is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # none left
            pass

    def wait(self) -> int:
        return self.proc.wait()

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reload(server: ServerSettings) -> bool:
    """Restart the iipsrv processes so that none serves an image it has in memory from a file that was
    replaced or removed since (iipsrv 1.1 keeps each image's size and does not re-read it when the file
    changes). lighttpd's graceful restart finishes the requests in flight first. False: no server is running."""
    if server.reload_command:
        try:
            subprocess.run(list(server.reload_command), check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConsumerError(f"cache.server.reload_command {list(server.reload_command)} failed: {exc}") from None
        return True
    pid_file = server.run_dir / "lighttpd.pid"
    try:
        pid = int(pid_file.read_text().strip())
        if psutil.Process(pid).name() != "lighttpd":
            return False  # a stale pid file: that lighttpd is gone
        before = _children(pid)
        os.kill(pid, signal.SIGUSR1)
    except (FileNotFoundError, ValueError, psutil.NoSuchProcess, ProcessLookupError):
        return False
    except (PermissionError, psutil.AccessDenied):
        raise ConsumerError(f"not allowed to signal lighttpd (pid file {pid_file}): set "
                            f"cache.server.reload_command, e.g. [sudo, systemctl, reload, lighttpd]") from None
    _wait_restarted(pid, before)
    return True


def _wait_restarted(pid: int, before: list[psutil.Process], timeout: float = 30.0) -> None:
    """Until the iipsrv processes from before the restart are gone and new ones run: when reload() returns,
    no process that may hold an old image is left (and a stop right after cannot orphan new ones)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        old = [p for p in before if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        current = _children(pid)
        if not old and any(p not in before for p in current):
            return
        time.sleep(0.05)
    raise ConsumerError(f"lighttpd (pid {pid}) did not restart its iipsrv processes within {timeout:.0f}s")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
