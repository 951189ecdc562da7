"""JPEG 2000 file structure read directly, for what neither the decoders nor jpylyzer tell: the JP2 boxes
before the codestream (decoding) and the packet sequence numbers inside it (verification)."""
from __future__ import annotations

import mmap
import re
import struct
from typing import BinaryIO

SIGNATURE = b"\xff\x4f\xff\x51"  # SOC, SIZ: the start of every codestream
_SOT, _SOD = b"\xff\x90", b"\xff\x93"
# An SOP marker segment: marker, Lsop = 4, Nsop. Coded data never holds 0xFF followed by a byte above 0x8F (bit
# stuffing), so after SOD these bytes are a marker; in a tile-part header (a PLT's lengths) they need not be.
_SOP = re.compile(rb"\xff\x91\x00\x04(..)", re.DOTALL)


def box(f: BinaryIO, kind: bytes, end: int | None = None) -> int | None:
    """Moves `f` to the contents of the first `kind` box from here (to `end`); their length (-1: to the end of
    the file), or None when there is none or the boxes cannot be read."""
    while end is None or f.tell() < end:
        header = f.read(8)
        if len(header) < 8:
            return None
        length, found = struct.unpack(">I4s", header)
        if length == 1:
            extended = f.read(8)
            if len(extended) < 8:
                return None
            length = struct.unpack(">Q", extended)[0] - 8
        if found == kind:
            return length - 8 if length else -1
        if length < 8:
            return None
        f.seek(length - 8, 1)
    return None


def find(f: BinaryIO) -> bool:
    """Moves `f` (at its start) to the codestream's first byte: the file's own for a raw codestream, the jp2c box's
    contents in a JP2. False when there is none."""
    if f.read(4) == SIGNATURE:
        f.seek(0)
        return True
    f.seek(0)
    if box(f, b"jp2c") is None:
        return False
    start = f.tell()
    found = f.read(4) == SIGNATURE
    f.seek(start)
    return found


def packet_sequence_errors(path) -> list[str]:
    """Where the packets' SOP sequence numbers (Nsop) do not count 0, 1, 2 ... through each tile, across its
    tile-parts, as Part 1 (A.8.1) requires. OpenJPEG ignores them, and jpylyzer reads no packet; a decoder that
    follows them (Grok's) reads such a file as garbage. grk_compress 10.0.5 numbers them wrongly when the
    tile-parts are split by resolution. The codestream is walked tile-part by tile-part (Psot); a file too
    damaged to walk is left to the decoders and jpylyzer, which say what is wrong with it."""
    with open(path, "rb") as f:
        if not find(f):
            return []
        start = f.tell()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _sequence_errors(data, start)


def _sequence_errors(data, start: int) -> list[str]:
    position = data.find(_SOT, start)
    following: dict[int, int] = {}  # tile -> the Nsop its next packet must have
    while position >= 0 and position + 12 <= len(data):
        length, tile, psot = struct.unpack(">HHI", data[position + 2:position + 10])
        if length != 10:
            return []
        end = position + psot if psot else len(data)
        body = data.find(_SOD, position + 12, end)
        if body < 0:
            return []
        for match in _SOP.finditer(data, body + 2, end):
            expected = following.get(tile, 0)
            (number,) = struct.unpack(">H", match.group(1))
            if number != expected:
                return [f"packet sequence numbers (SOP) of tile {tile} skip from {expected} to {number}: "
                        f"a decoder that follows them reads the file wrongly"]
            following[tile] = (expected + 1) % 65536
        if not psot or end + 2 > len(data) or data[end:end + 2] != _SOT:
            return []
        position = end
    return []
