"""Where access masters and manifests are deposited: one protocol, a local filesystem store and an S3 store.

Every put is verified end to end: the SHA-256 computed while the file was produced (or, when not given, while
it is read here) is what the store must end up holding, and a mismatch is an IntegrityError, never a silent
success. Putting the same content again is a no-op detected by checksum; different content replaces the old
atomically (S3 PUT / CompleteMultipartUpload is atomic; locally write-temp-then-rename). Nothing half-written
is ever visible under a key.
"""
from __future__ import annotations

import base64
import errno
import hashlib
import io
import itertools
import json
import logging
import os
import random
import shutil
import string
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import IO, Annotated, Callable, ClassVar, Iterable, Iterator, Literal, Protocol, Union
from urllib.parse import quote, unquote, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as TransportError
from botocore.exceptions import HTTPClientError, NoCredentialsError, SSLError
from pydantic import Field, field_validator
from s3transfer.bandwidth import BandwidthLimitedStream, LeakyBucket
from s3transfer.exceptions import RetriesExceededError
from s3transfer.futures import TransferCoordinator
from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber
from s3transfer.utils import ChunksizeAdjuster, signal_not_transferring, signal_transferring

from gcis_etl.durable import DISK_REFUSES_WRITES, fsync_path, sha256_stream
from gcis_etl.errors import ConfigError, IntegrityError, StoreError, StoreFull, StoreRefused, StoreUnavailable
from gcis_etl.keys import KeyTemplates, UnsafeKey, check_key, check_prefix
from gcis_etl.settings import Settings

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_BOTOCORE_POOL = 10  # botocore's own default max_pool_connections: an S3 client never gets fewer
CHUNK = 1 * MiB
# S3 metadata travels in HTTP headers: printable ASCII only, '%' escapes the rest.
_HEADER_SAFE = string.punctuation.replace("%", "")
CONTENT_TYPES = {".tif": "image/tiff", ".tiff": "image/tiff", ".jp2": "image/jp2", ".json": "application/json"}
# Manifests and collections are re-published under the same key: browsers and CDNs revalidate them after a minute
# (without a Cache-Control, browsers keep one for a tenth of its age). A minute, not no-cache: a CDN still answers
# a viewer's bursts of requests. Access masters keep the bucket's or CDN's default.
DOCUMENT_CACHE_CONTROL = "max-age=60, must-revalidate"
_DOCUMENT_TYPES = frozenset({"application/json", "application/ld+json"})


@dataclass(frozen=True)
class Provenance:
    """Where a stored object came from; it travels with the object (S3 user metadata, or the local sidecar)."""

    source_id: str | None = None
    source_checksum: str | None = None  # "<algorithm>:<hex>" as the source reported it
    master_sha256: str | None = None  # of the master's bytes: recognises it when only its source version changed
    recipe: str | None = None
    recipe_digest: str | None = None
    width: int | None = None
    height: int | None = None

    def to_metadata(self) -> dict[str, str]:
        return {name.replace("_", "-"): quote(str(value), safe=_HEADER_SAFE, errors="surrogatepass")
                for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> Provenance:
        values = {}
        for f in fields(cls):
            raw = metadata.get(f.name.replace("_", "-"))
            if raw is not None:
                text = unquote(raw, errors="surrogatepass")
                values[f.name] = int(text) if f.name in ("width", "height") and text.isdigit() else text
        return cls(**values)


@dataclass(frozen=True)
class StoredObject:
    """What a store holds under a key (from put or head)."""

    key: str
    size: int
    sha256: str | None            # hex SHA-256 of the whole object as recorded; None if not written by gcis-etl,
                                  # or (a local file of another size than recorded) changed since: doubt says so
    content_type: str | None
    provenance: Provenance
    unchanged: bool = False       # the put found this content already there and wrote nothing
    doubt: str | None = None      # why the object may not hold what its record says: not ours unchanged


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    modified: datetime


class Store(Protocol):
    """What the pipeline (its items and manifests), migrations and the iipsrv cache sync need from a store."""

    keys: KeyTemplates
    uploads_left: ClassVar[str]
    """What becomes of an incomplete upload nothing aborts, and what removes it (uploads_kept says it)."""

    def put(self, key: str, path: Path, *, sha256: str | None = None, provenance: Provenance = Provenance(),
            content_type: str | None = None, overwrite: bool = False) -> StoredObject:
        """Deposit a local file; `sha256` is the hex digest computed while the file was written, if known.
        Identical bytes already under `key` are left alone (`unchanged`), as the store's own record of them
        says, unless `overwrite` or the record is in doubt (StoredObject.doubt): that record outlives damage to
        the bytes it describes."""

    def put_bytes(self, key: str, data: bytes, *, content_type: str,
                  provenance: Provenance = Provenance()) -> StoredObject:
        """Deposit a small document (manifests, collections)."""

    def get_bytes(self, key: str) -> bytes:
        """The object's content; StoreError if there is none."""

    def download(self, key: str, dest: Path) -> str:
        """Stream the object into `dest`, fsynced, and return the SHA-256 of what was written: access masters
        are too large for get_bytes. StoreError if there is no object."""

    def digest(self, key: str) -> tuple[str, int]:
        """The SHA-256 (hex) and size of the object's bytes as read back now, streamed through the hash and
        kept nowhere (a fixity audit needs no scratch room). StoreError if there is no object, or it cannot be
        read; StoreUnavailable if the store is down, as download() says."""

    def head(self, key: str) -> StoredObject | None:
        """What is stored under `key`, or None."""

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> bool:
        """Remove the object; True if there was one."""

    def list(self, prefix: str = "") -> Iterator[ListedObject]:
        """Objects whose key starts with `prefix`, in key order."""

    def abort_incomplete_uploads(self, older_than: timedelta = timedelta(days=1),
                                 keys: str | tuple[str, ...] = "", exact: bool = False,
                                 dry: bool = False) -> list[str]:
        """Remove what uploads of keys starting with `keys` (a prefix, or several: one listing serves them all;
        `exact`, whole keys), begun more than `older_than` ago, left behind when their process was killed;
        return those keys. `dry`: only list them."""

    def describe(self, key: str) -> str:
        """Where `key` lives, for messages (never carries credentials)."""

    def check(self, *, create: bool | None = None) -> None:
        """One cheap request before work that would otherwise fail on every object: a StoreError, in one line
        saying what to do, if the store cannot be used (missing, refusing the credentials, unreachable past
        its retries). `create` is what the caller knows: True, nothing was deposited here yet, so a missing
        local root is made rather than taken for an unmounted volume (buckets are never created); False,
        deposits were (the ledger records some), so a store holding no object under its root or prefix is
        refused too: its prefix or root changed, or its volume is not mounted, and a harvest there would
        publish manifests naming images it does not have; None, neither."""


def _write_durably(dest: Path, fill) -> str:
    """Let `fill` write `dest`, fsync it, and hash what reached the disk (not what was meant to). A failed
    download leaves no `dest`: half a master must never pass for one."""
    try:
        with open(dest, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    with open(dest, "rb") as f:
        return sha256_stream(f)


class _Sha256Sink:
    """A write-only, non-seekable file that keeps only the SHA-256 and the size of what is written to it: s3transfer
    writes a ranged download to it in order (DownloadNonSeekableOutputManager), dropping the bytes it wrote already
    when it retries a part cut short (S3Store.digest says why ranged)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self.size += len(data)
        return len(data)

    def seekable(self) -> bool:
        return False

    def result(self) -> tuple[str, int]:
        return self._digest.hexdigest(), self.size


def _holds_nothing(where: str, settings: str, first: str = "") -> StoreError:
    """check(create=False) of a store with no object: what to do, for either kind of store."""
    return StoreError(f"{where}: the store holds no object, yet the ledger records deposits into it: {first}if "
                      f"{settings} changed, set it back (`gcis-migrate move_store --to-store NEW` moves a store's "
                      f"deposits, before the switch); if the store was emptied on purpose, only a fresh ledger "
                      f"(another ledger.path) makes a harvest deposit everything again")


# What to do about a local write refused for this key alone (a full or read-only disk refuses every key)
_LOCAL_REMEDIES = {
    errno.EISDIR: " (a folder is in the way: remove it)",
    errno.EEXIST: " (a file is in the way of a folder: remove it)",
    errno.ENOTDIR: " (a file is in the way of a folder on this path: remove it)",
    errno.EACCES: " (check the permissions of the store's folders)",
    errno.EPERM: " (check its attributes and its folder's, which lsattr shows: immutable, append-only)",
}


def content_type_for(key: str) -> str:
    return CONTENT_TYPES.get(Path(key).suffix.lower(), "application/octet-stream")


def _object_headers(content_type: str) -> dict[str, str]:
    """The headers S3 keeps with an object and serves: its type, and DOCUMENT_CACHE_CONTROL for a JSON document
    (whichever way it is put: a store move copies manifests with put)."""
    headers = {"ContentType": content_type}
    if content_type.split(";", 1)[0].strip().lower() in _DOCUMENT_TYPES:
        headers["CacheControl"] = DOCUMENT_CACHE_CONTROL
    return headers


def _headers_differ(content_type: str, stored: dict[str, str | None]) -> bool:
    """Whether a document (_object_headers gives it a Cache-Control) is `stored` with other headers than a put of
    it as `content_type` gives it: those the store keeps (S3: ContentType, CacheControl; a local store records
    the type). An access master stored with another type is left as it is: its bytes are no small cost to put
    again for a header."""
    wanted = _object_headers(content_type)
    return "CacheControl" in wanted and any(value != wanted.get(name) for name, value in stored.items())


def _check_sha256(value: str | None) -> None:
    if value is not None and (len(value) != 64 or set(value) - set("0123456789abcdef")):
        raise ValueError(f"sha256 must be 64 lower-case hex digits, got {value!r}")


# --------------------------------------------------------------------------------------------- local store


class LocalStoreSettings(Settings):
    kind: Literal["local"] = "local"
    root: Path = Path("var/store")
    keys: KeyTemplates = KeyTemplates()


class LocalStore:
    """Files under a root directory, laid out exactly as the keys say (what iipsrv's FILESYSTEM_PREFIX serves).

    Size, SHA-256, content type and provenance live in a sidecar tree `<root>/.meta/<key>.json`; keys never
    have a segment starting with '.', so neither the sidecars nor the hidden temporary files can collide with
    an object. The sidecar records the data file's inode and modification time (to the nanosecond, which
    the put sets from the fine clock): a sidecar describing another file than the one under its key (a crash
    between the two renames, a file replaced by hand) names neither, and is ignored; a copy of the store that
    keeps times (cp -a, rsync -a, shutil.copy2) keeps the mtime, and so the record. Sidecars written before
    mtime_ns was recorded count by inode alone.
    """

    META = ".meta"
    uploads_left: ClassVar[str] = ("their hidden temporary files (.<name>.<random>.tmp) stay in the store's folders: "
                                   "delete those a day old")

    def __init__(self, settings: LocalStoreSettings):
        self.settings = settings
        self.keys = settings.keys
        self.root = settings.root.absolute()  # a relative root followed os.chdir: a second store beside the first

    def describe(self, key: str) -> str:
        return str(self.root / key)

    def _missing_root(self, action: str) -> StoreError:
        return StoreError(f"{self.root}: {action}: the store's root folder is missing (its volume not mounted? "
                          f"if the store is new, create the folder)")

    def check(self, *, create: bool | None = None) -> None:
        """A missing root is an error unless `create`, as for list(): an unmounted volume looks exactly like
        that, and deposits written into its empty mount point would vanish from view once it is mounted. When
        `create` is False, so is a root holding no object: the mount point itself, or a store.root changed.
        Writing is tried for real (an unnamed temporary file, gone even if the process is killed), so a
        read-only mount or another user's folder is found whatever this process's privileges."""
        try:
            if create:
                self.root.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.root).close()
        except FileNotFoundError:
            raise self._missing_root("cannot use the store") from None
        except OSError as exc:
            raise StoreError(f"{self.root}: cannot write into the store's root folder: {exc.strerror}") from None
        if create is False and next(self._files(self.root), None) is None:
            raise _holds_nothing(str(self.root), "store.root", "if its volume is not mounted, mount it; ")

    def put(self, key: str, path: Path, *, sha256: str | None = None, provenance: Provenance = Provenance(),
            content_type: str | None = None, overwrite: bool = False) -> StoredObject:
        _check_sha256(sha256)
        try:
            with open(path, "rb") as f:
                return self._write(key, iter(lambda: f.read(CHUNK), b""), sha256, provenance,
                                   content_type or content_type_for(key), overwrite)
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot read {path}: {exc.strerror}") from None

    def put_bytes(self, key: str, data: bytes, *, content_type: str,
                  provenance: Provenance = Provenance()) -> StoredObject:
        return self._write(key, [data], None, provenance, content_type)

    def _write(self, key: str, chunks: Iterable[bytes], expected: str | None, provenance: Provenance,
               content_type: str, overwrite: bool = False) -> StoredObject:
        dest = self.root / check_key(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        except OSError as exc:
            raise self._unwritable(key, exc) from None
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            sha256 = digest.hexdigest()
            if expected is not None and sha256 != expected:
                raise IntegrityError(f"{self.describe(key)}: the file read has SHA-256 {sha256}, "
                                     f"not the {expected} it was produced with; nothing was stored")
            current = None if overwrite else self.head(key)
            if current is not None and current.sha256 == sha256 and current.size == size \
                    and not _headers_differ(content_type, {"ContentType": current.content_type}):
                return replace(current, unchanged=True)
            os.chmod(tmp, 0o644)
            # From the fine clock: the kernel stamps a file's times from a coarse one (a clock tick, before
            # Linux 6.13's multigrain timestamps), which two writes of one key in a tick would share.
            os.utime(tmp, ns=(time.time_ns(),) * 2)
            record = StoredObject(key=key, size=size, sha256=sha256, content_type=content_type,
                                  provenance=provenance)
            # The sidecar written first, naming the inode and mtime the rename keeps, and renamed last: a sidecar
            # that cannot be written (a full disk), or a rename the filesystem refuses (an immutable file), leaves
            # the key as it was, with its own sidecar; a crash between the two renames leaves the old sidecar,
            # naming neither the inode nor the mtime under the key, which head() ignores.
            with self._sidecar_written(key, record, tmp.stat()):
                os.replace(tmp, dest)
                fsync_path(dest.parent)
            return record
        except OSError as exc:
            raise self._unwritable(key, exc) from None
        finally:
            tmp.unlink(missing_ok=True)

    def _unwritable(self, key: str, exc: OSError) -> StoreError:
        """Names what failed (the sidecar, a folder on the way; for a temporary of ours, its folder) and what to
        do, by cause: a full disk stops the run (StoreFull), and so does a read-only one, until it is remounted
        (StoreRefused); the rest are this key's alone."""
        failed = exc.filename2 or exc.filename
        if failed is None:
            failed = self.describe(key)
        elif Path(failed).name.startswith(".") and Path(failed).name.endswith(".tmp"):
            failed = Path(failed).parent
        if exc.errno == errno.EROFS:
            return StoreRefused(f"{failed}: cannot write: {exc.strerror} (remount the store's filesystem "
                                f"read-write)")
        if exc.errno in DISK_REFUSES_WRITES:
            return StoreFull(f"{failed}: cannot write: {exc.strerror} "
                             f"({shutil.disk_usage(self.root).free / 1e6:.1f} MB free in the store's filesystem)")
        return StoreError(f"{failed}: cannot write: {exc.strerror}{_LOCAL_REMEDIES.get(exc.errno, '')}")

    def _sidecar(self, key: str) -> Path:
        return self.root / self.META / f"{key}.json"

    @contextmanager
    def _sidecar_written(self, key: str, record: StoredObject, st: os.stat_result) -> Iterator[None]:
        """The sidecar written to a temporary, and renamed over the old one once the block (the data's rename)
        succeeds. A filesystem keeping whole seconds (ext4 with small inodes, HFS+) gets no mtime_ns: two writes
        in one second would share it. Its copies lose their records, as all did before mtime_ns."""
        sidecar = self._sidecar(key)
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        body = {"size": record.size, "sha256": record.sha256, "content_type": record.content_type,
                "inode": st.st_ino, "mtime_ns": st.st_mtime_ns if st.st_mtime_ns % 1_000_000_000 else None,
                "provenance": asdict(record.provenance)}
        fd, tmp_name = tempfile.mkstemp(prefix=f".{sidecar.name}.", suffix=".tmp", dir=sidecar.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(body, out)
                out.flush()
                os.fsync(out.fileno())
            yield
            os.replace(tmp, sidecar)
            fsync_path(sidecar.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def head(self, key: str) -> StoredObject | None:
        path = self.root / check_key(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(self._sidecar(key).read_text())
        except (OSError, ValueError):
            meta = {}
        same_file = st.st_ino == meta.get("inode") or st.st_mtime_ns == meta.get("mtime_ns")  # or its copy
        if not same_file:
            meta = {}  # written by something else, or a sidecar left from the previous content
        # the deposit's own file, since cut short or written over in place: damage, not a foreign file
        changed = bool(meta) and meta.get("size") != st.st_size
        return StoredObject(key=key, size=st.st_size, sha256=None if changed else meta.get("sha256"),
                            content_type=meta.get("content_type"),
                            provenance=Provenance(**meta.get("provenance", {})),
                            doubt=f"changed since its deposit ({st.st_size} bytes, recorded {meta['size']})"
                            if changed else None)

    def exists(self, key: str) -> bool:
        return (self.root / check_key(key)).is_file()

    def get_bytes(self, key: str) -> bytes:
        try:
            return (self.root / check_key(key)).read_bytes()
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot read: {exc.strerror}") from None

    def download(self, key: str, dest: Path) -> str:
        try:
            with open(self.root / check_key(key), "rb") as src:
                return _write_durably(dest, lambda out: shutil.copyfileobj(src, out, CHUNK))
        except FileNotFoundError:
            raise StoreError(f"{self.describe(key)}: no such object") from None
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot copy to {dest}: {exc.strerror}") from None

    def digest(self, key: str) -> tuple[str, int]:
        sink = _Sha256Sink()
        try:
            with open(self.root / check_key(key), "rb") as src:
                shutil.copyfileobj(src, sink, CHUNK)
        except FileNotFoundError:
            raise StoreError(f"{self.describe(key)}: no such object") from None
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot read: {exc.strerror}") from None
        return sink.result()

    def delete(self, key: str) -> bool:
        path = self.root / check_key(key)
        try:
            self._sidecar(key).unlink(missing_ok=True)
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:  # a read-only mount, a folder without write permission: as S3 refuses a delete
            raise StoreRefused(f"{self.describe(key)}: cannot delete: {exc.strerror} (check the store folder's "
                               f"permissions and mount)") from None
        return True

    def list(self, prefix: str = "") -> Iterator[ListedObject]:
        """A listing that cannot be read completely is a StoreError, never a shorter listing: the cache sync
        takes what is not listed for deleted. So a missing root is an error (an unmounted volume looks
        exactly like that), as a missing bucket is for S3; only a missing folder below an existing root is
        empty (nothing deposited under that prefix yet)."""
        _check_list_prefix(prefix)
        if not self.root.is_dir():
            raise self._missing_root("cannot list")
        found = []
        for path in self._files(self.root / prefix.rpartition("/")[0]):
            key = path.relative_to(self.root).as_posix()
            if key.startswith(prefix):
                try:
                    st = path.stat()
                except FileNotFoundError:  # deleted since the folder was read
                    continue
                except OSError as exc:
                    raise StoreError(f"{path}: cannot list: {exc.strerror}") from None
                found.append(ListedObject(key, st.st_size, datetime.fromtimestamp(st.st_mtime, timezone.utc)))
        return iter(sorted(found, key=lambda o: o.key))

    def _files(self, start: Path) -> Iterator[Path]:
        """The objects' files below `start`, folder by folder (sidecars and temporary files, hidden, aside). A
        folder that cannot be read is a StoreError, never a shorter walk; only `start` missing below the root
        is nothing (deposited under that prefix yet)."""
        def unreadable(exc: OSError) -> None:
            if not (isinstance(exc, FileNotFoundError) and Path(exc.filename) == start != self.root):
                raise StoreError(f"{exc.filename}: cannot list: {exc.strerror}") from None

        for dirpath, dirnames, filenames in os.walk(start, onerror=unreadable):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            yield from (Path(dirpath, name) for name in filenames if not name.startswith("."))

    def abort_incomplete_uploads(self, older_than: timedelta = timedelta(days=1),
                                 keys: str | tuple[str, ...] = "", exact: bool = False,
                                 dry: bool = False) -> list[str]:
        """The hidden temporary files (".<name>.<random>.tmp", of objects and of sidecars) that writes killed
        before their rename leave behind."""
        prefixes = _list_prefixes(keys)
        cutoff = time.time() - older_than.total_seconds()
        folders = {prefix.rpartition("/")[0] for prefix in prefixes}
        folders = {f for f in folders if not any(o != f and (o == "" or f.startswith(o + "/")) for o in folders)}
        aborted = set()
        for (top, suffix), folder in itertools.product(((self.root, ""), (self.root / self.META, ".json")), folders):
            for dirpath, dirnames, filenames in os.walk(top / folder):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                for name in filenames:
                    temporary = Path(dirpath, name)
                    if not (name.startswith(".") and name.endswith(".tmp")) or temporary.stat().st_mtime > cutoff:
                        continue
                    key = Path(dirpath, name[1:].rsplit(".", 2)[0]).relative_to(top).as_posix().removesuffix(suffix)
                    if _among(key, prefixes, exact):
                        if not dry:
                            temporary.unlink(missing_ok=True)
                        aborted.add(key)
        return sorted(aborted)


# ------------------------------------------------------------------------------------------------ S3 store


class RetryPolicy(Settings):
    """botocore's retry modes: 'standard' backs off exponentially (with jitter) on throttling, 5xx and
    connection errors; max_attempts counts the first try."""

    mode: Literal["standard", "adaptive", "legacy"] = "standard"
    max_attempts: int = Field(10, ge=1, le=100)
    connect_timeout: float = Field(10.0, gt=0)
    read_timeout: float = Field(60.0, gt=0)


class S3StoreSettings(Settings):
    """An S3 bucket (AWS or any S3-compatible server). Credentials come from boto3's chain (environment,
    shared profile, instance or task role): there is deliberately no setting for them."""

    per_host: ClassVar[frozenset[str]] = frozenset({
        "profile", "retry", "multipart_threshold", "multipart_chunksize", "max_concurrency", "max_bandwidth",
        "addressing_style"})
    """What may differ from host to host without changing where objects go or what they hold: the profile that
    picks a machine's credentials, how it transfers (Pipeline.worker_digests leaves them out)."""

    kind: Literal["s3"] = "s3"
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: Literal["auto", "virtual", "path"] = "auto"
    profile: str | None = None
    retry: RetryPolicy = RetryPolicy()
    multipart_threshold: int = Field(64 * MiB, ge=5 * MiB)
    multipart_chunksize: int = Field(16 * MiB, ge=5 * MiB, le=5 * 1024 * MiB)
    max_concurrency: int = Field(4, ge=1, le=64)
    max_bandwidth: int | None = Field(None, gt=0, description="bytes per second, each upload")
    keys: KeyTemplates = KeyTemplates()

    @field_validator("prefix")
    @classmethod
    def _valid_prefix(cls, prefix: str) -> str:
        try:
            return check_prefix(prefix)
        except UnsafeKey as exc:
            raise ValueError(str(exc)) from None

    @field_validator("endpoint_url")
    @classmethod
    def _valid_endpoint(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (use the environment or a profile)")
        return url


# S3 error codes meaning "the bytes received are not the bytes announced".
_INTEGRITY_CODES = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch"}
_REFUSED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
            "InvalidTokenId", "AllAccessDisabled"}  # the credentials (a HEAD's 403 carries no body: its code is
# "403"; InvalidTokenId is MinIO's for a session token it does not know)
_FULL = {"XMinioStorageFull", "XMinioAdminBucketQuotaExceeded"}  # MinIO's drives past their free-space threshold
_UNAVAILABLE = {"503", "ServiceUnavailable", "SlowDown", "XMinioServerNotInitialized"}  # still so after the retries


CUT_OFF = 499  # MinIO's answer, with no body, to the requests it cuts off as it stops


def _retry_cut_off(max_attempts: int, attempts: int, response=None, **_) -> float | None:
    """The delay before trying again a request the server cut off, which botocore's retry modes take for a
    client error; None leaves the decision to them. Backs off as their standard mode does."""
    if response is None or response[0].status_code != CUT_OFF or attempts >= max_attempts:
        return None
    return min(random.random() * 2 ** (attempts - 1), 20.0)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _checksum_doubt(recorded: str, checksum: str | None) -> str | None:
    """Why the object's bytes may not be those its metadata's SHA-256 (`recorded`) describes, or None. Every
    deposit makes the server store a SHA-256 (`checksum`), so a missing one, or one of a single PUT that differs,
    means another tool wrote the object, keeping its metadata. A multipart object's checksum is composite (the
    SHA-256 of its parts' digests, "-N"), which the whole object's SHA-256 cannot be compared with: only its
    presence is checked (reading the object back would tell more)."""
    try:
        _check_sha256(recorded)
    except ValueError:
        return f"the SHA-256 its metadata records ({recorded!r}) is none: another tool wrote the object"
    if checksum is None:
        return ("the server holds no SHA-256 of the object, as every deposit stores one: another tool wrote it, "
                "so the SHA-256 its metadata records is not trusted")
    if "-" not in checksum and checksum != _b64(bytes.fromhex(recorded)):
        return (f"the server's SHA-256 of the object ({checksum}) is not the one its metadata records "
                f"({_b64(bytes.fromhex(recorded))}): another tool overwrote it, keeping its metadata")
    return None


class _HashingReader:
    """The file as s3transfer reads it for a multipart upload, hashed on the way through.

    It computes the whole-object SHA-256 and the SHA-256 of every part (cut at the same part size s3transfer
    uses), so the file is read once. When the last byte has been read and the whole-object digest is not the
    expected one, the read raises: s3transfer then aborts the upload before completing it, and nothing
    replaces what the key held. A file that shrinks or grows while being read raises too.
    """

    def __init__(self, f: IO[bytes], size: int, part_size: int, expected: str, where: str):
        self._f, self._size, self._part_size, self._expected, self._where = f, size, part_size, expected, where
        self._whole = hashlib.sha256()
        self._part = hashlib.sha256()
        self._in_part = 0
        self._read = 0
        self.part_digests: list[bytes] = []

    def read(self, amount: int = -1) -> bytes:
        data = self._f.read(amount)
        if not data and self._read < self._size:
            raise IntegrityError(f"{self._where}: the file shrank to {self._read} bytes while being uploaded "
                                 f"(expected {self._size}); the upload was aborted")
        self._read += len(data)
        if self._read > self._size:
            raise IntegrityError(f"{self._where}: the file grew while being uploaded; the upload was aborted")
        self._whole.update(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self._part_size - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self._part_size:
                self._close_part()
        if data and self._read == self._size:
            if self._in_part:
                self._close_part()
            actual = self._whole.hexdigest()
            if actual != self._expected:
                raise IntegrityError(f"{self._where}: the file read has SHA-256 {actual}, not the "
                                     f"{self._expected} it was produced with; the upload was aborted")
        return data

    def _close_part(self) -> None:
        self.part_digests.append(self._part.digest())
        self._part = hashlib.sha256()
        self._in_part = 0

    def composite(self) -> str:
        """S3's checksum of a multipart object: SHA-256 of the concatenated part digests, then '-<parts>'."""
        return f"{_b64(hashlib.sha256(b''.join(self.part_digests)).digest())}-{len(self.part_digests)}"


class S3Store:
    """Objects in an S3 bucket below an optional prefix.

    Files below `multipart_threshold` go up in one PutObject carrying the producer's SHA-256
    (x-amz-checksum-sha256): the server recomputes it and refuses the bytes if they differ. Larger files go
    through s3transfer as a multipart upload with ChecksumAlgorithm=SHA256: the server checks every part, and
    then reports a composite checksum (SHA-256 of the part digests, "-N") rather than the object's SHA-256
    (S3 has no full-object SHA-256 for multipart uploads). So the whole-object SHA-256 is compared with the
    producer's while the parts are read, before the upload is completed; the composite the server reports is
    compared with the one computed from the same reads; and the whole-object SHA-256 is kept in the object's
    metadata (`sha256`) for head(), the ledger and no-op detection.
    """

    uploads_left: ClassVar[str] = ("their parts stay in the bucket (invisible, billed) until a lifecycle rule "
                                   "(AbortIncompleteMultipartUpload) removes them")

    def __init__(self, settings: S3StoreSettings, threads: int = 1):
        """`threads`: how many threads put and get at once through this store (a harvest's items in flight,
        move_store's --concurrency): each may hold max_concurrency connections for a multipart transfer and one
        more for its HEAD. A smaller pool drops connections as they come back (urllib3 warns "Connection pool is
        full" for each) and reconnects for the next part."""
        self.settings = settings
        self.keys = settings.keys
        self._base = f"{settings.prefix}/" if settings.prefix else ""
        self._pool = threads * (settings.max_concurrency + 1)
        self._client_lock = threading.Lock()
        self._client_pid: int | None = None
        self._client = None

    @property
    def client(self):
        """boto3 clients are not fork-safe: a Celery child or a process-pool worker builds its own."""
        with self._client_lock:
            if self._client_pid != os.getpid():
                s = self.settings
                self._client = boto3.session.Session(profile_name=s.profile).client(
                    "s3", endpoint_url=s.endpoint_url, region_name=s.region,
                    config=Config(retries={"mode": s.retry.mode, "total_max_attempts": s.retry.max_attempts},
                                  connect_timeout=s.retry.connect_timeout, read_timeout=s.retry.read_timeout,
                                  s3={"addressing_style": s.addressing_style},
                                  max_pool_connections=max(self._pool, _BOTOCORE_POOL)))
                # as a TransferManager does: a throttled body is read at full speed for the request's signature
                events = self._client.meta.events
                events.register_first("request-created.s3", signal_not_transferring,
                                      unique_id="s3upload-not-transferring")
                events.register_last("request-created.s3", signal_transferring, unique_id="s3upload-transferring")
                events.register_first("needs-retry.s3", partial(_retry_cut_off, s.retry.max_attempts),
                                      unique_id="gcis-retry-cut-off")
                self._client_pid = os.getpid()
            return self._client

    def _full_key(self, key: str) -> str:
        return self._base + check_key(key)

    def describe(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{self._base}{key}"

    def _error(self, key: str, action: str, exc: Exception) -> StoreError:
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code, cls, hint = error.get("Code"), StoreError, ""
            if code in _REFUSED:
                cls, hint = StoreRefused, " (check the store's credentials and its bucket policy"
                hint += "; deleting superseded access masters needs s3:DeleteObject on <prefix>/*)" \
                    if action == "delete" else ")"
            elif code == "NoSuchBucket":
                hint = " (check store.bucket, endpoint_url and region; gcis-etl never creates a bucket)"
            else:
                cls = IntegrityError if code in _INTEGRITY_CODES else StoreFull if code in _FULL \
                    else StoreUnavailable if code in _UNAVAILABLE else StoreError
            return cls(f"{self.describe(key)}: {action} refused by the server: {code}: {error.get('Message')}{hint}")
        if isinstance(exc, NoCredentialsError):
            return StoreRefused(f"{self.describe(key)}: {action} failed: {exc} (set AWS_ACCESS_KEY_ID and "
                                f"AWS_SECRET_ACCESS_KEY, store.profile, or give the host a role)")
        if isinstance(exc, SSLError):  # every request alike, until the certificate or the trust store changes
            return StoreRefused(f"{self.describe(key)}: {action} failed: {exc} (check the endpoint's certificate, "
                                f"and the CA bundle: AWS_CA_BUNDLE)")
        # unreachable, timed out (a hung server), cut off: botocore's transport failures, past their retries
        if isinstance(exc, (TransportError, HTTPClientError)):
            return StoreUnavailable(f"{self.describe(key)}: {action} failed after "
                                    f"{self.settings.retry.max_attempts} attempts: {exc} (is the server up, and "
                                    f"store.endpoint_url right?)")
        return StoreError(f"{self.describe(key)}: {action} failed: {exc}")

    def check(self, *, create: bool | None = None) -> None:
        """A ListObjectsV2 of at most one key under the prefix: it needs only s3:ListBucket on the prefix,
        which a deposit-only policy grants (with an s3:prefix condition) since, without it, S3 answers a HEAD
        of a key not yet deposited with 403 and no put could tell a new key from a refusal. HeadBucket would
        need s3:ListBucket on the whole bucket; a HEAD of some key cannot tell a missing bucket, whose 404 has
        no body either, from a missing key. The bucket is never created, whatever `create` says; when it is
        False, the key listed must be there (a changed or mistyped prefix lists none)."""
        try:
            listed = self.client.list_objects_v2(Bucket=self.settings.bucket, Prefix=self._base, MaxKeys=1)
        except (BotoCoreError, ClientError) as exc:
            raise self._error("", "store check", exc) from None
        if create is False and not listed.get("Contents"):
            raise _holds_nothing(self.describe(""), f"store.prefix ({self.settings.prefix!r}) or store.bucket")

    def _call(self, key: str, action: str, operation: str, **kwargs) -> dict:
        try:
            return getattr(self.client, operation)(Bucket=self.settings.bucket, Key=self._full_key(key), **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(key, action, exc) from None

    def _head(self, key: str) -> dict | None:
        """The raw HeadObject response (with the checksum S3 stored), or None when there is no object."""
        try:
            return self.client.head_object(Bucket=self.settings.bucket, Key=self._full_key(key),
                                           ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._error(key, "head", exc) from None
        except BotoCoreError as exc:
            raise self._error(key, "head", exc) from None

    def head(self, key: str) -> StoredObject | None:
        r = self._head(key)
        return None if r is None else self._stored(key, r)

    def _stored(self, key: str, r: dict) -> StoredObject:
        """What a HeadObject response says is stored under `key`."""
        metadata = r.get("Metadata", {})
        sha256 = metadata.get("sha256")
        return StoredObject(key=key, size=r["ContentLength"], sha256=sha256, content_type=r.get("ContentType"),
                            provenance=Provenance.from_metadata(metadata),
                            doubt=None if sha256 is None else _checksum_doubt(sha256, r.get("ChecksumSHA256")))

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def _unchanged(self, key: str, sha256: str, size: int, content_type: str) -> StoredObject | None:
        """What `key` holds, if it is these bytes as a put would store them: a document (manifest, collection)
        stored with other headers than _object_headers' (before DOCUMENT_CACHE_CONTROL, or by another tool) is
        put again, or browsers and CDNs would go on caching it as they please."""
        r = self._head(key)
        current = None if r is None else self._stored(key, r)
        if current is not None and current.doubt:
            log.warning("%s: %s; deposited again", self.describe(key), current.doubt)
            return None
        if current is not None and current.sha256 == sha256 and current.size == size \
                and not _headers_differ(content_type, {"ContentType": current.content_type,
                                                       "CacheControl": r.get("CacheControl")}):
            return replace(current, unchanged=True)
        return None

    def put(self, key: str, path: Path, *, sha256: str | None = None, provenance: Provenance = Provenance(),
            content_type: str | None = None, overwrite: bool = False) -> StoredObject:
        _check_sha256(sha256)
        content_type = content_type or content_type_for(key)
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot read {path}: {exc.strerror}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if sha256 is None:
                # Needed before sending: for the no-op check, and as the checksum a single PUT announces.
                sha256 = sha256_stream(f)
                f.seek(0)
            done = None if overwrite else self._unchanged(key, sha256, size, content_type)
            if done:
                return done
            if size < self.settings.multipart_threshold:
                return self._put_single(key, f, size, sha256, provenance, content_type)
            return self._put_multipart(key, f, size, sha256, provenance, content_type)

    def put_bytes(self, key: str, data: bytes, *, content_type: str,
                  provenance: Provenance = Provenance()) -> StoredObject:
        sha256 = hashlib.sha256(data).hexdigest()
        return self._unchanged(key, sha256, len(data), content_type) or self._put_single(
            key, data, len(data), sha256, provenance, content_type)

    def _put_single(self, key: str, body: IO[bytes] | bytes, size: int, sha256: str, provenance: Provenance,
                    content_type: str) -> StoredObject:
        announced = _b64(bytes.fromhex(sha256))
        if self.settings.max_bandwidth:  # s3transfer throttles multipart uploads only; most masters are smaller
            body = BandwidthLimitedStream(io.BytesIO(body) if isinstance(body, bytes) else body,
                                          LeakyBucket(self.settings.max_bandwidth), TransferCoordinator())
        r = self._call(key, "put", "put_object", Body=body, ContentLength=size, **_object_headers(content_type),
                       ChecksumSHA256=announced, Metadata={**provenance.to_metadata(), "sha256": sha256})
        if r.get("ChecksumSHA256") != announced:
            raise IntegrityError(f"{self.describe(key)}: the server reports SHA-256 {r.get('ChecksumSHA256')}, "
                                 f"not the {announced} sent")
        return StoredObject(key=key, size=size, sha256=sha256, content_type=content_type, provenance=provenance)

    def _put_multipart(self, key: str, f: IO[bytes], size: int, sha256: str, provenance: Provenance,
                       content_type: str) -> StoredObject:
        s = self.settings
        reader = _HashingReader(f, size, ChunksizeAdjuster().adjust_chunksize(s.multipart_chunksize, size),
                                sha256, self.describe(key))
        extra = {"ChecksumAlgorithm": "SHA256", **_object_headers(content_type),
                 "Metadata": {**provenance.to_metadata(), "sha256": sha256}}
        # Leaving the TransferManager on any exception (KeyboardInterrupt included) cancels the transfer and
        # aborts the multipart upload; a killed process leaves parts that abort_incomplete_uploads() removes.
        try:
            with TransferManager(self.client, self._transfer_config()) as manager:
                manager.upload(reader, s.bucket, self._full_key(key), extra_args=extra,
                               subscribers=[_KnownSize(size)]).result()
        except (BotoCoreError, ClientError) as exc:
            raise self._error(key, "multipart upload", exc) from None
        r = self._head(key)
        reported = (r["ContentLength"], r.get("ChecksumSHA256")) if r else (None, None)
        if reported != (size, reader.composite()):
            self.delete(key)
            raise IntegrityError(f"{self.describe(key)}: the server reports {reported[0]} bytes with checksum "
                                 f"{reported[1]}, not the {size} bytes with {reader.composite()} sent; "
                                 f"the object was deleted")
        return StoredObject(key=key, size=size, sha256=sha256, content_type=content_type, provenance=provenance)

    def get_bytes(self, key: str) -> bytes:
        return self._call(key, "get", "get_object")["Body"].read()

    def _transfer_config(self) -> TransferConfig:
        s = self.settings
        return TransferConfig(multipart_threshold=s.multipart_threshold, multipart_chunksize=s.multipart_chunksize,
                              max_request_concurrency=s.max_concurrency, max_bandwidth=s.max_bandwidth,
                              num_download_attempts=s.retry.max_attempts)

    def _transfer(self, key: str, action: str, out, config: TransferConfig) -> None:
        """The object's bytes written to `out` (a file, or a non-seekable sink) through s3transfer, whose retries
        of a body cut short apply."""
        try:
            with TransferManager(self.client, config) as manager:
                manager.download(self.settings.bucket, self._full_key(key), out).result()
        except (BotoCoreError, ClientError) as exc:
            raise self._error(key, action, exc) from None
        except RetriesExceededError as exc:  # s3transfer's own retries of a body cut short, every time
            raise self._error(key, action, exc.last_exception) from None

    def download(self, key: str, dest: Path) -> str:
        try:
            return _write_durably(dest, partial(self._transfer, key, "download", config=self._transfer_config()))
        except OSError as exc:
            raise StoreError(f"{self.describe(key)}: cannot write {dest}: {exc.strerror}") from None

    def digest(self, key: str) -> tuple[str, int]:
        """Every object in ranged parts (multipart_threshold 1): s3transfer writes a single GET to a non-seekable
        target as it comes, and the GET it retries after a body cut short starts from the first byte again,
        which would hash the bytes seen twice; ranged parts go through its queue, which drops the bytes seen.
        That queue holds the parts come before an earlier one, up to max_in_memory_download_chunks (s3transfer's
        10) x multipart_chunksize a key: 160 MiB with the default 16 MiB parts, ~10 GiB under an audit's
        --concurrency 64. A window of max_concurrency parts (at least 2, one written while the next arrives)
        keeps every request of the key busy and bounds it to max_concurrency x multipart_chunksize (64 MiB)."""
        sink = _Sha256Sink()
        config = self._transfer_config()
        config.multipart_threshold = 1
        config.max_in_memory_download_chunks = max(2, config.max_request_concurrency)
        self._transfer(key, "read", sink, config)
        return sink.result()

    def delete(self, key: str) -> bool:
        existed = self.exists(key)
        self._call(key, "delete", "delete_object")
        return existed

    def _paginate(self, operation: str, result: str, **kwargs) -> Iterator[dict]:
        try:
            for page in self.client.get_paginator(operation).paginate(Bucket=self.settings.bucket, **kwargs):
                yield from page.get(result, [])
        except (BotoCoreError, ClientError) as exc:
            raise self._error("", operation, exc) from None

    def list(self, prefix: str = "") -> Iterator[ListedObject]:
        _check_list_prefix(prefix)
        for o in self._paginate("list_objects_v2", "Contents", Prefix=self._base + prefix):
            yield ListedObject(o["Key"][len(self._base):], o["Size"], o["LastModified"])

    def abort_incomplete_uploads(self, older_than: timedelta = timedelta(days=1),
                                 keys: str | tuple[str, ...] = "", exact: bool = False,
                                 dry: bool = False) -> list[str]:
        """Abort the multipart uploads of keys starting with `keys` started more than `older_than` ago, and
        return their keys. A process killed mid-upload leaves its parts behind (invisible, but billed); on AWS
        a bucket lifecycle rule (AbortIncompleteMultipartUpload) does the same. This is housekeeping, not what
        a deposit needs: a policy granting only that (the README's) refuses the listing or the abort, which is a
        warning, never an error: a run after a kill -9 stopped on it, every time."""
        cutoff = datetime.now(timezone.utc) - older_than
        prefixes = tuple(self._base + key for key in _list_prefixes(keys))
        aborted: list[str] = []
        try:
            stale = [u for u in self._paginate("list_multipart_uploads", "Uploads")  # MinIO ignores partial Prefixes
                     if _among(u["Key"], prefixes, exact) and u["Initiated"] <= cutoff]
            for upload in stale:
                key = upload["Key"][len(self._base):]
                if dry:
                    aborted.append(key)
                    continue
                try:
                    self.client.abort_multipart_upload(Bucket=self.settings.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                except (BotoCoreError, ClientError) as exc:
                    raise self._error(key, "abort", exc) from None
                aborted.append(key)
        except StoreRefused as exc:
            log.warning("%s; the parts of uploads a killed run left stay in the bucket (invisible, billed) until "
                        "a lifecycle rule (AbortIncompleteMultipartUpload) removes them, or grant "
                        "s3:ListBucketMultipartUploads on the bucket and s3:AbortMultipartUpload on <prefix>/*", exc)
        return aborted


class _KnownSize(BaseSubscriber):
    """Tells s3transfer the size up front, so it reads the stream part by part instead of probing it."""

    def __init__(self, size: int):
        self.size = size

    def on_queued(self, future, **kwargs):
        future.meta.provide_transfer_size(self.size)


def _check_list_prefix(prefix: str) -> None:
    if prefix.rstrip("/"):
        check_key(prefix.rstrip("/"))


def _list_prefixes(keys: str | tuple[str, ...]) -> tuple[str, ...]:
    prefixes = (keys,) if isinstance(keys, str) else keys
    for prefix in prefixes:
        _check_list_prefix(prefix)
    return prefixes


def _among(key: str, prefixes: tuple[str, ...], exact: bool) -> bool:
    """Whether abort_incomplete_uploads' `keys` take in `key`: a key "p/o/a.tif" is a prefix of item "a.tif"'s
    "p/o/a.tif.tif", whose upload may be going on."""
    return key in prefixes if exact else key.startswith(prefixes)


def uploads_kept(store: Store, pipeline: str, who: str, older_than: timedelta = timedelta(0)) -> str | None:
    """Why the incomplete uploads of images under the pipeline's prefix, begun more than `older_than` ago, which
    `who` may have left, are not aborted, and what removes them; None when there are none (one listing, dry), or
    the pipeline's image keys start with a prefix of its own (KeyTemplates.own_image_prefix), under which they
    are aborted: without one, any upload under their prefix may be another pipeline's, going on (aborting it
    failed that pipeline's item)."""
    if store.keys.own_image_prefix(pipeline) is not None:
        return None
    found = store.abort_incomplete_uploads(older_than, keys=store.keys.image_prefix(pipeline), dry=True)
    if not found:
        return None
    return (f"{len(found)} incomplete uploads of images were not aborted, though {who} may have left some: "
            f"store.keys.image ({store.keys.image!r}) does not begin, after any fixed text, with {{pipeline}} and a "
            f"character no pipeline name has (such as \"/\"), so they cannot be told from another pipeline's "
            f"uploads going on in the same store; {store.uploads_left}")


StoreSettings = Annotated[Union[LocalStoreSettings, S3StoreSettings], Field(discriminator="kind")]


STORE_KINDS: dict[str, Callable[..., Store]] = {
    "local": lambda settings, threads: LocalStore(settings),  # no connection pool to size
    "s3": S3Store,
}
"""How open_store opens each kind of StoreSettings, called with (settings, threads): a kind added to the union
needs its entry here."""


def open_store(settings: LocalStoreSettings | S3StoreSettings, threads: int = 1) -> Store:
    """`threads`: how many threads use the store at once (S3Store sizes its connection pool for them). A kind
    with no entry in STORE_KINDS is a ConfigError, rather than opened as another kind's store."""
    opener = STORE_KINDS.get(settings.kind)
    if opener is None:
        raise ConfigError(f"store: kind {settings.kind!r} has no implementation (gcis_etl.stores.STORE_KINDS knows "
                          f"{', '.join(STORE_KINDS)})")
    return opener(settings, threads)
