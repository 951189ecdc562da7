"""Streaming a master into scratch space, verified: the one download loop every connector uses.

Bytes go to a hidden temporary name next to the destination and are renamed into place only once
their count matches what the source and the transport announced and their digest matches the
source's fixity. A truncated or corrupt transfer is retried under the retry policy and never
reaches the final name, so the converter only ever sees verified files. A body that runs past the size the
source records is cut there rather than compared once it has ended: an endless body, or a small one decoding to
ever more, would fill the scratch space first. A transfer slower than the
policy's min_transfer_bytes_per_second is interrupted: a body trickling in never trips the read timeout,
which only bounds silences. A master larger than the scratch space's free room fails alone, before a byte is
written, where it would otherwise fill the disk and stop the run (the worker stops on a full scratch space).
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterable, Iterator

from connectors.base import FetchedFile, Fixity, SourceItem
from connectors.errors import FetchIntegrityError, TransferInterrupted
from connectors.retry import RetryBudget, RetryPolicy, TransferPace
from gcis_etl.durable import DISK_MARGIN, room, special_kind
from gcis_etl.errors import SourceError

CHUNK_SIZE = 1 << 20
_KERNEL_COPY = 1 << 30
# no copy_file_range (kernel or libc); files on two filesystems (refused by most kernels); none on this filesystem
_NO_KERNEL_COPY = {errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL}

_SCRATCH_NAME_MAX = 120  # bytes: a name under NAME_MAX (255) with the temporary name's and a converter's suffixes

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


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for reading, or OSError when it is no regular file: opened without waiting (a FIFO swapped in
    since the listing has no writer), checked on the descriptor opened, then read as any file. A FIFO, device or
    socket found by stat is not opened at all (opening some devices does something)."""
    kind = special_kind(os.stat(path).st_mode)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        kind = special_kind(mode) or (None if stat.S_ISREG(mode) else "a folder")
        if kind is None:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        os.close(fd)
    raise OSError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))


def scratch_name(item: SourceItem) -> str:
    """A safe, collision-free file name for an item: its id made filesystem-safe, plus the original suffix; a long
    one keeps its beginning, the hash of the whole id making it unique."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", item.id).strip("._") or "item"
    suffix = PurePosixPath(item.original_name.replace("\\", "/")).suffix.lower()
    if not re.fullmatch(r"\.[a-z0-9]{1,8}", suffix):
        suffix = ""
    if safe != item.id or len(safe) > _SCRATCH_NAME_MAX:
        safe = f"{safe[:_SCRATCH_NAME_MAX - 9 - len(suffix)]}-{hashlib.sha1(item.id.encode()).hexdigest()[:8]}"
    return safe if safe.lower().endswith(suffix) else safe + suffix


def fetch_verified(item: SourceItem, dest_dir: Path, open_body: BodyOpener, policy: RetryPolicy) -> FetchedFile:
    """Stream `item` into `dest_dir`, retrying interrupted or unverifiable transfers within `policy`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    _refuse_too_large(item, dest_dir)
    final = dest_dir / scratch_name(item)
    budget = RetryBudget(policy)
    expected = item.fixity if item.fixity and hashlib_name(item.fixity.algorithm) else None
    while True:
        budget.start_attempt()
        temp = dest_dir / f".{final.name}.{uuid.uuid4().hex[:12]}.part"
        try:
            with open_body(budget) as body:
                size, sha256, fixity_digest = _copy(body, temp, expected, TransferPace(policy, item.id), item.size)
                announced = body.length
                transferred = body.transferred() if body.transferred else size
            problem = _disagreement(item, expected, announced, transferred, size, fixity_digest)
        except TransferInterrupted as exc:  # it names what was read: the transport its request, the pace the item
            temp.unlink(missing_ok=True)
            budget.after_failure(str(exc))
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


class TooLargeForScratch(SourceError):
    """The master is larger than the scratch space's free room: its item fails, and the others go on."""


def _refuse_too_large(item: SourceItem, dest_dir: Path) -> None:
    """Fail an item whose listed size exceeds the free room in `dest_dir` (less DISK_MARGIN), rather than
    fill the disk. A disk already full (no room beyond the margin) or read-only is left to refuse the write, which
    stops the run as every item would fail alike."""
    free, read_only = room(dest_dir)
    if item.size is None or read_only or free <= DISK_MARGIN or item.size <= free - DISK_MARGIN:
        return
    raise TooLargeForScratch(f"{item.id} is {item.size / 1e6:.1f} MB; the scratch space has {free / 1e6:.1f} MB "
                             f"free (scratch: {dest_dir}): too large to fetch here")


class _TooLong(Exception):
    """More bytes arrived than the source records: why, the transfer cut there."""


def _too_long(received: int, size: int, local: bool) -> str:
    """Why more bytes than the source records arrived: a local file growing, else a body longer than announced."""
    if local:
        return f"more than the {size} bytes listed arrived: it grew while it was read (still being written?)"
    return f"received {received} bytes, the source records {size}: stopped reading there"


def _copy(body: Body, temp: Path, expected: Fixity | None, pace: TransferPace,
          size: int | None) -> tuple[int, str, str | None]:
    """Write `body` to `temp`; the size and digests are those of the bytes `temp` received: read from it
    again after a kernel copy, a chunk at a time (mapped whole, a master counted in full in the pool
    process's resident memory, which its recycling and limits go by)."""
    local = body.file is not None
    with open(temp, "xb") as out:
        written = _copy_in_kernel(body.file, out, size) if body.file is not None else None
        if written is None:
            return _digest(_bounded(_paced(body.chunks, pace), size, local), expected, out)
    if size is not None and written > size:
        raise _TooLong(_too_long(written, size, local))
    with open(temp, "rb") as copied:
        return _digest(iter(lambda: copied.read(CHUNK_SIZE), b""), expected)


def _copy_in_kernel(source: BinaryIO, out: BinaryIO, size: int | None) -> int | None:
    """Copy `source` into the empty `out` with copy_file_range (a reflink where the filesystem shares
    blocks), at most one byte past the `size` listed (a file still growing is not copied to its end first);
    the bytes copied, or None, nothing copied, where the kernel or the filesystems cannot."""
    limit = None if size is None else size + 1
    copied = 0
    try:
        while limit is None or copied < limit:
            count = _KERNEL_COPY if limit is None else min(_KERNEL_COPY, limit - copied)
            done = os.copy_file_range(source.fileno(), out.fileno(), count)
            if not done:
                break
            copied += done
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
        source.seek(0)
        out.seek(0)
        out.truncate()
        return None
    return copied


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


def _bounded(chunks: Iterable[bytes], size: int | None, local: bool) -> Iterator[bytes]:
    """`chunks`, cut (_TooLong) before the first that takes them past the source's `size`: an endless body, or a
    small one decoding to ever more (a gzip bomb), or a `local` file still being written, must not fill the scratch
    space before the sizes are compared. The transport itself reads no more than the length it announced
    (http.client, botocore)."""
    received = 0
    for chunk in chunks:
        received += len(chunk)
        if size is not None and received > size:
            raise _TooLong(_too_long(received, size, local))
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
