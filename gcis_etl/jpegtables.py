"""Shared JPEG tables: every tile of a level repeats the same quantisation and Huffman tables (~600
bytes); TIFF lets them live once in the JPEGTables tag, as libtiff itself writes them (about 7% of a
pyramid). A tile whose tables differ from the shared ones keeps them: complete streams stay valid."""
from __future__ import annotations

import struct
import threading

SOI, EOI = b"\xff\xd8", b"\xff\xd9"
_TABLE_MARKERS = {0xDB, 0xC4}          # DQT, DHT
_DROPPED = {0xE0}                      # APP0 (JFIF) means nothing inside TIFF


class JpegTables:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: bytes | None = None   # SOI + DQT/DHT segments + EOI, once the first tile set them

    def abbreviate(self, stream: bytes) -> bytes:
        """The tile stream without the shared tables (or whole, when its tables differ)."""
        tables, rest = _split(stream)
        with self._lock:
            if self.tables is None:
                self.tables = SOI + tables + EOI
        return SOI + rest if SOI + tables + EOI == self.tables else stream


def _split(stream: bytes) -> tuple[bytes, bytes]:
    """(table segments, everything from the first other segment after SOI), APP0 dropped."""
    pos, tables, kept = 2, bytearray(), bytearray()
    while pos + 4 <= len(stream) and stream[pos] == 0xFF:
        marker = stream[pos + 1]
        if marker == 0xDA:  # start of scan: the rest is entropy-coded data
            break
        (length,) = struct.unpack(">H", stream[pos + 2:pos + 4])
        segment = stream[pos:pos + 2 + length]
        if marker in _TABLE_MARKERS:
            tables += segment
        elif marker not in _DROPPED:
            kept += segment
        pos += 2 + length
    return bytes(tables), bytes(kept) + stream[pos:]
