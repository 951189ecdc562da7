"""Streaming a master into scratch space, verified: the one download loop every connector uses.

Bytes go to a hidden temporary name next to the destination and are renamed into place only once
their count matches what the source and the transport announced and their digest matches the
source's fixity. A truncated or corrupt transfer is retried under the retry policy and never
reaches the final name, so the converter only ever sees verified files. A body that runs past the size the
source records is cut there rather than compared once it has ended: an endless body, or a small one decoding to
ever more, would fill the scratch space first. A transfer slower than the
policy's min_transfer_bytes_per_second is interrupted: a body trickling in never trips the read timeout,
which only bounds silences.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterable, Iterator

from connectors.base import FetchedFile, Fixity, SourceItem
from connectors.errors import FetchIntegrityError, TransferInterrupted
from connectors.retry import RetryBudget, RetryPolicy, TransferPace

CHUNK_SIZE = 1 << 20
_KERNEL_COPY = 1 << 30
# no copy_file_range (kernel or libc); files on two filesystems (refused by most kernels); none on this filesystem
_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL}

CHECKABLE_DIGESTS = ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")  # hashlib names
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True)
class Body:
    """An open stream of bytes and the length the transport announced for it (Content-Length), if any;
    `file`, when the bytes are a local file's, lets the kernel copy them (copy_file_range). Where the
    transport decodes what it carries (HTTP Content-Encoding), `length` counts the encoded bytes:
    `transferred` then says how many of those arrived, the chunks' own count being the decoded size."""

    chunks: Iterable[bytes]
    length: int | None = None
    file: BinaryIO | None = None
    transferred: Callable[[], int] | None = None


BodyOpener = Callable[[RetryBudget], AbstractContextManager[Body]]


def hashlib_name(algorithm: str) -> str | None:
    """The hashlib name of a digest as a source or a setting spells it ("MD5", "SHA-256", "sha1" -> "md5",
    "sha256", "sha1"), or None for one we cannot compute ("CRC32"): the one reading of those names."""
    name = _compact(algorithm)
    return name if name in CHECKABLE_DIGESTS else None


def fixity(algorithm: str, value: str) -> Fixity | None:
    """A Fixity from a source's spelling ("MD5", "SHA-256", "sha1"); None without a value or for a malformed
    digest. An algorithm we cannot compute (CRC32) is kept under its compacted name, so that the fetch says
    it was not checked instead of passing as a master that came with no fixity."""
    digest = value.strip().lower()
    name = hashlib_name(algorithm)
    if name is None:
        unknown = _compact(algorithm)
        return Fixity(unknown, digest) if unknown and digest else None
    if not _HEX.match(digest) or len(digest) != hashlib.new(name).digest_size * 2:
        return None
    return Fixity(name, digest)


def fetch_warnings(fetched: FetchedFile) -> tuple[str, ...]:
    """What the item's outcome must say about its fetch: a source fixity that could not be checked."""
    given = fetched.item.fixity
    if given is None or fetched.fixity_verified:
        return ()
    return (f"the source's {given.algorithm} fixity cannot be checked (only {', '.join(CHECKABLE_DIGESTS)} can): "
            "the master was not verified against it",)


def _compact(algorithm: str) -> str:
    return re.sub(r"[^a-z0-9]", "", algorithm.lower())


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
    expected = item.fixity if item.fixity and hashlib_name(item.fixity.algorithm) else None
    while True:
        budget.start_attempt()
        temp = dest_dir / f".{final.name}.{uuid.uuid4().hex[:12]}.part"
        try:
            with open_body(budget) as body:
                size, sha256, fixity_digest = _copy(body, temp, expected, TransferPace(policy), item.size)
                announced = body.length
                transferred = body.transferred() if body.transferred else size
            problem = _disagreement(item, expected, announced, transferred, size, fixity_digest)
        except TransferInterrupted as exc:
            temp.unlink(missing_ok=True)
            budget.after_failure(f"{item.id}: {exc}")
            continue
        except _TooLong as exc:
            problem = str(exc)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if problem:
            temp.unlink(missing_ok=True)
            budget.after_failure(f"{item.id}: {problem}", give_up=FetchIntegrityError)
            continue
        os.replace(temp, final)
        return FetchedFile(item=item, path=final, size=size, sha256=sha256, fixity_verified=expected is not None)


class _TooLong(Exception):
    """More bytes arrived than the source records: why, the transfer cut there."""


def _copy(body: Body, temp: Path, expected: Fixity | None, pace: TransferPace,
          size: int | None) -> tuple[int, str, str | None]:
    """Write `body` to `temp`; the size and digests are those of the bytes `temp` received: read from it
    again after a kernel copy, a chunk at a time (mapped whole, a master counted in full in the pool
    process's resident memory, which its recycling and limits go by)."""
    with open(temp, "xb") as out:
        if body.file is None or not _copy_in_kernel(body.file, out):
            return _digest(_bounded(_paced(body.chunks, pace), size), expected, out)
    with open(temp, "rb") as copied:
        return _digest(iter(lambda: copied.read(CHUNK_SIZE), b""), expected)


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


def _paced(chunks: Iterable[bytes], pace: TransferPace) -> Iterator[bytes]:
    """`chunks`, interrupted when they come too slowly (checked as each arrives)."""
    for chunk in chunks:
        pace.arrived(len(chunk))
        yield chunk


def _bounded(chunks: Iterable[bytes], size: int | None) -> Iterator[bytes]:
    """`chunks`, cut (_TooLong) before the first that takes them past the source's `size`: an endless body, or a
    small one decoding to ever more (a gzip bomb), must not fill the scratch space before the sizes are compared.
    The transport itself reads no more than the length it announced (http.client, botocore)."""
    received = 0
    for chunk in chunks:
        received += len(chunk)
        if size is not None and received > size:
            raise _TooLong(f"received {received} bytes, the source records {size}: stopped reading there")
        yield chunk


def _disagreement(item: SourceItem, expected: Fixity | None, announced: int | None, transferred: int, size: int,
                  digest: str | None) -> str | None:
    """Why the bytes received are not the master: the transport's count against what it announced, the
    decoded bytes against the source's size and fixity."""
    if announced is not None and transferred != announced:
        return f"received {transferred} bytes, the response announced {announced}"
    if item.size is not None and size != item.size:
        return f"received {size} bytes, the source records {item.size}"
    if expected and digest != expected.value:
        return f"{expected.algorithm} {digest} does not match the source's fixity {expected.value}"
    return None
