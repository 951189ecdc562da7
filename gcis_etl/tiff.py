"""TIFF structure: a writer for streamed, pre-compressed tiles and IFDs, and the entry values readers decode.

Tile data is appended as it is produced (levels interleaved), and the IFDs are written last. The first
16 bytes are reserved so that the same tile layout can be finished as classic TIFF or as BigTIFF: the
choice is made at the end from the real size, so BigTIFF is used only when the file needs it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO, Sequence

BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED, SSHORT, SLONG, SRATIONAL, FLOAT, DOUBLE = range(1, 13)
IFD, LONG8, SLONG8, IFD8 = 13, 16, 17, 18
OFFSETS = -1  # LONG in classic TIFF, LONG8 in BigTIFF

_FORMAT = {BYTE: "B", ASCII: "B", SHORT: "H", LONG: "I", RATIONAL: "I", SBYTE: "b", UNDEFINED: "B",
           SSHORT: "h", SLONG: "i", SRATIONAL: "i", FLOAT: "f", DOUBLE: "d", IFD: "I", LONG8: "Q",
           SLONG8: "q", IFD8: "Q"}
_SIZE = {BYTE: 1, ASCII: 1, SHORT: 2, LONG: 4, RATIONAL: 8, SBYTE: 1, UNDEFINED: 1, SSHORT: 2, SLONG: 4,
         SRATIONAL: 8, FLOAT: 4, DOUBLE: 8, IFD: 4, LONG8: 8, SLONG8: 8, IFD8: 8}
TYPES = frozenset(_SIZE)  # the entry types known here
BYTES_TYPES = (BYTE, ASCII, SBYTE, UNDEFINED)  # values kept as raw bytes
HEADER_RESERVED = 16
CLASSIC_LIMIT = 2 ** 32


@dataclass
class Tag:
    """One IFD entry. `values` are numbers (rationals as flat numerator/denominator pairs) or raw bytes;
    `sub_ifd` makes this a pointer tag (EXIF, GPS, Interop) whose target IFD is written by the writer."""

    code: int
    type: int
    values: bytes | Sequence[int | float] = ()
    sub_ifd: list["Tag"] | None = None

    def count(self) -> int:
        if self.sub_ifd is not None:
            return 1
        n = len(self.values)
        return n // 2 if self.type in (RATIONAL, SRATIONAL) else n

    def encode(self, bigtiff: bool) -> tuple[int, bytes]:
        """(on-disk type, little-endian value bytes)."""
        typ = self.type
        if typ == OFFSETS:
            typ = LONG8 if bigtiff else LONG
        if isinstance(self.values, (bytes, bytearray)):
            return typ, bytes(self.values)
        return typ, struct.pack(f"<{len(self.values)}{_FORMAT[typ]}", *self.values)


def field_size(typ: int, count: int) -> int:
    """Bytes of an entry's `count` values of type `typ` (KeyError for a type this module does not know)."""
    return _SIZE[typ] * count


def decode_values(typ: int, raw: bytes, order: str) -> bytes | tuple[int | float, ...]:
    """An entry's values from their bytes in byte order `order` ('<' or '>'), as Tag holds them."""
    if typ in BYTES_TYPES:
        return raw
    char = _FORMAT[typ]
    return struct.unpack(f"{order}{len(raw) // struct.calcsize(char)}{char}", raw)


def ascii_tag(code: int, text: str) -> Tag:
    return Tag(code, ASCII, text.encode("latin-1", "replace") + b"\0")


@dataclass
class TiffFileWriter:
    """Append blobs, then finish() with the IFD chain; offsets returned by append() stay valid either way."""

    f: BinaryIO
    size: int = 0

    def start(self) -> None:
        self.f.write(b"\0" * HEADER_RESERVED)
        self.size = HEADER_RESERVED

    def append(self, data: bytes) -> int:
        offset = self.size
        self.f.write(data)
        self.size += len(data)
        return offset

    def finish(self, ifds: list[list[Tag]], force_bigtiff: bool = False) -> bool:
        """Write the IFD chain and the header; return True when the file had to be BigTIFF."""
        bigtiff = force_bigtiff or self._needs_bigtiff(ifds)
        self._align()
        first = self.size
        blob = _serialise_chain(ifds, first, bigtiff)
        self.append(blob)
        self.f.seek(0)
        if bigtiff:
            self.f.write(b"II" + struct.pack("<HHHQ", 43, 8, 0, first))
        else:
            self.f.write(b"II" + struct.pack("<HI", 42, first) + b"\0" * 8)
        self.f.seek(0, 2)
        return bigtiff

    def _align(self) -> None:
        if self.size % 2:
            self.append(b"\0")

    def _needs_bigtiff(self, ifds: list[list[Tag]]) -> bool:
        estimate = self.size + len(_serialise_chain(ifds, self.size, False))
        return estimate >= CLASSIC_LIMIT


def _serialise_chain(ifds: list[list[Tag]], start: int, bigtiff: bool) -> bytes:
    out = bytearray()
    offsets: list[int] = []
    next_pointers: list[int] = []
    for tags in ifds:
        offset = start + len(out)
        offsets.append(offset)
        block, next_at = _serialise_ifd(tags, offset, bigtiff)
        next_pointers.append(len(out) + next_at)
        out += block
    ptr = "<Q" if bigtiff else "<I"
    for i, at in enumerate(next_pointers):
        nxt = offsets[i + 1] if i + 1 < len(offsets) else 0
        out[at:at + struct.calcsize(ptr)] = struct.pack(ptr, nxt)
    return bytes(out)


def _serialise_ifd(tags: list[Tag], offset: int, bigtiff: bool) -> tuple[bytes, int]:
    """One IFD, its out-of-line values and its sub-IFDs; returns (bytes, position of its next-IFD pointer)."""
    tags = sorted(tags, key=lambda t: t.code)
    count_fmt, entry_fmt, inline = ("<Q", "<HHQ", 8) if bigtiff else ("<H", "<HHI", 4)
    head = struct.calcsize(count_fmt) + len(tags) * (struct.calcsize(entry_fmt) + inline) + inline
    entries = bytearray(struct.pack(count_fmt, len(tags)))
    extra = bytearray()

    def place(data: bytes) -> int:
        if (head + len(extra)) % 2:
            extra.append(0)
        at = offset + head + len(extra)
        extra.extend(data)
        return at

    for tag in tags:
        if tag.sub_ifd is not None:
            if (head + len(extra)) % 2:
                extra.append(0)
            sub_offset = offset + head + len(extra)
            sub, next_at = _serialise_ifd(tag.sub_ifd, sub_offset, bigtiff)
            extra.extend(sub)
            typ, data = (IFD8 if bigtiff else LONG), struct.pack("<Q" if bigtiff else "<I", sub_offset)
        else:
            typ, data = tag.encode(bigtiff)
        entries += struct.pack(entry_fmt, tag.code, typ, tag.count())
        if len(data) <= inline:
            entries += data.ljust(inline, b"\0")
        else:
            entries += struct.pack("<Q" if bigtiff else "<I", place(data))
    next_at = len(entries)
    entries += b"\0" * inline
    return bytes(entries + extra), next_at
