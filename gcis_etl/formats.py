"""Format by content (masters arrive with wrong extensions, so the first bytes decide, never the name), and
what a file name tells iipsrv."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from gcis_etl.durable import special_kind

# (magic prefix, offset, format name). Order matters: longer, more specific signatures first.
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
    (b"II+\x00", 0, "BigTIFF"),
    (b"MM\x00+", 0, "BigTIFF"),
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", 0, "JP2"),
    (b"\xff\x4f\xff\x51", 0, "J2K"),
    (b"GIF87a", 0, "GIF"),
    (b"GIF89a", 0, "GIF"),
    (b"BM", 0, "BMP"),
    (b"RIFF", 0, "RIFF"),
    (b"ftypavif", 4, "AVIF"),
    (b"ftypheic", 4, "HEIF"),
    (b"ftypmif1", 4, "HEIF"),
    (b"OggS", 0, "OGG"),
    (b"%PDF", 0, "PDF"),
    (b"8BPS", 0, "PSD"),
)

FORMAT_NAMES = tuple(dict.fromkeys(name for _, _, name in _SIGNATURES))  # what sniff() can say of content

# What each content format is usually called, to notice a misleading file name.
_EXTENSIONS = {
    "TIFF": {".tif", ".tiff"},
    "BigTIFF": {".tif", ".tiff", ".btf", ".tf8"},
    "JPEG": {".jpg", ".jpeg", ".jpe", ".jfif"},
    "PNG": {".png"},
    "JP2": {".jp2", ".jpx", ".jpf"},
    "J2K": {".j2k", ".j2c", ".jpc", ".jp2"},
}


def refuse_special(path: str | Path) -> None:
    """Raise OSError for a FIFO, device or socket, as opening a folder does: opening a FIFO waits for a writer,
    for ever if none comes, and a device or socket is no image. Before the first read of a file named to us."""
    kind = special_kind(os.stat(path).st_mode)
    if kind:
        raise OSError(errno.EINVAL, f"it is {kind}, not a regular file", str(path))


def sniff(path: str | Path) -> str:
    """Return the content format ('TIFF', 'JPEG', ...), 'empty' for a zero-byte file, 'unknown' otherwise;
    OSError for what is no regular file (refuse_special)."""
    refuse_special(path)
    with open(path, "rb") as f:
        head = f.read(32)
    if not head:
        return "empty"
    for magic, offset, name in _SIGNATURES:
        if head[offset:offset + len(magic)] == magic:
            return name
    return "unknown"


def names_of(fmt: str) -> set[str]:
    """The extensions a file of this content format is usually given (what iipsrv goes by)."""
    return _EXTENSIONS.get(fmt, set())


def extension_mismatch(path: str | Path, fmt: str) -> str | None:
    """A warning when the file name's extension names another format than the content has."""
    ext = Path(path).suffix.lower()
    expected = names_of(fmt)
    if not ext or not expected or ext in expected:
        return None
    return f"extension {ext} does not match the content ({fmt}); processed as {fmt}"


def names_a_sequence(name: str) -> bool:
    """iipsrv 1.1 reads '_pyr_' anywhere in a file name as a 3-D sequence marker (in any case, to be safe)."""
    return "_pyr_" in name.lower()
