"""Streaming a master into scratch space, verified: the one download loop every connector uses.

Bytes go to a hidden temporary name next to the destination and are renamed into place only once
their count matches what the source and the transport announced and their digest matches the
source's fixity. A truncated or corrupt transfer is retried under the retry policy and never
reaches the final name, so the converter only ever sees verified files.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import re
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterable

from connectors.base import FetchedFile, Fixity, SourceItem
from connectors.errors import FetchIntegrityError, TransferInterrupted
from connectors.retry import RetryBudget, RetryPolicy

CHUNK_SIZE = 1 << 20
_KERNEL_COPY = 1 << 30
# no copy_file_range (kernel or libc); files on two filesystems (refused by most kernels); none on this filesystem
_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL}

_ALGORITHMS = {"md5": "md5", "sha1": "sha1", "sha224": "sha224", "sha256": "sha256",
               "sha384": "sha384", "sha512": "sha512"}
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True)
class Body:
    """An open stream of bytes and the length the transport announced for it (Content-Length), if any;
    `file`, when the bytes are a local file's, lets the kernel copy them (copy_file_range)."""

    chunks: Iterable[bytes]
    length: int | None = None
    file: BinaryIO | None = None


BodyOpener = Callable[[RetryBudget], AbstractContextManager[Body]]


def fixity(algorithm: str, value: str) -> Fixity | None:
    """A Fixity from a source's spelling ("MD5", "SHA-256", "sha1"), or None for algorithms we cannot check."""
    name = _ALGORITHMS.get(re.sub(r"[^a-z0-9]", "", algorithm.lower()))
    digest = value.strip().lower()
    if name is None or not _HEX.match(digest) or len(digest) != hashlib.new(name).digest_size * 2:
        return None
    return Fixity(name, digest)


def scratch_name(item: SourceItem) -> str:
    """A safe, collision-free file name for an item: its id made filesystem-safe, plus the original suffix."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", item.id).strip("._") or "item"
    if safe != item.id:
        safe = f"{safe}-{hashlib.sha1(item.id.encode()).hexdigest()[:8]}"
    suffix = PurePosixPath(item.original_name.replace("\\", "/")).suffix.lower()
    if not re.fullmatch(r"\.[a-z0-9]{1,8}", suffix) or safe.lower().endswith(suffix):
        suffix = ""
    return safe + suffix


def fetch_verified(item: SourceItem, dest_dir: Path, open_body: BodyOpener, policy: RetryPolicy) -> FetchedFile:
    """Stream `item` into `dest_dir`, retrying interrupted or unverifiable transfers within `policy`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / scratch_name(item)
    budget = RetryBudget(policy)
    while True:
        budget.start_attempt()
        temp = dest_dir / f".{final.name}.{uuid.uuid4().hex[:12]}.part"
        try:
            with open_body(budget) as body:
                size, sha256, fixity_digest = _copy(body, temp, item.fixity)
                announced = body.length
        except TransferInterrupted as exc:
            temp.unlink(missing_ok=True)
            budget.after_failure(f"{item.id}: {exc}")
            continue
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        problem = _disagreement(item, announced, size, fixity_digest)
        if problem:
            temp.unlink(missing_ok=True)
            budget.after_failure(f"{item.id}: {problem}", give_up=FetchIntegrityError)
            continue
        os.replace(temp, final)
        return FetchedFile(item=item, path=final, size=size, sha256=sha256, fixity_verified=item.fixity is not None)


def _copy(body: Body, temp: Path, expected: Fixity | None) -> tuple[int, str, str | None]:
    """Write `body` to `temp`; the size and digests are those of the bytes `temp` received: read from it
    again after a kernel copy."""
    with open(temp, "xb") as out:
        if body.file is None or not _copy_in_kernel(body.file, out):
            return _digest(body.chunks, expected, out)
    with open(temp, "rb") as copied:
        if not os.fstat(copied.fileno()).st_size:
            return _digest([], expected)
        with mmap.mmap(copied.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _digest([mapped], expected)


def _copy_in_kernel(source: BinaryIO, out: BinaryIO) -> bool:
    """Copy `source` into the empty `out` with copy_file_range (a reflink where the filesystem shares
    blocks), or return False, nothing copied, where the kernel or the filesystems cannot."""
    try:
        while os.copy_file_range(source.fileno(), out.fileno(), _KERNEL_COPY):
            pass
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
        source.seek(0)
        out.seek(0)
        out.truncate()
        return False
    return True


def _digest(chunks: Iterable[bytes], expected: Fixity | None,
            out: BinaryIO | None = None) -> tuple[int, str, str | None]:
    """Size, SHA-256 and the digest `expected` names (None without one) of `chunks`, written to `out`."""
    sha256 = hashlib.sha256()
    other = hashlib.new(expected.algorithm) if expected and expected.algorithm != "sha256" else None
    size = 0
    for chunk in chunks:
        if out is not None:
            out.write(chunk)
        sha256.update(chunk)
        if other:
            other.update(chunk)
        size += len(chunk)
    if expected is None:
        return size, sha256.hexdigest(), None
    return size, sha256.hexdigest(), (other or sha256).hexdigest()


def _disagreement(item: SourceItem, announced: int | None, size: int, digest: str | None) -> str | None:
    if announced is not None and size != announced:
        return f"received {size} bytes, the response announced {announced}"
    if item.size is not None and size != item.size:
        return f"received {size} bytes, the source records {item.size}"
    if item.fixity and digest != item.fixity.value:
        return f"{item.fixity.algorithm} {digest} does not match the source's fixity {item.fixity.value}"
    return None
